"""The trust root of what runs on a machine: digests the user's side holds, never the store's word.

A worker's scoped credentials may write ``wheels/*`` in the store, and so may notebook code on
any machine, a malicious package there, or the host's root. A wheel set or a lockfile index
read back from the store is therefore only as good as the record this computer keeps of it:
when this side stores a set it records the set's digest (BLAKE3 of its exact bytes, which name
every wheel's hash) here, in the user's own data folder, where no worker writes. A later
Continue uses a set from the store only when its bytes hash to that record; a set this computer
never stored (another computer's, or one planted) is used only after this side fetched the same
wheels itself from its package index or find-links folders and they hashed the same.

The file is ``<jupyter data dir>/portable/trusted-wheels.json`` (``c.PortableWheels.trust_file``,
or ``$JUPYTER_PORTABLE_TRUST_FILE``, moves it): ``{"format": "jupyter-portable.trust", "schema": 1,
"sets": {"<store url>\\n<key>": "<digest>"}}``. Losing it costs a re-fetch, never safety.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from jupyter_portable.core.errors import IntegrityError, PortableError
from jupyter_portable.store.repo import digest
from jupyter_portable.workdir.outside import write_outside_copy

TRUST_FILE_ENV = "JUPYTER_PORTABLE_TRUST_FILE"
FORMAT = "jupyter-portable.trust"


def trust_path() -> Path:
    """``c.PortableWheels.trust_file`` (``$JUPYTER_PORTABLE_TRUST_FILE``), else the default in the data dir."""
    from jupyter_portable.core.envconfig import PortableWheels

    named = PortableWheels.current().trust_file
    if named:
        return Path(named).expanduser()
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / "portable" / "trusted-wheels.json"


def _load() -> dict[str, str]:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        obj = json.loads(trust_path().read_bytes())
        if obj.get("format") == FORMAT and obj.get("schema") == 1 and isinstance(obj.get("sets"), dict):
            return {str(k): str(v) for k, v in obj["sets"].items()}
    return {}  # none yet, or unreadable: every set is verified again before it is trusted


def _name(store_url: str, key: str) -> str:
    return f"{store_url}\n{key}"


def trusted(store_url: str, key: str) -> str | None:
    """The digest this computer recorded for ``key`` in the store at ``store_url``, if any."""
    return _load().get(_name(store_url, key))


def record(store_url: str, key: str, data: bytes) -> str:
    """Record ``data`` (the set's exact bytes) as what ``key`` must hold from now on; its digest."""
    sets = _load()
    sets[_name(store_url, key)] = d = digest(data)
    path = trust_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_outside_copy(path, json.dumps({"format": FORMAT, "schema": 1, "sets": sets}, indent=1).encode(), mode=0o600)
    return d


def check(store_url: str, key: str, data: bytes) -> bool:
    """True when ``data`` is what this computer recorded for ``key``; False when it recorded nothing.
    IntegrityError, naming the object, when the store holds something else."""
    want = trusted(store_url, key)
    if want is None:
        return False
    if digest(data) != want:
        raise IntegrityError(f"{key} in the store is not the one this computer stored: its bytes hash to "
                             f"{digest(data)[:16]}…, this computer recorded {want[:16]}… (anyone who can write the "
                             "store, a worker among them, may have changed which wheels a machine runs)",
                             hint=f"delete {key} from the store; the next Continue fetches those wheels again "
                                  "and records them anew")
    return True


LAYOUT_FORMAT = "jupyter-portable.laid-out"


def _layouts_path() -> Path:
    """Beside the trust file: the environments this computer laid out (a layout key -> the archive)."""
    return trust_path().with_name("laid-out-environments.json")


def laid_out() -> dict[str, tuple[str, int]]:
    """Each layout key (``envprep.layout_key``) this computer laid out -> its archive's object and size."""
    from jupyter_portable.core.validate import check_hash

    with contextlib.suppress(OSError, ValueError, TypeError, KeyError, AttributeError, IndexError, PortableError):
        obj = json.loads(_layouts_path().read_bytes())
        if obj.get("format") == LAYOUT_FORMAT and obj.get("schema") == 1:
            return {str(k): (check_hash(v[0], "a laid-out archive"), int(v[1])) for k, v in obj["layouts"].items()}
    return {}  # none yet, or unreadable: laid out again


def remember_layout(key: str, h: str, size: int) -> None:
    """Record that the layout ``key`` made the archive object ``h`` of ``size`` bytes."""
    layouts: dict[str, list[Any]] = {k: list(v) for k, v in laid_out().items()}
    layouts[key] = [h, size]
    path = _layouts_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_outside_copy(path, json.dumps({"format": LAYOUT_FORMAT, "schema": 1, "layouts": layouts}).encode(),
                       mode=0o600)


__all__ = ["LAYOUT_FORMAT", "TRUST_FILE_ENV", "check", "laid_out", "record", "remember_layout", "trust_path",
           "trusted"]
