"""The local market's catalog: a TOML file of offers, their capacity and their faults.

The format is documented in ``docs/catalog.md``. Everything read from the file is validated
on the way in; an error names the file, the offer and the field, and unknown keys are
refused (a misspelt ``launch_failure_rat`` would otherwise silently mean "never fails").
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.offers import Offer

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 has no tomllib; tomli is the same parser
    import tomli as tomllib

CATALOG_ENV = "JUPYTER_PORTABLE_CATALOG"
CATALOG_VERSION = 1
PROVIDER = "local"
_HINT = "edit the catalog; its format is in docs/catalog.md"


@dataclass(frozen=True)
class Catalog:
    """A loaded catalog. ``actual_drivers`` and ``quotas`` are the market's own knowledge: a
    renter sees only the offers, so they are kept out of :class:`Offer`."""

    path: Path
    offers: list[Offer]
    store_region: str
    store_egress_per_gb: float
    actual_drivers: dict[str, str] = field(default_factory=dict)
    quotas: dict[str, int] = field(default_factory=dict)

    def offer(self, offer_id: str) -> Offer | None:
        """The offer with this id, or None when the catalog does not list it."""
        return next((o for o in self.offers if o.id == offer_id), None)


def default_catalog_path() -> Path:
    """``$JUPYTER_PORTABLE_CATALOG``, else the demo catalog shipped with the package (compute.config)."""
    from jupyter_portable.compute.config import PortableLocal

    return Path(PortableLocal().catalog)


# --- field checkers: each returns the value or raises ValueError with what was expected ---

def _str(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a non-empty string")
    return value


def _int(lo: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        # bool is an int in Python; ``capacity = true`` is a mistake, not a 1
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise ValueError(f"must be an integer >= {lo}")
        return value
    return check


def _num(lo: float, hi: float = math.inf, *, lo_open: bool = False) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ok = ok and (value > lo if lo_open else value >= lo) and value <= hi
        if not ok:
            bound = f"> {lo:g}" if lo_open else f">= {lo:g}"
            raise ValueError(f"must be a number {bound}" + (f" and <= {hi:g}" if hi != math.inf else ""))
        return float(value)
    return check


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def _strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError("must be a list of non-empty strings")
    return tuple(value)


_REQUIRED: dict[str, Callable[[Any], Any]] = {
    "id": _str,
    "gpu": _str,
    "gpu_count": _int(0),
    "gpu_memory_gb": _num(0, lo_open=True),
    "driver": _str,
    "cuda": _str,
    "price_per_hour": _num(0),
    "region": _str,
    "capacity": _int(0),
    "boot_seconds": _num(0),
    "launch_failure_rate": _num(0, 1),
    "reliability": _num(0, 1),
    "bandwidth_mbps": _num(0, lo_open=True),
}
_OPTIONAL: dict[str, Callable[[Any], Any]] = {
    "actual_driver": _str,
    "reservable": _bool,
    "images": _strings,
    "quota": _int(0),
    "spot": _bool,
    "egress_per_gb": _num(0),
}
_STORE: dict[str, Callable[[Any], Any]] = {"region": _str, "egress_per_gb": _num(0)}


def _fields(table: Any, spec: dict[str, Callable[[Any], Any]], optional: dict[str, Callable[[Any], Any]],
            where: str) -> dict[str, Any]:
    """Check one table against its spec; ``where`` names it in errors."""
    if not isinstance(table, dict):
        raise UsageError(f"{where}: must be a table", hint=_HINT)
    unknown = sorted(set(table) - set(spec) - set(optional))
    if unknown:
        known = ", ".join(sorted({*spec, *optional}))
        raise UsageError(f"{where}: unknown field(s) {', '.join(unknown)} (known: {known})", hint=_HINT)
    missing = [k for k in spec if k not in table]
    if missing:
        raise UsageError(f"{where}: missing field(s) {', '.join(missing)}", hint=_HINT)
    out = {}
    for key, value in table.items():
        try:
            out[key] = {**spec, **optional}[key](value)
        except ValueError as exc:
            raise UsageError(f"{where}: field {key!r} {exc}, got {value!r}", hint=_HINT) from None
    return out


def load_catalog(path: str | os.PathLike[str]) -> Catalog:
    """Read and validate a catalog; raises UsageError naming the file, offer and field at fault."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise UsageError(f"catalog {path} does not exist", hint=f"create it, or unset {CATALOG_ENV}") from None
    except OSError as exc:
        raise UsageError(f"catalog {path} cannot be read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"catalog {path} is not valid TOML: {exc}", hint=_HINT) from None
    unknown = sorted(set(data) - {"version", "store", "offer"})
    if unknown:
        raise UsageError(f"catalog {path}: unknown top-level key(s) {', '.join(unknown)} "
                         "(known: version, store, offer)", hint=_HINT)
    version = data.get("version", CATALOG_VERSION)
    if version != CATALOG_VERSION:
        # the version rule: a catalog written for another format is refused, never guessed at
        raise UsageError(f"catalog {path}: version {version!r} is not supported (this reads {CATALOG_VERSION})")
    if "store" not in data:
        raise UsageError(f"catalog {path}: missing [store] table (region, egress_per_gb)", hint=_HINT)
    store = _fields(data["store"], _STORE, {}, f"catalog {path}: [store]")
    raw_offers = data.get("offer", [])
    if not isinstance(raw_offers, list) or not raw_offers:
        raise UsageError(f"catalog {path}: needs at least one [[offer]] table", hint=_HINT)

    offers: list[Offer] = []
    actual: dict[str, str] = {}
    quotas: dict[str, int] = {}
    for n, raw in enumerate(raw_offers, 1):
        name = raw.get("id") if isinstance(raw, dict) and isinstance(raw.get("id"), str) else f"#{n}"
        where = f"catalog {path}: offer {name!r}"
        f = _fields(raw, _REQUIRED, _OPTIONAL, where)
        if any(o.id == f["id"] for o in offers):
            raise UsageError(f"{where}: field 'id' repeats an earlier offer's id", hint=_HINT)
        if "actual_driver" in f:
            actual[f["id"]] = f.pop("actual_driver")
        if "quota" in f:
            quotas[f["id"]] = f.pop("quota")
        try:
            offers.append(Offer(provider=PROVIDER, **f))
        except UsageError as exc:  # the id's character set is Offer's rule
            raise UsageError(f"{where}: {exc}", hint=_HINT) from None
    return Catalog(path=path, offers=offers, store_region=store["region"],
                   store_egress_per_gb=store["egress_per_gb"], actual_drivers=actual, quotas=quotas)


__all__ = ["CATALOG_ENV", "Catalog", "default_catalog_path", "load_catalog"]
