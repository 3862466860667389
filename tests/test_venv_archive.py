"""A bare machine gets the worker's venv as one archive, laid out on the user's side (issue 32
item 5): a warm machine unpacks it instead of installing 45 wheels; a swapped archive is refused
before anything runs; the wheels are still installed one by one where no archive can be made.
The machines are twin machines (a real sshd, a bare pyenv Python 3.10, no package index); uv is real."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakegpu import H100
from twins.machines import PYTHONS, TwinMachine, python_missing, start_machine, unavailable

from jupyter_portable.core.errors import IntegrityError, LaunchFailed, PortableError
from jupyter_portable.store.repo import Store, object_key

pytestmark = pytest.mark.timeout(300)
Exec = Callable[[str, "bytes | None", float], "tuple[int, bytes, bytes]"]


@pytest.fixture
def machines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wheelhouse: Path) -> Iterator[Callable[[str], Exec]]:
    """Start twin machines of Python 3.10 on demand; each call gives an ``exec_remote`` reaching a new one."""
    for reason in (unavailable(), python_missing("3.10")):
        if reason:
            pytest.skip(reason)
    from jupyter_portable.compute.keys import user_key

    monkeypatch.setenv("JUPYTER_PORTABLE_SSH_STATE", str(tmp_path / "ssh-state"))
    monkeypatch.setenv("JUPYTER_PORTABLE_TRUST_FILE", str(tmp_path / "trust.json"))
    started: list[TwinMachine] = []

    def new(name: str) -> Exec:
        m = start_machine(tmp_path / "machines", name, gpus=[H100], driver="550.54.15", cuda="12.4",
                          public_keys=[user_key().public], python=PYTHONS["3.10"])
        started.append(m)
        argv = ["ssh", "-p", str(m.port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                "-o", f"UserKnownHostsFile={tmp_path / f'kh-{name}'}", "-o", "LogLevel=ERROR", "-i",
                str(tmp_path / "ssh-state" / "id_ed25519"), f"root@{m.host}"]

        def exec_remote(command: str, data: bytes | None, limit: float) -> tuple[int, bytes, bytes]:
            proc = subprocess.run([*argv, command], input=data or b"", capture_output=True, timeout=limit)
            return proc.returncode, proc.stdout, proc.stderr

        exec_remote.home = m.home  # type: ignore[attr-defined]
        return exec_remote

    try:
        yield new
    finally:
        for m in started:
            m.remove()


def _workdir(exec_remote: Exec) -> Path:
    return Path(exec_remote.home) / ".jupyter-portable"  # type: ignore[attr-defined]


def _run(exec_remote: Exec, python: str, code: str) -> str:
    rc, out, err = exec_remote(f"{python} -c '{code}'", None, 60)
    assert rc == 0, err.decode(errors="replace")
    return out.decode().strip()


def test_a_warm_machine_unpacks_the_venv_archive_instead_of_installing_each_wheel(
        machines: Callable[[str], Exec], tmp_path: Path) -> None:
    from jupyter_portable.worker.bootstrap import bootstrap
    from jupyter_portable.worker.wheelset import wheel_set

    store = Store.open(f"file://{tmp_path / 'store'}")
    first = bootstrap(machines("m1"), store)  # cold: the set fetched here, its archive laid out here
    assert first.installed_from == "archive" and not first.warm_store
    docs = list((tmp_path / "store" / "wheels" / "worker").rglob("*.venv.json"))
    assert len(docs) == 1
    warm_machine = machines("m2")
    warm = bootstrap(warm_machine, store)
    assert warm.warm_store and warm.installed_from == "archive" and not warm.reused_venv
    # what reached the machine: the archive, this package's wheel and uv; none of the other 44 wheels
    sent = sorted(p.name for p in (_workdir(warm_machine) / "wheels").iterdir() if not p.name.endswith(".sha256"))
    assert warm.sent == 3 and len(sent) == 3
    assert sent[0].startswith("jupyter_portable-") and sent[1].startswith("uv-") and sent[2].startswith("worker-venv-")
    # the venv works: the worker and the kernel import, from the venv's own site-packages
    venv = str(Path(warm.python).parent.parent)
    site = f"{venv}/lib/python3.10/site-packages"
    got = _run(warm_machine, warm.python, "import ipykernel, zmq, blake3, jupyter_portable.worker.agent as a; "
                                          "print(a.__file__, ipykernel.__file__)").split()
    assert all(path.startswith(site + "/") for path in got)
    # every wheel of the set is installed, at its version (uv's binary is linked, not installed)
    listed = _run(warm_machine, warm.python, "import json; from importlib.metadata import distributions as d; "
                                             f"print(json.dumps(sorted([x.metadata[\"Name\"], x.version] "
                                             f"for x in d(path=[\"{site}\"]))))")
    wset = wheel_set(store, warm.target)  # type: ignore[arg-type]
    norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()  # noqa: E731
    assert sorted((norm(n), v) for n, v in json.loads(listed)) == sorted(
        (norm(w.filename.split("-")[0]), w.filename.split("-")[1]) for w in (*wset.wheels, wset.own)
        if w is not wset.uv())
    # a console script runs the venv's own python wherever the venv lies
    rc, out, err = warm_machine(f"{venv}/bin/jupyter --paths --json", None, 60)
    assert rc == 0, err
    assert any(p.startswith(venv) for p in json.loads(out)["data"])


def test_a_swapped_archive_is_refused_before_anything_runs(machines: Callable[[str], Exec], tmp_path: Path) -> None:
    from jupyter_portable.worker.bootstrap import bootstrap

    store = Store.open(f"file://{tmp_path / 'store'}")
    bootstrap(machines("m1"), store)
    doc_path = next((tmp_path / "store" / "wheels" / "worker").rglob("*.venv.json"))
    doc = json.loads(doc_path.read_bytes())
    original = doc_path.read_bytes()

    # a writer of the store points the document at an archive of its own (a valid object)
    evil = b"not the worker's venv"
    doc["archive"].update(hash=store.put_object(evil), sha256=hashlib.sha256(evil).hexdigest(), size=len(evil))
    doc_path.write_bytes(json.dumps(doc).encode())
    second = machines("m2")
    with pytest.raises(IntegrityError, match="not the one this computer stored") as info:
        bootstrap(second, store)
    assert "venv.json" in str(info.value)
    assert not (_workdir(second) / "wheels").exists() and not (_workdir(second) / "venvs").exists()

    # or changes the archive's bytes where they lie
    doc_path.write_bytes(original)
    obj = tmp_path / "store" / object_key(json.loads(original)["archive"]["hash"])
    obj.chmod(0o644)
    obj.write_bytes(b"\x1f\x8b" + obj.read_bytes()[2:-1])
    with pytest.raises(IntegrityError, match="corrupt"):
        bootstrap(second, store)
    assert not (_workdir(second) / "wheels").exists() and not (_workdir(second) / "venvs").exists()


def test_what_an_earlier_bootstrap_left_on_the_machine_is_hashed_again_before_use(
        machines: Callable[[str], Exec], tmp_path: Path) -> None:
    from jupyter_portable.worker.bootstrap import bootstrap

    store = Store.open(f"file://{tmp_path / 'store'}")
    machine = machines("m1")
    first = bootstrap(machine, store)
    wheels = _workdir(machine) / "wheels"
    archive = next(wheels.glob("worker-venv-*.tar.gz"))
    shutil.rmtree(_workdir(machine) / "venvs")  # the venv gone, the wheels kept: the next one unpacks again
    # kept files are not sent again, so the machine checks them itself (what just arrived was checked
    # as it arrived, and the archive is unpacked from those bytes)
    again = bootstrap(machine, store)
    assert again.sent == 0 and again.installed_from == "archive" and again.python == first.python
    assert _run(machine, again.python, "import jupyter_portable.worker.agent; print(1)") == "1"

    shutil.rmtree(_workdir(machine) / "venvs")
    archive.write_bytes(archive.read_bytes()[:-1] + b"\0")  # changed where it lies, its .sha256 beside it kept
    with pytest.raises(LaunchFailed, match=rf"{re.escape(archive.name)} on the machine does not match"):
        bootstrap(machine, store)
    assert not (_workdir(machine) / "venvs").exists()


def test_the_machine_refuses_an_archive_that_is_not_the_one_named_over_ssh(
        machines: Callable[[str], Exec], tmp_path: Path) -> None:
    """Whatever changes the bytes on the way (the SSH stream, a file left on the machine), the machine
    checks the archive against the SHA-256 the user's side sent, and unpacks nothing else."""
    from jupyter_portable.worker.bootstrap import bootstrap

    store = Store.open(f"file://{tmp_path / 'store'}")
    bootstrap(machines("m1"), store)
    target = machines("m2")

    def tampering(command: str, data: bytes | None, limit: float) -> tuple[int, bytes, bytes]:
        if data:
            src = tarfile.open(fileobj=io.BytesIO(data))
            out = io.BytesIO()
            with tarfile.open(fileobj=out, mode="w") as dst:
                for m in src.getmembers():
                    body = src.extractfile(m).read()  # type: ignore[union-attr]
                    if m.name.startswith("worker-venv-"):
                        body = body[:-1] + bytes([body[-1] ^ 1])
                    dst.addfile(m, io.BytesIO(body))
            data = out.getvalue()
        return target(command, data, limit)

    with pytest.raises(LaunchFailed, match=r"worker-venv-[0-9a-f]+\.tar\.gz arrived corrupted"):
        bootstrap(tampering, store)
    assert not (_workdir(target) / "venvs").exists()


def test_where_no_archive_can_be_made_each_wheel_is_installed(machines: Callable[[str], Exec], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_portable.worker import venvpack
    from jupyter_portable.worker.bootstrap import bootstrap

    def cannot(*_args: object, **_kwargs: object) -> bytes:
        raise PortableError("uv could not lay out the worker's venv: no such platform")

    monkeypatch.setattr(venvpack, "build", cannot)
    lines: list[str] = []
    m = machines("m1")
    result = bootstrap(m, Store.open(f"file://{tmp_path / 'store'}"), progress=lines.append)
    assert result.installed_from == "wheels" and result.sent > 40
    assert any("installing the wheels one by one" in line for line in lines)
    assert _run(m, result.python, "import jupyter_portable.worker.agent; print(1)") == "1"


# -- unpacking: nothing outside the venv, nothing over what is there ---------------------------

def _tar(members: list[tuple[tarfile.TarInfo, bytes]], *, table: bool = False) -> bytes:
    """A gzip'd tar of ``members``; with ``table``, led by the member table ``build`` writes."""
    import gzip

    from jupyter_portable.worker.venvpack import _with_table

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for info, body in members:
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body) if info.isfile() else None)
    return gzip.compress(_with_table(out.getvalue()) if table else out.getvalue())


def _tabled(rows: list[object], doc: dict[str, object] | None = None) -> bytes:
    """A tar whose member table says ``rows``, whatever the headers after it say: what a planted or
    damaged archive could hold."""
    import json

    from jupyter_portable.worker.venvpack import TABLE, TABLE_FORMAT

    table = json.dumps({"format": TABLE_FORMAT, "schema": 1, "members": rows, **(doc or {})}).encode()
    payload = b"x" * 600
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo(TABLE)
        info.size = len(table)
        tar.addfile(info, io.BytesIO(table))
        info = tarfile.TarInfo("payload")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    return out.getvalue()


def _file(name: str, body: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), body


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, b""


@pytest.mark.parametrize("member", [
    _file("../outside"), _file("/tmp/absolute"), _file("lib/../../outside"), _file("lib//x"),
    _link("lib/link", "/etc"), _link("lib/hard", "/etc/passwd", tarfile.LNKTYPE),
], ids=["dotdot", "absolute", "dotdot-inside", "empty-part", "symlink", "hardlink"])
def test_unpacking_refuses_names_out_of_the_venv_and_links(member: tuple[tarfile.TarInfo, bytes],
                                                           tmp_path: Path) -> None:
    from jupyter_portable.worker.venvpack import tar_entries, unpack

    venv = tmp_path / "venv"
    venv.mkdir()
    with pytest.raises(ValueError, match="refusing"):
        unpack(tar_entries(_tar([_file("lib/ok.py"), member])), str(venv))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["venv"]


@pytest.mark.parametrize("name", ["../outside", "/tmp/absolute", "lib/../../outside", "lib//x", ""])
def test_a_member_table_is_held_to_the_same_names(name: str, tmp_path: Path) -> None:
    from jupyter_portable.worker.venvpack import tar_entries, unpack

    venv = tmp_path / "venv"
    venv.mkdir()
    with pytest.raises(ValueError, match="refusing"):
        unpack(tar_entries(_tabled([["lib/ok.py", 0o644, 0, 10], [name, 0o644, 0, 10]])), str(venv))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["venv"]


@pytest.mark.parametrize(("rows", "doc", "says"), [
    ([["lib/x.py", 0o644, 600, 20_000]], {}, "past the archive's end"),
    ([["lib/x.py", 0o644, 2**40, 1]], {}, "past the archive's end"),
    ([["lib/x.py", 0o644, -1, 10]], {}, "malformed row"),
    ([["lib/x.py", 0o644, 0]], {}, "malformed row"),
    ([["lib/x.py", "0644", 0, 10]], {}, "malformed row"),
    ([["lib/x.py", 0o644, 0, True]], {}, "malformed row"),
    ([["lib/x.py", 0o1000000]], {}, "malformed row"),
    ([[7, 0o644, 0, 10]], {}, "malformed row"),
    ([], {"schema": 2}, "not one this version reads"),
], ids=["past-end", "far-past-end", "negative", "short", "mode-text", "bool", "mode-big", "name-int", "schema"])
def test_a_member_table_that_does_not_hold_is_refused(rows: list[object], doc: dict[str, object], says: str,
                                                      tmp_path: Path) -> None:
    from jupyter_portable.worker.venvpack import tar_entries, unpack

    venv = tmp_path / "venv"
    venv.mkdir()
    with pytest.raises(ValueError, match=says):
        unpack(tar_entries(_tabled(rows, doc)), str(venv))
    assert not any(venv.iterdir())


def test_the_member_table_places_each_member_where_its_header_does() -> None:
    import gzip

    from jupyter_portable.worker.venvpack import TABLE, tar_entries

    members = [_file(f"lib/p{i % 5}/m{i}.py", bytes([i]) * (i * 131 % 1500)) for i in range(60)]
    long_name = "lib/" + "d" * 120 + "/" + "é" * 30 + ".py"  # past ustar's 100 bytes: a pax header
    members += [_file(long_name, b"long"), (tarfile.TarInfo("lib/empty"), b"")]
    members[-1][0].type = tarfile.DIRTYPE
    tabled, plain = _tar(members, table=True), _tar(members)
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(tabled))) as tar:
        assert tar.getnames()[0] == TABLE  # still a tar any tool reads, the table first
        assert tar.getnames()[1:] == [info.name for info, _ in members]

    def read(blob: bytes) -> list[tuple[str, bytes | None, int]]:
        return [(n, None if d is None else bytes(d), m) for n, d, m in tar_entries(blob)]

    assert read(tabled) == read(plain) == [
        (info.name, None if info.isdir() else body, info.mode) for info, body in members]


def test_unpacking_writes_through_no_link_and_over_no_file(tmp_path: Path) -> None:
    from jupyter_portable.worker.venvpack import tar_entries, unpack

    venv, outside = tmp_path / "venv", tmp_path / "outside"
    venv.mkdir()
    outside.mkdir()
    os.symlink(outside, venv / "lib")  # a link already in the venv: its name is not a way out
    with pytest.raises(ValueError, match="leads out of the venv"):
        unpack(tar_entries(_tar([_file("lib/x.py")])), str(venv))
    (venv / "bin").mkdir()
    (venv / "bin" / "python").write_text("kept")
    with pytest.raises(FileExistsError):
        unpack(tar_entries(_tar([_file("bin/python", b"replaced")])), str(venv))
    assert (venv / "bin" / "python").read_text() == "kept" and not any(outside.iterdir())


def test_unpacking_in_threads_writes_every_file_whole_and_raises_the_first_failure(tmp_path: Path) -> None:
    from jupyter_portable.worker.venvpack import tar_entries, unpack

    members = [_file(f"lib/p{i % 17}/m{i}.py", bytes([i % 251]) * (i * 37 % 5000)) for i in range(700)]
    members.append(_file("lib/big.so", os.urandom(9 << 20)))  # over a batch's bytes by itself
    script = tarfile.TarInfo("bin/tool")
    script.mode = 0o755
    members.append((script, b"#!/bin/sh\n"))
    venv = tmp_path / "venv"
    venv.mkdir()
    assert unpack(tar_entries(_tar(members, table=True)), str(venv), threads=3) == len(members)
    for info, body in members:
        assert (venv / info.name).read_bytes() == body, info.name
    assert os.access(venv / "bin" / "tool", os.X_OK) and not os.access(venv / "lib" / "big.so", os.X_OK)

    # a file already there, deep in the archive: its write fails in a thread, and that error is raised
    again = tmp_path / "again"
    (again / "lib" / "p3").mkdir(parents=True)
    (again / "lib" / "p3" / "m360.py").write_text("kept")
    with pytest.raises(FileExistsError):
        unpack(tar_entries(_tar(members)), str(again), threads=3)
    assert (again / "lib" / "p3" / "m360.py").read_text() == "kept"


# -- the notebook's environment: one archive per lockfile index ----------------------------------

LOCK = b"needy==2.0\nplainpkg==1.0\n"


@pytest.fixture
def prepared_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Store, object, str]:
    """The lockfile's index for a Python 3.10 machine, prepared on the user's side, and that Python."""
    from test_envcache import make_wheel

    from jupyter_portable.worker.envprep import prepare_index
    from jupyter_portable.worker.interpreter import target_for
    from jupyter_portable.worker.wheelindex import env_tag

    if python_missing("3.10"):
        pytest.skip(python_missing("3.10"))
    monkeypatch.setenv("JUPYTER_PORTABLE_TRUST_FILE", str(tmp_path / "trust.json"))
    links = tmp_path / "links"
    make_wheel(links, "plainpkg", "1.0")
    make_wheel(links, "needy", "2.0", requires=("plainpkg>=1.0",))
    python = PYTHONS["3.10"]
    tag = env_tag(python)
    target = target_for(tag.split("-")[1])
    store = Store.open(f"file://{tmp_path / 'store'}")
    prepared = prepare_index(store, LOCK, tag, target.wheel_platform(), image={},
                             sources=["--find-links", str(links), "--no-index"])
    return store, prepared, python


def test_a_new_machine_unpacks_the_environments_archive_instead_of_installing_each_wheel(
        prepared_env: tuple[Store, object, str], tmp_path: Path) -> None:
    from jupyter_portable.worker.envcache import build_env

    store, prepared, python = prepared_env
    index = prepared.index  # type: ignore[attr-defined]
    assert index.archive is not None and store.has_object(index.archive.hash)
    built = build_env(store, LOCK, tmp_path / "m" / "venv", python=python, expect=prepared.digest)  # type: ignore[attr-defined]
    assert built.kind == "warm" and built.installed_from == "archive"
    assert [k for k, _ in built.to_json()["phases"].items()] == ["fetch_s", "venv_s", "unpack_s"]
    # no wheel was fetched to the machine, and uv unzipped none into its cache
    assert not any((tmp_path / "m" / "wheel-files").iterdir())
    assert not list((tmp_path / "m" / "uv-cache").glob("archive-v*/*"))
    proc = subprocess.run([str(built.python), "-c", "import needy, plainpkg, sys; from importlib.metadata import "
                           "version; print(needy.VERSION, version('plainpkg'), needy.__file__.startswith(sys.prefix))"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2.0", "1.0", "True"]


@pytest.mark.parametrize("where", ["last-byte", "first-header"])
def test_a_changed_environment_archive_is_refused_and_no_venv_is_left(
        prepared_env: tuple[Store, object, str], tmp_path: Path, where: str) -> None:
    """The archive's headers are read beside its hash: a change that leaves it a readable tar, or
    one that does not (its first header garbled), is refused as corrupt all the same, nothing of it
    written and the venv made beside it removed."""
    from jupyter_portable.worker.envcache import build_env

    store, prepared, python = prepared_env
    archive = prepared.index.archive  # type: ignore[attr-defined]
    path = tmp_path / "store" / object_key(archive.hash)
    path.chmod(0o644)
    body = path.read_bytes()
    changed = body[:-1] + bytes([body[-1] ^ 1]) if where == "last-byte" else b"\xff" * 512 + body[512:]
    path.write_bytes(changed)
    with pytest.raises(IntegrityError, match="corrupt"):
        build_env(store, LOCK, tmp_path / "m" / "venv", python=python, expect=prepared.digest)  # type: ignore[attr-defined]
    assert not (tmp_path / "m" / "venv").exists()


def test_an_index_from_elsewhere_naming_another_archive_is_refused(
        prepared_env: tuple[Store, object, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store writer plants an index naming the genuine wheels and an archive of its own: the user's
    side (which never recorded it) lays the archive out itself, and refuses the other."""
    from jupyter_portable.worker.envprep import prepare_index
    from jupyter_portable.worker.interpreter import target_for

    store, prepared, python = prepared_env
    index = prepared.index  # type: ignore[attr-defined]
    doc = json.loads(store.backend.read(index.key))
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "sitecustomize.py").write_text("print('not yours')\n")
    blob = io.BytesIO()
    with tarfile.open(fileobj=blob, mode="w") as tar:
        tar.add(evil / "sitecustomize.py", "lib/python3.10/site-packages/sitecustomize.py")
    doc["archive"].update(hash=store.put_object(blob.getvalue()), size=len(blob.getvalue()))
    store.backend.write(index.key, json.dumps(doc, indent=1).encode())
    monkeypatch.setenv("JUPYTER_PORTABLE_TRUST_FILE", str(tmp_path / "another-computer.json"))
    with pytest.raises(IntegrityError, match="another archive"):
        prepare_index(store, LOCK, index.env, target_for(index.env.split("-")[1]).wheel_platform(), image={},
                      sources=["--find-links", str(tmp_path / "links"), "--no-index"])


def test_a_lockfile_of_other_bytes_naming_the_same_wheels_reuses_the_archive_laid_out_here(
        prepared_env: tuple[Store, object, str], tmp_path: Path) -> None:
    """A lockfile recorded on a machine names the versions built there, in other bytes than the one they
    were built from: the same wheels, so the archive laid out for them is used again, not laid out twice.
    Once the store lost it, it is laid out again."""
    from jupyter_portable.worker.envcache import build_env
    from jupyter_portable.worker.envprep import prepare_index
    from jupyter_portable.worker.interpreter import target_for

    store, prepared, python = prepared_env
    first = prepared.index  # type: ignore[attr-defined]
    recorded = b"# generated by jupyter-portable (on the machine)\nplainpkg==1.0\nneedy==2.0\n"
    platform = target_for(first.env.split("-")[1]).wheel_platform()
    sources = ["--find-links", str(tmp_path / "links"), "--no-index"]
    said: list[str] = []
    again = prepare_index(store, recorded, first.env, platform, image={}, sources=sources, progress=said.append)
    assert again.index.key != first.key and again.index.archive == first.archive, (again.index, first)
    assert any("laid out here before" in line and "used again" in line for line in said), said
    assert not any(line.startswith("laid out the environment") for line in said), said
    built = build_env(store, recorded, tmp_path / "m" / "venv", python=python, expect=again.digest)
    assert built.kind == "warm" and built.installed_from == "archive"

    (tmp_path / "store" / object_key(first.archive.hash)).unlink()
    said.clear()
    third = prepare_index(store, b"needy==2.0\nplainpkg==1.0\n# once more\n", first.env, platform, image={},
                          sources=sources, progress=said.append)
    assert any(line.startswith("laid out the environment") for line in said), said
    assert third.index.archive == first.archive and store.has_object(first.archive.hash)


def test_the_modules_a_kernel_imports_are_learnt_from_a_kernel_started_here() -> None:
    from jupyter_portable.worker.venvpack import kernel_modules

    names = kernel_modules()
    assert {"ipykernel/kernelapp.py", "ipykernel/ipkernel.py", "IPython/core/interactiveshell.py",
            "traitlets/traitlets.py", "jupyter_client/session.py"} <= set(names)
    assert all(n.endswith(".py") and not n.startswith("/") and ".." not in n.split("/") for n in names)
    assert kernel_modules() is names  # learnt once per process


def test_a_kernels_modules_travel_compiled_for_a_machine_of_this_python(wheelhouse: Path, tmp_path: Path) -> None:
    """For a machine of this major.minor the listed modules the wheels hold are compiled here, as
    pycs the machine's Python uses without reading their source; names outside the layout, or not
    in it, are skipped; for another minor nothing is compiled; the bytes do not depend on where
    the layout was made."""
    import sys

    from jupyter_portable.worker.venvpack import build, tar_entries, unpack

    wheel = next(wheelhouse.glob("traitlets-*.whl"))
    here = "{}.{}.{}".format(*sys.version_info[:3])
    site = "lib/python{}.{}/site-packages".format(*sys.version_info[:2])
    listed = ["traitlets/__init__.py", "traitlets/traitlets.py", "../escape.py", "/etc/hostname", "absent/x.py"]
    blob = build([wheel], here, "x86_64-manylinux_2_28", tmp_path / "one", compress=False, precompile=listed)
    tag = sys.implementation.cache_tag
    pycs = sorted(name for name, _data, _mode in tar_entries(blob) if name.endswith(".pyc"))
    assert pycs == [f"{site}/traitlets/__pycache__/{stem}.{tag}.pyc" for stem in ("__init__", "traitlets")]
    data = {name: bytes(d) for name, d, _mode in tar_entries(blob) if d is not None}
    header = data[pycs[0]][:16]
    assert int.from_bytes(header[4:8], "little") == 0b01  # PEP 552: hash-based, its source never checked
    again = build([wheel], here, "x86_64-manylinux_2_28", tmp_path / "elsewhere" / "two", compress=False,
                  precompile=listed)
    assert again == blob
    other = build([wheel], "3.10.13" if sys.version_info[:2] != (3, 10) else "3.12.1", "x86_64-manylinux_2_28",
                  tmp_path / "three", compress=False, precompile=listed)
    assert not any(name.endswith(".pyc") or "__pycache__" in name for name, _d, _m in tar_entries(other))

    venv = tmp_path / "venv"
    venv.mkdir()  # the machine's empty venv
    unpack(tar_entries(blob), str(venv))
    source = venv / site / "traitlets" / "__init__.py"
    source.write_text(source.read_text() + "\nraise SystemExit('the source was compiled on the machine')\n")
    proc = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(venv / site)!r}); "
                           "import traitlets; print(traitlets.__file__)"],
                          capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                               if not k.startswith("PYTHON")})
    assert proc.returncode == 0, proc.stderr  # the compiled module ran, not the changed source
    assert proc.stdout.strip() == str(source)  # the real path, not the name it was compiled under
