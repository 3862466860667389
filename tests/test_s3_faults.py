"""S3 faults are reported truthfully: a write whose answer was lost is recognised as
landed, a conflict is only ever another writer, and a store of unknown format is refused.

Every command here runs against the moto server through ``s3_faults.FaultProxy``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import make_bucket, read_tree, write_tree
from s3_faults import FaultProxy
from safetensors.numpy import save_file

from jupyter_portable.core.errors import ConflictError
from jupyter_portable.engine.restore import restore
from jupyter_portable.engine.snapshot import Extras, snapshot
from jupyter_portable.engine.verify import fsck
from jupyter_portable.interfaces.cli.commands import main
from jupyter_portable.store import open_backend
from jupyter_portable.store.backend import Backend
from jupyter_portable.store.repo import Store
from jupyter_portable.workdir.workcopy import WorkspaceCopy

# Only another writer can make these true, and the fault suite has one writer.
FALSE_CLAIMS = ("another writer", "changed under us", "moved to version", "claimed by a newer", "is at version")


@pytest.fixture
def proxy(moto_endpoint: str, aws_env: dict[str, str]) -> Iterator[FaultProxy]:
    p = FaultProxy(moto_endpoint, seed=7).start()
    yield p
    p.stop()


def _clean(url: str, endpoint: str) -> Store:
    """The store as it really is, read straight from moto (no faults)."""
    import s3fs

    st = Store.open(url)
    st.backend.fs = s3fs.S3FileSystem(endpoint_url=endpoint, use_listings_cache=False,  # type: ignore[attr-defined]
                                      skip_instance_cache=True)
    return st


def _cli(endpoint: str, *args: str, extra: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``jupyter portable ...`` (its ``main``, in this process) with S3 at ``endpoint``:
    exit status, stdout, stderr."""
    env = {"AWS_ENDPOINT_URL": endpoint, **(extra or {})}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return _inproc(list(args))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _copy(tmp_path: Path, moto: str, name: str = "w") -> tuple[str, Path]:
    url = f"s3://{make_bucket()}/team"
    root = tmp_path / name
    write_tree(root, {"a.txt": "hello\n", "data/b.bin": os.urandom(2000)})
    code, _, err = _cli(moto, "init", str(root), "--store", url, "-q")
    assert code == 0, err
    return url, root


def _ws(root: Path) -> str:
    return WorkspaceCopy(root).read_config().workspace_id


# -- one exact fault at a time -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["error_after", "reset_after"])
def test_a_head_swap_that_landed_before_a_500_or_reset_is_reported_as_published(
        proxy: FaultProxy, moto_endpoint: str, tmp_path: Path, kind: str) -> None:
    url, root = _copy(tmp_path, moto_endpoint)
    proxy.once(kind, method="PUT", path="/HEAD", header="If-Match")
    code, out, err = _cli(proxy.url, "snapshot", "--json", "-q", "-C", str(root))
    assert code == 0, err
    assert json.loads(out)["version"] == 1 and proxy.counts.faults[kind] == 1
    head, _ = _clean(url, moto_endpoint).read_head(_ws(root))
    assert head.version == 1 and WorkspaceCopy(root).read_config().version == 1


@pytest.mark.parametrize("kind", ["error_after", "reset_after"])
def test_a_retried_create_only_manifest_put_that_gets_412_is_a_success(
        proxy: FaultProxy, moto_endpoint: str, tmp_path: Path, kind: str) -> None:
    url, root = _copy(tmp_path, moto_endpoint)
    proxy.once(kind, method="PUT", path="/manifests/", header="If-None-Match")
    code, out, err = _cli(proxy.url, "snapshot", "--json", "-q", "-C", str(root))
    assert code == 0, err
    assert json.loads(out)["version"] == 1 and proxy.counts.faults[kind] == 1
    assert fsck(_clean(url, moto_endpoint), read_data=True).ok


def test_init_whose_head_write_landed_but_every_answer_was_500_succeeds(
        proxy: FaultProxy, moto_endpoint: str, tmp_path: Path) -> None:
    url = f"s3://{make_bucket()}/team"
    proxy.always("error_after", method="PUT", path="/HEAD")
    code, out, err = _cli(proxy.url, "init", str(tmp_path / "w"), "--store", url, "--json", "-q",
                          extra={"AWS_MAX_ATTEMPTS": "2"})
    assert code == 0, err
    assert _clean(url, moto_endpoint).workspaces() == [json.loads(out)["workspace_id"]]


def test_init_that_cannot_tell_whether_it_created_the_workspace_leaves_no_orphan(
        proxy: FaultProxy, moto_endpoint: str, tmp_path: Path) -> None:
    url = f"s3://{make_bucket()}/team"
    proxy.always("error_after", method="PUT", path="/HEAD")
    proxy.always("slowdown", method="GET", path="/HEAD")  # the read-back cannot tell either
    code, _, err = _cli(proxy.url, "init", str(tmp_path / "w"), "--store", url, "-q",
                        extra={"AWS_MAX_ATTEMPTS": "1"})
    assert code == 1
    assert err.count("\n") == 1 and "cannot tell whether" in err, err
    assert _clean(url, moto_endpoint).workspaces() == []
    assert not (tmp_path / "w" / ".portable" / "config.json").exists()


def test_a_create_only_write_retried_with_the_same_bytes_succeeds(aws_env: dict[str, str], tmp_path: Path) -> None:
    backends: list[Backend] = [open_backend(f"file://{tmp_path}/store"), open_backend(f"s3://{make_bucket()}/p")]
    for backend in backends:
        backend.write_new("workspaces/w/manifests/m.json", b"same")
        backend.write_new("workspaces/w/manifests/m.json", b"same")  # the retry of a write that landed
        with pytest.raises(ConflictError):
            backend.write_new("workspaces/w/manifests/m.json", b"other")
        backend.swap("workspaces/w/HEAD", b"v0", None)
        backend.swap("workspaces/w/HEAD", b"v0", None)
        with pytest.raises(ConflictError):
            backend.swap("workspaces/w/HEAD", b"v1", None)


# -- conflicts: only another writer, and the advice works -----------------------------------


def _advice(stderr: str) -> list[str]:
    found = re.search(r"`jupyter portable ([^`]+)`", stderr)
    assert found, f"the conflict advice names no command: {stderr}"
    return found.group(1).split()


def _two_copies(tmp_path: Path, moto: str) -> tuple[str, Path, Path]:
    """A copy at version 1 and a second copy of it, each with its own edit to a.txt."""
    url, root = _copy(tmp_path, moto)
    assert _cli(moto, "snapshot", "-q", "-C", str(root))[0] == 0
    other = tmp_path / "other"
    assert _cli(moto, "restore", str(other), "--store", url, "--workspace", _ws(root), "-q")[0] == 0
    (other / "a.txt").write_text("theirs\n")
    (root / "a.txt").write_text("ours\n")
    return url, root, other


def test_a_real_conflict_at_the_head_swap_is_reported_and_its_advice_works(
        proxy: FaultProxy, moto_endpoint: str, tmp_path: Path) -> None:
    url, root, other = _two_copies(tmp_path, moto_endpoint)

    def other_writer_first() -> None:  # runs in the proxy, before our head swap reaches S3
        assert snapshot(WorkspaceCopy(other), _clean(url, moto_endpoint)).version == 2

    proxy.once("latency", method="PUT", path="/HEAD", header="If-Match").hook = other_writer_first
    code, _, err = _cli(proxy.url, "snapshot", "-q", "-C", str(root))
    assert code == 1 and "another writer published version 2" in err, err
    code, out, err = _cli(moto_endpoint, *_advice(err), "--json", "-C", str(root))
    assert code == 0, err
    assert json.loads(out)["version"] == 3
    assert [m.version for m in _clean(url, moto_endpoint).history(_ws(root))] == [3, 2, 1]


def test_the_advice_after_the_head_moved_during_a_snapshot_is_the_command_that_works(
        moto_endpoint: str, aws_env: dict[str, str], tmp_path: Path) -> None:
    url, root, other = _two_copies(tmp_path, moto_endpoint)

    def meanwhile(entries: dict[str, Any], base: Any) -> tuple[list[dict[str, Any]], set[str]]:
        assert snapshot(WorkspaceCopy(other), Store.open(url)).version == 2
        return [], set()

    with pytest.raises(ConflictError) as info:
        snapshot(WorkspaceCopy(root), Store.open(url), extras=Extras(before_publish=meanwhile))
    assert "during the snapshot" in str(info.value)
    code, out, err = _cli(moto_endpoint, *_advice(info.value.one_line()), "--json", "-C", str(root))
    assert code == 0, err
    assert json.loads(out)["version"] == 3


# -- config.json is checked before every read -----------------------------------------------


@pytest.mark.parametrize(("config", "says", "fix"), [
    (None, "has no config.json", "check the store URL"),
    (b'{"format": "restic", "version": 2}', "not a jupyter-portable store", "check the store URL"),
    (b'{"format": "jupyter-portable.store", "schema": 2}', "store schema 2", "upgrade jupyter-portable"),
])
def test_restore_refuses_a_store_whose_config_json_is_missing_foreign_or_newer(
        tmp_path: Path, config: bytes | None, says: str, fix: str) -> None:
    url = f"file://{tmp_path}/store"
    root = tmp_path / "w"
    write_tree(root, {"a.txt": "hello\n"})
    assert _cli("", "init", str(root), "--store", url, "-q")[0] == 0
    assert _cli("", "snapshot", "-q", "-C", str(root))[0] == 0
    cfg = tmp_path / "store" / "config.json"
    if config is None:
        cfg.unlink()
    else:
        cfg.write_bytes(config)
    dest = tmp_path / "restored"
    code, _, err = _cli("", "restore", str(dest), "--store", url, "--workspace", _ws(root))
    assert code == 1, err
    line, = err.splitlines()
    assert line.startswith("error: ") and says in line and f"to fix: {fix}" in line and "config.json" in line
    assert not dest.exists()
    for verb in ("log", "verify", "snapshot", "status"):
        code, _, err = _cli("", verb, "-q", "-C", str(root))
        assert code == 1 and says in err, (verb, err)
    code, out, _ = _cli("", "fsck", "--store", url, "--read-data")
    assert code == 1 and says in out, out


# -- the fault suite -------------------------------------------------------------------------


@dataclass
class Tally:
    commands: int = 0
    failures: int = 0
    untrue: int = 0
    lost: int = 0
    messages: list[str] = field(default_factory=list)


def _inproc(argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` in this process (a subprocess per command would double the suite's time)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except Exception as exc:  # noqa: BLE001 - a traceback is an untrue report too
            return 99, "", f"uncaught {type(exc).__name__}: {exc}"
    return code, out.getvalue(), err.getvalue()


class _Suite:
    def __init__(self, url: str, moto: str, tally: Tally) -> None:
        self.url, self.tally, self.clean = url, tally, _clean(url, moto)
        self.published: dict[int, dict[str, Any]] = {}

    def _head(self, ws: str | None) -> tuple[int, str | None] | None:
        if ws is None:
            return None
        head, _ = self.clean.read_head(ws)
        return head.version, head.manifest

    def run(self, argv: list[str], *, ws: str | None = None, tries: int = 12) -> dict[str, Any]:
        """Run until it succeeds; check every failure's message and the store after it."""
        for _ in range(tries):
            before = self._head(ws)
            code, out, err = _inproc([*argv, "--json", "-q"])
            self.tally.commands += 1
            if code == 0:
                return json.loads(out)
            self.tally.failures += 1
            lines = [ln for ln in err.splitlines() if ln.strip()]
            after = self._head(ws)
            true = (code == 1 and len(lines) == 1 and lines[0].startswith("error: ")
                    and not any(claim in lines[0] for claim in FALSE_CLAIMS))
            if before != after and "cannot tell whether" not in err:
                true = False  # it published, and said it did not
            self.tally.messages.append(f"{argv[0]}: {lines[-1] if lines else err.strip()}")
            if not true:
                self.tally.untrue += 1
                self.tally.messages[-1] = "UNTRUE " + self.tally.messages[-1]
            checked = fsck(self.clean, read_data=True)
            assert checked.ok, checked.errors
        raise AssertionError(f"{argv[0]} never succeeded in {tries} tries; the last answers: "
                             f"{self.tally.messages[-3:]}")

    def snapshot(self, root: Path, ws: str, argv: list[str]) -> int:
        got = self.run(argv, ws=ws)
        self.published[got["version"]] = read_tree(root)
        return int(got["version"])

    def count_lost(self, ws: str, dest: Path) -> None:
        """Every version reported published holds exactly the files it was published with."""
        for version, tree in sorted(self.published.items()):
            where = dest / f"v{version}"
            try:
                restore(self.clean, ws, where, version=version, start_fetcher=False)
                if read_tree(where) != tree:
                    self.tally.lost += 1
            except Exception:  # noqa: BLE001 - anything unreadable is lost
                self.tally.lost += 1


TALLIES: dict[str, Tally] = {}


class _ShortJitter:
    """``random`` for botocore's retry handler: its backoff before retry ``n`` is ``random() * 2 ** (n - 1)``
    seconds; here a twentieth of that (at most 50 ms before the first retry instead of 1 s)."""

    def __init__(self, seed: int) -> None:
        import random

        self._rng = random.Random(seed)

    def random(self) -> float:
        return self._rng.random() / 20


@pytest.fixture
def short_retry_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore's retries (and aiobotocore's, for s3fs) wait a twentieth of their usual backoff: the
    same retries, in the same order, against the same seeded faults; at 50% faults about 140 of them
    waited 0.5 s each on average, most of the suite's minute. The wait itself is nothing under test."""
    from botocore import retryhandler

    monkeypatch.setattr(retryhandler, "random", _ShortJitter(seed=7))


@pytest.mark.parametrize("rate", [0.2, 0.5])
@pytest.mark.usefixtures("short_retry_backoff")
def test_commands_under_s3_faults_succeed_or_fail_truthfully_and_lose_nothing(
        moto_endpoint: str, aws_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], rate: float) -> None:
    url = f"s3://{make_bucket()}/team"
    proxy = FaultProxy(moto_endpoint, rate=rate, seed=int(rate * 100)).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    # Fewer retries than botocore's default, so that faults also reach the commands' own
    # handling and some commands fail: those failures are what this suite checks.
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    tally = TALLIES.setdefault(f"{rate:.0%}", Tally())
    suite = _Suite(url, moto_endpoint, tally)
    root = tmp_path / "w"
    write_tree(root, {"notes.md": "# run\n", "src/train.py": "print('hi')\n",
                      "data/big.bin": os.urandom(700_000), "data/small.bin": os.urandom(3000)})
    try:
        ws = suite.run(["init", str(root), "--store", url])["workspace_id"]
        suite.snapshot(root, ws, ["snapshot", "-C", str(root), "-m", "first"])
        write_tree(root, {"notes.md": "# run\nsecond\n", "data/more.bin": os.urandom(5000)})
        suite.snapshot(root, ws, ["snapshot", "-C", str(root), "-m", "second"])
        save_file({"w": np.arange(64, dtype=np.float32)}, str(root / "step1.safetensors"))
        got = suite.run(["checkpoint", str(root / "step1.safetensors"), "--step", "1", "--settle", "0",
                         "-C", str(root)], ws=ws)
        assert got["status"] == "verified"
        suite.published[got["version"]] = read_tree(root)
        assert suite.run(["verify", "-C", str(root)], ws=ws)["ok"]
        restored = suite.run(["restore", str(tmp_path / "r"), "--store", url, "--workspace", ws], ws=ws)
        assert restored["version"] == max(suite.published)
        assert read_tree(tmp_path / "r") == suite.published[max(suite.published)]
        assert suite.run(["fsck", "--store", url, "--read-data"], ws=ws)["ok"]
    finally:
        proxy.stop()
    suite.count_lost(ws, tmp_path / "check")
    tally.untrue += len(set(suite.clean.workspaces()) - {ws})  # an orphan from a failed init
    with capsys.disabled():
        print(f"\nS3 fault suite at {rate:.0%} (seed {int(rate * 100)}): {tally.commands} commands run, "
              f"{proxy.counts.injected} faults injected in {proxy.counts.requests} requests "
              f"({dict(sorted(proxy.counts.faults.items()))}), {tally.failures} failures reported, "
              f"{tally.untrue} untrue, {tally.lost} data lost")
        for message in tally.messages:
            print(f"  reported: {message[:300]}")
    assert proxy.counts.injected > 0
    assert tally.untrue == 0
    assert tally.lost == 0
