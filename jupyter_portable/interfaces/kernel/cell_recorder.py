"""Records, from IPython's cell events, which notebook cell ran last or is running."""

from __future__ import annotations

import os
from typing import Any

from jupyter_portable.core.errors import PortableError
from jupyter_portable.core.times import now_iso
from jupyter_portable.workdir.next_action import notebook_path, update_next_action
from jupyter_portable.workdir.workcopy import WorkspaceCopy


class CellRecorder:
    """IPython ``pre_run_cell`` / ``post_run_cell`` callbacks writing the next action."""

    _installed: "CellRecorder | None" = None

    def __init__(self, ipython: Any = None) -> None:
        self.notebook = notebook_path()
        self.ipython = ipython

    def _copy(self) -> WorkspaceCopy | None:
        try:
            return WorkspaceCopy.find(os.getcwd())
        except PortableError:
            return None

    def pre_run_cell(self, info: Any) -> None:
        copy = self._copy()
        if copy is None:
            return
        try:
            count = getattr(self.ipython, "execution_count", None)
            update_next_action(copy, notebook=self.notebook, cell_id=getattr(info, "cell_id", None),
                               execution_count=count if isinstance(count, int) else None,
                               state="running", started=now_iso(), finished=None)
        except OSError:
            pass  # recording where work stands must never break the cell itself

    def post_run_cell(self, result: Any) -> None:
        copy = self._copy()
        if copy is None:
            return
        failed = bool(getattr(result, "error_before_exec", None) or getattr(result, "error_in_exec", None))
        try:
            update_next_action(copy, state="failed" if failed else "finished", finished=now_iso())
        except OSError:
            pass

    @classmethod
    def install(cls, ipython: Any) -> None:
        cls.uninstall(ipython)
        rec = cls(ipython)
        ipython.events.register("pre_run_cell", rec.pre_run_cell)
        ipython.events.register("post_run_cell", rec.post_run_cell)
        cls._installed = rec

    @classmethod
    def uninstall(cls, ipython: Any) -> None:
        rec = cls._installed
        if rec is not None:
            for name, fn in (("pre_run_cell", rec.pre_run_cell), ("post_run_cell", rec.post_run_cell)):
                try:
                    ipython.events.unregister(name, fn)
                except ValueError:
                    pass
        cls._installed = None
