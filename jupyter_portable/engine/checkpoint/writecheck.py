"""The write check: is a checkpoint on disk finished and sound?

Only headers, trailers, zip directories and marker files are read; tensors are never loaded,
so a multi-GB checkpoint costs a few small reads. ``check_checkpoint`` runs, in order:
exists? -> temporary name? -> quiet window (nothing still writing) -> format check.

What each format check accepts (anything else is refused, with the reason):

- ``torch-zip``: ``torch.save`` since 1.6. The zip central directory reads, one
  ``<folder>/data.pkl`` entry exists, every entry's local header and bytes lie inside the
  file, and the small entries (``data.pkl``, ``version``, ``byteorder`` ...; not ``data/N``)
  pass their CRC-32.
- ``torch-legacy``: ``torch.save(..., _use_new_zipfile_serialization=False)``. Its three
  opening pickles (magic number, protocol, system info) parse and bytes follow them.
  Truncation inside the tensor data cannot be seen without unpickling, so it is not.
- ``safetensors``: the header length fits the file, the header is a JSON object, every
  tensor has dtype, shape and ``data_offsets`` whose span matches dtype x shape (dtypes this
  module does not know skip that size check), spans tile the data section without gap or
  overlap, and ``8 + header + data`` is exactly the file size.
- ``orbax``: a directory without orbax's ``.orbax-checkpoint-tmp`` name holding
  ``commit_success.txt`` (orbax's marker on object stores), or, because on local
  filesystems orbax finishes by an atomic rename, a non-empty ``_CHECKPOINT_METADATA`` at
  the top, or ``_METADATA`` / ``checkpoint`` at the top or in an item folder one level down.
- ``torch-dcp``: ``torch.distributed.checkpoint``: a non-empty ``.metadata`` (written last)
  and at least one ``*.distcp`` file.
- ``deepspeed``: a ``latest`` file naming a tag folder that exists beside it; that folder
  then passes the ``directory`` check.
- ``directory``: not empty; no file carries a temporary mark; every ``.safetensors`` file,
  every zip or legacy torch file with a ``.pt``/``.pth``/``.bin``/``.ckpt`` suffix, and every
  other zip (central directory and entry bounds only) passes its check.
- ``file``: any other single file, sound when not empty.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import pickletools
import stat as statmod
import struct
import time
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from jupyter_portable.core.errors import UsageError

FORMATS = ("torch-zip", "torch-legacy", "safetensors", "orbax", "torch-dcp", "deepspeed", "directory", "file")
DIRECTORY_FORMATS = ("orbax", "torch-dcp", "deepspeed", "directory")

# A name ending in one of these (or holding one followed by ".", "-" or "_", as in
# "model.pt.tmp.4321") is a file its writer has not yet renamed into place.
TEMP_MARKS: tuple[str, ...] = (
    ".tmp",
    ".temp",
    ".part",
    ".partial",
    ".incomplete",
    ".inprogress",
    ".swp",
    "~",
    "orbax-checkpoint-tmp",
)
_ORBAX_TMP = "orbax-checkpoint-tmp"

_ZIP_MAGIC = b"PK\x03\x04"
# Legacy torch.save opens with a protocol-2 pickle of this long integer.
_LEGACY_MAGIC = b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")
_TORCH_SUFFIXES = frozenset({".pt", ".pth", ".bin", ".ckpt"})
_SMALL_ENTRY = 16 << 20
_ST_MAX_HEADER = 100 << 20  # the safetensors library itself refuses larger headers
_ST_ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8, "C64": 8,
}  # fmt: skip


@dataclass(frozen=True)
class WriteCheck:
    """The verdict on one checkpoint path; ``reason`` is None exactly when ``ok``."""

    ok: bool
    format: str
    reason: str | None
    files: tuple[str, ...]
    # each regular file's (size, mtime_ns) as the format check began, by path inside the checkpoint
    # ('' for a single file): what was checked, for whoever holds the files to it afterwards
    held: dict[str, tuple[int, int]] | None = field(default=None, compare=False, repr=False)


def has_temp_mark(path: Path) -> str | None:
    """The temporary-file mark carried by any component of ``path``'s name, or None."""
    for name in Path(path).parts:
        mark = _mark_in(name)
        if mark is not None:
            return mark
    return None


def _mark_in(name: str) -> str | None:
    for mark in TEMP_MARKS:
        # A folder named just ".tmp" is a place to work in, not an unfinished write.
        if name == mark:
            continue
        if mark == _ORBAX_TMP:
            if mark in name:
                return mark
        elif name.endswith(mark) or (mark.startswith(".") and any(mark + sep in name for sep in ".-_")):
            return mark
    return None


def not_a_file(path: Path) -> str | None:
    """Why ``path`` (or, for a directory, anything under it) is neither a regular file nor a
    directory, or None. Only stat is used: opening a FIFO would wait for a writer forever."""
    path = Path(path)

    def kind(full: str) -> str | None:
        try:
            mode = os.stat(full).st_mode  # through a symlink: what a reader would open
        except FileNotFoundError:
            return None  # a broken link; the format check reports it
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # links that lead to each other: nothing to read at the end
                return "a symlink loop (its links lead back to themselves)"
            raise
        if statmod.S_ISREG(mode) or statmod.S_ISDIR(mode):
            return None
        for test, name in ((statmod.S_ISFIFO, "a FIFO (named pipe)"), (statmod.S_ISSOCK, "a socket"),
                           (statmod.S_ISCHR, "a character device"), (statmod.S_ISBLK, "a block device")):
            if test(mode):
                return name
        return "a special file"

    what = kind(str(path))
    if what is not None:
        return f"{path} is {what}, not a regular file or a directory"
    if path.is_dir():
        for dirpath, _dirnames, filenames in os.walk(path):
            for name in sorted(filenames):
                what = kind(os.path.join(dirpath, name))
                if what is not None:
                    rel = (Path(dirpath) / name).relative_to(path).as_posix()
                    return f"'{rel}' in {path} is {what}; a checkpoint holds only regular files and directories"
    return None


def _listing(root: Path) -> tuple[str, ...]:
    """Every non-directory entry under ``root``, as sorted relative POSIX paths."""
    found: list[str] = []
    for dirpath, _dirnames, filenames in os.walk(root):
        base = Path(dirpath).relative_to(root)
        found.extend((base / name).as_posix() for name in filenames)
    return tuple(sorted(found))


_Snapshot = dict[str, tuple[int, int]]


def _snapshot(path: Path) -> _Snapshot | None:
    try:
        if not path.is_dir():
            st = path.stat()
            return {"": (st.st_size, st.st_mtime_ns)}
        snap: _Snapshot = {}
        for rel in _listing(path):
            try:
                st = (path / rel).stat()
            except FileNotFoundError:
                continue  # removed between listing and stat; the next poll reports it
            snap[rel] = (st.st_size, st.st_mtime_ns)
        return snap
    except FileNotFoundError:
        return None


def _describe_change(before: _Snapshot | None, after: _Snapshot | None) -> str:
    if after is None:
        return "it disappeared"
    if before is None:
        return "it appeared"
    added, removed = sorted(after.keys() - before.keys()), sorted(before.keys() - after.keys())
    if added or removed:
        parts = [f"{label} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                 for label, names in (("files appeared", added), ("files disappeared", removed)) if names]
        return " and ".join(parts)
    rel = next(k for k in sorted(after) if after[k] != before[k])
    (old_size, _), (new_size, _) = before[rel], after[rel]
    what = f"'{rel}' " if rel else ""
    if old_size != new_size:
        return f"{what}size changed from {old_size} to {new_size}"
    return f"{what}modification time changed"


def wait_quiet(path: Path, *, quiet_s: float = 2.0, timeout_s: float = 30.0, poll_s: float = 0.2,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> str | None:
    """None once ``path`` (size, mtime, and for a directory its set of files) holds still for
    ``quiet_s``; otherwise why not. A quiet window must begin within ``timeout_s``. ``clock``
    and ``sleep`` are passed in so that tests measure the bound on their own clock."""
    path = Path(path)
    deadline = clock() + timeout_s
    previous = _snapshot(path)
    quiet_since = clock()
    while True:
        remaining = quiet_since + quiet_s - clock()
        if remaining <= 0:
            return None
        sleep(min(poll_s, remaining))
        current = _snapshot(path)
        if current != previous:
            change = _describe_change(previous, current)
            previous, quiet_since = current, clock()
            if quiet_since > deadline:
                return (f"still being written: {change} during the quiet window; it did not hold "
                        f"still for {quiet_s:g} s within {timeout_s:g} s")


def detect_format(path: Path) -> str:
    """The format ``path`` looks like, from its content and marker files; see ``FORMATS``."""
    path = Path(path)
    if path.is_dir():
        return _detect_directory(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(16)
    except OSError:
        size, head = 0, b""
    if head.startswith(_ZIP_MAGIC):
        return "torch-zip"
    if head.startswith(_LEGACY_MAGIC):
        return "torch-legacy"
    if path.suffix == ".safetensors" or _plausible_safetensors(head, size):
        return "safetensors"
    return "file"


def _plausible_safetensors(head: bytes, size: int) -> bool:
    if len(head) < 9:
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return 2 <= n <= size - 8 and head[8:9] == b"{"


def _detect_directory(path: Path) -> str:
    names = set(os.listdir(path))
    items = [path / n for n in names if (path / n).is_dir()]
    if (
        _ORBAX_TMP in path.name
        or names & {"commit_success.txt", "_CHECKPOINT_METADATA", "_METADATA"}
        or any((item / "_METADATA").is_file() for item in items)
    ):
        return "orbax"
    if ".metadata" in names or any(n.endswith(".distcp") for n in names):
        return "torch-dcp"
    if "latest" in names or "zero_to_fp32.py" in names:
        return "deepspeed"
    return "directory"


def check_format(path: Path, fmt: str | None = None) -> str | None:
    """None if ``path`` is a complete, sound checkpoint of ``fmt`` (detected when None), else why not."""
    path = Path(path)
    fmt = detect_format(path) if fmt is None else fmt
    check = _CHECKS.get(fmt)
    if check is None:
        raise UsageError(f"unknown checkpoint format {fmt!r}", hint=f"use one of: {', '.join(FORMATS)}")
    if not path.exists():
        return f"{path} does not exist"
    if (fmt in DIRECTORY_FORMATS) != path.is_dir():
        kind = "a directory" if fmt in DIRECTORY_FORMATS else "a single file"
        return f"a {fmt} checkpoint is {kind}, but {path} is not"
    try:
        return check(path)
    except OSError as exc:
        # Unreadable is not verified; the reason says what stopped us.
        return f"could not read {exc.filename or path}: {exc.strerror or exc}"


def _check_plain_file(path: Path) -> str | None:
    return "empty file" if path.stat().st_size == 0 else None


def _check_safetensors(path: Path) -> str | None:
    size = path.stat().st_size
    if size < 8:
        return f"truncated safetensors file: {size} bytes is too short to hold the 8-byte header length"
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8:
            return (f"truncated or corrupt safetensors file: its header length field says {n} bytes, "
                    f"but only {size - 8} bytes follow it")
        if n > _ST_MAX_HEADER:
            return f"corrupt safetensors file: header length {n} bytes is over safetensors' 100 MB limit"
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except ValueError:
        return f"corrupt safetensors file: its {n}-byte header is not valid JSON"
    if not isinstance(header, dict):
        return "corrupt safetensors file: its header is not a JSON object"
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        problem = _tensor_problem(entry)
        if problem is not None:
            return f"corrupt safetensors file: tensor {name!r} {problem}"
        begin, end = entry["data_offsets"]
        spans.append((begin, end, name))
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position:
            return (f"corrupt safetensors file: tensor {name!r} starts at data byte {begin}, "
                    f"expected {position} (a gap or an overlap between tensors)")
        position = end
    expected = 8 + n + position
    if expected > size:
        return f"truncated safetensors file: header says {expected} bytes, file has {size}"
    if expected < size:
        return f"corrupt safetensors file: header says {expected} bytes, file has {size} (trailing bytes)"
    return None


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _tensor_problem(entry: object) -> str | None:
    if not isinstance(entry, dict):
        return "is not a JSON object"
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        return "has no dtype"
    if not (isinstance(shape, list) and all(_natural(d) for d in shape)):
        return "has no valid shape"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_natural(o) for o in offsets)):
        return "has no valid data_offsets [begin, end]"
    begin, end = offsets
    if begin > end:
        return f"has data_offsets [{begin}, {end}] with begin after end"
    itemsize = _ST_ITEMSIZE.get(dtype)
    needed = None if itemsize is None else math.prod(shape) * itemsize
    if needed is not None and needed != end - begin:
        return f"is {dtype} {shape}, which needs {needed} bytes, but its data_offsets span {end - begin}"
    return None


def _check_torch_zip(path: Path) -> str | None:
    return _check_zip(path, torch=True)


def _check_zip(path: Path, *, torch: bool) -> str | None:
    what = "torch zip file" if torch else "zip file"
    size = path.stat().st_size
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, EOFError, ValueError) as exc:
        return f"truncated or damaged {what}: its central directory cannot be read ({exc})"
    with zf, path.open("rb") as raw:
        infos = zf.infolist()
        pickles = [i for i in infos if i.filename.count("/") == 1 and i.filename.endswith("/data.pkl")]
        if torch and not pickles:
            return "zip file has no <folder>/data.pkl entry, so it is not a torch.save checkpoint"
        for info in infos:
            problem = _entry_out_of_bounds(raw, info, size)
            if problem is not None:
                return f"truncated or damaged {what}: {problem}"
        if not torch:
            return None
        # Tensor payloads (<folder>/data/N) can be gigabytes; CRC-test only the small records.
        small = [i for i in infos if i.filename.split("/")[1:2] != ["data"] and i.file_size <= _SMALL_ENTRY]
        for info in {i.filename: i for i in pickles + small}.values():
            try:
                zf.read(info)  # reading to the end verifies the CRC-32
            except (zipfile.BadZipFile, zlib.error, OSError, ValueError) as exc:
                return f"corrupt torch zip file: entry {info.filename!r} fails its check ({exc})"
    return None


def _entry_out_of_bounds(raw: BinaryIO, info: zipfile.ZipInfo, size: int) -> str | None:
    start = info.header_offset
    if start + 30 > size:
        return f"entry {info.filename!r} starts at byte {start}, past the end of the {size}-byte file"
    raw.seek(start)
    local = raw.read(30)
    if local[:4] != _ZIP_MAGIC:
        return f"entry {info.filename!r} has no local header at byte {start}"
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    end = start + 30 + name_len + extra_len + info.compress_size
    if end > size:
        return f"entry {info.filename!r} ends at byte {end}, past the end of the {size}-byte file"
    return None


def _check_torch_legacy(path: Path) -> str | None:
    with path.open("rb") as f:
        try:
            for _ in range(3):  # magic number, protocol version, system info
                for _op in pickletools.genops(f):
                    pass
        except ValueError as exc:
            return f"truncated or damaged legacy torch file: its opening pickles do not parse ({exc})"
        if not f.read(1):
            return "truncated legacy torch file: it ends right after its header"
    return None


def _check_member(path: Path) -> str | None:
    """The check of one file inside a checkpoint directory, by what it is."""
    if not path.exists():
        return "broken symbolic link"
    with path.open("rb") as f:
        head = f.read(16)
    torchy = path.suffix in _TORCH_SUFFIXES
    if head.startswith(_ZIP_MAGIC):
        return _check_zip(path, torch=torchy)
    if torchy and head.startswith(_LEGACY_MAGIC):
        return _check_torch_legacy(path)
    if path.suffix == ".safetensors":
        return _check_safetensors(path)
    return None


def _check_files(root: Path, files: tuple[str, ...]) -> str | None:
    for rel in files:
        mark = has_temp_mark(Path(rel))
        if mark is not None:
            return f"'{rel}' carries the temporary mark {mark!r}: its writer has not finished"
    for rel in files:
        problem = _check_member(root / rel)
        if problem is not None:
            return f"'{rel}': {problem}"
    return None


def _check_directory(path: Path) -> str | None:
    files = _listing(path)
    if not files:
        return f"empty directory: {path} holds no files"
    return _check_files(path, files)


def _check_orbax(path: Path) -> str | None:
    if _ORBAX_TMP in path.name:
        return f"orbax checkpoint {path.name!r} still has its temporary name: orbax renames it when the save finishes"
    files = _listing(path)
    if "commit_success.txt" not in files:
        markers = [f for f in files if f == "_CHECKPOINT_METADATA"
                   or (f.count("/") <= 1 and f.rsplit("/", 1)[-1] in ("_METADATA", "checkpoint"))]
        if not markers:
            return ("orbax checkpoint has neither commit_success.txt nor _CHECKPOINT_METADATA, _METADATA or "
                    "checkpoint: orbax writes these last, so the save has not finished")
        if all((path / m).stat().st_size == 0 for m in markers):
            return f"orbax checkpoint marker '{markers[0]}' is empty"
    return _check_files(path, files)


def _check_dcp(path: Path) -> str | None:
    files = _listing(path)
    if ".metadata" not in files:
        return ("torch.distributed.checkpoint directory has no .metadata file: it is written after every "
                "rank's data, so the save has not finished")
    if (path / ".metadata").stat().st_size == 0:
        return "torch.distributed.checkpoint directory has an empty .metadata file"
    if not any(f.endswith(".distcp") for f in files):
        return "torch.distributed.checkpoint directory has no .distcp data files"
    return _check_files(path, files)


def _check_deepspeed(path: Path) -> str | None:
    latest = path / "latest"
    if not latest.is_file():
        return ("DeepSpeed checkpoint has no 'latest' file: DeepSpeed writes it after the tag directory, "
                "so the save has not finished")
    with latest.open("rb") as f:
        tag = f.read(4096).decode("utf-8", errors="replace").strip()
    if not tag:
        return "DeepSpeed 'latest' file is empty: it should name the tag directory of the last save"
    if "/" in tag or "\\" in tag or tag in (".", ".."):
        return f"DeepSpeed 'latest' names {tag!r}, which is not a folder name inside the checkpoint"
    if not (path / tag).is_dir():
        return f"DeepSpeed 'latest' names tag {tag!r}, but there is no directory {tag!r} beside it"
    problem = _check_directory(path / tag)
    return None if problem is None else f"tag {tag!r}: {problem}"


_CHECKS: dict[str, Callable[[Path], str | None]] = {
    "torch-zip": _check_torch_zip,
    "torch-legacy": _check_torch_legacy,
    "safetensors": _check_safetensors,
    "orbax": _check_orbax,
    "torch-dcp": _check_dcp,
    "deepspeed": _check_deepspeed,
    "directory": _check_directory,
    "file": _check_plain_file,
}


def check_checkpoint(path: Path, *, quiet_s: float = 2.0, timeout_s: float = 30.0,
                     clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> WriteCheck:
    """Whether ``path`` is a finished, sound checkpoint: exists, no temporary name, quiet, format
    sound. ``clock`` and ``sleep`` time the quiet window (:func:`wait_quiet`)."""
    path = Path(path)

    def verdict(reason: str | None, fmt: str | None = None) -> WriteCheck:
        files = _listing(path) if path.is_dir() else ()
        return WriteCheck(ok=reason is None, format=fmt or detect_format(path), reason=reason, files=files)

    if not path.exists():
        return verdict(f"{path} does not exist")
    special = not_a_file(path)
    if special is not None:  # refused before anything opens it: reading a FIFO never returns
        return WriteCheck(ok=False, format="file", reason=special, files=())
    mark = has_temp_mark(path)
    if mark is not None:
        return verdict(f"{path.name!r} carries the temporary mark {mark!r}: its writer has not finished and renamed it")
    busy = wait_quiet(path, quiet_s=quiet_s, timeout_s=timeout_s, clock=clock, sleep=sleep)
    if busy is not None:
        return verdict(busy)
    held = _regular_files(path)
    fmt = detect_format(path)
    return dataclasses.replace(verdict(check_format(path, fmt), fmt), held=held)


def _regular_files(path: Path) -> dict[str, tuple[int, int]]:
    """Each regular file of ``path`` (a file: ''; a folder: its relative paths) with its size and
    mtime, as lstat sees them (a symlink has no bytes of its own)."""
    out: dict[str, tuple[int, int]] = {}
    for rel in _listing(path) if path.is_dir() else ("",):
        try:
            st = (path / rel).lstat() if rel else path.lstat()
        except FileNotFoundError:
            continue
        if statmod.S_ISREG(st.st_mode):
            out[rel] = (st.st_size, st.st_mtime_ns)
    return out
