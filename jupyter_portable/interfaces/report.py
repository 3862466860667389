"""Human text for workspace state, shared by the CLI, the magics and the panel."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from jupyter_portable.core.records import CheckpointRecord
from jupyter_portable.engine.progress import human_bytes


def format_checkpoint(c: CheckpointRecord) -> str:
    step = f"step {c.step}" if c.step is not None else "no step"
    if c.verified:
        return f"  #{c.id} verified  {c.path} ({step}, {human_bytes(c.size)}, v{c.version}) {c.created}"
    return f"  #{c.id} REJECTED  {c.path} ({step}): {c.reason}"


def format_checkpoints(records: list[CheckpointRecord], *, version: int | None = None,
                       copy_version: int | None = None) -> str:
    """The checkpoints of ``version`` (the head, when given), naming this copy's own version beside it."""
    head = "" if version is None else f"workspace version {version} (head){_copy_words(version, copy_version)}\n"
    if not records:
        return head + "no checkpoints registered yet"
    return head + "\n".join(format_checkpoint(c) for c in records)


def _copy_words(head: int, copy_version: int | None) -> str:
    if copy_version is None or copy_version == head:
        return "; this copy is on it"
    return f"; this copy is on version {copy_version}"


def format_log(versions: list[dict[str, Any]]) -> str:
    return "\n".join(f"{v['version']:>5}  {v['created']}  {v['files']:>7} files  {v['bytes']:>14} B  {v['message']}"
                     for v in versions) or "no versions yet"


def format_gpus(runtime: dict[str, Any] | None) -> str:
    if not runtime:
        return "unknown"
    gpus = runtime.get("gpus") or []
    if not gpus:
        return runtime.get("gpu_note") or "no GPU"
    first = gpus[0]
    cuda = f", CUDA {runtime['cuda_driver']}" if runtime.get("cuda_driver") else ""
    return f"{len(gpus)} x {first.get('name')} ({first.get('memory_mb')} MB), driver {first.get('driver')}{cuda}"


def in_flight_line(rec: dict[str, Any], now: datetime | None = None) -> str:
    """A checkpoint in flight in the words every view says (core/state_words, as the sidebar shows
    it): its rate is its bytes done over the time since its phase began, to ``now``."""
    from jupyter_portable.core.state_words import checkpoint_line, checkpoint_rate
    from jupyter_portable.core.times import parse_iso_or_none, utcnow

    since = parse_iso_or_none(rec.get("since")) if isinstance(rec.get("since"), str) else None
    rate = checkpoint_rate(int(rec.get("done_bytes") or 0), since, now or utcnow())
    return checkpoint_line(rec if rate is None else {**rec, "rate": rate})


def format_in_flight(items: list[dict[str, Any]], now: datetime | None = None) -> str:
    """Checkpoints still uploading or being read back: not verified yet, so not "latest"."""
    return "\n".join(f"  in flight  {i.get('path')}: {in_flight_line(i, now)}" for i in items)


def fenced_line(st: dict[str, Any]) -> str | None:
    """What a newer epoch on the head means for this copy, or None when it holds the newest.

    On the user's side (a copy with a lifecycle) that is normal use: each Continue gives the
    workspace's history to the machine it rents, and the user's saves reach that machine. Only a
    copy without one (a machine's copy that lost its lease, or a stale restore) is fenced."""
    if not st.get("fenced"):
        return None
    if st.get("lifecycle"):
        return ("publishing: by the machines a Continue rents (they hold the workspace's newest epoch);"
                " your saves here are forwarded to the one serving it")
    return "FENCED: a newer allocation owns this workspace; this copy cannot publish"


def format_status(st: dict[str, Any]) -> str:
    lines = [f"workspace {st['workspace_id']} in {st['store']}"]
    if "copy_version" in st:  # issue 16: what follows describes the head
        lines.append(f"workspace version {st['head_version']} (head){_copy_words(st['head_version'], st['version'])}")
    else:
        lines.append(f"this copy: version {st['version']} (latest: {st['head_version']})")
    fenced = fenced_line(st)
    if fenced:
        lines.append(fenced)
    lifecycle = st.get("lifecycle")
    if lifecycle:  # the same words as the sidebar and a cell's error (core/state_words.py)
        lines.append(f"machine: {lifecycle['line']}; {lifecycle['words']['action']}")
    latest = st.get("latest_checkpoint")
    lines.append("latest verified checkpoint: " + (
        f"{latest['path']}" + (f" (step {latest['step']})" if latest.get("step") is not None else "")
        if latest else "none"))
    if st.get("checkpoints_in_flight"):
        lines.append("checkpoints in flight (not verified yet):\n" + format_in_flight(st["checkpoints_in_flight"]))
    runtime = st.get("runtime")
    if runtime:
        lines.append(f"python {runtime.get('python')}; GPU: {format_gpus(runtime)}")
    nxt = st.get("next_action")
    if nxt:
        where = " ".join(x for x in (nxt.get("notebook"), f"cell {nxt['execution_count']}"
                                     if nxt.get("execution_count") is not None else None, nxt.get("state")) if x)
        lines.append(f"next action: {nxt.get('text') or ''}" + (f" [{where}]" if where else ""))
    if st.get("pending"):
        lines.append(f"pending (lazy restore): {len(st['pending'])} file(s)\n  " + "\n  ".join(st["pending"]))
    return "\n".join(lines)
