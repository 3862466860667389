"""Issue 16: the no-machine placeholder kernel (a real process, spoken to over ZMQ), the move
notice, and ``%workspace latest --load``'s loaders."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.error import UsageError as IPythonUsageError

from jupyter_portable.core.errors import UsageError
from jupyter_portable.interfaces.kernel.placeholder import no_machine_message
from jupyter_portable.interfaces.kernel.resume import load_checkpoint
from jupyter_portable.orchestration.kernel_moves import moved_message
from jupyter_portable.orchestration.provisioner import FIRST_MACHINE_ENV, NO_MACHINE_ENV, first_machine_mode

ROUTE = {"id": "local/a100", "gpu": "NVIDIA A100-SXM4-80GB", "gpu_count": 1, "provider": "local", "offer": "a100",
         "region": "local-a", "price_per_hour": 1.5}


@pytest.fixture
def placeholder(tmp_path: Path) -> Iterator[object]:
    from jupyter_client import BlockingKernelClient
    from jupyter_client.connect import write_connection_file

    fname, _ = write_connection_file(str(tmp_path / "kernel.json"), ip="127.0.0.1", key=b"k" * 32)
    facts = {"state": "LOST", "reason": "preempted by the market", "first": False, "route": ROUTE}
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_portable.interfaces.kernel.placeholder", "-f", fname],
                            cwd=tmp_path, env={**_env(), NO_MACHINE_ENV: json.dumps(facts),
                                               "JUPYTER_PORTABLE_WORKSPACE": str(tmp_path)})
    client = BlockingKernelClient(connection_file=fname)
    client.load_connection_file()
    client.start_channels()
    try:
        client.kernel_info(reply=True, timeout=60)  # answered once the process is up
        yield client
    finally:
        client.stop_channels()
        proc.kill()
        proc.wait()


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def test_the_placeholder_answers_a_cell_at_once_with_the_no_machine_error_and_the_route(placeholder: object) -> None:
    client = placeholder
    info = client.kernel_info(reply=True, timeout=30)  # type: ignore[attr-defined]
    assert info["content"]["implementation"] == "portable-placeholder"
    t0 = time.monotonic()
    reply = client.execute_interactive("import torch", timeout=30, output_hook=_collect)  # type: ignore[attr-defined]
    assert time.monotonic() - t0 < 5
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "NoGPUMachine"
    text = "\n".join(_seen)
    assert "No GPU machine: press Continue in the portable sidebar" in text
    assert "The workspace is LOST: preempted by the market." in text
    assert "Continue would take: 1x NVIDIA A100-SXM4-80GB on local/a100 (local-a) at $1.50/h" in text


_seen: list[str] = []


def _collect(msg: dict[str, object]) -> None:
    if msg["msg_type"] == "error":
        _seen.extend(msg["content"]["traceback"])  # type: ignore[index]


def test_the_first_machine_message_asks_for_the_confirmation() -> None:
    head, text = no_machine_message({"state": "IDLE", "first": True, "route": None})
    assert head.startswith("No GPU machine yet: confirm the start")
    assert "no route is open now" in text


def test_the_move_notice_names_the_gpu_provider_region_and_version() -> None:
    rec = {"gpu": "NVIDIA A100 80GB", "provider": "runpod", "region": "eu-ro-1"}
    assert moved_message(rec, 12) == "Now on NVIDIA A100 80GB (runpod, eu-ro-1). Workspace version 12 verified."


def test_a_bad_first_machine_setting_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FIRST_MACHINE_ENV, "later")
    with pytest.raises(UsageError, match=FIRST_MACHINE_ENV):
        first_machine_mode()
    monkeypatch.setenv(FIRST_MACHINE_ENV, "first-cell")
    assert first_machine_mode() == "first-cell"


def test_load_reads_torch_files_weights_only_and_refuses_pickled_code(tmp_path: Path) -> None:
    import torch

    good = tmp_path / "ckpt.pt"
    torch.save({"w": torch.ones(2, 2) * 3}, good)
    assert float(load_checkpoint(good)["w"].sum()) == 12.0
    bad = tmp_path / "evil.pt"
    torch.save({"obj": _Unsafe()}, bad)
    with pytest.raises(IPythonUsageError, match="weights_only"):
        load_checkpoint(bad)


class _Unsafe:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("this must never run",))


def test_load_reads_safetensors(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "model.safetensors"
    save_file({"w": torch.arange(4.0)}, str(path))
    assert load_checkpoint(path)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(IPythonUsageError, match="not in this copy"):
        load_checkpoint(tmp_path / "missing.safetensors")

