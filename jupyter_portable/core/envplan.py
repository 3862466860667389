"""How a recorded environment lands on another machine: what is kept, changed or left out, and why.

A lockfile is made on the user's interpreter (say CPython 3.11.7 on macOS); the machine may run
3.10 on Linux with a CUDA build of torch in its image. The rules here are pure data and
decisions; the resolver that asks an index which versions exist lives in ``worker/resolve``.

- The image's own builds of a few large frameworks win when their version is compatible (same
  major.minor release): replacing a CUDA torch by another build is slower and usually worse.
- Packages that only exist for the user's platform (``pyobjc``, ``pywin32``...) are left out.
- Everything else is resolved for the machine with the recorded versions as preferences: exact
  where they fit, else the nearest compatible version; each difference is one :class:`EnvChange`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from jupyter_portable.core.errors import ManifestError

# the frameworks an image ships built for its GPU: a compatible version there is kept
IMAGE_WINS = frozenset({"torch", "torchvision", "torchaudio", "jax", "jaxlib", "tensorflow", "tensorflow-gpu",
                        "tf-keras", "triton", "xformers", "flash-attn", "cupy", "cupy-cuda11x", "cupy-cuda12x"})
# projects published only for macOS or Windows: never installable on a Linux machine
_USER_PLATFORM_ONLY = re.compile(r"\A(pyobjc(-.*)?|pywin32|pywinpty|winkerberos|wmi|comtypes|pythonnet-win|"
                                 r"windows-curses|appscript|macholib-mac|pyobjc-framework-.*)\Z")

# why a version differs, as the record says it (a closed set: the sidebar and the CLI word them)
WHY = {
    "requires-python": "the recorded version does not support the machine's Python",
    "no-wheel": "the recorded version has no wheel for the machine's platform",
    "yanked": "the recorded version was yanked from the index",
    "not-found": "the recorded version is not on the index the machine's wheels come from",
    "dependency": "another package's requirements on the machine's Python need a different version",
    "image": "the image ships a compatible build, kept rather than replaced",
    "platform-only": "the package exists only for the user's platform",
    "added": "a dependency the machine's Python needs that the user's did not",
    "built": "on no package index (editable, a local folder or a git URL): built into a wheel on the user's side",
}
KINDS = ("changed", "kept", "left-out", "added", "built")


@dataclass(frozen=True)
class EnvChange:
    """One way the machine's environment differs from the recorded one."""

    name: str
    recorded: str | None  # the lockfile's version (None: not in the lockfile)
    installed: str | None  # what the machine gets (None: left out)
    why: str  # a key of WHY
    kind: str  # changed, kept (the image's build), left-out, added
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "recorded": self.recorded, "installed": self.installed, "why": self.why,
                "kind": self.kind, "detail": self.detail}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "EnvChange":
        if not isinstance(obj, dict) or set(obj) != {"name", "recorded", "installed", "why", "kind", "detail"}:
            raise ManifestError(f"{where}: an environment change needs exactly name, recorded, installed, why, "
                                "kind and detail")
        ok = isinstance(obj["name"], str) and 0 < len(obj["name"]) <= 200 and obj["why"] in WHY \
            and obj["kind"] in KINDS and isinstance(obj["detail"], str) and len(obj["detail"]) <= 2000 \
            and all(v is None or (isinstance(v, str) and 0 < len(v) <= 100)
                    for v in (obj["recorded"], obj["installed"]))
        if not ok:
            raise ManifestError(f"{where}: malformed environment change {obj!r:.200}")
        return cls(obj["name"], obj["recorded"], obj["installed"], obj["why"], obj["kind"], obj["detail"])

    def line(self) -> str:
        """One line for a person: ``ipython 9.9.0 -> 8.39.0 (requires-python)``."""
        if self.kind == "left-out":
            return f"{self.name} {self.recorded or ''}: left out ({self.why})".replace("  ", " ")
        if self.kind == "kept":
            return f"{self.name} {self.recorded} -> the image's {self.installed} ({self.why})"
        if self.kind == "added":
            return f"{self.name} {self.installed}: added (a dependency this Python needs)"
        if self.kind == "built":
            return f"{self.name} {self.installed}: built on your side from {self.detail}"
        return f"{self.name} {self.recorded} -> {self.installed} ({self.why})"


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a PEP 440 version: ``2.3.1+cu121`` -> (2, 3, 1); () when there is none."""
    m = re.match(r"\A(?:\d+!)?(\d+(?:\.\d+)*)", version.strip())
    return tuple(int(p) for p in m.group(1).split(".")) if m else ()


def image_compatible(recorded: str, image: str) -> bool:
    """Whether the image's build of a framework stands in for the recorded one: same major.minor."""
    a, b = release(recorded), release(image)
    return len(a) >= 2 and len(b) >= 2 and a[:2] == b[:2]


def user_platform_only(name: str) -> bool:
    return bool(_USER_PLATFORM_ONLY.match(name))


@dataclass(frozen=True)
class Split:
    """A lockfile's pins, divided before resolving: what to resolve, what the image keeps, what is left out."""

    resolve: dict[str, str]  # name -> recorded version
    kept: list[EnvChange]
    left_out: list[EnvChange]


def split(pins: Mapping[str, str], image: Mapping[str, str]) -> Split:
    """Divide ``pins`` (normalised name -> recorded version) given the machine image's packages."""
    resolve: dict[str, str] = {}
    kept: list[EnvChange] = []
    left: list[EnvChange] = []
    for name, version in sorted(pins.items()):
        if user_platform_only(name):
            left.append(EnvChange(name, version, None, "platform-only", "left-out"))
        elif name in IMAGE_WINS and name in image and image_compatible(version, image[name]):
            kept.append(EnvChange(name, version, image[name], "image", "kept"))
        else:
            resolve[name] = version
    return Split(resolve, kept, left)


def changes(recorded: Mapping[str, str], resolved: Mapping[str, str], reasons: Mapping[str, tuple[str, str]],
            ) -> list[EnvChange]:
    """The differences between ``recorded`` and ``resolved`` pins; ``reasons[name] = (why, detail)``
    for each version that changed (``dependency`` where no reason was found)."""
    out = []
    for name in sorted(set(recorded) | set(resolved)):
        was, now = recorded.get(name), resolved.get(name)
        if was == now:
            continue
        if was is None:
            out.append(EnvChange(name, None, now, "added", "added"))
        elif now is None:
            why, detail = reasons.get(name, ("not-found", ""))
            out.append(EnvChange(name, was, None, why, "left-out", detail))
        else:
            why, detail = reasons.get(name, ("dependency", ""))
            out.append(EnvChange(name, was, now, why, "changed", detail))
    return out


RECORD_FIELDS = frozenset({"mode", "python", "exact", "changes", "summary"})


def record(detail: Mapping[str, Any]) -> dict[str, Any]:
    """What a machine's history keeps of its environment (READY's detail, trimmed)."""
    return {k: detail.get(k) for k in sorted(RECORD_FIELDS)}


def check_record(obj: Any, where: str) -> dict[str, Any]:
    """Validate an allocation's ``environment`` record, as :func:`record` writes it."""
    if not isinstance(obj, dict) or set(obj) != RECORD_FIELDS:
        raise ManifestError(f"{where}: environment needs exactly {', '.join(sorted(RECORD_FIELDS))}")
    if obj["mode"] not in ("image", "lockfile") or not isinstance(obj["exact"], bool) \
            or not isinstance(obj["summary"], str) or len(obj["summary"]) > 4000 \
            or not isinstance(obj["changes"], list) or len(obj["changes"]) > 10000:
        raise ManifestError(f"{where}: malformed environment record")
    py = obj["python"]
    if py is not None and not (isinstance(py, dict) and set(py) == {"recorded", "installed"}
                               and all(isinstance(v, str) and 0 < len(v) <= 20 for v in py.values())):
        raise ManifestError(f"{where}: environment python must be null or {{recorded, installed}}")
    for c in obj["changes"]:
        EnvChange.from_json(c, where)
    return obj


def differences(items: Iterable[EnvChange]) -> list[EnvChange]:
    """The changes that make an environment other than the recorded one (a built wheel is the same code)."""
    return [c for c in items if c.kind != "built"]


def summary(items: Iterable[EnvChange]) -> str:
    """``3 differences: ipython 9.9.0 -> 8.39.0 (requires-python), ...`` or ``exact``."""
    items = list(items)
    lines = [c.line() for c in differences(items)]
    built = [c.line() for c in items if c.kind == "built"]
    tail = f" ({'; '.join(built[:6])})" if built else ""
    if not lines:
        return "exact: every recorded version" + tail
    head = f"{len(lines)} difference{'s' if len(lines) != 1 else ''} from the recorded environment: "
    return head + "; ".join(lines[:6]) + (f"; and {len(lines) - 6} more" if len(lines) > 6 else "") + tail


__all__ = ["IMAGE_WINS", "KINDS", "RECORD_FIELDS", "WHY", "EnvChange", "Split", "changes", "check_record",
           "differences", "image_compatible", "record", "release", "split", "summary", "user_platform_only"]
