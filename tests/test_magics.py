"""``%workspace`` in a real kernel: checkpoints proven good, the latest one, the next action."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hooks_site.portable_faults import fault_env
from kernel import Kernel

from jupyter_portable import Workspace

TRAIN = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
print("trained", step + 1)
"""


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    root = tmp_path / "project"
    root.mkdir()
    (root / "train.py").write_text("# training code\n")
    return Workspace.init(root, f"file://{tmp_path}/store")


@pytest.fixture
def kernel(workspace: Workspace) -> Iterator[Kernel]:
    # the fault hooks are installed in it (hooks_site): a test may corrupt a read-back
    k = Kernel(workspace.root, env=fault_env(JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES="0"))
    assert k.run("%load_ext jupyter_portable").error is None
    yield k
    k.close()


def test_new_user_checkpoint_latest_and_a_rejected_copy(kernel: Kernel, workspace: Workspace) -> None:
    assert "trained 2" in kernel.run(TRAIN).stdout
    out = kernel.run("%workspace checkpoint ckpt.pt --step 2 --save model")
    assert out.error is None, out
    # the cell returns once the checkpoint is saved and checked; it counts once read back
    assert "saved and checked: ckpt.pt (step 2); upload and read-back run in the background" in out.text
    for _ in range(600):
        if "#1 verified  ckpt.pt" in kernel.run("%workspace checkpoints").stdout:
            break
        time.sleep(0.1)
    assert workspace.latest_checkpoint().step == 2
    latest = kernel.run("%workspace latest")
    assert latest.result == "'ckpt.pt'"
    assert latest.stdout == "", "the name is shown once, as the cell's result, not printed as well"
    # A truncated copy registered after it is rejected, and latest stays at step 2.
    kernel.run("data = open('ckpt.pt', 'rb').read(); open('ckpt-copy.pt', 'wb').write(data[:len(data) // 2])")
    out = kernel.run("%workspace checkpoint ckpt-copy.pt --step 3 --settle 0.2 --wait")
    assert "REJECTED: ckpt-copy.pt" in out.text and "central directory" in out.text
    assert kernel.run("%workspace latest").result == "'ckpt.pt'"
    records = workspace.checkpoints()
    assert [(c.path, c.step, c.status) for c in records] == [("ckpt.pt", 2, "verified"),
                                                             ("ckpt-copy.pt", 3, "rejected")]
    assert workspace.latest_checkpoint().step == 2
    # The verified checkpoint's bytes are in the store, and load back in the kernel.
    assert kernel.run("import torch; sd = torch.load('ckpt.pt'); print(sorted(sd))").stdout.strip() == \
        "['bias', 'weight']"
    listing = kernel.run("%workspace checkpoints").stdout
    assert "#1 verified  ckpt.pt" in listing and "#2 REJECTED  ckpt-copy.pt" in listing


def test_the_cell_returns_a_handle_while_the_upload_waits_and_every_view_shows_it_in_flight(
        kernel: Kernel, workspace: Workspace) -> None:
    assert "trained 2" in kernel.run(TRAIN).stdout
    # the upload waits for the kernel's operation lock, as it would behind a snapshot in a cell
    assert kernel.run("from jupyter_portable.interfaces.kernel.lock import OPERATION_LOCK\n"
                      "OPERATION_LOCK.acquire()").error is None
    out = kernel.run("h = %workspace checkpoint ckpt.pt --step 2 --save model\nh")
    assert out.error is None, out
    assert re.fullmatch(r"<checkpoint ckpt\.pt \(step 2\): (queued|uploading)>", out.result or ""), out.result
    listing = kernel.run("%workspace checkpoints").stdout
    assert re.search(r"in flight \(not verified yet\):\n  in flight  ckpt\.pt: step 2: (queued|uploading)",
                     listing), listing
    assert "no verified checkpoint yet" in kernel.run("%workspace latest").stdout
    assert "latest verified checkpoint: none" in kernel.run("%workspace status").stdout
    assert workspace.latest_checkpoint() is None
    out = kernel.run("OPERATION_LOCK.release()\nrecord = h.wait(60)\nprint(record.verified, h.state)\nh")
    assert out.stdout.strip() == "True verified" and out.result == "<checkpoint ckpt.pt (step 2): verified (version 1)>"
    assert kernel.run("%workspace latest").result == "'ckpt.pt'"
    assert "in flight" not in kernel.run("%workspace checkpoints").stdout


def test_latest_load_refuses_a_checkpoint_file_written_again_since_it_was_verified(
        kernel: Kernel, workspace: Workspace) -> None:
    assert "trained 2" in kernel.run(TRAIN).stdout
    assert kernel.run("%workspace checkpoint ckpt.pt --step 2 --save model --wait").error is None
    assert "loaded ckpt.pt (step 2)" in kernel.run("%workspace latest --load sd").text
    # the training loop writes the same file again and dies before registering it
    kernel.run("torch.save({'other': torch.zeros(3)}, 'ckpt.pt')")
    out = kernel.run("%workspace latest --load sd2")
    assert "UsageError" in out.stderr and "changed since its checkpoint step 2 was verified" in out.stderr, out
    assert kernel.run("print('sd2' in dir())").stdout.strip() == "False"  # nothing was loaded
    # saved and registered again: that one loads
    assert kernel.run("%workspace checkpoint ckpt.pt --step 3 --wait").error is None
    assert "loaded ckpt.pt (step 3)" in kernel.run("%workspace latest --load sd3").text


def test_safetensors_verified_and_truncated_rejected(kernel: Kernel) -> None:
    code = """
import numpy as np
from safetensors.numpy import save_file
save_file({"w": np.arange(64, dtype=np.float32).reshape(8, 8)}, "model.safetensors")
raw = open("model.safetensors", "rb").read()
open("cut.safetensors", "wb").write(raw[:-7])
"""
    assert kernel.run(code).error is None
    out = kernel.run("%workspace checkpoint model.safetensors --settle 0.2 --wait")
    assert "verified: model.safetensors" in out.text
    out = kernel.run("%workspace checkpoint cut.safetensors --settle 0.2 --wait")
    assert "REJECTED: cut.safetensors: truncated safetensors file" in out.text


def test_a_checkpoint_still_being_written_is_never_verified(kernel: Kernel, workspace: Workspace) -> None:
    code = """
import threading, time
stop = threading.Event()
def writer():
    with open("growing.pt", "ab") as fh:
        while not stop.is_set():
            fh.write(b"x" * 4096); fh.flush(); time.sleep(0.05)
threading.Thread(target=writer, daemon=True).start()
time.sleep(0.3)
"""
    kernel.run(code)
    out = kernel.run("%workspace checkpoint growing.pt --settle 0.5 --timeout 1.5 --wait")
    kernel.run("stop.set()")
    assert "REJECTED: growing.pt: still being written" in out.text
    manifest = workspace.manifest()
    assert "growing.pt" not in manifest.by_path(), "a file being written is never published"
    assert workspace.latest_checkpoint() is None


def test_store_corruption_between_upload_and_read_back_is_rejected(kernel: Kernel, workspace: Workspace) -> None:
    kernel.run("open('weights.bin', 'wb').write(bytes(range(256)) * 4096)")
    kernel.run("import os; os.environ['JUPYTER_PORTABLE_CORRUPT_READBACK'] = '1'")
    out = kernel.run("%workspace checkpoint weights.bin --settle 0.2 --wait")
    assert "REJECTED: weights.bin: read-back from the store failed" in out.text
    kernel.run("del os.environ['JUPYTER_PORTABLE_CORRUPT_READBACK']")
    assert workspace.latest_checkpoint() is None
    assert "weights.bin" not in workspace.manifest().by_path()


def test_mistakes_raise_usage_errors(kernel: Kernel) -> None:
    for line, expect in (("%workspace", "%workspace status"), ("%workspace bogus", "invalid choice"),
                         ("%workspace checkpoint", "path"), ('%workspace next "unclosed', "quotes"),
                         ("%workspace checkpoint x.pt --step two", "invalid int"),
                         ("%workspace checkpoint nope.pt --save nothing_here", "no variable"),
                         ("%workspace checkpoint /etc/passwd", "outside the workspace"),
                         ("%workspace diff 1", "the following arguments are required")):
        out = kernel.run(line)
        # IPython shows a UsageError as one message on stderr, without a traceback.
        assert out.stderr.startswith("UsageError: "), (line, out)
        assert expect in out.stderr, (line, out.stderr)


def test_next_action_snapshot_log_and_panel(kernel: Kernel, workspace: Workspace) -> None:
    out = kernel.run('%workspace next "resume at epoch 3 with lr=0.01"')
    assert out.error is None and "next: resume at epoch 3 with lr=0.01" in out.text
    snap = kernel.run('%workspace snapshot -m "two words"')
    assert snap.error is None and "published version 1" in snap.text
    manifest = workspace.manifest()
    assert manifest.message == "two words"
    assert manifest.next_action["text"] == "resume at epoch 3 with lr=0.01"
    assert manifest.next_action["state"] == "running", "the cell that ran the snapshot was running"
    assert "two words" in kernel.run("%workspace log").stdout
    panel = kernel.run("%workspace panel")
    assert panel.error is None and "application/vnd.jupyter.widget-view+json" in panel.mimes
    status = kernel.run("%workspace status").stdout
    assert "next action: resume at epoch 3" in status


def test_auto_snapshot_runs_in_the_background(workspace: Workspace) -> None:
    k = Kernel(workspace.root, env={"JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES": "0.02"})
    try:
        assert k.run("%load_ext jupyter_portable").error is None
        k.run("open('notes.txt', 'w').write('autosaved')")
        out = k.run("import importlib, time\n"
                    "auto = importlib.import_module('jupyter_portable.interfaces.kernel.autosnapshot')\n"
                    "for _ in range(100):\n    time.sleep(0.1)\n"
                    "    if 'version' in auto.describe(): break\n"
                    "print(auto.describe())")
        assert "version" in out.stdout, out
    finally:
        k.close()
    log = workspace.log()
    assert log and log[0]["message"] == "auto-snapshot"
    assert "notes.txt" in workspace.manifest(log[0]["version"]).by_path()
    assert json.loads(json.dumps(log))  # plain data
