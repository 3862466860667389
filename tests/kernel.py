"""A real ipykernel started through jupyter_client, for running cells in tests."""

from __future__ import annotations

import os
import queue
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager


@dataclass
class CellResult:
    stdout: str = ""
    stderr: str = ""
    result: str | None = None
    displays: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None  # "ename: evalue"
    mimes: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        shown = "".join(d.get("text/plain", "") for d in self.displays)
        return self.stdout + shown + (self.result or "")


class Kernel:
    """One running kernel in ``cwd`` with ``env``; ``run(code)`` executes a cell."""

    def __init__(self, cwd: Path, env: dict[str, str] | None = None) -> None:
        self.km = KernelManager(kernel_name="python3")
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.km.start_kernel(cwd=str(cwd), env=full_env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 120) -> CellResult:
        msg_id = self.kc.execute(code, store_history=True)
        out = CellResult()
        displays: dict[str, dict[str, Any]] = {}
        order: list[str] = []
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=timeout)
            except queue.Empty as exc:
                raise TimeoutError(f"cell did not finish in {timeout} s: {code!r}") from exc
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    out.stdout += content["text"]
                else:
                    out.stderr += content["text"]
            elif kind == "execute_result":
                out.result = content["data"].get("text/plain")
                out.mimes += list(content["data"])
            elif kind in ("display_data", "update_display_data"):
                ident = content.get("transient", {}).get("display_id") or f"anon-{len(order)}"
                if ident not in displays:
                    order.append(ident)
                displays[ident] = content["data"]
                out.mimes += list(content["data"])
            elif kind == "error":
                out.error = f"{content['ename']}: {content['evalue']}"
            elif kind == "status" and content["execution_state"] == "idle":
                break
        out.displays = [displays[i] for i in order]
        return out

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
