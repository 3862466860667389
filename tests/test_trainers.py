"""The trainers register their own checkpoints (issue 44): a Hugging Face Trainer and a Lightning
Trainer each train a tiny model built from a config on the CPU (no weights downloaded), saving
every step under the trainer's own limit; plain torch.save goes through a context manager."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from jupyter_portable.engine.checkpoint.background import queue_for
from jupyter_portable.engine.trees import iter_under
from jupyter_portable.engine.workspace import Workspace
from jupyter_portable.interfaces.trainers import hf_callback, lightning_checkpoint, saving


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace.init(tmp_path / "work", f"file://{tmp_path}/store")


def local_files(folder: Path, root: Path) -> set[str]:
    if folder.is_file():
        return {folder.relative_to(root).as_posix()}
    return {(Path(d) / n).relative_to(root).as_posix() for d, _ds, names in os.walk(folder) for n in names}


def check_registered(ws: Workspace, handles: list, expected: dict[str, int]) -> None:
    """Every save was registered with its step; the latest verified one is the trainer's last
    save and the store holds exactly the files the trainer wrote there, byte for byte."""
    assert queue_for(ws.copy).drain(120)
    for h in handles:
        assert h.finished and h.state in ("verified", "rejected", "skipped"), h.describe()
        if h.state == "rejected":  # deleted by the trainer's own limit before it was verified
            assert "removed before its upload was verified" in (h.reason or ""), h.reason
    assert {h.path: h.step for h in handles} == expected
    records = ws.checkpoints()
    assert all(expected[r.path] == r.step for r in records)
    last = max(expected, key=lambda p: expected[p])
    latest = ws.latest_checkpoint()
    assert latest is not None and (latest.path, latest.step) == (last, expected[last])
    manifest = ws.store.read_manifest(ws.workspace_id, latest.version)
    stored = {e.path: e for e in iter_under(ws.store, manifest.tree, last)}
    assert set(stored) == local_files(ws.root / last, ws.root)
    for path, e in stored.items():
        assert ws.store.read_file_range(e, 0, e.size) == (ws.root / path).read_bytes(), path


def test_hugging_face_trainer_registers_each_checkpoint_folder_within_save_total_limit(ws: Workspace) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    data = [{"input_ids": torch.randint(0, 32, (8,)), "labels": torch.randint(0, 32, (8,))} for _ in range(8)]
    out = ws.root / "out"
    args = TrainingArguments(output_dir=str(out), max_steps=4, save_steps=1, save_total_limit=2,
                             per_device_train_batch_size=2, report_to=[], use_cpu=True, logging_steps=100,
                             disable_tqdm=True, dataloader_num_workers=0)
    callback = hf_callback(ws, policy="keep-both")
    Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()
    # the trainer's limit is the trainer's: two folders kept on disk, the older ones it deleted
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-3",
                                                                                        "checkpoint-4"]
    check_registered(ws, callback.handles, {f"out/checkpoint-{n}": n for n in range(1, 5)})


def test_lightning_model_checkpoint_registers_each_file_it_saves_within_save_top_k(ws: Workspace) -> None:
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _i: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2)
    ckpts = ws.root / "ckpts"
    cb = lightning_checkpoint(dirpath=str(ckpts), filename="{step}", every_n_train_steps=1, save_top_k=2,
                              monitor="step", mode="max", workspace=ws, policy="keep-both")
    trainer = L.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[cb], default_root_dir=str(ws.root))
    trainer.fit(Tiny(), loader)
    assert sorted(p.name for p in ckpts.iterdir()) == ["step=3.ckpt", "step=4.ckpt"]
    check_registered(ws, cb.handles, {f"ckpts/step={n}.ckpt": n for n in range(1, 5)})


def test_torch_save_through_the_context_manager_registers_the_file_and_a_failed_save_nothing(
        ws: Workspace) -> None:
    state = torch.nn.Linear(8, 4).state_dict()
    with saving(ws.root / "ckpt-7.pt", step=7) as ck:
        torch.save(state, ck.path)
    assert ck.handle is not None
    record = ck.handle.wait(60)
    assert record is not None and record.verified and (record.path, record.step) == ("ckpt-7.pt", 7)
    with pytest.raises(RuntimeError, match="out of memory"), saving(ws.root / "ckpt-8.pt", step=8) as bad:
        torch.save(state, bad.path)
        raise RuntimeError("CUDA out of memory")
    assert bad.handle is None
    assert [r.path for r in ws.checkpoints()] == ["ckpt-7.pt"]
