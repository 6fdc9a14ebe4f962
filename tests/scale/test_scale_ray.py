"""One Ray-backed buffer shared by a collector process and 2 DDP ranks, on a local Ray cluster.

The test is the head node: it starts Ray on loopback and owns the named buffer actor; a
collector process and the DDP run (scripts/) join the cluster by address and find the
buffer by name, as separate machines would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import psutil
import pytest
import torch
from leftovers import ProcessTree, left_behind, semaphores, still_alive, wait_for
from run_output import unexpected_lines
from script_runs import REPO, finish_script, rank_results, run_script, start_script
from torchrl.data import LazyTensorStorage, PrioritizedSampler, ReplayBuffer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.distributed.ray_checkpoint import RemoteDumpRequest

ray = pytest.importorskip("ray")
from rb_lightning.distributed.ray import (  # noqa: E402
    RayReplayBufferView,
    named_actor_config,
    release_semaphore_names,
)

pytestmark = pytest.mark.ray

TOTAL = 400


def _owner(name: str, capacity: int = 1_000) -> ReplayBuffer:
    owner = ReplayBuffer(
        storage=partial(LazyTensorStorage, capacity),
        sampler=partial(PrioritizedSampler, capacity, alpha=1.0, beta=0.5),
        service_backend="ray",
        service_backend_options={"remote_config": named_actor_config(name)},
    )
    release_semaphore_names(owner)  # an owner outside a DataModule, as a script's
    return owner


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


class _RayConfigRun:
    """``python train.py fit --config configs/cartpole_dqn_ray.yaml`` as a user types it (2 DDP
    ranks, progress bar), joining the test's cluster (``RAY_ADDRESS``: the config says
    ``address: auto``); its own session, so that a test can kill all of it at once.

    :meth:`watch` records every process it starts: its descendants, and the buffer actor
    (a Ray worker, a child of the raylet).
    """

    ACTOR = ("cartpole_dqn", "rb_lightning")  # the config's remote_config name and namespace

    def __init__(self, cluster: str, tmp_path: Path, *args: str) -> None:
        env = {**os.environ, "RAY_ADDRESS": cluster, "PYTHONPATH": str(REPO)}
        env["MASTER_ADDR"] = "127.0.0.1"
        for name in ("MASTER_PORT", "PYTHONWARNINGS", "RB_LIGHTNING_DEBUG"):
            env.pop(name, None)
        self.output = tmp_path / "output.txt"
        command = [sys.executable, str(REPO / "train.py"), "fit"]
        command += ["--config", str(REPO / "configs" / "cartpole_dqn_ray.yaml"), *args]
        command.append(f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}")
        with self.output.open("w") as out:
            self.process = subprocess.Popen(
                command,
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.tree = ProcessTree(self.process.pid)
        self.actor = None

    def actor_len(self) -> int:
        """Items in the buffer actor (0 before it exists, or once it is gone); records its
        process."""
        try:
            if self.actor is None:
                self.actor = ray.get_actor(self.ACTOR[0], namespace=self.ACTOR[1])
                pid = ray.get(self.actor.__ray_call__.remote(lambda _: os.getpid()), timeout=30)
                self.tree.add(psutil.Process(pid))
            return ray.get(self.actor.__len__.remote(), timeout=30)
        except (ValueError, ray.exceptions.RayError):  # not there yet, or ended with the run
            return 0

    def watch(self, until=lambda: False, timeout: float = 300) -> bool:
        """Record its processes every 0.5 s until ``until()``, its end, or ``timeout``."""

        def done() -> bool:
            if self.process.poll() is not None:
                return True
            self.tree.look()
            self.actor_len()  # records the actor's process once it exists
            return until()

        return wait_for(done, timeout)

    def text(self) -> str:
        return self.output.read_text()

    def left_running(self) -> dict:
        """Its processes still running 30 s after it ended (Ray ends the actor of a job whose
        driver is gone)."""
        return still_alive(self.tree.seen, timeout=30)


def test_the_ray_config_prints_only_what_a_user_reads_and_leaves_nothing(cluster, tmp_path):
    pytest.importorskip("gymnasium")
    before = semaphores()
    run = _RayConfigRun(cluster, tmp_path, "--trainer.max_steps=30")
    run.watch()
    run.process.wait(timeout=300)
    out = run.text()
    assert run.process.returncode == 0, out[-3000:]
    assert unexpected_lines(out) == [], f"lines a user does not need:\n{out[-4000:]}"
    assert out.count("Ray cluster at") == 1
    assert f"Ray cluster at {cluster}: buffer actor cartpole_dqn" in out
    assert "fit stopped at step 30" in out
    assert run.actor is not None and len(run.tree.seen) >= 3  # the ranks and the actor
    assert run.left_running() == {}
    assert left_behind(before, run.tree.mapped) == []


def test_a_killed_ray_config_run_leaves_nothing(cluster, tmp_path):
    pytest.importorskip("gymnasium")
    before = semaphores()
    run = _RayConfigRun(cluster, tmp_path, "--trainer.max_steps=100000")
    try:
        # Killed while training: the collector's 1,000 warm-up frames are in the buffer.
        assert run.watch(until=lambda: run.actor_len() >= 1_000), run.text()[-3000:]
        assert run.process.poll() is None, run.text()[-3000:]
        run.watch(timeout=2)  # both ranks started by now
    finally:
        os.killpg(run.process.pid, signal.SIGKILL)
    run.process.wait(timeout=30)
    assert run.left_running() == {}
    assert left_behind(before, run.tree.mapped) == []


def test_a_killed_buffer_actor_stops_the_run_in_one_paragraph_and_it_resumes(cluster, tmp_path):
    # Issue 54, item 5: the actor dies mid-run (ray.kill, as a node's loss would end it).
    # Both ranks stop within seconds (no rank left waiting in a collective), rank 0 says
    # what was lost and how to resume, and the resume command it prints works.
    pytest.importorskip("gymnasium")
    run = _RayConfigRun(cluster, tmp_path, "--trainer.max_steps=100000")
    last = tmp_path / "runs" / "cartpole_dqn_ray" / "version_0" / "checkpoints" / "last.ckpt"
    try:
        assert run.watch(until=last.exists), run.text()[-3000:]
        assert run.process.poll() is None and run.actor is not None, run.text()[-3000:]
        ray.kill(run.actor)
        run.process.wait(timeout=120)
    finally:
        if run.process.poll() is None:
            os.killpg(run.process.pid, signal.SIGKILL)
    out = run.text()
    assert run.process.returncode == 2, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out[-3000:]  # rank 0 tells it; rank 1 ends quietly
    assert "Traceback" not in out, out[-3000:]
    assert unexpected_lines(out.replace(errors[0], "")) == [], out[-3000:]
    assert "the Ray buffer actor 'cartpole_dqn' (namespace rb_lightning) is gone" in errors[0]
    assert "killed by `ray.kill`" in errors[0] and "checkpoints/last.ckpt" in errors[0]
    resume = errors[0].split("resume with `")[1].split("`")[0]
    assert resume.endswith("--ckpt_path last"), errors[0]
    assert run.left_running() == {}

    again = _RayConfigRun(cluster, tmp_path, "--ckpt_path", "last", "--trainer.max_steps=1010")
    again.watch()
    again.process.wait(timeout=300)
    assert again.process.returncode == 0, again.text()[-3000:]
    assert "fit stopped at step 1,010" in again.text()


def test_the_ray_config_joins_a_ray_start_cluster_as_typed(tmp_path):
    # docs/scaling.md: `ray start --head`, then `python train.py fit --config
    # configs/cartpole_dqn_ray.yaml`, nothing else. `ray start` (Ray 2.60) turns token
    # authentication on and writes the token to a file (~/.ray/auth_token; here
    # RAY_AUTH_TOKEN_PATH), and Ray's client sends it only under RAY_AUTH_MODE=token, which
    # a user does not type: without train.py setting it, this run fails after 20 s.
    pytest.importorskip("gymnasium")
    from ray_nodes import RayNode, cluster_env

    token = "0" * 64
    head = RayNode({"head": 8}, cluster_env(None, token, str(REPO)))
    try:
        token_file = tmp_path / "auth_token"
        token_file.write_text(token)
        env = {**cluster_env(f"127.0.0.1:{head.port}", token, str(REPO))}
        for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "MASTER_PORT", "RB_LIGHTNING_DEBUG"):
            env.pop(name, None)
        env["RAY_AUTH_TOKEN_PATH"] = str(token_file)
        done = subprocess.run(
            [sys.executable, str(REPO / "train.py"), "fit", "--config",
             str(REPO / "configs" / "cartpole_dqn_ray.yaml"), "--trainer.max_steps=20",
             "--trainer.strategy=auto", "--trainer.devices=1",  # joining is the point, not DDP
             f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        head.kill()
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "fit stopped at step 20" in out
