"""Trainers that register their own checkpoints: Hugging Face ``Trainer``, PyTorch Lightning,
and plain ``torch.save``.

Each registers exactly what the trainer wrote, with its step, right after the trainer wrote it,
and returns at once (``Workspace.checkpoint_async``): the upload and read-back run beside the
training loop, and "latest" moves only when the read-back holds. While the trainer saves, the
uploads of earlier checkpoints pause, so that the save has the disk and the CPU: no part starts,
and on S3 a part already on its way (or being read back) stops between pieces of 1 MiB.
The trainer's own limits stay the trainer's: ``save_total_limit`` (Hugging Face) and
``save_top_k`` (Lightning) delete old checkpoints as before; one deleted before its upload was
verified is rejected, never verified, and "latest" stays on the last that was.

- :func:`hf_callback` -> a ``transformers.TrainerCallback``: on every ``on_save``, the folder
  ``OUTPUT_DIR/checkpoint-STEP`` the Trainer just finished (and rotated the old ones out).
- :class:`PortableModelCheckpoint` (from :func:`lightning_checkpoint`) -> Lightning's
  ``ModelCheckpoint`` that registers each file right after it saved it.
- :func:`saving` -> ``with saving("ckpt-100.pt", step=100) as ck: torch.save(sd, ck.path)``.

transformers and lightning are imported only when asked for: neither is a dependency.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any

from jupyter_portable.engine.checkpoint.background import CheckpointHandle, queue_for
from jupyter_portable.engine.workspace import Workspace


def _workspace(workspace: Workspace | None, near: str | os.PathLike[str]) -> Workspace:
    return workspace if workspace is not None else Workspace.find(Path(near).parent)


class saving:  # noqa: N801 - used as a context manager, like open()
    """``with saving(path, step=N) as ck: torch.save(state, ck.path)``: once the block ends
    without error, ``ck.path`` is registered (checked, fsynced, then uploaded in the background;
    ``ck.handle.wait()`` waits for "verified"). A block that raises registers nothing."""

    def __init__(self, path: str | os.PathLike[str], *, step: int | None = None, note: str = "",
                 workspace: Workspace | None = None, policy: str | None = None) -> None:
        self.path = Path(path)
        self.step = step
        self.note = note
        self.policy = policy
        self._workspace = workspace
        self.handle: CheckpointHandle | None = None

    def __enter__(self) -> saving:
        # the uploads of earlier checkpoints make way while the trainer saves (never past 2 min)
        self._ws = _workspace(self._workspace, self.path)
        queue_for(self._ws.copy).pause()
        return self

    def __exit__(self, kind: type[BaseException] | None, _exc: BaseException | None,
                 _tb: TracebackType | None) -> None:
        queue_for(self._ws.copy).resume()
        if kind is not None:
            return
        ws = self._ws
        # the writer returned: nothing is still writing it, so no quiet window is waited for
        self.handle = ws.checkpoint_async(self.path, step=self.step, note=self.note, quiet_s=0,
                                          policy=self.policy)


def hf_callback(workspace: Workspace | None = None, *, policy: str | None = None) -> Any:
    """A ``transformers.TrainerCallback`` registering each checkpoint folder the Trainer saves
    (``trainer.add_callback(hf_callback())`` or ``Trainer(callbacks=[hf_callback()])``)."""
    from transformers import TrainerCallback

    class PortableCallback(TrainerCallback):  # type: ignore[misc]
        """Registers ``OUTPUT_DIR/checkpoint-STEP`` on every save, on the main process only."""

        def __init__(self) -> None:
            self.handles: list[CheckpointHandle] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **_kwargs: Any) -> None:
            if control.should_save and state.is_world_process_zero:  # the Trainer saves next
                queue_for(_workspace(workspace, Path(args.output_dir) / "x").copy).pause()

        def on_save(self, args: Any, state: Any, control: Any, **_kwargs: Any) -> None:
            if not state.is_world_process_zero:
                return
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            ws = _workspace(workspace, folder)
            queue_for(ws.copy).resume()
            if not folder.is_dir():
                return  # nothing written by this save (a save_strategy that wrote elsewhere)
            self.handles.append(ws.checkpoint_async(folder, step=int(state.global_step), quiet_s=0,
                                                    note="transformers Trainer", policy=policy))

    return PortableCallback()


def lightning_checkpoint(*args: Any, workspace: Workspace | None = None, policy: str | None = None,
                         **kwargs: Any) -> Any:
    """Lightning's ``ModelCheckpoint(*args, **kwargs)`` that registers each checkpoint file
    right after it saved it, with ``trainer.global_step`` (put it in ``Trainer(callbacks=...)``
    where the ``ModelCheckpoint`` would go)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    class PortableModelCheckpoint(ModelCheckpoint):  # type: ignore[misc]
        handles: list[CheckpointHandle]

        def _save_checkpoint(self, trainer: Any, filepath: str) -> None:
            ws = _workspace(workspace, filepath) if trainer.is_global_zero else None
            if ws is not None:
                queue_for(ws.copy).pause()  # the uploads in flight make way for this save
            try:
                super()._save_checkpoint(trainer, filepath)  # written: trainer.save_checkpoint returned
            finally:
                if ws is not None:
                    queue_for(ws.copy).resume()
            if ws is None or not os.path.isfile(filepath):
                return
            self.handles.append(ws.checkpoint_async(filepath, step=int(trainer.global_step), quiet_s=0,
                                                    note="Lightning ModelCheckpoint", policy=policy))

    cb = PortableModelCheckpoint(*args, **kwargs)
    cb.handles = []
    return cb


__all__ = ["hf_callback", "lightning_checkpoint", "saving"]
