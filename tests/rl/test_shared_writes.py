"""The collector's worker process writes into the replay buffer; the trainer learns which rows.

What a user relies on: with ``OnlineCollector(asynchronous=True, run_in="process")`` the
frames land in the very buffer the DataModule samples, a ``PrioritizedSampler`` samples
them (the trainer gave them priorities), a checkpoint never holds half a write, and a
worker that dies in the middle of a write ends the run instead of hanging it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import lightning as L
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, PrioritizedSampler, TensorDictReplayBuffer
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule, SamplesPerInsert
from rb_lightning.buffers.shared_writes import WorkerWrites, WriterLock
from rb_lightning.checkpoint import dump_buffer, load_dump
from rb_lightning.errors import CollectorError
from rb_lightning.rl import DQN, OnlineCollector
from rb_lightning.rl.make_cartpole_demos import KEYS

FORK = multiprocessing.get_context("fork")


class WritesSeen(L.Callback):
    """Whether the collector's worker wrote into the buffer (not the training process)."""

    def __init__(self, collector: OnlineCollector) -> None:
        self.collector = collector
        self.worker_writes: list[bool] = []

    def on_train_batch_end(self, *args) -> None:
        background = self.collector._background
        self.worker_writes.append(background is not None and background.writes is not None)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_prioritized_sampler_samples_the_rows_the_worker_wrote(start_method):
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(4_000), sampler=PrioritizedSampler(4_000, alpha=0.6, beta=0.4)
    )
    collector = OnlineCollector(
        "CartPole-v1",
        env_kwargs={"categorical_action_encoding": True},
        asynchronous=True,
        run_in="process",
        start_method=start_method,
        init_random_frames=64,
        frames_per_step=16,
        sync_every_n_steps=5,
        seed=0,
        n_steps=3,
        keys=[*KEYS, "policy_version"],
    )
    seen = WritesSeen(collector)
    limiter = SamplesPerInsert(samples_per_insert=4, min_size=64)
    trainer = quiet_trainer(max_steps=60, callbacks=[collector, seen])
    dm = ReplayBufferDataModule(rb, batch_size=16, num_batches=None, rate_limiter=limiter)
    trainer.fit(DQN(observation_size=4, num_actions=2, eps_decay_steps=20), datamodule=dm)

    assert all(seen.worker_writes)
    learned = collector.frames + 0  # the warm-up's 64, then what the trainer learned
    assert limiter.inserted == learned and learned > 64 + 16
    assert rb.write_count >= learned  # the worker may have written one batch more
    assert not rb.shared  # the buffer is the user's own again
    rows = rb[:learned]
    assert set(rows.keys(True, True)) >= {"observation", "steps_to_next_obs", "policy_version"}
    assert rows["policy_version"][64:].max() > 0  # the worker acted with synced weights
    # Every learned row has a priority: a large draw reaches the last learned rows.
    _, info = rb.sample(20_000, return_info=True)
    assert int(info["index"].max()) >= learned - 16


def _write_batches(view, stop_after: int) -> None:
    # A writer process: batches whose two columns hold the same number in every row.
    for number in range(1, stop_after + 1):
        value = torch.full((64, 256), float(number))
        view.extend(TensorDict(a=value, b=value.clone(), batch_size=[64]))


def test_a_save_holds_off_the_worker_and_never_has_half_a_write(tmp_path):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(512))
    zeros = torch.zeros(8, 256)
    rb.extend(TensorDict(a=zeros, b=zeros.clone(), batch_size=[8]))
    writes = WorkerWrites(rb, FORK)
    writer = FORK.Process(target=_write_batches, args=(writes.view, 3_000), daemon=True)
    writer.start()
    try:
        dumps = 0
        while writer.is_alive() and dumps < 25:
            path = tmp_path / f"dump{dumps}"
            manifest = dump_buffer(rb, path, checksums=False)
            copy = TensorDictReplayBuffer(storage=LazyTensorStorage(512))
            load_dump(copy, path, verify="size")
            rows = copy[: len(copy)]
            # A row read while it was being written would hold two different numbers.
            assert torch.equal(rows["a"], rows["b"]), f"dump {dumps} holds a torn row"
            assert manifest["write_count"] == copy.write_count
            dumps += 1
        assert dumps >= 5
    finally:
        writer.kill()
        writer.join()
        writes.close()


def _hold_and_die(lock: WriterLock, held) -> None:
    lock.__enter__()
    held.set()
    time.sleep(60)


def test_a_writer_killed_while_holding_the_lock_is_an_error_not_a_hang():
    lock = WriterLock(FORK)
    held = FORK.Event()
    holder = FORK.Process(target=_hold_and_die, args=(lock, held), daemon=True)
    holder.start()
    assert held.wait(30)
    os.kill(holder.pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(CollectorError, match="died while it was writing"):
        with lock:
            pass
    assert time.monotonic() - start < 10
    holder.join()


def test_rows_written_after_the_last_learning_are_learned_first_on_resume():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(64), sampler=PrioritizedSampler(64, alpha=1.0, beta=1.0)
    )
    rb.extend(TensorDict(x=torch.zeros(4), batch_size=[4]))
    writes = WorkerWrites(rb, FORK, rows_learned=None)
    writes.view.extend(TensorDict(x=torch.ones(6), batch_size=[6]))
    assert writes.learn(up_to=8).tolist() == [4, 5, 6, 7]  # the noticed rows only
    assert writes.unlearned() == 2
    writes.close()
    # A resumed run that had learned 8 of the 10 rows learns the last two first.
    again = WorkerWrites(rb, FORK, rows_learned=8)
    assert again.unlearned() == 2 and again.learn().tolist() == [8, 9]
    again.close()
    _, info = rb.sample(4_000, return_info=True)
    assert set(info["index"].tolist()) == set(range(10))
