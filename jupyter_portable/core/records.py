"""The manifest's other records: checkpoints, next action and allocation history.

Each is a plain JSON object inside the manifest, validated here on the way in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jupyter_portable.core.envplan import check_record
from jupyter_portable.core.errors import ManifestError
from jupyter_portable.core.paths import check_relpath
from jupyter_portable.core.spend import SPEND_SOURCES
from jupyter_portable.core.validate import check_hash, check_number

CHECKPOINT_STATUSES = ("verified", "rejected")
CHECKPOINT_KINDS = ("file", "directory")


def _opt(obj: dict, key: str, types: type | tuple[type, ...], what: str) -> Any:
    """``obj[key]`` if absent, null or of ``types`` (booleans never count as numbers)."""
    value = obj.get(key)
    if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
        raise ManifestError(f"{what}: {key} has the wrong type ({type(value).__name__})")
    return value


@dataclass(frozen=True)
class CheckpointRecord:
    """One registered checkpoint and the outcome of its write check."""

    id: int
    path: str
    status: str
    created: str
    step: int | None = None
    note: str = ""
    reason: str | None = None
    format: str | None = None
    kind: str = "file"
    hash: str | None = None  # the file's BLAKE3, or for a directory the BLAKE3 of its listing
    size: int = 0
    files: int = 1
    version: int | None = None  # the manifest version that published it

    @property
    def verified(self) -> bool:
        return self.status == "verified"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "path": self.path, "status": self.status, "created": self.created,
                "step": self.step, "note": self.note, "reason": self.reason, "format": self.format,
                "kind": self.kind, "hash": self.hash, "size": self.size, "files": self.files,
                "version": self.version}

    @classmethod
    def from_json(cls, obj: object) -> "CheckpointRecord":
        if not isinstance(obj, dict):
            raise ManifestError("a checkpoint record must be an object")
        what = f"checkpoint {obj.get('path')!r}"
        extra = set(obj) - set(cls.__dataclass_fields__)
        if extra:
            raise ManifestError(f"{what} has unknown field(s) {', '.join(sorted(extra))}")
        status = obj.get("status")
        if status not in CHECKPOINT_STATUSES:
            raise ManifestError(f"{what}: status must be verified or rejected, got {status!r}")
        kind = obj.get("kind", "file")
        if kind not in CHECKPOINT_KINDS:
            raise ManifestError(f"{what}: kind must be file or directory")
        ident = obj.get("id")
        if not isinstance(ident, int) or isinstance(ident, bool) or ident < 1:
            raise ManifestError(f"{what}: id must be a positive integer")
        step = _opt(obj, "step", int, what)
        digest = obj.get("hash")
        if status == "verified":
            check_hash(digest, f"{what} hash")
            if obj.get("reason") is not None:
                raise ManifestError(f"{what}: a verified checkpoint has no rejection reason")
        elif digest is not None:
            check_hash(digest, f"{what} hash")
        if status == "rejected" and not isinstance(obj.get("reason"), str):
            raise ManifestError(f"{what}: a rejected checkpoint needs its reason")
        size, files, version = obj.get("size", 0), obj.get("files", 1), obj.get("version")
        for name, value in (("size", size), ("files", files)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ManifestError(f"{what}: {name} must be a non-negative integer")
        if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 1):
            raise ManifestError(f"{what}: version must be a positive integer")
        return cls(
            id=ident, path=check_relpath(obj.get("path"), what="checkpoint path"), status=status,
            created=str(_opt(obj, "created", str, what) or ""), step=step,
            note=_opt(obj, "note", str, what) or "", reason=_opt(obj, "reason", str, what),
            format=_opt(obj, "format", str, what), kind=kind, hash=digest, size=size, files=files,
            version=version)


SYMLINK_CHECKPOINT_REASON = ("it was a symlink, published by an older jupyter-portable as verified with no hash; "
                             "register the file it points to")


def symlink_record_read(record: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint record as a manifest is read: a "verified" file checkpoint with the hash ``""``,
    which an older jupyter-portable published for a symlink (issue 40), reads as rejected with its
    reason, so the manifest stays readable and "latest verified" never points at it (and the next
    version carries the record so); any other record as it is, for :class:`CheckpointRecord` to check."""
    if record.get("status") == "verified" and record.get("hash") == "" and record.get("kind", "file") == "file" \
            and record.get("reason") is None:
        return {**record, "status": "rejected", "hash": None, "reason": SYMLINK_CHECKPOINT_REASON}
    return record


def latest_verified(records: list[CheckpointRecord]) -> CheckpointRecord | None:
    """The last verified checkpoint in registration order: rejected ones never count."""
    for record in reversed(records):
        if record.verified:
            return record
    return None


def check_next_action(obj: object) -> dict[str, Any] | None:
    """What ran last or is running, and what the user said comes next."""
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise ManifestError("next_action must be an object")
    allowed = {"notebook", "cell_id", "execution_count", "state", "started", "finished", "text", "updated"}
    extra = set(obj) - allowed
    if extra:
        raise ManifestError(f"next_action has unknown field(s) {', '.join(sorted(extra))}")
    for key in ("notebook", "cell_id", "state", "started", "finished", "text", "updated"):
        _opt(obj, key, str, "next_action")
    _opt(obj, "execution_count", int, "next_action")
    if obj.get("state") not in (None, "running", "finished", "failed"):
        raise ManifestError("next_action state must be running, finished or failed")
    return obj


ALLOCATION_FIELDS = {"allocation_id", "provider", "offer", "gpu", "region", "started", "stopped",
                     "stop_reason", "spend", "spend_source", "currency", "failures", "epoch", "state", "ref",
                     "price_per_hour", "driver", "predicted", "measured", "environment", "reservation_id",
                     "released_by"}
# What the route predicted for this allocation, and what happened (seconds, dollars, hours). Optional:
# records written before they existed, and launches that never reached Ready, have neither.
PREDICTED_FIELDS = {"time_to_ready_s", "boot_s", "catalog_boot_s", "transfer_s", "queue_s", "bytes", "cost",
                    "total", "hours"}
MEASURED_FIELDS = {"time_to_ready_s", "up_s", "boot_s", "transfer_s", "environment_s", "verify_s", "spend",
                   "hours", "cost"}
BOOT_BASES = ("catalog", "measured", "provider")  # where a predicted boot came from (core.routing)


def check_estimate(obj: object, name: str) -> dict[str, Any] | None:
    """An allocation's ``predicted`` or ``measured`` object: known keys, each a number >= 0
    (``predicted.boot_basis`` one of :data:`BOOT_BASES`)."""
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise ManifestError(f"allocation {name} must be an object")
    allowed = PREDICTED_FIELDS | {"boot_basis"} if name == "predicted" else MEASURED_FIELDS
    extra = set(obj) - allowed
    if extra:
        raise ManifestError(f"allocation {name} has unknown field(s) {', '.join(sorted(extra))}")
    for key, value in obj.items():
        if key == "boot_basis":
            if value not in BOOT_BASES:
                raise ManifestError(f"allocation predicted.boot_basis must be one of {', '.join(BOOT_BASES)}, "
                                    f"got {value!r}")
        else:
            check_number(value, f"allocation {name}.{key}", minimum=0)
    return obj


def check_allocation(obj: object) -> dict[str, Any]:
    """One allocation of the workspace's history (filled in by the compute layer)."""
    if not isinstance(obj, dict):
        raise ManifestError("an allocation record must be an object")
    extra = set(obj) - ALLOCATION_FIELDS
    if extra:
        raise ManifestError(f"allocation record has unknown field(s) {', '.join(sorted(extra))}")
    if not isinstance(obj.get("allocation_id"), str) or not obj["allocation_id"]:
        raise ManifestError("an allocation record needs its allocation_id")
    # reservation_id: the booking the provider sold that the machine was launched into (its spend is part of it)
    for key in ("provider", "offer", "gpu", "region", "started", "stopped", "stop_reason", "currency", "state", "ref",
                "driver", "reservation_id"):
        _opt(obj, key, str, "allocation")
    for key in ("spend", "price_per_hour"):
        if _opt(obj, key, (int, float), "allocation") is not None:
            check_number(obj[key], f"allocation {key}")
    _opt(obj, "epoch", int, "allocation")
    source = _opt(obj, "spend_source", str, "allocation")
    if source is not None and source not in (*SPEND_SOURCES, "provider"):  # "provider": before the three
        raise ManifestError(f"allocation spend_source must be one of {', '.join(SPEND_SOURCES)}, got {source!r}")
    check_estimate(obj.get("predicted"), "predicted")
    check_estimate(obj.get("measured"), "measured")
    failures = obj.get("failures", [])
    if not isinstance(failures, list) or not all(isinstance(f, str) for f in failures):
        raise ManifestError("allocation failures must be a list of strings")
    if obj.get("released_by") is not None:  # the machine ended its own billing while the user side was away
        from jupyter_portable.core.guardian import check_release

        check_release(obj["released_by"])
    if obj.get("environment") is not None:  # what the machine's Python and packages were (issue 26)
        check_record(obj["environment"], f"allocation {obj['allocation_id']}")
    return obj
