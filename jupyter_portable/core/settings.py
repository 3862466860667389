"""The workspace's settings as a record, and the one set of rules every field passes.

A settings document is kept with the workspace in its store (``orchestration/settings``
reads and writes it)::

    {"requirements": {...Requirements...}, "budget": {...Budget...},
     "hours": 8.0, "autosnapshot_minutes": null, "idle_minutes": 30.0}

Every value is checked against :data:`FIELDS`: finite numbers within a sensible range,
whole counts, bounded strings and lists. A value that breaks a rule is a UsageError that
names the field and says what it must be; nothing is changed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.idle import DEFAULT_IDLE_MINUTES
from jupyter_portable.core.images import (
    CONTAINER_WORDS,
    MACHINE_WORDS,
    check_container_image,
    check_machine_image,
    legacy_image,
)
from jupyter_portable.core.offers import Requirements
from jupyter_portable.core.spend import Budget
from jupyter_portable.core.validate import check_int, check_number, check_str, check_str_list, short_repr

DEFAULT_HOURS = 8.0
MAX_HOURS = 24.0 * 365  # one year of planned GPU time
MAX_PRICE_PER_HOUR = 10_000.0  # dollars; the dearest multi-GPU machines cost well under this
MAX_BUDGET = 100_000_000.0
MAX_GPU_COUNT = 64
MAX_GPU_MEMORY_GB = 4096.0
MAX_AUTOSNAPSHOT_MINUTES = 24 * 60.0
MIN_AUTOSNAPSHOT_MINUTES = 0.1  # under 6 s the kernel would do little but snapshot
MIN_IDLE_MINUTES = 1.0  # the GPU's utilization is sampled every few seconds; under a minute it says little
MAX_IDLE_MINUTES = 7 * 24 * 60.0
MAX_ITEMS = 32
MAX_TEXT = 64

# a driver version is numbers and dots (NVIDIA: 550.54.15); "nan" or "latest" never matches a machine
_DRIVER_RE = re.compile(r"\A\d{1,5}(?:\.\d{1,5}){0,3}\Z")
_CUDA_RE = re.compile(r"\A\d{1,3}(\.\d{1,3}){0,2}\Z")
_REGION_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


@dataclass(frozen=True)
class Field:
    """One setting: its name (in ``update_settings``, the REST body), where the document keeps
    it, its kind and bounds, and the rule in words for the error message."""

    name: str
    section: str  # "requirements", "budget", or "" for the top level
    key: str  # its key within ``section``
    kind: str  # "int", "number", "text" or "list"
    rule: str
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None  # exclusive lower bound
    pattern: re.Pattern[str] | None = None
    nullable: bool = False  # None (or "") is a value of its own; otherwise it means the default
    off_value: float | None = None  # a number outside the range that still means something (0: off)
    # a text's own rule past the pattern: returns the value or raises a UsageError of its own words
    check: Callable[[str], str] | None = None


FIELDS: tuple[Field, ...] = (
    Field("gpus", "requirements", "gpus", "list",
          f"a list of at most {MAX_ITEMS} GPU model names of at most {MAX_TEXT} characters, such as [\"H100\"]"),
    Field("gpu_count", "requirements", "gpu_count", "int", f"a whole number of GPUs from 0 to {MAX_GPU_COUNT}",
          minimum=0, maximum=MAX_GPU_COUNT),
    Field("min_gpu_memory_gb", "requirements", "min_gpu_memory_gb", "number",
          f"a number of GB from 0 to {MAX_GPU_MEMORY_GB:g}", minimum=0, maximum=MAX_GPU_MEMORY_GB),
    Field("driver", "requirements", "driver", "text", "an exact driver version such as 550.54.15, or \"\" to unpin",
          pattern=_DRIVER_RE, nullable=True),
    Field("min_cuda", "requirements", "min_cuda", "text", "a CUDA version such as 12.4, or \"\" for any",
          pattern=_CUDA_RE, nullable=True),
    Field("container_image", "requirements", "container_image", "text",
          f"the container image {CONTAINER_WORDS} start, such as nvcr.io/nvidia/pytorch:24.05-py3, "
          "or \"\" for each provider's default", nullable=True, check=check_container_image),
    Field("machine_image", "requirements", "machine_image", "text",
          f"the image {MACHINE_WORDS} boot: an AMI (ami-0123456789abcdef0) for AWS or an image "
          "(projects/PROJECT/global/images/family/FAMILY) for Google Cloud, or \"\" for each cloud's default",
          nullable=True, check=check_machine_image),
    Field("max_price_per_hour", "requirements", "max_price_per_hour", "number",
          f"a price in $/h from 0 to {MAX_PRICE_PER_HOUR:g}, or \"\" for no cap", minimum=0,
          maximum=MAX_PRICE_PER_HOUR, nullable=True),
    Field("regions", "requirements", "regions", "list",
          f"a list of at most {MAX_ITEMS} region names such as [\"us-east-1\"]", pattern=_REGION_RE),
    Field("budget_max_price_per_hour", "budget", "max_price_per_hour", "number",
          f"a price in $/h from 0 to {MAX_PRICE_PER_HOUR:g}, or \"\" for no cap", minimum=0,
          maximum=MAX_PRICE_PER_HOUR, nullable=True),
    Field("budget_total", "budget", "total", "number",
          f"an amount in dollars from 0 to {MAX_BUDGET:g}, or \"\" for no budget", minimum=0, maximum=MAX_BUDGET,
          nullable=True),
    Field("budget_warn_fraction", "budget", "warn_fraction", "number",
          "a fraction of the budget more than 0 and at most 1, such as 0.8", above=0, maximum=1),
    Field("hours", "", "hours", "number", f"a number of planned GPU hours more than 0 and at most {MAX_HOURS:g}",
          above=0, maximum=MAX_HOURS),
    Field("autosnapshot_minutes", "", "autosnapshot_minutes", "number",
          f"0 (off), or minutes from {MIN_AUTOSNAPSHOT_MINUTES:g} to {MAX_AUTOSNAPSHOT_MINUTES:g}, "
          "or \"\" for the machine's default", minimum=MIN_AUTOSNAPSHOT_MINUTES,
          maximum=MAX_AUTOSNAPSHOT_MINUTES, nullable=True, off_value=0),
    Field("idle_minutes", "", "idle_minutes", "number",
          f"0 (off), or minutes from {MIN_IDLE_MINUTES:g} to {MAX_IDLE_MINUTES:g} after which an idle machine "
          f"is sealed and released, or \"\" for the default ({DEFAULT_IDLE_MINUTES:g})",
          minimum=MIN_IDLE_MINUTES, maximum=MAX_IDLE_MINUTES, nullable=True, off_value=0),
)
FIELD_NAMES = frozenset(f.name for f in FIELDS)
# settings that are no more, and what took their place (a request naming one is told)
RENAMED = {"image": f"image is two settings now: container_image (the container {CONTAINER_WORDS} start) "
                    f"and machine_image (the image {MACHINE_WORDS} boot)"}
_BY_NAME = {f.name: f for f in FIELDS}
_BY_PLACE = {(f.section, f.key): f for f in FIELDS}
_SECTIONS = ("requirements", "budget")
_TOP = frozenset({"requirements", "budget", "hours", "autosnapshot_minutes", "idle_minutes"})


def check_setting(name: str, value: object) -> Any:
    """``value`` for the setting ``name`` as the document keeps it (None: the default, or unset);
    UsageError naming the setting and what it must be otherwise."""
    f = _BY_NAME.get(name)
    if f is None and name in RENAMED:
        raise UsageError(f"setting {RENAMED[name]}", hint=f"set {name} as one of those")
    if f is None:
        raise UsageError(f"unknown setting {short_repr(name)}; the settings are {', '.join(sorted(FIELD_NAMES))}")
    if value is None or value == "":
        return None
    what = f"setting {name}"
    if f.kind == "text" and f.check is not None:
        # a rule of its own, which says in its own words what is wrong (and which providers it affects)
        try:
            text = check_str(value, what, max_len=200, min_len=1, printable=True, error=UsageError).strip()
        except UsageError:
            raise UsageError(f"setting {name} must be {f.rule}, got {short_repr(value)}") from None
        return f.check(text)
    try:
        if f.kind == "list":
            items = check_str_list(value, what, max_items=MAX_ITEMS, max_len=MAX_TEXT, error=UsageError)
            if f.pattern is not None and not all(f.pattern.match(item) for item in items):
                raise UsageError(what)
            return items
        if f.kind == "text":
            text = check_str(value, what, max_len=200, min_len=1, printable=True, error=UsageError).strip()
            if f.pattern is not None and not f.pattern.match(text):
                raise UsageError(what)
            return text
        if f.kind == "int":
            return check_int(value, what, minimum=int(f.minimum or 0),
                             maximum=None if f.maximum is None else int(f.maximum), error=UsageError)
        if f.off_value is not None and not isinstance(value, bool) and value == f.off_value:
            return float(f.off_value)
        return check_number(value, what, minimum=f.minimum, maximum=f.maximum, above=f.above, error=UsageError)
    except UsageError:
        # one message for every way a value can be wrong: the field, the rule, what was given
        raise UsageError(f"setting {name} must be {f.rule}, got {short_repr(value)}") from None


def _section(obj: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    part = obj.get(name)
    if part is None:
        return {}
    if not isinstance(part, dict):
        raise UsageError(f"settings {name} must be a JSON object, got {short_repr(part)}")
    known = {f.key for f in FIELDS if f.section == name}
    if name == "requirements" and "image" in part:  # a document written before image was two settings
        part = dict(part)
        old = part.pop("image")
        if isinstance(old, str) and old.strip():
            setting, value = legacy_image(old.strip())
            part.setdefault(setting, value)
    unknown = set(part) - known
    if unknown:
        raise UsageError(f"settings {name} has unknown field(s) {', '.join(sorted(map(str, unknown)))[:200]}")
    return part


@dataclass(frozen=True)
class Settings:
    """What this workspace needs and may spend, kept with it."""

    requirements: Requirements = field(default_factory=Requirements)
    budget: Budget = field(default_factory=Budget)
    hours: float = DEFAULT_HOURS
    # the kernel's auto-snapshot on the worker, in minutes (0: off); None: the machine's default
    autosnapshot_minutes: float | None = None
    # a machine with no cell run and no GPU work for this long is sealed and released (0: never)
    idle_minutes: float = DEFAULT_IDLE_MINUTES

    def to_json(self) -> dict[str, Any]:
        return {"requirements": self.requirements.to_json(), "budget": self.budget.to_json(), "hours": self.hours,
                "autosnapshot_minutes": self.autosnapshot_minutes, "idle_minutes": self.idle_minutes}

    @classmethod
    def from_json(cls, obj: object) -> "Settings":
        """Validate a settings document (None: the defaults); a missing or null field is its default."""
        if obj is None:
            return cls()
        if not isinstance(obj, dict):
            raise UsageError(f"the workspace settings must be a JSON object, got {short_repr(obj)}")
        unknown = set(obj) - _TOP
        if unknown:
            raise UsageError(f"the workspace settings have unknown field(s) "
                             f"{', '.join(sorted(map(str, unknown)))[:200]}")
        values: dict[str, Any] = {}
        for section in ("", *_SECTIONS):
            part = _section(obj, section) if section else {k: obj[k] for k in ("hours", "autosnapshot_minutes",
                                                                               "idle_minutes") if k in obj}
            for key, value in part.items():
                values[_BY_PLACE[(section, key)].name] = check_setting(_BY_PLACE[(section, key)].name, value)
        req_defaults, budget_defaults = Requirements(), Budget()

        def pick(name: str, default: Any) -> Any:
            value = values.get(name)
            return default if value is None else value

        requirements = Requirements(
            gpus=tuple(pick("gpus", ())), gpu_count=pick("gpu_count", req_defaults.gpu_count),
            min_gpu_memory_gb=pick("min_gpu_memory_gb", req_defaults.min_gpu_memory_gb),
            driver=values.get("driver"), min_cuda=values.get("min_cuda"),
            container_image=values.get("container_image"), machine_image=values.get("machine_image"),
            max_price_per_hour=values.get("max_price_per_hour"), regions=tuple(pick("regions", ())))
        budget = Budget(max_price_per_hour=values.get("budget_max_price_per_hour"), total=values.get("budget_total"),
                        warn_fraction=pick("budget_warn_fraction", budget_defaults.warn_fraction))
        return cls(requirements, budget, pick("hours", DEFAULT_HOURS), values.get("autosnapshot_minutes"),
                   pick("idle_minutes", DEFAULT_IDLE_MINUTES))


def apply_changes(current: object, changes: Mapping[str, Any]) -> Settings:
    """The settings ``current`` (a stored document, or None) with ``changes`` made: None leaves a
    field as it is, "" clears it (to its default). Every field of the result passes the rules, so a
    value stored before the rules existed is repaired by setting it again."""
    for name in set(changes) & set(RENAMED):
        check_setting(name, changes[name])
    unknown = set(changes) - FIELD_NAMES
    if unknown:
        raise UsageError(f"unknown setting(s): {', '.join(sorted(map(str, unknown)))[:200]}",
                         hint=f"the settings are {', '.join(sorted(FIELD_NAMES))}")
    checked = {name: check_setting(name, value) for name, value in changes.items() if value is not None}
    if current is None:
        current = {}
    if not isinstance(current, dict):
        raise UsageError(f"the workspace settings must be a JSON object, got {short_repr(current)}")
    doc: dict[str, Any] = {k: v for k, v in current.items()}
    for section in _SECTIONS:
        if section in doc and doc[section] is not None and not isinstance(doc[section], dict):
            raise UsageError(f"settings {section} must be a JSON object, got {short_repr(doc[section])}")
        doc[section] = dict(_section(doc, section)) if section in doc else {}
    for name, value in checked.items():
        f = _BY_NAME[name]
        (doc[f.section] if f.section else doc)[f.key] = value
    return Settings.from_json(doc)


__all__ = ["DEFAULT_HOURS", "FIELDS", "FIELD_NAMES", "RENAMED", "Field", "Settings", "apply_changes",
           "check_setting"]
