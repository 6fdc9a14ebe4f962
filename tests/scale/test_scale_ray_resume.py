"""A Ray-served buffer is checkpointed with the run by one process and restored on resume.

Local Ray cluster on loopback; the test owns the named buffer actor. One process: the
actor is brought back to its saved length and priorities, whether it changed since or
is a fresh actor. Two gloo DDP ranks (scripts/ray_resume_ddp.py): one dump per
checkpoint, and after the resume both ranks see the restored content.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from rb_testdata import id_items
from script_runs import rank_results, run_script
from torchrl.data import LazyTensorStorage, PrioritizedSampler, RandomSampler, ReplayBuffer
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.buffers.reader import SavedBuffer
from rb_lightning.errors import BufferCheckpointError

ray = pytest.importorskip("ray")
from rb_lightning.distributed.ray import named_actor_config, release_semaphore_names  # noqa: E402

pytestmark = pytest.mark.ray

CAPACITY = 200


def _owner(name: str, sampler: str = "prioritized", fill: int = 40) -> ReplayBuffer:
    make_sampler = (
        partial(PrioritizedSampler, CAPACITY, alpha=0.8, beta=0.5)
        if sampler == "prioritized"
        else RandomSampler
    )
    rb = ReplayBuffer(
        storage=partial(LazyTensorStorage, CAPACITY),
        sampler=make_sampler,
        service_backend="ray",
        service_backend_options={"remote_config": named_actor_config(name)},
    )
    release_semaphore_names(rb)  # an owner outside a DataModule, as a script's
    if fill:
        rb.extend(id_items(torch.arange(fill)))
    return rb


def _snapshot(rb: ReplayBuffer) -> dict:
    """Length, write count, ids and priorities (the sampler's sum tree) of the actor's buffer."""
    state = rb.state_dict()
    return {
        "len": len(rb),
        "write_count": rb.write_count,
        "ids": rb[torch.arange(len(rb))]["id"].tolist(),
        # The sum tree is a C++ segment tree: index it (torch.as_tensor on it crashes).
        "priorities": state["_sampler"]["_sum_tree"][torch.arange(CAPACITY)].tolist(),
    }


class Prioritize(L.LightningModule):
    """Writes 2 items and updates the sampled items' priorities every step."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.start: dict | None = None

    def on_train_start(self) -> None:
        self.start = _snapshot(self.trainer.datamodule.replay_buffer)

    def training_step(self, batch, batch_idx):
        datamodule = self.trainer.datamodule
        datamodule.replay_buffer.extend(id_items(torch.arange(2) + 1_000 + 2 * self.global_step))
        datamodule.update_priority(batch, (batch["id"] % 7 + 1 + self.global_step).float())
        return self.layer(batch["obs"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-4)


def _fit(rb: ReplayBuffer, root: Path, max_steps: int, ckpt: Path | None = None) -> Prioritize:
    trainer = quiet_trainer(
        default_root_dir=str(root),
        max_steps=max_steps,
        callbacks=[ModelCheckpoint(dirpath=root / "ckpt", save_last=True, every_n_train_steps=2)],
    )
    module = Prioritize()
    datamodule = ReplayBufferDataModule(rb, batch_size=8, num_batches=None)
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(ckpt) if ckpt else None)
    return module


def test_ray_buffer_is_restored_to_its_saved_length_and_priorities(cluster, tmp_path):
    owner = _owner("resume")
    try:
        _fit(owner, tmp_path, max_steps=4)
        saved = _snapshot(owner)
        assert saved["len"] == 40 + 2 * 4
        checkpoint = tmp_path / "ckpt" / "epoch=0-step=4.ckpt"
        versions = list((tmp_path / "ckpt" / "epoch=0-step=4.ckpt.buffer").iterdir())
        assert len(versions) == 1 and (versions[0] / "sampler" / "sumtree.memmap").exists()
        # What the actor saved reads back without Ray, e.g. for rb-lightning-export-hf.
        exported = SavedBuffer.read(checkpoint)
        assert "a Ray buffer's content, saved beside it by its actor" in exported.kind
        assert exported.replay_buffer[:]["id"].tolist() == saved["ids"]

        # The same actor, changed since the checkpoint: the resume puts the saved one back.
        owner.extend(id_items(torch.arange(30) + 5_000))
        owner.update_priority(torch.arange(len(owner)), torch.full((len(owner),), 50.0))
        assert _snapshot(owner) != saved
        resumed = _fit(owner, tmp_path / "again", max_steps=5, ckpt=checkpoint)
        assert resumed.start == saved

        # A fresh actor (a new cluster): restored the same way.
        owner.close()
        owner = _owner("resume", fill=0)
        resumed = _fit(owner, tmp_path / "fresh", max_steps=5, ckpt=checkpoint)
        assert resumed.start == saved
    finally:
        owner.close()

    other = _owner("resume_random", sampler="random", fill=0)
    try:
        with pytest.raises(BufferCheckpointError, match="saved sampler=PrioritizedSampler"):
            _fit(other, tmp_path / "mismatch", max_steps=5, ckpt=checkpoint)
    finally:
        other.close()


def _ddp(out_dir: Path, address: str, max_steps: int, ckpt: Path | None = None) -> list[dict]:
    run_script(
        "ray_resume_ddp.py", out_dir, address, "ddp_resume", max_steps, *([ckpt] if ckpt else [])
    )
    return rank_results(out_dir)


def test_ddp_ranks_write_the_shared_buffer_once_and_both_see_it_restored(cluster, tmp_path):
    owner = _owner("ddp_resume")
    try:
        _ddp(tmp_path, cluster, max_steps=3)
        saved = _snapshot(owner)
        assert saved["len"] == 40 + 2 * 3  # rank 0 writes 2 items per step
        # Every step's checkpoint (save_top_k=-1) and last.ckpt: one dump each, no other.
        checkpoints = sorted((tmp_path / "ckpt").glob("*.ckpt"))
        assert len(checkpoints) == 4
        dumps = sorted(path.parent for path in tmp_path.rglob("manifest.json"))
        assert dumps == sorted(
            version for path in checkpoints for version in Path(f"{path}.buffer").iterdir()
        )
        assert len(dumps) == 4

        owner.extend(id_items(torch.arange(10) + 5_000))  # the collector went on after the save
        ranks = _ddp(tmp_path, cluster, max_steps=5, ckpt=tmp_path / "ckpt" / "last.ckpt")
        for rank in ranks:
            assert rank["step"] == 3
            assert rank["len"] == saved["len"], f"rank {rank['rank']} sampled before the restore"
            assert rank["priorities"] == saved["priorities"]
    finally:
        owner.close()
