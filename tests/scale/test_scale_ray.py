"""One Ray-backed buffer shared by a collector process and 2 DDP ranks, on a local Ray cluster.

The test is the head node: it starts Ray on loopback and owns the named buffer actor; a
collector process and the DDP run (scripts/) join the cluster by address and find the
buffer by name, as separate machines would.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch
from script_runs import finish_script, rank_results, run_script, start_script
from torchrl.data import LazyTensorStorage, PrioritizedSampler, ReplayBuffer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.distributed.ray_checkpoint import RemoteDumpRequest

ray = pytest.importorskip("ray")
from rb_lightning.distributed.ray import RayReplayBufferView, named_actor_config  # noqa: E402

pytestmark = pytest.mark.ray

TOTAL = 400


def _owner(name: str, capacity: int = 1_000) -> ReplayBuffer:
    return ReplayBuffer(
        storage=partial(LazyTensorStorage, capacity),
        sampler=partial(PrioritizedSampler, capacity, alpha=1.0, beta=0.5),
        service_backend="ray",
        service_backend_options={"remote_config": named_actor_config(name)},
    )


def test_ddp_ranks_sample_one_buffer_a_collector_fills(cluster, tmp_path):
    owner = _owner("shared")
    args = [cluster, "shared", TOTAL]
    collector = start_script("ray_collector.py", *args)
    try:
        run_script("ray_ddp.py", tmp_path, *args)
        finish_script(collector, timeout=60)
        ranks = rank_results(tmp_path)
        assert len(owner) == TOTAL
        for rank in ranks:
            assert rank["global_step"] == 6  # limit_train_batches=3 per rank, 2 epochs
        batches = [{tuple(b) for b in rank["ids"]} for rank in ranks]
        assert not batches[0] & batches[1], "two ranks drew the same batch from the shared buffer"
        # Each rank boosted its own index (10 and 11) in the shared sampler; the owner's
        # samples must be dominated by both.
        drawn = owner.sample(400)["id"]
        for index in (10, 11):
            assert (drawn == index).sum() > 100, f"rank {index - 10}'s priority update was lost"
        assert ((drawn == 10) | (drawn == 11)).float().mean() > 0.95
    finally:
        collector.kill()
        owner.close()


def test_view_is_a_replay_buffer_for_the_datamodule(cluster):
    owner = _owner("view")
    try:
        view = RayReplayBufferView("view", timeout=5)
        assert len(view) == 0
        with pytest.raises(ValueError, match="num_workers=0"):
            ReplayBufferDataModule(view, batch_size=4, num_workers=1)
        dm = ReplayBufferDataModule(view, batch_size=4, num_batches=2)
        assert "served by a ray actor" in repr(dm)
        # Outside a DDP run this process is rank 0: the actor dumps the buffer when
        # BufferCheckpointIO saves (tests/scale/test_scale_ray_resume.py).
        state = dm.state_dict()
        assert state["batches_served"] == 0
        assert isinstance(state["buffer"], RemoteDumpRequest)
        view.close()
        assert len(owner) == 0, "closing a view must leave the owner's actor alive"
        with pytest.raises(TimeoutError, match="'missing'"):
            RayReplayBufferView("missing", timeout=0.5)
    finally:
        owner.close()


def test_remote_buffer_is_not_reseeded_by_ranks_or_workers(cluster):
    # set_rng on a Ray buffer would reset the one sampler every rank shares.
    from tensordict import TensorDict

    from rb_lightning import ReplayBufferBatchDataset
    from rb_lightning.stream.sharding import Shard

    owner = _owner("seed")
    try:
        owner.extend(TensorDict({"id": torch.arange(100)}, batch_size=[100]))
        dataset = ReplayBufferBatchDataset(owner, 8, num_batches=1)
        draws = []
        for _ in range(2):
            # Re-seeding from the same global seed would replay the same batch twice.
            torch.manual_seed(0)
            dataset.stream.seed_replica(Shard(rank=1, world_size=2))
            draws.append(owner.sample(32)["id"])
        assert not torch.equal(*draws), "the shared stream was reset by a rank"
        assert next(iter(dataset))["id"].shape == (8,)
    finally:
        owner.close()


def test_cartpole_dqn_ray_config_trains_from_the_shared_buffer(cluster, tmp_path):
    # One process here (the DDP run itself is covered above); Ray is already up, so the
    # config's ray_init_config is not used and its buffer actor joins this cluster.
    pytest.importorskip("gymnasium")
    from torchrl.data import RayReplayBuffer

    from rb_lightning.runs.cli import main

    config = Path(__file__).resolve().parents[2] / "configs" / "cartpole_dqn_ray.yaml"
    cli = main(
        args=[
            "fit",
            f"--config={config}",
            "--trainer.strategy=auto",
            "--trainer.devices=1",
            "--trainer.max_steps=4",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
        ]
    )
    rb = cli.datamodule.replay_buffer
    try:
        assert isinstance(rb, RayReplayBuffer)
        assert cli.trainer.global_step == 4
        # Another process would find the same buffer by the config's name.
        view = RayReplayBufferView("cartpole_dqn", timeout=5)
        assert len(view) == len(rb) >= 1_000  # the collector's warm-up frames
        view.close()
    finally:
        rb.close()
