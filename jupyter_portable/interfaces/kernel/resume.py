"""Resume cells from the kernel's side: ``%workspace resume-tag`` and ``%workspace latest --load``.

A cell tagged ``portable-resume`` runs by itself on the new kernel after a Continue (the
notebook does it: labextension/src/notebook.ts). The kernel cannot edit the notebook, so
``resume-tag`` sends a display output of its own MIME type that the notebook reads and turns
into the tag on the cell that ran it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.display import display

RESUME_TAG = "portable-resume"
TAG_MIME = "application/vnd.jupyter-portable.resume-tag+json"
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar")


def check_unchanged(path: Path, record: Any) -> None:
    """UsageError unless the file at ``path`` still holds the bytes ``record`` verified: a
    checkpoint file written again after it was verified (a save whose check was refused, a plain
    overwrite) is not that checkpoint any more, and loading it would hand over other bytes."""
    from jupyter_portable.store.repo import hash_file

    if record.kind != "file" or not path.is_file():
        return  # a directory is checked by its framework's loader; a missing file says so on load
    if hash_file(path) != record.hash:
        step = f" step {record.step}" if record.step is not None else ""
        raise UsageError(f"--load: {record.path} changed since its checkpoint{step} was verified in version "
                         f"{record.version}; it is not that checkpoint any more. Register it again "
                         f"(`%workspace checkpoint {record.path}`), or restore version {record.version} to get "
                         "the verified bytes back")


def load_checkpoint(path: Path) -> Any:
    """The checkpoint at ``path`` as objects: safetensors for ``.safetensors`` (torch tensors when
    torch is there, else numpy arrays), ``torch.load(weights_only=True)`` for anything else."""
    if path.is_dir():
        raise UsageError(f"--load: {path.name} is a directory checkpoint; load it with your framework's loader")
    if not path.is_file():
        raise UsageError(f"--load: {path} is not in this copy yet")
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            try:
                from safetensors.numpy import load_file  # type: ignore[assignment]
            except ImportError as exc:
                raise UsageError("--load: install safetensors to load .safetensors checkpoints") from exc
        return load_file(str(path))
    try:
        import torch
    except ImportError as exc:
        raise UsageError(f"--load: {path.name} needs torch (pip install torch), or save it as .safetensors") from exc
    try:
        return torch.load(str(path), weights_only=True, map_location="cpu" if not torch.cuda.is_available() else None)
    except Exception as exc:  # torch raises plain Exceptions (UnpicklingError, RuntimeError) for unsafe files
        raise UsageError(f"--load: {path.name} does not load with torch.load(weights_only=True): "
                         f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc


def resume_tag(*, on: bool) -> None:
    """Ask the notebook to tag (or untag) the running cell ``portable-resume``."""
    plain = (f"this cell is tagged {RESUME_TAG}: it runs by itself after a Continue" if on
             else f"the {RESUME_TAG} tag is removed from this cell")
    plain += " (needs the jupyter-portable JupyterLab extension; else set the tag in the property inspector)"
    display({TAG_MIME: {"tag": RESUME_TAG, "on": on}, "text/plain": plain}, raw=True)


__all__ = ["RESUME_TAG", "TAG_MIME", "load_checkpoint", "resume_tag"]
