"""The GPU path: device-storage checks, the copy prefetcher, exact resume with it on.

CPU tests run everywhere (the prefetcher with CPU copy engines: a synchronous one and
a threaded one whose copies finish out of order). Tests marked ``gpu`` need CUDA and
are skipped without it.
"""

from __future__ import annotations

import gc
import random
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import lightning as L
import pytest
import torch
from resume.resume_helpers import (
    CAPACITY,
    INITIAL_ITEMS,
    Recorder,
    buffer_ids,
    items,
    make_buffer,
    make_trainer,
)
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.errors import UsageError
from rb_lightning.stream.device_prefetch import (
    CudaStreamCopy,
    DevicePrefetcher,
    check_device_storage,
)

CUDA = torch.cuda.is_available()


class SyncCopy:
    """CPU stand-in for :class:`CudaStreamCopy`: copies in ``start``, on the calling thread.

    The result is always a new batch (``clone`` when the batch is already on ``device``),
    as a real transfer would give, so the consumer never holds the loader's object.

    """

    def start(self, batch: TensorDictBase, device: torch.device) -> TensorDictBase:
        """Copy now; the ticket is the copy."""
        return batch.clone() if batch.device == device else batch.to(device)

    def finish(self, ticket: TensorDictBase) -> TensorDictBase:
        """The copy made by :meth:`start`."""
        return ticket


needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


class ThreadedCopy:
    """A CPU copy engine whose copies run on a thread pool and finish in random order."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=3)
        self.started = 0
        self.finished = 0
        self.lock = threading.Lock()

    def _copy(self, batch: TensorDictBase, delay: float) -> TensorDictBase:
        time.sleep(delay)
        return batch.clone()

    def start(self, batch: TensorDictBase, device: torch.device) -> Future:
        with self.lock:
            self.started += 1
        return self.pool.submit(self._copy, batch, random.uniform(0, 0.01))

    def finish(self, ticket: Future) -> TensorDictBase:
        with self.lock:
            self.finished += 1
        return ticket.result()


class CountingCopy(SyncCopy):
    """SyncCopy that counts its copies."""

    def __init__(self) -> None:
        self.started = 0
        self.finished = 0

    def start(self, batch: TensorDictBase, device: torch.device) -> TensorDictBase:
        self.started += 1
        return super().start(batch, device)

    def finish(self, ticket: TensorDictBase) -> TensorDictBase:
        self.finished += 1
        return super().finish(ticket)


def _batch(value: int) -> TensorDict:
    return TensorDict({"x": torch.full((4, 2), value)}, batch_size=[4])


# -- device-storage checks -------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(num_workers=2, pin_memory=False, prefetch_to_device=False), "num_workers"),
        (dict(num_workers=0, pin_memory=True, prefetch_to_device=False), "pin_memory"),
        (dict(num_workers=0, pin_memory=False, prefetch_to_device=True), "prefetch_to_device"),
    ],
)
def test_device_storage_refuses_host_only_arguments(kwargs, argument):
    with pytest.raises(UsageError) as err:
        check_device_storage(torch.device("cuda", 0), **kwargs)
    assert err.value.argument == argument
    assert f"{argument}=" in str(err.value) or argument in str(err.value)
    # The same arguments are fine for a host storage, and for an unknown device.
    check_device_storage(torch.device("cpu"), **kwargs)
    check_device_storage(None, **kwargs)


def test_batch_already_on_the_target_device_is_handed_over_without_a_copy():
    rb = ReplayBuffer(storage=LazyTensorStorage(32, device="cpu"))
    rb.extend(_batch(1))
    datamodule = ReplayBufferDataModule(rb, batch_size=4)
    batch = rb.sample(4)
    assert datamodule.transfer_batch_to_device(batch, torch.device("cpu"), 0) is batch


def test_prefetch_to_device_must_be_a_bool_or_engine():
    with pytest.raises(TypeError, match="prefetch_to_device"):
        ReplayBufferDataModule(make_buffer(), batch_size=8, prefetch_to_device="cuda")


# -- the prefetcher ----------------------------------------------------------------------------
def test_prefetcher_matches_copies_to_their_batches_whatever_order_they_finish():
    engine = ThreadedCopy()
    prefetcher = DevicePrefetcher(engine, torch.device("cpu"))
    batches = [_batch(v) for v in range(4)]
    for batch in batches:
        prefetcher.submit(batch)
    assert prefetcher.take(_batch(9)) is None  # never submitted (e.g. a validation batch)
    assert len(prefetcher) == 4  # ... and nothing was dropped for it
    for value in (2, 0, 3, 1):
        out = prefetcher.take(batches[value])
        assert out is not batches[value]
        assert torch.equal(out["x"], batches[value]["x"])
        assert prefetcher.take(batches[value]) is None  # taken once
    assert len(prefetcher) == 0
    assert engine.started == engine.finished == 4


def test_prefetcher_keeps_no_reference_to_dropped_batches():
    prefetcher = DevicePrefetcher(SyncCopy(), torch.device("cpu"), max_in_flight=2)
    unused = _batch(0)
    prefetcher.submit(unused)
    host = weakref.ref(unused)
    del unused
    gc.collect()
    assert host() is None  # the prefetcher does not keep the host batch alive
    kept = [_batch(v) for v in range(3)]
    for batch in kept:
        prefetcher.submit(batch)
    assert len(prefetcher) == 2  # the dead batch's copy pruned, then capped at max_in_flight
    assert prefetcher.take(kept[0]) is None  # the oldest copy was dropped by the cap
    assert torch.equal(prefetcher.take(kept[2])["x"], kept[2]["x"])
    prefetcher.clear()
    assert len(prefetcher) == 0


def test_prefetcher_ignores_non_tensordict_batches():
    prefetcher = DevicePrefetcher(SyncCopy(), torch.device("cpu"))
    prefetcher.submit({"x": torch.zeros(2)})
    assert len(prefetcher) == 0


# -- the DataModule with prefetching, on CPU ---------------------------------------------------
class _Identity(L.LightningModule):
    """Checks each batch reaches the step as the prefetched copy, not the loader's object."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.handed: list[Any] = []
        self.stepped: list[Any] = []

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.stepped.append(batch)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(batch["obs"]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _quiet_trainer(**kwargs: Any) -> L.Trainer:
    return quiet_trainer(
        **kwargs,
    )


def test_fit_hands_every_training_batch_over_as_its_prefetched_copy():
    engine = CountingCopy()
    datamodule = ReplayBufferDataModule(
        make_buffer(), batch_size=8, num_batches=None, prefetch_to_device=engine
    )
    model = _Identity()
    trainer = _quiet_trainer(max_steps=6)
    trainer.fit(model, datamodule=datamodule)
    assert trainer.global_step == 6
    # Every step's batch was finished by the engine; Lightning read one batch ahead.
    assert engine.finished == 6
    assert engine.started in (6, 7)
    loader = trainer.train_dataloader
    assert loader.prefetcher is not None and loader.prefetcher.engine is engine
    assert len(loader.prefetcher) == 0  # teardown dropped the read-ahead copy


def test_prefetch_true_on_a_cpu_trainer_is_a_no_op():
    datamodule = ReplayBufferDataModule(
        make_buffer(), batch_size=8, num_batches=2, prefetch_to_device=True
    )
    trainer = _quiet_trainer(max_steps=2)
    trainer.fit(_Identity(), datamodule=datamodule)
    assert trainer.train_dataloader.prefetcher is None


RESUME_CASES = {
    # Prioritized, sized epochs, priority updates and writes each step, resume mid-epoch.
    "prioritized": dict(
        sampler="prioritized",
        module=lambda: Recorder(write_per_step=3, update_priority=True),
        dm=dict(num_batches=5, checkpoint_inline_max_bytes=0),
    ),
    # An endless stream: the batch Lightning read ahead is saved in the checkpoint.
    "stream": dict(
        sampler="without_replacement",
        module=lambda: Recorder(write_per_step=3),
        dm=dict(num_batches=None),
    ),
}


@pytest.mark.parametrize("engine", ["threaded", "sync", "off"])
@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_resume_with_prefetch_matches_a_straight_run(tmp_path, case, engine):
    spec = RESUME_CASES[case]
    n = 4

    def run(root, steps, *, prefetch, ckpt_path=None, filled=True):
        rb = make_buffer(spec["sampler"], filled=filled)
        datamodule = ReplayBufferDataModule(
            rb, batch_size=8, prefetch_to_device=prefetch, **spec["dm"]
        )
        model = spec["module"]()
        trainer = make_trainer(root, steps, n, accelerator="cpu")
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
        return model, rb

    def engine_for():
        return {"threaded": ThreadedCopy, "sync": SyncCopy, "off": lambda: False}[engine]()

    reference, _ = run(tmp_path / "reference", 2 * n, prefetch=False)
    straight, straight_rb = run(tmp_path / "straight", 2 * n, prefetch=engine_for())
    first, _ = run(tmp_path / "resumed", n, prefetch=engine_for())
    resumed, resumed_rb = run(
        tmp_path / "resumed", 2 * n, prefetch=engine_for(), ckpt_path="last", filled=False
    )
    assert straight.seen == reference.seen  # prefetching changes no batch
    assert first.seen == straight.seen[:n]
    assert resumed.seen == straight.seen[n:]
    assert buffer_ids(resumed_rb) == buffer_ids(straight_rb)


# -- on a CUDA device ---------------------------------------------------------------------------
def _cuda_trees() -> bool:
    """Whether this torchrl was built with CUDA segment trees (else they stay on the CPU)."""
    try:
        from torchrl._torchrl import CudaSumSegmentTreeFp32  # noqa: F401
    except ImportError:
        return False
    return True


def _gpu_buffer(sampler: str = "random", filled: bool = True) -> ReplayBuffer:
    if sampler == "prioritized":
        # Without CUDA trees in the torchrl build, PrioritizedSampler refuses a CUDA storage
        # unless told to keep its trees on the CPU.
        device = None if _cuda_trees() else "cpu"
        chosen = PrioritizedSampler(CAPACITY, alpha=0.8, beta=0.5, device=device)
    else:
        chosen = None
    rb = ReplayBuffer(
        storage=LazyTensorStorage(CAPACITY, device="cuda"),
        generator=torch.Generator(device="cuda").manual_seed(0),
        **({"sampler": chosen} if chosen is not None else {}),
    )
    if filled:
        rb.extend(items(INITIAL_ITEMS, 0))
    return rb


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(
    "kwargs, argument",
    [(dict(num_workers=2), "num_workers"), (dict(pin_memory=True), "pin_memory")],
)
def test_gpu_storage_refuses_workers_and_pinning(kwargs, argument):
    with pytest.raises(UsageError) as err:
        ReplayBufferDataModule(_gpu_buffer(), batch_size=8, **kwargs)
    assert err.value.argument == argument


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("sampler", ["random", "prioritized"])
def test_gpu_storage_resume_is_exact_and_never_leaves_the_device(tmp_path, sampler):
    n = 4

    class OnDevice(Recorder):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            assert batch.device.type == "cuda"
            return super().training_step(batch, batch_idx)

    def run(root, steps, ckpt_path=None, filled=True):
        rb = _gpu_buffer(sampler, filled)
        datamodule = ReplayBufferDataModule(rb, batch_size=8, num_batches=None)
        model = OnDevice(write_per_step=3, update_priority=sampler == "prioritized")
        trainer = make_trainer(root, steps, n, accelerator="gpu", devices=1)
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
        return model, rb

    straight, straight_rb = run(tmp_path / "straight", 2 * n)
    run(tmp_path / "resumed", n)
    resumed, resumed_rb = run(tmp_path / "resumed", 2 * n, ckpt_path="last", filled=False)
    assert resumed.seen == straight.seen[n:]
    assert buffer_ids(resumed_rb) == buffer_ids(straight_rb)
    assert resumed_rb.storage.device.type == "cuda"


@pytest.mark.gpu
@needs_cuda
def test_gpu_batches_are_handed_over_without_a_copy():
    rb = _gpu_buffer()
    datamodule = ReplayBufferDataModule(rb, batch_size=8)
    batch = rb.sample(8)
    device = torch.device("cuda", torch.cuda.current_device())
    assert datamodule.transfer_batch_to_device(batch, device, 0) is batch


@pytest.mark.gpu
@needs_cuda
def test_prefetch_on_cuda_matches_the_plain_loader(tmp_path):
    def run(prefetch):
        datamodule = ReplayBufferDataModule(
            make_buffer(), batch_size=8, num_batches=None, prefetch_to_device=prefetch
        )
        model = Recorder(write_per_step=3)
        trainer = make_trainer(tmp_path / str(prefetch), 8, 4, accelerator="gpu", devices=1)
        trainer.fit(model, datamodule=datamodule)
        return model, trainer

    plain, _ = run(False)
    overlapped, trainer = run(True)
    assert isinstance(trainer.train_dataloader.prefetcher.engine, CudaStreamCopy)
    assert overlapped.seen == plain.seen
