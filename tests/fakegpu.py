"""A fake ``nvidia-smi`` for tests: a real executable on PATH that answers like the driver's tool.

Its outputs follow the formats of NVIDIA's nvidia-smi (R550): the default table, ``-q``, and
``--query-gpu=... --format=csv[,noheader][,nounits]``. The failure texts are read from
``tests/fixtures/nvidia-smi/``, and the healthy outputs for two H100s are kept there too, so a
test can check that what this module renders is the fixture, byte for byte.
"""

from __future__ import annotations

import json
import stat
import sys
import uuid
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
MODES = ("ok", "failed", "no-devices", "malformed", "hang")
H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}
_STAMP = "Tue Mar  5 10:12:01 2024"
_WIDTH = 89  # inside the outer bars of the R550 table

_FIELDS = {
    "index": lambda i, g, drv, units: str(i),
    "name": lambda i, g, drv, units: g["name"],
    "driver_version": lambda i, g, drv, units: drv,
    "memory.total": lambda i, g, drv, units: f"{g['memory_mb']}" if not units else f"{g['memory_mb']} MiB",
    "uuid": lambda i, g, drv, units: g["uuid"],
    # what each GPU reports now; the script reads the data dir's "utilization" (see set_utilization)
    "utilization.gpu": lambda i, g, drv, units: "0" if not units else "0 %",
}

_SCRIPT = '''#!{python}
"""Fake nvidia-smi written by tests/fakegpu.py."""
import json, pathlib, sys, time
data = pathlib.Path({data!r})
args = sys.argv[1:]
with open(data / "calls.log", "a") as log:
    log.write(json.dumps(args) + "\\n")
mode = (data / "mode").read_text()
if mode == "hang":
    time.sleep(60)
if mode in ("failed", "no-devices"):
    sys.stdout.write((data / "error.txt").read_text())
    sys.exit(9 if mode == "failed" else 6)
if not args:
    sys.stdout.write((data / "table.txt").read_text())
    sys.exit(0)
if args == ["-q"]:
    sys.stdout.write((data / "q.txt").read_text())
    sys.exit(0)
query = [a for a in args if a.startswith("--query-gpu=")]
fmt = [a for a in args if a.startswith("--format=")]
if len(args) != 2 or not query or not fmt or "csv" not in fmt[0].split("=", 1)[1].split(","):
    print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.")
    sys.exit(2)
opts = fmt[0].split("=", 1)[1].split(",")
fields = query[0].split("=", 1)[1].split(",")
table = json.loads((data / "query.json").read_text())
util = data / "utilization"
if util.exists():
    percents = util.read_text().split()
    for n, row in enumerate(table["rows"]):
        p = percents[min(n, len(percents) - 1)]
        row["utilization.gpu"] = {{"units": p + " %", "nounits": p}}
bad = [f for f in fields if f not in table["header"]]
if bad:
    print('Field "%s" is not a valid field to query.' % bad[0])
    sys.exit(2)
if "noheader" not in opts:
    print(", ".join(table["header"][f] for f in fields))
for n, row in enumerate(table["rows"]):
    values = [row[f]["nounits" if "nounits" in opts else "units"] for f in fields]
    if mode == "malformed" and n == 1:
        values = values[:-1]
    print(", ".join(values))
'''


def _gpus(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fill in bus ids and stable UUIDs so tests only name what they care about."""
    out = []
    for i, g in enumerate(gpus):
        full = {"bus_id": f"00000000:{0x18 + 0x12 * i:02X}:00.0", **g}
        full.setdefault("uuid", "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_OID, f"{g['name']}/{i}")))
        out.append(full)
    return out


def render_query(gpus: list[dict[str, Any]], driver: str) -> str:
    """``--query-gpu=index,name,driver_version,memory.total,uuid --format=csv,noheader,nounits``."""
    fields = ("index", "name", "driver_version", "memory.total", "uuid")
    return "".join(", ".join(_FIELDS[f](i, g, driver, False) for f in fields) + "\n"
                   for i, g in enumerate(_gpus(gpus)))


def render_table(gpus: list[dict[str, Any]], driver: str, cuda: str) -> str:
    """The default ``nvidia-smi`` table of the R550 drivers."""
    rule = "+" + "-" * _WIDTH + "+"
    split = "+".join("-" * w for w in (41, 24, 22))
    lines = [
        f"{_STAMP}       ",
        rule,
        "| " + f"NVIDIA-SMI {driver:<22} Driver Version: {driver:<14} CUDA Version: {cuda}".ljust(_WIDTH - 1) + "|",
        "|" + split + "+",
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|" + "+".join("=" * w for w in (41, 24, 22)) + "|",
    ]
    for i, g in enumerate(_gpus(gpus)):
        lines += [
            "|" + f"{i:>4}  {g['name']}" + "On  ".rjust(41 - len(f"{i:>4}  {g['name']}")) + "|"
            + f"{g['bus_id']} Off ".rjust(24) + "|"
            + "0 ".rjust(22) + "|",
            "| N/A   27C    P0             69W /  700W |" + f"0MiB / {g['memory_mb']:>6}MiB ".rjust(24) + "|"
            + "0%      Default ".rjust(22) + "|",
            "|" + " " * 41 + "|" + " " * 24 + "|" + "Disabled ".rjust(22) + "|",
            "+" + split + "+",
        ]
    lines += [
        " " * (_WIDTH + 2),
        rule,
        "| Processes:".ljust(_WIDTH + 1) + "|",
        "|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|" + "=" * _WIDTH + "|",
        "|  No running processes found".ljust(_WIDTH + 1) + "|",
        rule,
    ]
    return "\n".join(lines) + "\n"


def render_q(gpus: list[dict[str, Any]], driver: str, cuda: str) -> str:
    """The start of ``nvidia-smi -q``: versions, then one block a GPU (abridged)."""
    full = _gpus(gpus)
    key = lambda k, indent=0: (" " * indent + k).ljust(42) + ": "  # noqa: E731
    lines = ["", "==============NVSMI LOG==============", "", key("Timestamp") + _STAMP,
             key("Driver Version") + driver, key("CUDA Version") + cuda, "", key("Attached GPUs") + str(len(full))]
    for g in full:
        lines += [f"GPU {g['bus_id']}", key("Product Name", 4) + g["name"], key("Product Brand", 4) + "NVIDIA",
                  key("GPU UUID", 4) + g["uuid"], "    FB Memory Usage", key("Total", 8) + f"{g['memory_mb']} MiB",
                  key("Used", 8) + "0 MiB", ""]
    return "\n".join(lines) + "\n"


def install_fake_nvidia_smi(bin_dir: Path, gpus: list[dict[str, Any]], driver: str, cuda: str,
                            mode: str = "ok", python: str = sys.executable) -> Path:
    """Write an executable ``bin_dir/nvidia-smi`` presenting ``gpus``; returns its path.

    ``gpus`` are dicts with ``name`` and ``memory_mb`` (``uuid`` optional). ``mode``: ``ok``;
    ``failed`` (exit 9, cannot talk to the driver); ``no-devices`` (exit 6, a pod restarted
    without GPUs); ``malformed`` (the second CSV row loses a field); ``hang`` (never answers).
    Each call's argv is appended as JSON to ``bin_dir/nvidia-smi.d/calls.log`` (writable by any
    user). ``python`` runs the script (stdlib only; a machine's may be another user's).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    data = bin_dir / "nvidia-smi.d"
    data.mkdir(parents=True, exist_ok=True)
    (data / "mode").write_text(mode)
    if mode in ("failed", "no-devices"):
        (data / "error.txt").write_text((FIXTURES / f"{'failed-driver' if mode == 'failed' else 'no-devices'}.txt")
                                        .read_text())
    (data / "table.txt").write_text(render_table(gpus, driver, cuda))
    (data / "q.txt").write_text(render_q(gpus, driver, cuda))
    header = {"index": "index", "name": "name", "driver_version": "driver_version",
              "memory.total": "memory.total [MiB]", "uuid": "uuid", "utilization.gpu": "utilization.gpu [%]"}
    rows = [{f: {"units": fn(i, g, driver, True), "nounits": fn(i, g, driver, False)} for f, fn in _FIELDS.items()}
            for i, g in enumerate(_gpus(gpus))]
    (data / "query.json").write_text(json.dumps({"header": header, "rows": rows}))
    exe = bin_dir / "nvidia-smi"
    log = data / "calls.log"
    log.touch()
    log.chmod(0o666)  # a machine's login user calls it
    exe.write_text(_SCRIPT.format(python=python, data=str(data)))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return exe


def set_utilization(bin_dir: Path, *percents: int) -> None:
    """Make ``utilization.gpu`` answer ``percents`` (one for every GPU, or one each) from now on."""
    if not percents or not all(0 <= p <= 100 for p in percents):
        raise ValueError("give one or more percents from 0 to 100")
    (bin_dir / "nvidia-smi.d" / "utilization").write_text(" ".join(str(int(p)) for p in percents))


def calls(bin_dir: Path) -> list[list[str]]:
    """The argv of every call the fake answered so far."""
    log = bin_dir / "nvidia-smi.d" / "calls.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
