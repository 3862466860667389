"""The worker environment's cold and warm build of one lockfile, timed side by side (bench/continue.py
prints it; tests/test_envcache.py checks it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from jupyter_portable.core.errors import UsageError  # noqa: E402
from jupyter_portable.store.repo import Store, digest  # noqa: E402
from jupyter_portable.worker.envcache import build_env  # noqa: E402
from jupyter_portable.worker.installers import Progress, redact  # noqa: E402
from jupyter_portable.worker.wheelindex import env_tag, read_index  # noqa: E402


def time_cold_and_warm(store: Store, lockfile: bytes, workdir: Path, find_links: list[str] | None, *,
                       index_url: str | None = None, python: str = sys.executable,
                       progress: Progress | None = None) -> dict[str, Any]:
    """Build ``lockfile`` cold (wheels from ``find_links``/``index_url``) then warm (store only), in ``workdir``.

    Returns both builds and their seconds; ``speedup`` is cold seconds over warm seconds.
    ``store`` must not yet cache this lockfile, or the first build would not be cold.
    """
    env = env_tag(python)
    if read_index(store, digest(lockfile), env) is not None:
        raise UsageError(f"{redact(store.url)} already caches the wheels of this lockfile, so no build would be cold",
                         hint="time against a fresh store")
    work = Path(workdir)
    cold = build_env(store, lockfile, work / "venv-cold", find_links=find_links, index_url=index_url,
                     python=python, progress=progress)
    warm = build_env(store, lockfile, work / "venv-warm", python=python, progress=progress)
    return {
        "cold_s": round(cold.seconds, 3), "warm_s": round(warm.seconds, 3),
        "speedup": round(cold.seconds / warm.seconds, 2) if warm.seconds > 0 else None,
        "wheels": cold.wheels, "bytes": cold.bytes, "cold": cold.to_json(), "warm": warm.to_json(),
    }

