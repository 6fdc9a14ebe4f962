"""A collector thread extends the buffer while a real Trainer samples from it."""

from __future__ import annotations

import threading
import time

import lightning as L
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule

STEPS = 1_500
WIDTH = 8


def rows(start: int, n: int) -> TensorDict:
    """Rows whose every field is derived from the row id, so a torn row is detectable."""
    ids = torch.arange(start, start + n)
    return TensorDict(
        {
            "id": ids,
            "obs": ids.float().unsqueeze(-1).expand(n, WIDTH).clone(),
            "next": {"check": ids * 7 + 3},
        },
        batch_size=[n],
    )


class Verifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(WIDTH, 1)
        self.rows_verified = 0
        self.max_id_seen = -1

    def training_step(self, batch, batch_idx):
        ids = batch["id"]
        # Every row must be whole: all fields written by the same extend call.
        assert torch.equal(batch["obs"], ids.float().unsqueeze(-1).expand_as(batch["obs"]))
        assert torch.equal(batch["next", "check"], ids * 7 + 3)
        self.rows_verified += ids.numel()
        self.max_id_seen = max(self.max_id_seen, int(ids.max()))
        return self.net(batch["obs"]).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


@pytest.mark.parametrize("prefetch", [None, 2])
def test_thread_writer_during_fit_no_torn_rows_no_deadlock(prefetch):
    # torchrl needs the batch size up front to sample ahead in threads.
    rb = ReplayBuffer(storage=LazyTensorStorage(5_000), prefetch=prefetch, batch_size=32)
    rb.extend(rows(0, 256))
    stop = threading.Event()
    written = [256]
    errors: list[BaseException] = []

    def collector() -> None:
        try:
            while not stop.is_set():
                rb.extend(rows(written[0], 64))  # wraps around the 5k capacity many times
                written[0] += 64
        except BaseException as err:  # surfaced in the main thread below
            errors.append(err)

    thread = threading.Thread(target=collector, daemon=True)
    thread.start()
    model = Verifier()
    try:
        quiet_trainer(
            max_steps=STEPS,
        ).fit(model, datamodule=ReplayBufferDataModule(rb, batch_size=32, num_batches=None))
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive(), "collector thread did not stop: deadlock"
    assert not errors, errors
    assert model.rows_verified == STEPS * 32
    assert written[0] > 5_000, "the writer should have wrapped the buffer at least once"
    assert model.max_id_seen > 256, "training never saw rows written during fit"


def _write_until_stopped(rb: ReplayBuffer, start: int, stop, written) -> None:
    next_id = start
    while not stop.is_set():
        rb.extend(rows(next_id, 64))
        next_id += 64
        written.value = next_id


def test_process_writer_no_torn_rows():
    """A collector *process* writes into a shared buffer that this process samples."""
    import torch.multiprocessing as mp

    from rb_lightning import ReplayBufferBatchDataset, batch_loader

    rb = ReplayBuffer(storage=LazyTensorStorage(5_000))
    rb.extend(rows(0, 256))
    rb.share()  # one cross-process lock for writes and samples
    ctx = mp.get_context("spawn")
    stop, written = ctx.Event(), ctx.Value("q", 256)
    writer = ctx.Process(target=_write_until_stopped, args=(rb, 256, stop, written), daemon=True)
    writer.start()
    verified, max_id = 0, -1
    try:
        deadline = time.monotonic() + 120
        while written.value < 2_000 and time.monotonic() < deadline:  # let the spawn start
            time.sleep(0.05)
        assert written.value >= 2_000, "writer process did not start writing"
        stream = iter(batch_loader(ReplayBufferBatchDataset(rb, 32, num_batches=None)))
        for _ in range(3_000):
            batch = next(stream)
            ids = batch["id"]
            assert torch.equal(batch["obs"], ids.float().unsqueeze(-1).expand_as(batch["obs"]))
            assert torch.equal(batch["next", "check"], ids * 7 + 3)
            verified += ids.numel()
            max_id = max(max_id, int(ids.max()))
    finally:
        stop.set()
        writer.join(timeout=60)
    assert writer.exitcode == 0, "writer process failed or hung"
    assert verified == 96_000
    assert max_id > 256, "the sampler never saw rows written by the other process"
