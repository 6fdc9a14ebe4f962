"""ShardedRayReplayBuffer: one buffer's distribution, stale priority updates dropped, every
shard saved and spread onto another number of shards, trained from by a DataModule.

One local Ray instance for the module (starting Ray takes seconds on 2 cores).
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, PrioritizedSampler, RandomSampler, ReplayBuffer

from rb_lightning import ReplayBufferDataModule

ray = pytest.importorskip("ray")
from rb_lightning.buffers.handles import resolve_buffer  # noqa: E402
from rb_lightning.distributed import ShardedRayReplayBuffer  # noqa: E402
from rb_lightning.distributed.actor_process import semaphore_names_released  # noqa: E402
from rb_lightning.distributed.sharded import ShardedBuffer  # noqa: E402
from rb_lightning.errors import BufferCheckpointError  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("cluster")]

ITEMS = 60
DRAWS = 30_000
#: chi2.ppf(0.999, df=59): a correct sampler fails the test once in a thousand seeds.
CHI2_999_DF59 = 98.32


@pytest.fixture(scope="module")
def shards():
    """Two 2-shard buffers (uniform, prioritized) for the module: an actor costs seconds."""
    made = {p: ShardedRayReplayBuffer(100, num_shards=2, prioritized=p) for p in (False, True)}
    yield made
    for rb in made.values():
        rb.close()


@pytest.fixture
def uniform(shards):
    shards[False].empty()
    return shards[False]


@pytest.fixture
def prioritized(shards):
    rb = shards[True]
    rb.empty()
    rb.in_flight = 16
    return rb


def _items(start: int, stop: int) -> TensorDict:
    return TensorDict({"id": torch.arange(start, stop)}, batch_size=[stop - start])


def _fill_unevenly(rb) -> None:
    # 45 items in shard 0, 15 in shard 1: the split of each batch must follow the sizes.
    rb.extend(_items(0, 45), shard=0)
    rb.extend(_items(45, 60), shard=1)


def _two_sample_chi2(a: torch.Tensor, b: torch.Tensor) -> float:
    """Chi-square statistic of two equally long samples of ids 0..ITEMS-1 (same law?)."""
    ca = torch.bincount(a, minlength=ITEMS).double()
    cb = torch.bincount(b, minlength=ITEMS).double()
    return float(((ca - cb) ** 2 / (ca + cb)).sum())


def _draw(sample, n: int = DRAWS, batch: int = 500) -> torch.Tensor:
    return torch.cat([sample(batch)["id"] for _ in range(n // batch)])


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_item_distribution_equals_one_buffers(kind, request):
    sharded = request.getfixturevalue(kind)
    prioritized = kind == "prioritized"
    sampler = PrioritizedSampler(100, 0.6, 0.4) if prioritized else RandomSampler()
    single = ReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler)
    single.set_rng(torch.Generator().manual_seed(0))
    _fill_unevenly(sharded)
    single.extend(_items(0, ITEMS))
    assert len(sharded) == ITEMS and sharded.write_count == ITEMS
    assert sharded.shard_lengths() == [45, 15]
    if prioritized:
        # id i gets priority i + 1 in both (global index of id i: its shard's offset + slot)
        ids = torch.arange(ITEMS)
        index = torch.where(ids < 45, ids, ids - 45 + sharded.stride)
        sharded.update_priority(index, (ids + 1).float())
        sharded.flush()
        single.update_priority(ids, (ids + 1).float())
    ours = _draw(sharded.sample)
    theirs = _draw(lambda b: single.sample(b))
    assert _two_sample_chi2(ours, theirs) < CHI2_999_DF59
    if prioritized:
        # Importance weights as one buffer computes them: (p_i / p_min)^-beta over all shards.
        batch = sharded.sample(500)
        expected = (batch["id"] + 1).double().pow(0.6).pow(-0.4).float()
        torch.testing.assert_close(batch["priority_weight"], expected)


def test_priority_update_for_an_overwritten_slot_is_dropped(prioritized):
    rb = prioritized
    rb.in_flight = 1
    rb.extend(_items(0, 50), shard=0)  # shard 0 full: the next write to it wraps around
    rb.extend(_items(50, 60), shard=1)
    batch = rb.sample(512)
    rb.extend(_items(60, 64), shard=0)  # slots 0..3 written again before the update arrives
    stale = int((batch["index"] < 4).sum())
    assert 0 < stale < 512
    dropped_before = rb.dropped_updates
    rb.update_priority(
        batch["index"], torch.full((512,), 50.0), generation=batch["index_generation"]
    )
    rb.flush()
    assert rb.dropped_updates - dropped_before == stale
    items, priority = rb.contents()
    new = items["id"] >= 60
    # the new items keep the priority they were written with; the sampled live ones got 50
    assert torch.all(priority[new] < 50.0 - 1e-3)
    sampled_live = torch.isin(items["index"], batch["index"]) & ~new
    torch.testing.assert_close(
        priority[sampled_live], torch.full_like(priority[sampled_live], 50.0), rtol=1e-4, atol=0
    )


def test_dump_comes_back_onto_another_number_of_shards(tmp_path, prioritized):
    three = ShardedRayReplayBuffer(90, num_shards=3, prioritized=True)
    try:
        _fill_unevenly(prioritized)
        items, _ = prioritized.contents()
        prioritized.update_priority(items["index"], (items["id"] + 1).float())
        prioritized.dumps(tmp_path / "two")
        for source, target in ((tmp_path / "two", three), (tmp_path / "three", prioritized)):
            target.loads(source)
            back, priority = target.contents()
            assert sorted(back["id"].tolist()) == list(range(ITEMS))  # none lost, none twice
            assert max(target.shard_lengths()) - min(target.shard_lengths()) <= 1
            torch.testing.assert_close(priority, (back["id"] + 1).double(), rtol=1e-4, atol=1e-4)
            three.dumps(tmp_path / "three")
        too_small = ShardedRayReplayBuffer(40, num_shards=1, prioritized=True)
        with pytest.raises(BufferCheckpointError, match="capacity >= 60"):
            too_small.loads(tmp_path / "two")
        too_small.close()
    finally:
        three.close()


class _Prioritizing(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch["id"].float().unsqueeze(-1)).pow(2).mean()
        self.trainer.datamodule.update_priority(batch, torch.full((batch.shape[0],), 7.0))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_datamodule_trains_from_the_shards_and_their_priorities_change(prioritized):
    rb = prioritized
    _fill_unevenly(rb)
    assert isinstance(resolve_buffer(rb), ShardedBuffer)
    address = ray.get_runtime_context().gcs_address
    assert (
        resolve_buffer(rb).where() == f"Ray cluster at {address}: 2 buffer shard actors (unnamed)"
    )
    # Each shard's process removed its semaphore names when it was made: none left to remove.
    release = semaphore_names_released()
    assert ray.get([shard.__ray_call__.remote(release) for shard in rb._shards]) == [0, 0]
    dm = ReplayBufferDataModule(rb, batch_size=16, num_batches=None)
    trainer = L.Trainer(
        max_steps=5, logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    trainer.fit(_Prioritizing(), datamodule=dm)
    rb.flush()
    _, priority = rb.contents()
    # updates from training_step reached the shards
    assert int(torch.isclose(priority, torch.tensor(7.0, dtype=torch.double)).sum()) > 0


def test_checkpoint_holds_every_shard_and_resumes_onto_one(tmp_path, prioritized):
    _fill_unevenly(prioritized)
    trainer = L.Trainer(
        max_steps=3, logger=False, enable_progress_bar=False, default_root_dir=tmp_path
    )
    trainer.fit(_Prioritizing(), datamodule=ReplayBufferDataModule(prioritized, batch_size=8))
    saved, saved_priority = prioritized.contents()
    ckpt = next(tmp_path.rglob("*.ckpt"))
    one = ShardedRayReplayBuffer(100, num_shards=1, prioritized=True)
    try:
        resumed = L.Trainer(
            max_steps=4, logger=False, enable_progress_bar=False, default_root_dir=tmp_path
        )
        dm = ReplayBufferDataModule(one, batch_size=8)
        resumed.fit(_Prioritizing(), datamodule=dm, ckpt_path=ckpt)
        back, priority = one.contents()
        assert sorted(back["id"].tolist()) == list(range(ITEMS))
        order = back["id"].argsort()
        # priorities as saved, but for the last step's batch, trained again after the resume
        same = torch.isclose(priority[order], saved_priority[saved["id"].argsort()], rtol=1e-4)
        assert int(same.sum()) >= ITEMS - 8
    finally:
        one.close()


def test_a_config_names_the_sharded_buffer(tmp_path):
    """train.py reads the buffer from YAML (checked with --print_config: no Ray started)."""
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    config = yaml.safe_load((root / "configs" / "cartpole_dqn_ray.yaml").read_text())
    config["data"]["init_args"]["replay_buffer"] = {
        "class_path": "rb_lightning.distributed.ShardedRayReplayBuffer",
        "init_args": {"capacity": 50_000, "num_shards": 2, "prioritized": True, "name": "rb"},
    }
    path = tmp_path / "sharded.yaml"
    path.write_text(yaml.safe_dump(config))
    run = subprocess.run(
        [sys.executable, str(root / "train.py"), "fit", "--config", str(path), "--print_config"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    printed = yaml.safe_load(run.stdout)["data"]["init_args"]["replay_buffer"]
    assert printed["class_path"] == "rb_lightning.distributed.ShardedRayReplayBuffer"
    assert printed["init_args"]["num_shards"] == 2 and printed["init_args"]["in_flight"] == 16
