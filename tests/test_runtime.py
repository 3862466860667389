"""The runtime record: lockfiles that rebuild, GPUs as nvidia-smi reports them, records that validate, diffs."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import platform
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from fakegpu import FIXTURES, H100, calls, install_fake_nvidia_smi, render_q, render_query, render_table

from jupyter_portable.core.errors import ManifestError, UsageError
from jupyter_portable.engine.runtime import (
    RUNTIME_SCHEMA,
    Gpu,
    conda_explicit,
    diff_runtime,
    format_diff,
    lock_environment,
    parse_cuda_version,
    parse_lockfile,
    parse_query_csv,
    probe_runtime,
    query_gpus,
    rebuild_commands,
    validate_runtime,
)
from jupyter_portable.engine.runtime.lockfile import format_lockfile
from jupyter_portable.engine.runtime.probe import cuda_runtime_from, detect_image

FAILED = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
A100 = {"name": "NVIDIA A100-SXM4-80GB", "memory_mb": 81920}


@pytest.fixture
def fake_h100(tmp_path: Path) -> Path:
    return install_fake_nvidia_smi(tmp_path / "gpu-bin", [H100, H100], driver="550.54.15", cuda="12.4")


def _on_path(monkeypatch: pytest.MonkeyPatch, bin_dir: Path) -> None:
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


# -- nvidia-smi -------------------------------------------------------------------------------

def test_the_fake_answers_with_the_documented_fixture_outputs() -> None:
    gpus = [H100, H100]
    assert render_table(gpus, "550.54.15", "12.4") == (FIXTURES / "h100x2-table.txt").read_text()
    assert render_q(gpus, "550.54.15", "12.4") == (FIXTURES / "h100x2-q.txt").read_text()
    assert render_query(gpus, "550.54.15") == (FIXTURES / "h100x2-query.txt").read_text()
    assert "| NVIDIA-SMI 550.54.15" in (FIXTURES / "h100x2-table.txt").read_text()


def test_fixture_outputs_parse() -> None:
    gpus = parse_query_csv((FIXTURES / "h100x2-query.txt").read_text())
    assert [(g.index, g.name, g.driver, g.memory_mb) for g in gpus] == [
        (0, "NVIDIA H100 80GB HBM3", "550.54.15", 81559), (1, "NVIDIA H100 80GB HBM3", "550.54.15", 81559)]
    assert gpus[0].uuid.startswith("GPU-") and gpus[0].uuid != gpus[1].uuid
    assert parse_cuda_version((FIXTURES / "h100x2-table.txt").read_text()) == "12.4"
    assert parse_cuda_version((FIXTURES / "h100x2-q.txt").read_text()) == "12.4"
    assert parse_cuda_version((FIXTURES / "no-devices.txt").read_text()) is None


@pytest.mark.parametrize("line, complaint", [
    ("0, NVIDIA H100 80GB HBM3, 550.54.15, 81559", "has 4 fields, expected 5"),
    ("zero, NVIDIA H100 80GB HBM3, 550.54.15, 81559, GPU-1", "must be integers"),
    ("0, NVIDIA H100 80GB HBM3, 550.54.15, [N/A], GPU-1", "must be integers"),
    ("0, , 550.54.15, 81559, GPU-1", "empty field"),
])
def test_malformed_query_lines_are_named(line: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        parse_query_csv(line + "\n")


def test_gpus_from_nvidia_smi_on_path(fake_h100: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _on_path(monkeypatch, fake_h100.parent)
    gpus, cuda, note = query_gpus()
    assert note is None and cuda == "12.4"
    assert [g.name for g in gpus] == ["NVIDIA H100 80GB HBM3"] * 2
    assert gpus[1] == Gpu(name="NVIDIA H100 80GB HBM3", driver="550.54.15", memory_mb=81559, uuid=gpus[1].uuid, index=1)
    argv = calls(fake_h100.parent)
    assert ["--query-gpu=index,name,driver_version,memory.total,uuid", "--format=csv,noheader,nounits"] in argv
    assert [] in argv  # the plain table, for the CUDA version


@pytest.mark.parametrize("mode, note", [
    ("failed", f"no GPU: {FAILED} Make sure that the latest NVIDIA driver is installed and running."),
    ("no-devices", "no GPU: no devices were found"),
    ("malformed", "no GPU: nvidia-smi output not understood (line 2 has 4 fields, expected 5: "),
])
def test_a_broken_or_empty_gpu_host_is_a_note(tmp_path: Path, mode: str, note: str) -> None:
    exe = install_fake_nvidia_smi(tmp_path / "bin", [H100, H100], "550.54.15", "12.4", mode=mode)
    gpus, cuda, got = query_gpus(str(exe))
    assert (gpus, cuda) == ([], None)
    assert got is not None and got.startswith(note)


def test_no_nvidia_smi_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert query_gpus() == ([], None, "no GPU: nvidia-smi not found")
    assert query_gpus(str(tmp_path / "missing" / "nvidia-smi")) == ([], None, "no GPU: nvidia-smi not found")


def test_a_hung_nvidia_smi_times_out_into_a_note(tmp_path: Path) -> None:
    exe = install_fake_nvidia_smi(tmp_path / "bin", [H100], "550.54.15", "12.4", mode="hang")
    assert query_gpus(str(exe), timeout=1) == ([], None, "no GPU: nvidia-smi did not answer within 1s")


# -- lockfile ---------------------------------------------------------------------------------

def _run(*argv: str | Path) -> str:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{argv} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _setuptools_project(root: Path, name: str, version: str) -> Path:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(f"WHO = {name!r}\n")
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\n')
    return root


def _wheel(directory: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel, written by hand so no build backend is needed."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"WHO = {name!r}\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
              f"{len(data)}" for path, data in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for arcname, data in files.items():
            zf.writestr(arcname, data)
    return path


def _installed(venv: Path) -> dict[str, str]:
    listed = json.loads(_run(venv / "bin" / "python", "-m", "pip", "list", "--format=json"))
    return {p["name"].lower(): p["version"] for p in listed}


def _editables(venv: Path) -> list[str]:
    listed = json.loads(_run(venv / "bin" / "python", "-m", "pip", "list", "--editable", "--format=json"))
    return sorted(p["name"].lower() for p in listed)


def _body(lock: bytes) -> list[str]:
    """The lockfile minus its four header lines (which carry the date)."""
    lines = lock.decode().splitlines()
    assert lines[0].startswith("# generated by jupyter-portable")
    return lines[4:]


def test_a_locked_venv_rebuilds_to_the_same_packages(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    _run(sys.executable, "-m", "venv", first)
    edpkg = _setuptools_project(tmp_path / "src" / "edpkg", "edpkg", "0.1.0")
    dirpkg = _setuptools_project(tmp_path / "src" / "dirpkg", "dirpkg", "2.0")
    wheel = _wheel(tmp_path, "whlpkg", "1.5")
    _run(first / "bin" / "python", "-m", "pip", "install", "-q", "six==1.16.0", "packaging==24.1",
         "-e", edpkg, dirpkg.as_uri(), wheel.as_uri())

    lock = lock_environment(str(first / "bin" / "python"))
    tools = {k: v for k, v in _installed(first).items() if k in ("pip", "setuptools", "wheel")}
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert _body(lock) == [
        f"dirpkg @ {dirpkg.as_uri()}",
        "# editable: edpkg==0.1.0",
        f"-e {edpkg.as_uri()}",
        "packaging==24.1",
        "six==1.16.0",
        f"whlpkg @ {wheel.as_uri()}#sha256={digest}",
        "# packaging tools, pinned too: `uv pip sync` removes whatever is not listed",
        *[f"{name}=={version}" for name, version in sorted(tools.items())],
    ]
    header = lock.decode().splitlines()[:4]
    assert header[1] == f"# python: {platform.python_version()} (cpython)" and header[2].startswith("# platform: ")
    assert set(parse_lockfile(lock)) == {"dirpkg", "edpkg", "packaging", "six", "whlpkg", *tools}

    lock_path = tmp_path / "requirements.lock"
    lock_path.write_bytes(lock)
    for argv in rebuild_commands(str(lock_path), str(second)):
        _run(*argv)
    assert _installed(second) == _installed(first)
    assert _editables(second) == _editables(first) == ["edpkg"]
    assert _body(lock_environment(str(second / "bin" / "python"))) == _body(lock)
    where = _run(second / "bin" / "python", "-c", "import edpkg, dirpkg, whlpkg, six; print(edpkg.__file__)")
    assert Path(where.strip()).parent == edpkg / "edpkg"  # editable: imports come from the source tree


def test_direct_url_records_become_pinned_lines() -> None:
    def dist(name: str, version: str, direct: dict[str, Any] | str | None = None) -> dict[str, Any]:
        return {"name": name, "version": version,
                "direct_url": json.dumps(direct) if isinstance(direct, dict) else direct}

    info = {"python": "3.11.7", "implementation": "cpython", "platform": "Linux-x86_64", "dists": [
        dist("Zed_Lib", "1.0", {"url": "https://github.com/o/zed.git",
                                "vcs_info": {"vcs": "git", "commit_id": "0" * 40, "requested_revision": "main"},
                                "subdirectory": "py"}),
        dist("arch", "2.0", {"url": "https://files.example/arch-2.0.tar.gz", "archive_info": {"hash": "sha256=ab12"}}),
        dist("plain", "3.0", {"url": "https://files.example/plain-3.0.zip", "archive_info": {}}),
        dist("evil", "1.0", {"url": "https://x/y\n-e file:///etc", "archive_info": {}}),
        dist("broken", "1.0\n--index-url https://evil"),
        dist("arch", "9.9"),  # shadowed by the earlier sys.path entry
        dist("wheel", "0.43.0"),
    ]}
    lock = format_lockfile(info)
    text = lock.decode()
    assert "zed-lib @ git+https://github.com/o/zed.git@" + "0" * 40 + "#subdirectory=py" in text.splitlines()
    assert "arch @ https://files.example/arch-2.0.tar.gz#sha256=ab12" in text.splitlines()
    assert "plain @ https://files.example/plain-3.0.zip" in text.splitlines()
    assert "evil==1.0" in text.splitlines() and "\n-e file:///etc" not in text
    assert [line[:33] for line in text.splitlines() if "broken" in line] == ["# skipped (unreadable metadata): "]
    assert not any(line.startswith("--") for line in text.splitlines())
    assert text.splitlines()[-1] == "wheel==0.43.0"
    assert sorted(parse_lockfile(lock)) == ["arch", "evil", "plain", "wheel", "zed-lib"]


@pytest.mark.parametrize("data, complaint", [
    (b"\xff\xfe garbage", "not UTF-8"),
    (b"six==1.16.0\nsix==1.17.0\n", "listed twice"),
    (b"-e file:///src/pkg\n", "without its"),
    (b"<html>not a lockfile</html>\n", "line 1 is not a requirement"),
    (b"six>=1.0\n", "line 1 is not a requirement"),
    (b"six==1.16.0 ; python_version<'3'\n", "not a requirement"),
    (b"pkg @ not-a-url\n", "bad URL"),
    (b"--index-url https://evil.example/simple\n", "not a requirement"),
])
def test_garbage_lockfiles_are_refused(data: bytes, complaint: str) -> None:
    with pytest.raises(ManifestError, match=complaint):
        parse_lockfile(data)


def test_the_notebook_directory_neither_breaks_nor_joins_the_lock(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "json.py").write_text("raise SystemExit('the stdlib was shadowed')\n")
    (tmp_path / "ghost-1.0.dist-info").mkdir()
    (tmp_path / "ghost-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: ghost\nVersion: 1.0\n")
    monkeypatch.chdir(tmp_path)
    lock = parse_lockfile(lock_environment())
    assert "ghost" not in lock and "jupyter-portable" in lock


def test_lock_of_a_missing_interpreter_says_so(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot run the interpreter"):
        lock_environment(str(tmp_path / "no-python"))


def test_rebuild_prefers_uv_when_it_is_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert rebuild_commands("/l/req.lock", "/v")[1] == [
        "/v/bin/python", "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "-r", "/l/req.lock"]
    uv = tmp_path / "uv"
    uv.write_text("#!/bin/sh\n")
    uv.chmod(0o755)
    cmds = rebuild_commands("/l/req.lock", "/v")
    assert cmds == [[sys.executable, "-m", "venv", "/v"], [str(uv), "pip", "sync", "--python", "/v/bin/python",
                                                           "/l/req.lock"]]


def test_conda_explicit_only_for_conda_envs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    monkeypatch.delenv("CONDA_EXE", raising=False)
    bin_dir, env = tmp_path / "bin", tmp_path / "env"
    bin_dir.mkdir()
    env.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    assert conda_explicit(str(env)) is None  # not a conda env, and no conda anyway
    (env / "conda-meta").mkdir()
    assert conda_explicit(str(env)) is None  # a conda env, but no conda on PATH
    conda = bin_dir / "conda"
    conda.write_text(f"#!{sys.executable}\nimport sys\nprint('# argv: ' + ' '.join(sys.argv[1:]))\n"
                     "print('@EXPLICIT')\nprint('https://conda.anaconda.org/conda-forge/linux-64/zlib-1.3.1-h4.conda#0a1')\n")
    conda.chmod(0o755)
    out = conda_explicit(str(env))
    assert out is not None and b"@EXPLICIT" in out
    assert f"# argv: list --explicit --md5 --prefix {env}".encode() in out
    conda.write_text("#!/bin/sh\necho 'EnvironmentLocationNotFound' >&2\nexit 1\n")
    assert conda_explicit(str(env)) is None


# -- probe and record -------------------------------------------------------------------------

def test_probe_records_gpus_driver_and_cuda(fake_h100: Path) -> None:
    probe = probe_runtime(nvidia_smi=str(fake_h100))
    rec = probe.record
    assert rec["schema"] == RUNTIME_SCHEMA == 1
    assert rec["python"] == platform.python_version() and rec["implementation"] == sys.implementation.name
    assert rec["machine"] == platform.machine() and rec["executable"]
    assert rec["cuda_driver"] == "12.4" and rec["gpu_note"] is None
    assert [(g["index"], g["name"], g["driver"], g["memory_mb"]) for g in rec["gpus"]] == [
        (0, "NVIDIA H100 80GB HBM3", "550.54.15", 81559), (1, "NVIDIA H100 80GB HBM3", "550.54.15", 81559)]
    assert rec["packages"] == len(parse_lockfile(probe.lockfile)) > 0
    assert "jupyter-portable" in parse_lockfile(probe.lockfile)
    assert json.loads(json.dumps(rec)) == rec == validate_runtime(rec)


def test_probe_without_a_gpu_still_records_the_rest(tmp_path: Path) -> None:
    rec = probe_runtime(nvidia_smi=str(tmp_path / "nowhere" / "nvidia-smi")).record
    assert rec["gpus"] == [] and rec["cuda_driver"] is None
    assert rec["gpu_note"] == "no GPU: nvidia-smi not found"
    assert validate_runtime(rec) == rec


def _record() -> dict[str, Any]:
    return {"schema": 1, "python": "3.11.7", "implementation": "cpython", "executable": "/v/bin/python",
            "platform": "Linux-6.5.0-x86_64-with-glibc2.35", "machine": "x86_64", "packages": 3,
            "image": {"name": "nvcr.io/nvidia/pytorch:24.01-py3", "source": "env NVIDIA_PYTORCH_VERSION",
                      "in_container": True},
            "cuda_runtime": "12.1", "cuda_driver": "12.4",
            "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "driver": "550.54.15", "memory_mb": 81559,
                      "uuid": "GPU-1"}],
            "gpu_note": None}


@pytest.mark.parametrize("mutate", [
    lambda r: r.update(schema=2),
    lambda r: r.update(schema=True),
    lambda r: r.pop("gpus"),
    lambda r: r.update(surprise=1),
    lambda r: r.update(packages="3"),
    lambda r: r.update(packages=True),
    lambda r: r.update(python=3.11),
    lambda r: r.update(python="three"),
    lambda r: r.update(cuda_driver="twelve"),
    lambda r: r.update(cuda_runtime=12.1),
    lambda r: r.update(image={"name": "x"}),
    lambda r: r.update(image="ubuntu"),
    lambda r: r["gpus"][0].update(memory_mb="80GB"),
    lambda r: r["gpus"][0].pop("uuid"),
    lambda r: r["gpus"].append("H100"),
    lambda r: r.update(gpu_note=["no"]),
    lambda r: r.update(lockfile=7),
], ids=lambda f: "mutation")
def test_mutated_records_are_refused(mutate: Any) -> None:
    rec = _record()
    mutate(rec)
    with pytest.raises(ManifestError):
        validate_runtime(rec)


def test_a_record_is_validated_as_a_copy_with_the_hashes_added_later() -> None:
    rec = dict(_record(), lockfile="blake3:00ff", conda=None)
    checked = validate_runtime(rec)
    assert checked == rec and checked is not rec and checked["gpus"] is not rec["gpus"]
    with pytest.raises(ManifestError):
        validate_runtime([rec])


def test_the_image_is_found_without_network(tmp_path: Path) -> None:
    assert detect_image({}, tmp_path) is None
    (tmp_path / ".dockerenv").touch()
    assert detect_image({}, tmp_path) == {"name": None, "source": "/.dockerenv", "in_container": True}
    runpod = detect_image({"RUNPOD_POD_ID": "abc123"}, tmp_path)
    assert runpod is not None and runpod["name"] is None and "RunPod" in runpod["source"]
    ngc = detect_image({"NVIDIA_PYTORCH_VERSION": "24.01"}, tmp_path)
    assert ngc is not None and ngc["name"] == "nvcr.io/nvidia/pytorch:24.01-py3"
    assert detect_image({"CONTAINER_IMAGE": "ghcr.io/me/nb:1"}, tmp_path)["name"] == "ghcr.io/me/nb:1"  # type: ignore[index]
    podman = tmp_path / "podman"
    (podman / "run").mkdir(parents=True)
    (podman / "run" / ".containerenv").write_text(
        'engine="podman-4.9.3"\nname="nb"\nimage="docker.io/library/python:3.11"\n')
    assert detect_image({}, podman) == {"name": "docker.io/library/python:3.11", "source": "/run/.containerenv",
                                        "in_container": True}
    cgroup = tmp_path / "k8s"
    (cgroup / "proc" / "1").mkdir(parents=True)
    (cgroup / "proc" / "1" / "cgroup").write_text("12:pids:/kubepods/besteffort/pod1/abc\n")
    assert detect_image({}, cgroup) == {"name": None, "source": "/proc/1/cgroup (kubepods)", "in_container": True}


@pytest.mark.parametrize("packages, env, expected", [
    ({"nvidia-cuda-runtime-cu12": "nvidia-cuda-runtime-cu12==12.1.105", "torch": "torch==2.3.0"}, {}, "12.1"),
    ({"torch": "torch==2.3.0+cu124"}, {}, "12.4"),
    ({"torch": "torch @ https://download.pytorch.org/whl/cu118/torch-2.1.0%2Bcu118-cp311-linux_x86_64.whl"}, {},
     "11.8"),
    ({"torch": "torch==2.13.0+cpu"}, {}, None),
    ({"six": "six==1.16.0"}, {"CUDA_VERSION": "12.4.1"}, "12.4"),
    ({"six": "six==1.16.0"}, {}, None),
])
def test_cuda_runtime_without_importing_torch(packages: dict[str, str], env: dict[str, str],
                                              expected: str | None) -> None:
    assert cuda_runtime_from(packages, env) == expected


# -- diff -------------------------------------------------------------------------------------

LOCK_A = b"# generated by jupyter-portable\nnumpy==1.26.4\nsix==1.16.0\ntorch==2.2.0+cu121\n"
LOCK_B = b"# generated by jupyter-portable\nnumpy==1.26.4\npandas==2.2.2\ntorch==2.3.0+cu121\n"


def test_diff_shows_packages_and_driver_changes() -> None:
    a = _record()
    b = _record()
    b["gpus"] = [dict(a["gpus"][0], driver="535.104.05", uuid="GPU-2"), dict(a["gpus"][0], index=1, uuid="GPU-3",
                                                                         driver="535.104.05")]
    b["cuda_driver"] = "12.2"
    d = diff_runtime(a, b, LOCK_A, LOCK_B)
    assert d["packages"] == {"added": {"pandas": "pandas==2.2.2"}, "removed": {"six": "six==1.16.0"},
                             "changed": {"torch": ["torch==2.2.0+cu121", "torch==2.3.0+cu121"]}}
    assert d["driver"] == ["550.54.15", "535.104.05"] and d["cuda_driver"] == ["12.4", "12.2"]
    assert d["gpus"] == {"a": a["gpus"], "b": b["gpus"]}
    assert d["python"] is None and d["image"] is None and d["platform"] is None and d["cuda_runtime"] is None
    assert json.loads(json.dumps(d)) == d
    assert format_diff(d).splitlines() == [
        "CUDA supported by driver: 12.4 -> 12.2",
        "NVIDIA driver: 550.54.15 -> 535.104.05",
        "gpus: 1x NVIDIA H100 80GB HBM3 (81559 MiB) -> 2x NVIDIA H100 80GB HBM3 (81559 MiB)",
        "+ pandas==2.2.2",
        "- six==1.16.0",
        "~ torch: torch==2.2.0+cu121 -> torch==2.3.0+cu121",
    ]


def test_a_new_machine_with_the_same_kind_of_gpu_is_no_change() -> None:
    a, b = _record(), _record()
    b["gpus"] = [dict(a["gpus"][0], uuid="GPU-other")]
    d = diff_runtime(a, b, LOCK_A, LOCK_A)
    assert d["gpus"] is None and d["packages"] == {"added": {}, "removed": {}, "changed": {}}
    assert format_diff(d) == "no runtime changes"
    assert diff_runtime(a, b, None, LOCK_A)["packages"] is None


def test_diff_names_python_image_and_gpu_model_changes() -> None:
    a, b = _record(), _record()
    b.update(python="3.12.1", image=None, cuda_runtime="12.4",
             gpus=[{"index": 0, "name": A100["name"], "driver": "550.54.15", "memory_mb": 81920, "uuid": "GPU-9"}])
    text = format_diff(diff_runtime(a, b, None, None))
    assert text.splitlines() == [
        "python: 3.11.7 -> 3.12.1",
        "image: nvcr.io/nvidia/pytorch:24.01-py3 -> none",
        "CUDA runtime: 12.1 -> 12.4",
        "gpus: 1x NVIDIA H100 80GB HBM3 (81559 MiB) -> 1x NVIDIA A100-SXM4-80GB (81920 MiB)",
    ]
