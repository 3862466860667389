"""An ``nvidia-smi`` that presents an offer's GPUs: how the local market's machines have GPUs.

The demo's machines are processes on this computer, which has no GPU. Each gets its own
``bin/nvidia-smi`` (this module writes it) that answers in the formats of NVIDIA's tool, so
the real probe (:func:`jupyter_portable.compute.gpus.query_gpus`) and admission run
unchanged against it. Answered: the default table, ``-q`` (abridged), ``-L``,
``--version``, and ``--query-gpu=FIELDS --format=csv[,noheader][,nounits]`` with ``-i``.
With ``count=0`` it says "No devices were found" and exits 6, as a pod without GPUs does.
``utilization.gpu`` is 0 unless a file ``utilization`` beside the script says otherwise (one
percent for every GPU, or one each: :func:`set_utilization`), so a demo or a test can make a
machine's GPUs busy.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import uuid
from pathlib import Path

# The script is self-contained (stdlib, data inlined) so it keeps working whatever happens
# to the market's state; ``__DATA__`` is replaced by a JSON string literal.
_SCRIPT = r'''#!__PYTHON__
"""nvidia-smi as a local-market machine presents it (written by jupyter_portable.demo.fake_nvidia_smi)."""
import json
import os
import sys

D = json.loads(__DATA__)


def utilization(i):
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "utilization")) as f:
            percents = f.read().split()
        return str(int(percents[min(i, len(percents) - 1)]))
    except (OSError, ValueError, IndexError):
        return "0"


GPUS = D["gpus"]
INVALID = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
# field -> (header, value for GPU g at index i, unit shown without nounits)
FIELDS = {
    "count": ("count", lambda i, g: str(len(GPUS)), ""),
    "index": ("index", lambda i, g: str(i), ""),
    "name": ("name", lambda i, g: g["name"], ""),
    "gpu_name": ("name", lambda i, g: g["name"], ""),
    "driver_version": ("driver_version", lambda i, g: D["driver"], ""),
    "memory.total": ("memory.total [MiB]", lambda i, g: str(g["memory_mb"]), " MiB"),
    "memory.used": ("memory.used [MiB]", lambda i, g: "0", " MiB"),
    "memory.free": ("memory.free [MiB]", lambda i, g: str(g["memory_mb"]), " MiB"),
    "uuid": ("uuid", lambda i, g: g["uuid"], ""),
    "gpu_uuid": ("uuid", lambda i, g: g["uuid"], ""),
    "pci.bus_id": ("pci.bus_id", lambda i, g: g["bus_id"], ""),
    "gpu_bus_id": ("pci.bus_id", lambda i, g: g["bus_id"], ""),
    "temperature.gpu": ("temperature.gpu", lambda i, g: "30", ""),
    "utilization.gpu": ("utilization.gpu [%]", lambda i, g: utilization(i), " %"),
}


def out(text):
    sys.stdout.write(text)
    sys.exit(0)


def fail(text, code):
    # nvidia-smi prints its failures on stdout
    print(text)
    sys.exit(code)


def table():
    w = 89
    rule = "+" + "-" * w + "+"
    split = "+".join("-" * n for n in (41, 24, 22))
    lines = ["Tue Mar  5 10:12:01 2024       ", rule,
             "| " + ("NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %s"
                     % (D["driver"], D["driver"], D["cuda"])).ljust(w - 1) + "|",
             "|" + split + "+",
             "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
             "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
             "|                                         |                        |               MIG M. |",
             "|" + "+".join("=" * n for n in (41, 24, 22)) + "|"]
    for i, g in enumerate(GPUS):
        head = "%4d  %s" % (i, g["name"][:30])
        lines += ["|" + head + "On  ".rjust(41 - len(head)) + "|" + (g["bus_id"] + " Off ").rjust(24) + "|"
                  + "0 ".rjust(22) + "|",
                  "| N/A   30C    P0             60W /  350W |" + ("0MiB / %6dMiB " % g["memory_mb"]).rjust(24)
                  + "|" + "0%      Default ".rjust(22) + "|",
                  "|" + " " * 41 + "|" + " " * 24 + "|" + "Disabled ".rjust(22) + "|",
                  "+" + split + "+"]
    lines += [" " * (w + 2), rule, "| Processes:".ljust(w + 1) + "|",
              "|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |",
              "|        ID   ID                                                               Usage      |",
              "|" + "=" * w + "|", "|  No running processes found".ljust(w + 1) + "|", rule]
    return "\n".join(lines) + "\n"


def q():
    key = lambda k, indent=0: (" " * indent + k).ljust(42) + ": "  # noqa: E731
    lines = ["", "==============NVSMI LOG==============", "", key("Timestamp") + "Tue Mar  5 10:12:01 2024",
             key("Driver Version") + D["driver"], key("CUDA Version") + D["cuda"], "",
             key("Attached GPUs") + str(len(GPUS))]
    for g in GPUS:
        lines += ["GPU " + g["bus_id"], key("Product Name", 4) + g["name"], key("Product Brand", 4) + "NVIDIA",
                  key("GPU UUID", 4) + g["uuid"], "    FB Memory Usage",
                  key("Total", 8) + "%d MiB" % g["memory_mb"], key("Used", 8) + "0 MiB", ""]
    return "\n".join(lines) + "\n"


def query(args):
    opts = {}
    it = iter(args)
    for a in it:
        name, eq, value = a.partition("=")
        if name in ("--query-gpu", "--format", "-i", "--id"):
            opts[name.lstrip("-")] = value if eq else next(it, None)
        else:
            fail(INVALID, 2)
    if not opts.get("query-gpu") or not opts.get("format"):
        fail(INVALID, 2)
    fmt = opts["format"].split(",")
    if "csv" not in fmt or set(fmt) - {"csv", "noheader", "nounits"}:
        fail(INVALID, 2)
    fields = [f.strip() for f in opts["query-gpu"].split(",")]
    for f in fields:
        if f not in FIELDS:
            fail('Field "%s" is not a valid field to query.' % f, 2)
    rows = list(enumerate(GPUS))
    sel = opts.get("i") or opts.get("id")
    if sel is not None:
        if not sel.isdigit() or int(sel) >= len(GPUS):
            fail("No devices were found", 6)
        rows = [rows[int(sel)]]
    lines = []
    if "noheader" not in fmt:
        lines.append(", ".join(FIELDS[f][0] for f in fields))
    for i, g in rows:
        lines.append(", ".join(FIELDS[f][1](i, g) + ("" if "nounits" in fmt else FIELDS[f][2]) for f in fields))
    return "\n".join(lines) + "\n"


args = sys.argv[1:]
if args in (["-h"], ["--help"]):
    out("NVIDIA System Management Interface -- v%s\n" % D["driver"])
if args == ["--version"]:
    out("NVIDIA-SMI version  : %s\nNVML version        : %s\nDRIVER version      : %s\nCUDA Version        : %s\n"
        % (D["driver"], D["driver"].rsplit(".", 1)[0], D["driver"], D["cuda"]))
if not GPUS:
    fail("No devices were found", 6)
if not args:
    out(table())
if args == ["-q"]:
    out(q())
if args in (["-L"], ["--list-gpus"]):
    out("".join("GPU %d: %s (UUID: %s)\n" % (i, g["name"], g["uuid"]) for i, g in enumerate(GPUS)))
out(query(args))
'''


def write_fake_nvidia_smi(bin_dir: Path, *, gpu: str, count: int, memory_mb: int, driver: str, cuda: str,
                          uuid_seed: str) -> Path:
    """Write an executable ``bin_dir/nvidia-smi`` presenting ``count`` x ``gpu``; returns its path.

    ``memory_mb`` is MiB per GPU, as nvidia-smi counts. UUIDs derive from ``uuid_seed``, so one
    machine keeps its GPUs' identities across calls and two machines never share them.
    """
    if count < 0 or memory_mb < 0:
        raise ValueError("count and memory_mb must not be negative")
    for name, value in (("gpu", gpu), ("driver", driver), ("cuda", cuda)):
        if not value or "\n" in value:
            raise ValueError(f"{name} must be a non-empty single line")
    gpus = [{"name": gpu, "memory_mb": int(memory_mb),
             "uuid": "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_OID, f"{uuid_seed}/{i}")),
             "bus_id": f"00000000:{0x18 + 0x12 * i:02X}:00.0"} for i in range(count)]
    data = json.dumps({"gpus": gpus, "driver": driver, "cuda": cuda})
    script = _SCRIPT.replace("__PYTHON__", sys.executable, 1).replace("__DATA__", repr(data), 1)
    bin_dir = Path(bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "nvidia-smi"
    # written aside and renamed, so a probe never runs a half-written script
    tmp = bin_dir / f".nvidia-smi.{os.getpid()}.tmp"
    tmp.write_text(script)
    tmp.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    os.replace(tmp, exe)
    return exe


def set_utilization(bin_dir: Path, *percents: int) -> None:
    """Make the machine's ``nvidia-smi`` in ``bin_dir`` report ``percents`` as ``utilization.gpu``."""
    if not percents or not all(0 <= p <= 100 for p in percents):
        raise ValueError("give one or more percents from 0 to 100")
    tmp = Path(bin_dir) / f".utilization.{os.getpid()}.tmp"
    tmp.write_text(" ".join(str(int(p)) for p in percents))
    os.replace(tmp, Path(bin_dir) / "utilization")


__all__ = ["set_utilization", "write_fake_nvidia_smi"]
