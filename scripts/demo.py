"""Prepare the demo workspace (once) and start JupyterLab on it.

The demo lives in ``demo/`` at the repo root (git-ignored): ``demo/workspace`` is the
workspace copy and ``demo/store`` its local store. Running this again reuses both.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "demo"
WORKSPACE = DEMO / "workspace"
STORE = DEMO / "store"
LAB_SETTINGS = DEMO / "lab-settings"  # JupyterLab's application settings for the demo

WELCOME = [
    new_markdown_cell(
        "# jupyter-portable demo\n\n"
        "This folder is a **workspace**: its files live durably in a store "
        f"(here the local folder `{STORE}`), not on this machine. "
        "Every snapshot is a verified, immutable version."),
    new_code_cell("!jupyter portable status"),
    new_code_cell("# Make some work worth keeping\n"
                  "import json, random\n"
                  "json.dump({'step': 100, 'loss': random.random()}, open('results/metrics.json', 'w'))"),
    new_code_cell("!jupyter portable snapshot -m 'after step 100'"),
    new_code_cell("!jupyter portable log"),
    new_markdown_cell("Restore any version anywhere, then check it byte for byte:"),
    new_code_cell("import subprocess, json\n"
                  "ws = json.loads(subprocess.check_output(['jupyter', 'portable', 'status', '--json']))\n"
                  "print(ws['workspace_id'], ws['store'])\n"
                  "!jupyter portable restore --store {ws['store']} --workspace {ws['workspace_id']} "
                  "/tmp/portable-demo-copy\n"
                  "!cd /tmp/portable-demo-copy && jupyter portable verify"),
]


CHECKPOINTS = [
    new_markdown_cell(
        "# Checkpoints that are proven good\n\n"
        "`%workspace checkpoint` counts a checkpoint only after its write check: no temporary "
        "name, the file held still, its format reads (torch zip, safetensors, orbax, DCP, "
        "DeepSpeed), it was uploaded, and its bytes were read back from the store and hashed equal."),
    new_code_cell("%load_ext jupyter_portable"),
    new_code_cell("import torch\n"
                  "torch.manual_seed(0)\n"
                  "model = torch.nn.Linear(4, 2)\n"
                  "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                  "for step in range(1, 3):\n"
                  "    loss = model(torch.randn(8, 4)).pow(2).mean()\n"
                  "    opt.zero_grad(); loss.backward(); opt.step()\n"
                  "    print(f'step {step}: loss {loss.item():.4f}')"),
    new_code_cell("%workspace checkpoint ckpt.pt --step 2 --save model"),
    new_code_cell("%workspace latest"),
    new_markdown_cell("A truncated copy is rejected with its reason, and *latest* does not move:"),
    new_code_cell("data = open('ckpt.pt', 'rb').read()\n"
                  "open('ckpt-broken.pt', 'wb').write(data[: len(data) // 2])"),
    new_code_cell("%workspace checkpoint ckpt-broken.pt --step 3"),
    new_code_cell("%workspace checkpoints"),
    new_code_cell('%workspace next "train to step 10 with lr=0.05"'),
    new_code_cell("%workspace status"),
    new_code_cell("%workspace panel"),
]


CONTINUE = [
    new_markdown_cell(
        "# Continue after a lost GPU\n\n"
        "This notebook runs on the **Python (portable)** kernel: on a machine rented from the local "
        "market (a worker process on this computer, presenting its offer's GPU), in that machine's "
        "copy of this workspace. Opening it rents nothing: the first cell you run asks first, in a "
        "notification naming the GPU, the provider and its $/h. **Start** rents it and the cell runs there; "
        "**Cancel** rents nothing."),
    new_code_cell("import os\n"
                  "print('running on', os.environ['JUPYTER_PORTABLE_ALLOCATION'], 'in', os.getcwd())\n"
                  "!nvidia-smi -L"),
    new_code_cell("import torch\n"
                  "torch.manual_seed(0)\n"
                  "model = torch.nn.Linear(16, 4)\n"
                  "torch.save(model.state_dict(), 'model.pt')\n"
                  "_ = open('notes.txt', 'w').write('trained to step 100\\n')"),
    new_code_cell("%workspace checkpoint model.pt --step 100 --note 'before the GPU goes away'"),
    new_markdown_cell(
        "Now the GPU goes away: the market takes the machine back (a spot preemption). "
        "The kernel dies with it; the sidebar and a notification say **GPU lost** and why."),
    new_code_cell("!jupyter portable market lose $JUPYTER_PORTABLE_ALLOCATION"),
    new_markdown_cell(
        "Press **Continue** in the portable sidebar (or run `jupyter portable continue` in a terminal "
        "in this folder). A fresh machine is rented, the workspace is written onto it and read back, "
        "and this kernel restarts there with the same id. Then run the next cell: same files, same "
        "checkpoint, new machine."),
    new_code_cell("import os, torch\n"
                  "print('running on', os.environ['JUPYTER_PORTABLE_ALLOCATION'])\n"
                  "print(open('notes.txt').read().strip())\n"
                  "model = torch.nn.Linear(16, 4)\n"
                  "model.load_state_dict(torch.load('model.pt'))\n"
                  "print('checkpoint loaded')"),
    new_code_cell("%workspace latest"),
]


def prepare() -> None:
    from jupyter_portable import Workspace

    (WORKSPACE / "results").mkdir(parents=True, exist_ok=True)
    nb_path = WORKSPACE / "welcome.ipynb"
    if not nb_path.exists():
        nbformat.write(new_notebook(cells=WELCOME, metadata={"kernelspec": {
            "name": "python3", "display_name": "Python 3", "language": "python"}}), nb_path)
    ck_path = WORKSPACE / "checkpoints.ipynb"
    if not ck_path.exists():
        nbformat.write(new_notebook(cells=CHECKPOINTS, metadata={"kernelspec": {
            "name": "python3", "display_name": "Python 3", "language": "python"}}), ck_path)
    cont_path = WORKSPACE / "continue.ipynb"
    if not cont_path.exists():
        nbformat.write(new_notebook(cells=CONTINUE, metadata={"kernelspec": {
            "name": "portable", "display_name": "Python (portable)", "language": "python"}}), cont_path)
    readme = WORKSPACE / "README.md"
    if not readme.exists():
        readme.write_text("A demo workspace. Open welcome.ipynb, checkpoints.ipynb, then continue.ipynb.\n")
    if not (WORKSPACE / ".portable" / "workspace.json").exists():
        ws = Workspace.init(WORKSPACE, f"file://{STORE}")
        ws.snapshot("demo workspace created", progress=sys.stderr)
    print(f"demo workspace: {WORKSPACE} (store file://{STORE})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--start", action="store_true", help="start JupyterLab after preparing")
    parser.add_argument("--port", default=os.environ.get("PORTABLE_DEMO_PORT", "8888"))
    args = parser.parse_args()
    prepare()
    if args.start:
        bin_dir = Path(sys.executable).parent
        os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
        argv = lab_argv(bin_dir / "jupyter", args.port)
        if os.geteuid() == 0:
            argv.append("--allow-root")
        os.execv(argv[0], argv)
    return 0


def lab_argv(jupyter: Path, port: str, settings: Path = LAB_SETTINGS, root: Path = WORKSPACE) -> list[str]:
    """The demo's JupyterLab command line. Its application settings (``settings``, a folder of the
    demo's own: the user's settings and the environment's stay as they are) default JupyterLab's
    news feed to Never, so no "official Jupyter news?" question covers the demo's first minute;
    nothing is fetched from the internet for news or updates."""
    settings.mkdir(parents=True, exist_ok=True)
    overrides = settings / "overrides.json"
    values = json.loads(overrides.read_text()) if overrides.is_file() else {}
    values.setdefault("@jupyterlab/apputils-extension:notification", {}).update(
        {"fetchNews": "false", "checkForUpdates": False})
    overrides.write_text(json.dumps(values, indent=2) + "\n")
    return [str(jupyter), "lab", f"--ServerApp.root_dir={root}", f"--port={port}", "--ip=127.0.0.1",
            f"--LabApp.app_settings_dir={settings}", "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]


if __name__ == "__main__":
    raise SystemExit(main())
