"""What runs on a machine is checked against digests the user's side holds, not against the store
(issue 28 item 1): a worker, notebook code or a host's root can write ``wheels/*`` in the store,
and a swapped wheel set or lockfile index must stop the Continue with the object named. Real
stores, real uv and pip against the offline wheelhouse."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from jupyter_portable.core.errors import IntegrityError
from jupyter_portable.store.repo import Store


@pytest.fixture
def fresh_trust(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "trust" / "trusted-wheels.json"
    monkeypatch.setenv("JUPYTER_PORTABLE_TRUST_FILE", str(path))
    return path


def _swap_uv(store: Store, key: str) -> None:
    """What a writer of the store could do: another 'uv' wheel, and the set rewritten to name it."""
    doc = json.loads(store.backend.read(key))
    evil = b"PK not uv at all"
    for w in doc["wheels"]:
        if w["filename"].startswith("uv-"):
            w.update(hash=store.put_object(evil), sha256=hashlib.sha256(evil).hexdigest(), size=len(evil))
    store.backend.write(key, json.dumps(doc).encode())


def test_a_swapped_worker_wheel_set_stops_the_next_bootstrap(tmp_path: Path, wheelhouse: Path,
                                                              fresh_trust: Path) -> None:
    from jupyter_portable.worker.interpreter import target_for
    from jupyter_portable.worker.wheelset import set_key, wheel_set

    store = Store.open(f"file://{tmp_path / 'store'}")
    target = target_for("3.11.2")
    first = wheel_set(store, target, find_links=[str(wheelhouse)], no_index=True)
    assert first.warm is False and fresh_trust.exists()
    assert wheel_set(store, target, no_index=True, find_links=[]).warm is True  # recorded: warm, no index
    key = set_key(list(first.requirements), target.tag)
    _swap_uv(store, key)
    with pytest.raises(IntegrityError, match="not the one this computer stored") as info:
        wheel_set(store, target, no_index=True, find_links=[])
    assert key in str(info.value) and info.value.hint and f"delete {key}" in info.value.hint


def test_a_set_this_computer_never_stored_is_used_only_once_fetched_here_and_equal(
        tmp_path: Path, wheelhouse: Path, fresh_trust: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_portable.worker.interpreter import target_for
    from jupyter_portable.worker.wheelset import set_key, wheel_set

    store = Store.open(f"file://{tmp_path / 'store'}")
    target = target_for("3.10.13")
    made = wheel_set(store, target, find_links=[str(wheelhouse)], no_index=True)
    key = set_key(list(made.requirements), target.tag)
    # another computer (no record): the genuine set is confirmed by fetching the same wheels here
    monkeypatch.setenv("JUPYTER_PORTABLE_TRUST_FILE", str(tmp_path / "other" / "trust.json"))
    confirmed = wheel_set(store, target, find_links=[str(wheelhouse)], no_index=True)
    assert confirmed.wheels == made.wheels and confirmed.warm is False
    assert wheel_set(store, target, find_links=[], no_index=True).warm is True  # recorded there now
    # a third computer meets a planted set: refused, naming the wheel it cannot confirm
    _swap_uv(store, key)
    monkeypatch.setenv("JUPYTER_PORTABLE_TRUST_FILE", str(tmp_path / "third" / "trust.json"))
    with pytest.raises(IntegrityError, match=r"cannot confirm \(uv-"):
        wheel_set(store, target, find_links=[str(wheelhouse)], no_index=True)


def test_a_swapped_lockfile_index_is_refused_on_both_sides(tmp_path: Path, fresh_trust: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_env_any_python import LOCK, _platform, wheel

    from jupyter_portable.worker.envcache import build_env
    from jupyter_portable.worker.envprep import prepare_index

    links = tmp_path / "links"
    for name, version in (("needy", "2.0"), ("plainpkg", "1.0"), ("soupy", "4.1.3")):
        wheel(links, name, version, requires=("plainpkg>=1.0",) if name == "needy" else ())
    store = Store.open(f"file://{tmp_path / 'store'}")
    lock = LOCK.replace(b"pyobjc-core==10.3\n", b"")
    tag, platform = _platform("3.11.7")
    prepared = prepare_index(store, lock, tag, platform, image={}, sources=["--find-links", str(links), "--no-index"])
    key = prepared.index.key
    doc = json.loads(store.backend.read(key))
    doc["wheels"][0]["hash"] = store.put_object(b"something else")
    store.backend.write(key, json.dumps(doc, indent=1).encode())
    with pytest.raises(IntegrityError, match="not the one this computer stored"):
        prepare_index(store, lock, tag, platform, image={}, sources=["--no-index"])
    # the machine is sent the digest the user's side holds, and refuses the store's other bytes
    with pytest.raises(IntegrityError, match="not the index your side prepared"):
        build_env(store, lock, tmp_path / "venv", expect=prepared.digest)
    assert not (tmp_path / "venv").exists()
