"""The write check accepts finished checkpoints and refuses unfinished or damaged ones, saying why.

Checkpoints are written by the real libraries (safetensors, torch.save, torch.distributed.checkpoint);
layouts the tests cannot produce without a cluster (orbax, DeepSpeed) are built by hand in their shape.
"""

from __future__ import annotations

import json
import shutil
import struct
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import torch
import torch.distributed.checkpoint as dcp

from jupyter_portable.core.errors import UsageError
from jupyter_portable.engine.checkpoint.writecheck import (
    WriteCheck,
    check_checkpoint,
    check_format,
    detect_format,
    has_temp_mark,
    wait_quiet,
)


def truncated_copy(src: Path, dst: Path, size: int) -> Path:
    dst.write_bytes(src.read_bytes()[:size])
    return dst


def refused(path: Path, **kwargs: float) -> str:
    result = check_checkpoint(path, quiet_s=kwargs.get("quiet_s", 0.0), timeout_s=kwargs.get("timeout_s", 1.0))
    assert not result.ok, result
    assert result.reason
    return result.reason


@pytest.fixture
def st_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    tensors = {"weight": np.arange(1000, dtype=np.float32).reshape(10, 100), "bias": np.zeros(10, dtype=np.float16)}
    safetensors.numpy.save_file(tensors, str(path), metadata={"step": "10"})
    return path


@pytest.fixture
def torch_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.pt"
    torch.save(torch.nn.Linear(16, 8).state_dict(), path)
    return path


def write_safetensors(path: Path, header: dict[str, object], data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


# --- safetensors ---------------------------------------------------------------------------


def test_real_safetensors_file_verifies(st_file: Path) -> None:
    result = check_checkpoint(st_file, quiet_s=0)
    assert result == WriteCheck(ok=True, format="safetensors", reason=None, files=())


def test_safetensors_short_by_one_byte_is_refused_with_both_sizes(st_file: Path, tmp_path: Path) -> None:
    size = st_file.stat().st_size
    cut = truncated_copy(st_file, tmp_path / "cut.safetensors", size - 1)
    assert refused(cut) == f"truncated safetensors file: header says {size} bytes, file has {size - 1}"


def test_safetensors_cut_in_half_is_refused(st_file: Path, tmp_path: Path) -> None:
    size = st_file.stat().st_size
    cut = truncated_copy(st_file, tmp_path / "half.safetensors", size // 2)
    assert refused(cut).startswith("truncated safetensors file: header says")


def test_safetensors_cut_inside_its_header_is_refused(st_file: Path, tmp_path: Path) -> None:
    cut = truncated_copy(st_file, tmp_path / "stub.safetensors", 20)
    assert "header length field says" in refused(cut)


@pytest.mark.parametrize(
    ("new_length", "expected"),
    [(2**62, "header length field says 4611686018427387904 bytes"), (None, "is not valid JSON")],
)
def test_safetensors_with_corrupt_header_length_is_refused(
    st_file: Path, tmp_path: Path, new_length: int | None, expected: str
) -> None:
    raw = bytearray(st_file.read_bytes())
    (length,) = struct.unpack("<Q", raw[:8])
    raw[:8] = struct.pack("<Q", length - 5 if new_length is None else new_length)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(bytes(raw))
    assert expected in refused(bad)


def test_safetensors_whose_sizes_disagree_with_dtype_and_shape_is_refused(tmp_path: Path) -> None:
    path = write_safetensors(
        tmp_path / "x.safetensors", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4
    )
    assert check_format(path) == (
        "corrupt safetensors file: tensor 'a' is F32 [2], which needs 8 bytes, but its data_offsets span 4"
    )


def test_safetensors_with_overlapping_tensors_or_trailing_bytes_is_refused(tmp_path: Path) -> None:
    entry = {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}
    overlap = write_safetensors(tmp_path / "o.safetensors", {"a": entry, "b": entry}, b"\0" * 4)
    assert "gap or an overlap" in (check_format(overlap) or "")
    trailing = write_safetensors(tmp_path / "t.safetensors", {"a": entry}, b"\0" * 6)
    assert "trailing bytes" in (check_format(trailing) or "")


def test_safetensors_is_recognised_by_its_header_without_the_suffix(st_file: Path, tmp_path: Path) -> None:
    renamed = tmp_path / "weights.data"
    shutil.copy(st_file, renamed)
    assert detect_format(renamed) == "safetensors"
    assert check_format(renamed) is None


# --- torch.save ----------------------------------------------------------------------------


def test_real_torch_save_verifies(torch_file: Path) -> None:
    assert check_checkpoint(torch_file, quiet_s=0) == WriteCheck(ok=True, format="torch-zip", reason=None, files=())


def test_truncated_torch_save_is_refused_for_its_central_directory(torch_file: Path, tmp_path: Path) -> None:
    cut = truncated_copy(torch_file, tmp_path / "cut.pt", torch_file.stat().st_size - 100)
    reason = refused(cut)
    assert reason.startswith("truncated or damaged torch zip file: its central directory cannot be read")


def test_zip_without_data_pkl_is_not_a_torch_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("model/version", "3\n")
        zf.writestr("model/data/0", b"\0" * 64)
    assert detect_format(path) == "torch-zip"
    assert "no <folder>/data.pkl entry" in refused(path)


def test_torch_save_with_a_flipped_byte_in_data_pkl_fails_its_crc(torch_file: Path) -> None:
    with zipfile.ZipFile(torch_file) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith("/data.pkl"))
    raw = bytearray(torch_file.read_bytes())
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
    raw[info.header_offset + 30 + name_len + extra_len + 10] ^= 0xFF
    torch_file.write_bytes(bytes(raw))
    assert "fails its check (Bad CRC-32" in refused(torch_file)


def test_legacy_torch_save_verifies_and_its_stub_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "old.pt"
    torch.save({"w": torch.ones(3)}, path, _use_new_zipfile_serialization=False)
    assert (detect_format(path), check_format(path)) == ("torch-legacy", None)
    stub = truncated_copy(path, tmp_path / "stub.pt", 30)
    assert refused(stub).startswith("truncated or damaged legacy torch file")


# --- orbax ---------------------------------------------------------------------------------


def orbax_step(root: Path, name: str, *, markers: tuple[str, ...]) -> Path:
    step = root / name
    (step / "default" / "ocdbt.process_0").mkdir(parents=True)
    (step / "default" / "manifest.ocdbt").write_bytes(b"\1" * 32)
    (step / "default" / "ocdbt.process_0" / "d").mkdir()
    (step / "default" / "ocdbt.process_0" / "d" / "abc123").write_bytes(b"\2" * 256)
    for marker in markers:
        (step / marker).write_text('{"item_handlers": {"default": "PyTreeCheckpointHandler"}}')
    return step


@pytest.mark.parametrize(
    "markers", [("commit_success.txt",), ("_CHECKPOINT_METADATA",), ("default/_METADATA",)]
)
def test_orbax_step_with_a_marker_verifies(tmp_path: Path, markers: tuple[str, ...]) -> None:
    step = orbax_step(tmp_path, "step_10", markers=markers)
    result = check_checkpoint(step, quiet_s=0)
    assert (result.ok, result.format, result.reason) == (True, "orbax", None)
    assert "default/ocdbt.process_0/d/abc123" in result.files
    assert list(result.files) == sorted(result.files)


def test_orbax_step_without_any_marker_is_refused_as_orbax(tmp_path: Path) -> None:
    step = orbax_step(tmp_path, "step_10", markers=())
    assert detect_format(step) == "directory"
    assert "neither commit_success.txt nor _CHECKPOINT_METADATA" in (check_format(step, "orbax") or "")


def test_orbax_step_still_under_its_temporary_name_is_refused(tmp_path: Path) -> None:
    step = orbax_step(tmp_path, "step_10.orbax-checkpoint-tmp-1712345678", markers=("_CHECKPOINT_METADATA",))
    assert "temporary mark 'orbax-checkpoint-tmp'" in refused(step)
    assert "still has its temporary name" in (check_format(step) or "")


def test_orbax_item_still_under_its_temporary_name_is_refused(tmp_path: Path) -> None:
    step = orbax_step(tmp_path, "step_10", markers=("_CHECKPOINT_METADATA",))
    (step / "default").rename(step / "default.orbax-checkpoint-tmp-99")
    assert "'default.orbax-checkpoint-tmp-99/manifest.ocdbt' carries the temporary mark" in refused(step)


# --- torch.distributed.checkpoint ----------------------------------------------------------


@pytest.fixture
def dcp_dir(tmp_path: Path) -> Path:
    path = tmp_path / "dcp_step_5"
    with warnings.catch_warnings():
        # torch 2.x saves in a single process without init_process_group, and warns that it does.
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(torch.nn.Linear(16, 8).state_dict(), checkpoint_id=path)
    return path


def test_real_dcp_save_verifies(dcp_dir: Path) -> None:
    result = check_checkpoint(dcp_dir, quiet_s=0)
    assert (result.ok, result.format) == (True, "torch-dcp")
    assert ".metadata" in result.files and any(f.endswith(".distcp") for f in result.files)


def test_dcp_without_metadata_is_refused(dcp_dir: Path) -> None:
    (dcp_dir / ".metadata").unlink()
    assert refused(dcp_dir).startswith("torch.distributed.checkpoint directory has no .metadata file")


def test_dcp_with_empty_metadata_or_no_data_is_refused(dcp_dir: Path) -> None:
    (dcp_dir / ".metadata").write_bytes(b"")
    assert "empty .metadata" in refused(dcp_dir)
    (dcp_dir / ".metadata").write_bytes(b"x")
    for data in dcp_dir.glob("*.distcp"):
        data.unlink()
    assert "no .distcp data files" in refused(dcp_dir)


# --- DeepSpeed -----------------------------------------------------------------------------


@pytest.fixture
def ds_dir(tmp_path: Path, torch_file: Path) -> Path:
    root = tmp_path / "ds"
    tag = root / "global_step10"
    tag.mkdir(parents=True)
    shutil.copy(torch_file, tag / "mp_rank_00_model_states.pt")
    shutil.copy(torch_file, tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (root / "zero_to_fp32.py").write_text("# recovery script\n")
    (root / "latest").write_text("global_step10")
    return root


def test_deepspeed_with_latest_naming_its_tag_verifies(ds_dir: Path) -> None:
    result = check_checkpoint(ds_dir, quiet_s=0)
    assert (result.ok, result.format, result.reason) == (True, "deepspeed", None)
    assert "global_step10/mp_rank_00_model_states.pt" in result.files


def test_deepspeed_without_latest_is_refused(ds_dir: Path) -> None:
    (ds_dir / "latest").unlink()
    assert refused(ds_dir).startswith("DeepSpeed checkpoint has no 'latest' file")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("global_step20\n", "names tag 'global_step20', but there is no directory"),
        ("  \n", "'latest' file is empty"),
        ("../elsewhere", "not a folder name inside the checkpoint"),
    ],
)
def test_deepspeed_with_bad_latest_is_refused(ds_dir: Path, content: str, expected: str) -> None:
    (ds_dir / "latest").write_text(content)
    assert expected in refused(ds_dir)


def test_deepspeed_tag_with_a_truncated_file_is_refused(ds_dir: Path) -> None:
    states = ds_dir / "global_step10" / "mp_rank_00_model_states.pt"
    truncated_copy(states, states, 200)
    reason = refused(ds_dir)
    assert reason.startswith("tag 'global_step10': 'mp_rank_00_model_states.pt': truncated or damaged torch zip")


# --- generic directories and single files --------------------------------------------------


def test_directory_of_sound_files_verifies_and_lists_them(tmp_path: Path, st_file: Path) -> None:
    model = tmp_path / "hf"
    (model / "sub").mkdir(parents=True)
    shutil.copy(st_file, model / "sub" / "model.safetensors")
    (model / "config.json").write_text("{}")
    (model / "notes.zip.txt").write_text("")  # empty files inside a directory are allowed
    result = check_checkpoint(model, quiet_s=0)
    assert result == WriteCheck(
        ok=True, format="directory", reason=None, files=("config.json", "notes.zip.txt", "sub/model.safetensors")
    )


def test_directory_with_a_truncated_member_names_it(tmp_path: Path, st_file: Path) -> None:
    model = tmp_path / "hf"
    model.mkdir()
    truncated_copy(st_file, model / "model.safetensors", st_file.stat().st_size - 8)
    assert refused(model).startswith("'model.safetensors': truncated safetensors file")


def test_directory_with_a_temp_marked_member_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "hf"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.bin.part").write_bytes(b"x" * 10)
    assert refused(model) == "'model.bin.part' carries the temporary mark '.part': its writer has not finished"


def test_empty_directory_and_empty_file_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert refused(tmp_path / "empty").startswith("empty directory")
    (tmp_path / "blob").write_bytes(b"")
    assert refused(tmp_path / "blob") == "empty file"


def test_unknown_nonempty_file_verifies(tmp_path: Path) -> None:
    (tmp_path / "weights.npy").write_bytes(b"\x93NUMPY" + b"\0" * 100)
    assert check_checkpoint(tmp_path / "weights.npy", quiet_s=0) == WriteCheck(True, "file", None, ())


def test_missing_path_is_refused(tmp_path: Path) -> None:
    result = check_checkpoint(tmp_path / "nope.pt", quiet_s=0)
    assert (result.ok, result.reason) == (False, f"{tmp_path / 'nope.pt'} does not exist")


def test_format_names_are_checked(tmp_path: Path, torch_file: Path) -> None:
    with pytest.raises(UsageError, match="unknown checkpoint format 'keras'"):
        check_format(torch_file, "keras")
    assert check_format(torch_file, "torch-dcp") == f"a torch-dcp checkpoint is a directory, but {torch_file} is not"


# --- temporary names -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "mark"),
    [
        ("model.pt.tmp", ".tmp"),
        ("model.pt.tmp.4321", ".tmp"),
        ("x.part", ".part"),
        ("shard.partial", ".partial"),
        ("model.safetensors.incomplete", ".incomplete"),
        ("notes.ipynb~", "~"),
        (".model.pt.swp", ".swp"),
        ("step_10.orbax-checkpoint-tmp-123/_METADATA", "orbax-checkpoint-tmp"),
        ("run/ckpt.tmp/model.pt", ".tmp"),
        ("model.pt", None),
        ("template.json", None),
        ("parts/model.pt", None),
        (".tmp/model.pt", None),
    ],
)
def test_temp_marks_are_found_in_any_component(name: str, mark: str | None) -> None:
    assert has_temp_mark(Path(name)) == mark


@pytest.mark.parametrize("name", ["model.pt.tmp", "x.part"])
def test_temp_named_files_are_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"x" * 100)
    assert "carries the temporary mark" in refused(tmp_path / name)


# --- the quiet window ----------------------------------------------------------------------


class AppendingClock:
    """A clock of the test's own: each sleep advances it and appends to ``path``, as a writer
    would, until ``stop_at`` on this clock (never, by default). The bound is then measured
    without the wall clock."""

    def __init__(self, path: Path, stop_at: float = float("inf")) -> None:
        self.path, self.now, self.stop_at = path, 0.0, stop_at
        path.write_bytes(b"start")

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.now < self.stop_at:
            with self.path.open("ab") as f:
                f.write(b"more bytes ")


class ShardingClock(AppendingClock):
    """Each sleep writes one more shard into the folder ``path``, as a sharded save does."""

    def __init__(self, path: Path) -> None:
        path.mkdir()
        self.path, self.now, self.stop_at, self.shards = path, 0.0, float("inf"), 0

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        (self.path / f"shard_{self.shards:03}.bin").write_bytes(b"x")
        self.shards += 1


def test_file_still_being_appended_to_is_refused_in_bounded_time(tmp_path: Path) -> None:
    clock = AppendingClock(tmp_path / "stream.bin")
    reason = wait_quiet(clock.path, quiet_s=0.5, timeout_s=1.5, poll_s=0.2, clock=clock, sleep=clock.sleep)
    assert reason is not None
    assert clock.now < 1.5 + 0.5 + 0.3
    assert reason.startswith("still being written: size changed from")
    assert reason.endswith("during the quiet window; it did not hold still for 0.5 s within 1.5 s")


def test_file_whose_writer_stops_within_the_timeout_is_accepted(tmp_path: Path) -> None:
    clock = AppendingClock(tmp_path / "stream.bin", stop_at=0.5)  # its last write at 0.4
    result = check_checkpoint(clock.path, quiet_s=0.5, timeout_s=1.5, clock=clock, sleep=clock.sleep)
    assert (result.ok, result.reason) == (True, None)
    assert clock.path.stat().st_size > len(b"start")
    assert 0.4 + 0.5 - 1e-9 <= clock.now < 1.5  # quiet for the whole window after the last write


def test_directory_gaining_files_is_refused(tmp_path: Path) -> None:
    clock = ShardingClock(tmp_path / "ckpt")
    folder = clock.path
    reason = wait_quiet(folder, quiet_s=0.5, timeout_s=1.0, clock=clock, sleep=clock.sleep)
    assert reason is not None and reason.startswith("still being written: files appeared (shard_")
