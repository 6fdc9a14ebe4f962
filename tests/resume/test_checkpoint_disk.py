"""A checkpoint to a nearly full disk: a clear error before writing, the previous one resumes,
leftovers of dead saves are removed by the next save."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer
from trainers import quiet_trainer

import rb_lightning.persist.files as checkpoint_files
from rb_lightning import ReplayBufferDataModule
from rb_lightning.buffers.state import buffer_state
from rb_lightning.errors import NotEnoughDiskSpaceError
from rb_lightning.persist.beside import BufferDumpRequest

DISK_BYTES = 4 * 1024**2
CAPACITY = 16_000  # 264 B an item: a full buffer (4.2 MB) would not fit the disk at all


def _items(n: int, start: int) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict(
        {"id": ids, "obs": (ids.float() / 1e4).unsqueeze(-1).expand(n, 64).clone()},
        batch_size=[n],
    )


class _Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(64, 1)
        self.start_ids: list[int] = []

    def on_train_start(self) -> None:
        rb = self.trainer.datamodule.replay_buffer
        self.start_ids = rb[torch.arange(len(rb))]["id"].tolist()

    def training_step(self, batch, batch_idx):
        return self.net(batch["obs"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(root: Path, rb: ReplayBuffer, steps: int, ckpt_path: Path | None = None):
    datamodule = ReplayBufferDataModule(
        rb, batch_size=16, num_batches=None, checkpoint_inline_max_bytes=0
    )
    trainer = quiet_trainer(
        default_root_dir=str(root),
        max_steps=steps,
        limit_train_batches=steps,
    )
    model = _Model()
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer, model


def _nearly_full_disk_scenario(disk: Path, work: Path) -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(CAPACITY), generator=torch.Generator())
    rb.extend(_items(2_000, 0))
    trainer, _ = _fit(work, rb, steps=2)
    trainer.save_checkpoint(disk / "a.ckpt")

    # A save that died (SIGBUS, kill) left its staging directory behind, taking the space
    # the next save needs: that save only fits once the leftover is gone.
    dead = disk / "crashed.ckpt.buffer" / "0123abcd.tmp"
    dead.mkdir(parents=True)
    (dead / "obs.memmap").write_bytes(b"\0" * 3_000_000)
    rb.extend(_items(1_000, 2_000))
    trainer.save_checkpoint(disk / "b.ckpt")
    assert not dead.exists()
    saved_ids = rb[torch.arange(len(rb))]["id"].tolist()

    rb.extend(_items(9_000, 3_000))  # 12,000 items: 3.2 MB, more than is left
    with pytest.raises(NotEnoughDiskSpaceError) as caught:
        trainer.save_checkpoint(disk / "c.ckpt")
    message = str(caught.value)
    assert "MB free" in message and "needs about" in message and str(disk) in message
    assert "checkpoint_inline_max_bytes" in message and "dirpath" in message
    assert not (disk / "c.ckpt").exists()
    assert not list(disk.rglob("*.tmp"))

    # The previous checkpoint is intact: a new process resumes from it.
    fresh = ReplayBuffer(storage=LazyTensorStorage(CAPACITY), generator=torch.Generator())
    resumed_trainer, resumed = _fit(work / "resumed", fresh, steps=3, ckpt_path=disk / "b.ckpt")
    assert resumed.start_ids == saved_ids
    assert fresh.writer._write_count == 3_000
    assert resumed_trainer.global_step == 3


def test_nearly_full_tmpfs(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(disk)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    # In a child process: were the space check to regress, the dump would die of SIGBUS
    # (exit 135) mid-write, which would take the whole pytest session down with it.
    here = Path(__file__).parent
    code = (
        f"import sys; sys.path[:0] = [{str(here)!r}, {str(here.parent)!r}]\n"
        "from pathlib import Path\n"
        "from test_checkpoint_disk import _nearly_full_disk_scenario\n"
        f"_nearly_full_disk_scenario(Path({str(disk)!r}), Path({str(tmp_path / 'work')!r}))\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
        )
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    assert done.returncode == 0, (
        f"exit {done.returncode} (-7 or 135: SIGBUS, the disk filled up mid-write)\n{done.stderr[-4000:]}"
    )


def _used_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def test_nearly_full_disk_by_free_space_probe(tmp_path, monkeypatch):
    # The same disk, emulated: our free-space probe reports DISK_BYTES minus what is used.
    disk = tmp_path / "disk"
    disk.mkdir()
    monkeypatch.setattr(
        checkpoint_files, "free_disk_bytes", lambda path: DISK_BYTES - _used_bytes(disk)
    )
    _nearly_full_disk_scenario(disk, tmp_path / "work")


def test_inline_dump_checks_the_temporary_directory(monkeypatch):
    rb = ReplayBuffer(storage=LazyTensorStorage(1_000))
    rb.extend(_items(500, 0))
    monkeypatch.setattr(checkpoint_files, "free_disk_bytes", lambda path: 1_000)
    with pytest.raises(NotEnoughDiskSpaceError, match="TMPDIR") as caught:
        buffer_state(rb)
    assert "checkpoint_inline_max_bytes" in str(caught.value)


def test_failed_dump_removes_its_staging_directory(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    rb.extend(_items(10, 0))
    request = BufferDumpRequest(rb, pending_batches=[{"not": "a TensorDict"}])
    with pytest.raises(TypeError, match="pending batch 0"):
        request.write(tmp_path / "x.ckpt.buffer")  # fails after the storage was written
    assert list((tmp_path / "x.ckpt.buffer").iterdir()) == []
