"""The ipywidgets workspace panel (``%workspace panel`` or ``jupyter_portable.interfaces.kernel.panel()``)."""

from __future__ import annotations

import contextlib
import html
import threading
from typing import Any

from jupyter_portable.core.errors import PortableError
from jupyter_portable.engine.workspace import Workspace
from jupyter_portable.interfaces.kernel.lock import OPERATION_LOCK
from jupyter_portable.interfaces.report import fenced_line, format_gpus, in_flight_line


def _rows(ws: Workspace) -> str:
    st = ws.status()
    records = ws.checkpoints()
    log = ws.log()[:1]
    last = f"version {log[0]['version']} at {log[0]['created']}" if log else "none yet"
    verified = [c for c in records if c.verified]
    rejected = [c for c in records if not c.verified]
    latest = st.get("latest_checkpoint")
    runtime = st.get("runtime") or {}
    allocation = st.get("allocation")
    nxt = st.get("next_action") or {}

    def row(label: str, value: str) -> str:
        return f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(label)}</th><td>{value}</td></tr>"

    def ck_list(items: list[Any], verified_list: bool) -> str:
        if not items:
            return "none"
        parts = []
        for c in items[-5:]:
            step = f" step {c.step}" if c.step is not None else ""
            extra = "" if verified_list else f": {html.escape(c.reason or '')}"
            parts.append(f"<code>{html.escape(c.path)}</code>{step}{extra}")
        return "<br>".join(parts)

    rows = [
        row("Workspace", f"<code>{html.escape(st['workspace_id'])}</code>"),
        row("Store", f"<code>{html.escape(st['store'])}</code>"),
        row("Last snapshot", html.escape(last)),
        row("Latest verified checkpoint", html.escape(
            f"{latest['path']}" + (f" (step {latest['step']})" if latest and latest.get("step") is not None else ""))
            if latest else "none"),
        row("In flight (not verified yet)", "<br>".join(html.escape(in_flight_line(i))
                                                        for i in st.get("checkpoints_in_flight") or []) or "none"),
        row(f"Verified checkpoints ({len(verified)})", ck_list(verified, True)),
        row(f"Rejected checkpoints ({len(rejected)})", ck_list(rejected, False)),
        row("Runtime", html.escape(f"Python {runtime.get('python', '?')}; GPU: {format_gpus(runtime)}")),
        row("Allocation", html.escape(allocation.get("allocation_id", "") + " " + allocation.get("state", ""))
            if allocation else "this machine (no allocation recorded)"),
        row("Next action", html.escape(nxt.get("text") or nxt.get("state") or "not recorded")),
    ]
    fenced = fenced_line(st)
    if fenced:
        rows.insert(0, row("WARNING" if fenced.startswith("FENCED") else "Publishing",
                           html.escape(fenced.removeprefix("FENCED: ").removeprefix("publishing: "))))
    return "<table>" + "".join(rows) + "</table>"


def panel(ws: Workspace) -> Any:
    """A live panel: the workspace's state and buttons for Snapshot and Checkpoint."""
    import ipywidgets as w


    info = w.HTML(_rows(ws))
    path = w.Text(placeholder="checkpoint path, e.g. ckpt.pt", description="Path", layout=w.Layout(width="24em"))
    step = w.Text(placeholder="optional", description="Step", layout=w.Layout(width="12em"))
    snap_btn = w.Button(description="Snapshot", icon="save", tooltip="Publish the files as a new version")
    ck_btn = w.Button(description="Checkpoint", icon="check", tooltip="Register the checkpoint at Path")
    status = w.HTML("")

    def busy(flag: bool) -> None:
        snap_btn.disabled = ck_btn.disabled = flag

    def run(job: Any, locked: bool = True) -> None:
        def target() -> None:
            busy(True)
            try:
                # a checkpoint's upload takes the lock itself, in its own thread (engine/checkpoint/background)
                with OPERATION_LOCK if locked else contextlib.nullcontext():
                    status.value = html.escape(job())
                info.value = _rows(ws)
            except PortableError as exc:
                status.value = f"<b>Failed:</b> {html.escape(exc.one_line())}"
            finally:
                busy(False)
        threading.Thread(target=target, daemon=True).start()

    def on_snapshot(_: Any) -> None:
        def job() -> str:
            def show(text: str) -> None:
                status.value = html.escape(text)
            res = ws.snapshot("from the panel", progress=None, sink=show)
            return f"version {res.version}" + ("" if res.changed else " (no changes)")
        run(job)

    def on_checkpoint(_: Any) -> None:
        if not path.value.strip():
            status.value = "<b>Give the checkpoint's path first.</b>"
            return
        try:
            step_value = int(step.value) if step.value.strip() else None
        except ValueError:
            status.value = "<b>Step must be a whole number.</b>"
            return

        def job() -> str:
            record = ws.checkpoint(path.value.strip(), step=step_value, progress=None)
            return (f"verified {record.path} in version {record.version}" if record.verified
                    else f"REJECTED {record.path}: {record.reason}")
        run(job, locked=False)

    snap_btn.on_click(on_snapshot)
    ck_btn.on_click(on_checkpoint)
    return w.VBox([w.HTML("<h3>Portable workspace</h3>"), info, w.HBox([snap_btn]),
                   w.HBox([path, step, ck_btn]), status])
