"""Samples per second from a TorchRL replay buffer to ``training_step``, five ways.

Paths, all timed in the same process run so that ratios are fair:

1. ``raw``: a bare ``rb.sample(B)`` loop, the ceiling.
2. ``seed``: torchrl's ``TorchRLBufferDataset`` + ``DataLoader(batch_size=B)``
   (default collate): the path this project replaces.
3. ``per_item``: :class:`~rb_lightning.ReplayBufferDataset` + the same
   ``DataLoader`` (items split from each sample, re-collated by the loader).
4. ``batch``: :class:`~rb_lightning.ReplayBufferBatchDataset` through
   :func:`~rb_lightning.batch_loader` (whole sampled batches).
5. ``trainer``: :class:`~rb_lightning.ReplayBufferDataModule` inside a real
   ``Trainer.fit`` with a one-parameter model, with and without
   ``ReplayBuffer(prefetch=...)``; compared with ``batch`` and with the same
   model stepped by a hand-written loop (``plain_loop``), and with the same
   Trainer fed one pre-sampled batch (``trainer_pre_sampled``: Lightning
   alone; ``benchmarks/loop_overhead.py`` splits the difference into
   rb_lightning's plumbing and the sampling itself).

Each measurement runs for ``--min-seconds`` after one warm-up batch; every
shape is measured ``--repeats`` times, paths interleaved, and a ratio is the
median of the per-repeat ratios. Peak RSS is measured per path in a fresh
subprocess: the peak over the loop minus the resident size before it.

The Trainer rows also time the gap between steps, and the same gap when the
Trainer is fed one constant batch (Lightning's own bookkeeping), to isolate
what the sampled data adds inside ``Trainer.fit``.

Run from the repository root::

    python benchmarks/throughput.py --quick      # a few shapes, ~2 minutes
    python benchmarks/throughput.py              # the full grid (~18 min on 2 busy cores)
    python benchmarks/throughput.py --clock cpu  # process CPU time: steadier on a shared box
    python benchmarks/throughput.py --per        # the PrioritizedSampler loader rows only
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

# One intra-op thread: on a few shared cores more threads only contend (and the
# prefetch thread pool oversubscribes OpenMP, see /work/shared/notes).
torch.set_num_threads(1)

import lightning as L  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torchrl.data import (  # noqa: E402
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
)

from rb_lightning import (  # noqa: E402
    ReplayBufferBatchDataset,
    ReplayBufferDataModule,
    ReplayBufferDataset,
    batch_loader,
)

PATHS = ("raw", "seed", "per_item", "batch")
#: Also measured for prioritized samplers: the ceiling of a loop that needs the weights.
INFO_PATH = "raw_info"
TRAINER_PATHS = (
    "batch",
    "plain_loop",
    "trainer",
    "trainer_prefetch",
    "trainer_gap",
    "trainer_gap_constant",
    "trainer_pre_sampled",
)
RSS_PATHS = ("raw", "seed", "per_item", "batch", "trainer")
PREFETCH = 4
#: The clock every measurement reads: wall time (what users feel) or, with
#: ``--clock cpu``, this process's CPU time (steadier on a shared machine, but
#: it counts the prefetch threads' work instead of hiding it).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = CLOCKS["wall"]


# -- items -------------------------------------------------------------------------------------
def llm_items(n: int, generator: torch.Generator) -> TensorDict:
    """LLM-like: ``input_ids`` and ``attention_mask``, int64 [512]."""
    return TensorDict(
        {
            "input_ids": torch.randint(0, 32_000, (n, 512), generator=generator),
            "attention_mask": torch.ones(n, 512, dtype=torch.int64),
        },
        batch_size=[n],
    )


def rl_items(n: int, generator: torch.Generator) -> TensorDict:
    """RL transition: obs float [17], action [6], nested ``next`` with reward and done."""
    return TensorDict(
        {
            "obs": torch.randn(n, 17, generator=generator),
            "action": torch.randn(n, 6, generator=generator),
            "next": {
                "reward": torch.randn(n, 1, generator=generator),
                "done": torch.zeros(n, 1, dtype=torch.bool),
            },
        },
        batch_size=[n],
    )


def atari_items(n: int, generator: torch.Generator) -> TensorDict:
    """Atari-like: a uint8 [4, 84, 84] frame stack."""
    return TensorDict(
        {"pixels": torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8, generator=generator)},
        batch_size=[n],
    )


ITEMS: dict[str, Callable[[int, torch.Generator], TensorDict]] = {
    "llm": llm_items,
    "rl": rl_items,
    "atari": atari_items,
}
#: Buffer sizes per item: a few hundred MB at most (the machine is shared).
DEFAULT_SIZES = {"llm": 20_000, "rl": 100_000, "atari": 10_000}
#: The key the benchmark model reads in ``training_step``.
FEATURE_KEY = {"llm": "input_ids", "rl": "obs", "atari": "pixels"}


def item_bytes(item: str) -> int:
    """Bytes of one item's tensors."""
    one = ITEMS[item](1, torch.Generator().manual_seed(0))
    return sum(t.numel() * t.element_size() for t in one.values(True, True))


# -- buffers -----------------------------------------------------------------------------------
@dataclass
class Shape:
    """One benchmark configuration."""

    item: str
    storage: str
    sampler: str
    batch_size: int
    size: int

    @property
    def label(self) -> str:
        return f"{self.item} / {self.storage} / {self.sampler} / {self.batch_size}"


def make_storage(kind: str, size: int, scratch: str) -> Any:
    if kind == "tensor":
        return LazyTensorStorage(size)
    if kind == "memmap":
        return LazyMemmapStorage(size, scratch_dir=tempfile.mkdtemp(dir=scratch))
    if kind == "list":
        return ListStorage(size)
    raise ValueError(f"storage must be one of tensor, memmap, list; got {kind!r}")


def make_sampler(kind: str, size: int) -> Any:
    if kind == "random":
        return RandomSampler()
    if kind == "prioritized":
        return PrioritizedSampler(max_capacity=size, alpha=0.7, beta=0.5)
    raise ValueError(f"sampler must be random or prioritized; got {kind!r}")


def build_buffer(shape: Shape, scratch: str, chunk: int = 1_000) -> ReplayBuffer:
    """A full buffer of ``shape.size`` items, filled in chunks to keep the build's peak low."""
    rb = ReplayBuffer(
        storage=make_storage(shape.storage, shape.size, scratch),
        sampler=make_sampler(shape.sampler, shape.size),
    )
    generator = torch.Generator().manual_seed(0)
    for start in range(0, shape.size, chunk):
        data = ITEMS[shape.item](min(chunk, shape.size - start), generator)
        if shape.storage == "list":
            # Items added one by one own their memory, as in real ListStorage use
            # (extend() would store views of one shared chunk).
            for item in data.unbind(0):
                rb.add(item.clone())
        else:
            rb.extend(data)
    return rb


def prefetching_twin(rb: ReplayBuffer, batch_size: int) -> ReplayBuffer:
    """A buffer over the same storage that samples ahead in a thread pool."""
    return ReplayBuffer(
        storage=rb.storage, sampler=RandomSampler(), batch_size=batch_size, prefetch=PREFETCH
    )


# -- paths: each is an endless iterator of batches with B items ---------------------------------
def raw_batches(rb: ReplayBuffer, batch_size: int) -> Iterator[Any]:
    while True:
        yield rb.sample(batch_size)


def raw_info_batches(rb: ReplayBuffer, batch_size: int) -> Iterator[Any]:
    while True:
        yield rb.sample(batch_size, return_info=True)


def seed_batches(rb: ReplayBuffer, batch_size: int) -> Iterator[Any]:
    from torchrl.modules.llm.trl_interop import TorchRLBufferDataset

    dataset = TorchRLBufferDataset(rb, batch_size, num_batches=None)
    return iter(DataLoader(dataset, batch_size=batch_size))


def per_item_batches(rb: ReplayBuffer, batch_size: int) -> Iterator[Any]:
    dataset = ReplayBufferDataset(rb, batch_size, num_batches=None)
    return iter(DataLoader(dataset, batch_size=batch_size))


def batch_batches(rb: ReplayBuffer, batch_size: int) -> Iterator[Any]:
    return iter(batch_loader(ReplayBufferBatchDataset(rb, batch_size, num_batches=None)))


PATH_FACTORIES: dict[str, Callable[[ReplayBuffer, int], Iterator[Any]]] = {
    "raw": raw_batches,
    "raw_info": raw_info_batches,
    "seed": seed_batches,
    "per_item": per_item_batches,
    "batch": batch_batches,
}


def time_batches(batches: Iterator[Any], min_seconds: float, min_batches: int = 3) -> float:
    """Batches per second after one warm-up batch (iterator start-up, first sample)."""
    next(batches)
    count = 0
    start = _clock()
    while True:
        next(batches)
        count += 1
        elapsed = _clock() - start
        if count >= min_batches and elapsed >= min_seconds:
            return count / elapsed


# -- the Lightning path ------------------------------------------------------------------------
class TinyModel(L.LightningModule):
    """One parameter; ``training_step`` reads the batch and logs its loss, as real models do."""

    def __init__(self, feature_key: str) -> None:
        super().__init__()
        self.feature_key = feature_key
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen_shapes: list[tuple[int, ...]] = []
        self.record_shapes = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        feature = batch[self.feature_key]
        if self.record_shapes:
            self.seen_shapes.append(tuple(feature.shape))
        loss = (self.weight * feature[:, :1].float()).square().mean()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class StepClock(L.Callback):
    """Times the steps after ``warmup``: data fetch + step + Lightning's hooks.

    Also sums the gaps between one step's end and the next step's start: the
    data path inside the Trainer (fetch, batch transfer hooks, loop bookkeeping).
    """

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.start: float | None = None
        self.end: float | None = None
        self.steps = 0
        self.gap_seconds = 0.0

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if self.end is not None or (self.start is not None and trainer.global_step > self.warmup):
            self.gap_seconds += _clock() - (self.end or self.start)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.warmup:
            self.start = _clock()
        elif trainer.global_step > self.warmup:
            self.end = _clock()
            self.steps = trainer.global_step - self.warmup

    @property
    def rate(self) -> float:
        """Steps per second."""
        assert self.start is not None and self.end is not None, "too few steps to time"
        return self.steps / (self.end - self.start)

    @property
    def gap_rate(self) -> float:
        """1 / (mean seconds between steps): comparable with a loader's batches per second."""
        return self.steps / self.gap_seconds


def make_trainer(max_steps: int, callbacks: list[L.Callback]) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )


class _SameBatch(torch.utils.data.IterableDataset):
    """One batch, forever: a data source that costs nothing."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def __iter__(self) -> Iterator[Any]:
        return itertools.repeat(self.batch)


class _ConstantDataModule(ReplayBufferDataModule):
    """The DataModule with sampling taken out: isolates Lightning's own time between steps."""

    def train_dataloader(self) -> DataLoader:
        return batch_loader(_SameBatch(self.replay_buffer.sample(self.batch_size)))


def fit_steps(
    rb: ReplayBuffer,
    item: str,
    batch_size: int,
    steps: int,
    warmup: int = 5,
    model: TinyModel | None = None,
    constant: bool = False,
    batches_per_draw: int = 1,
) -> StepClock:
    """Run ``Trainer.fit`` fed by ``ReplayBufferDataModule``; its clock has steps/s.

    ``constant=True`` feeds one pre-sampled batch over and over instead.
    """
    clock = StepClock(warmup)
    module_class = _ConstantDataModule if constant else ReplayBufferDataModule
    datamodule = module_class(rb, batch_size, num_batches=None, batches_per_draw=batches_per_draw)
    model = TinyModel(FEATURE_KEY[item]) if model is None else model
    with _quiet_lightning():
        make_trainer(warmup + steps, [clock]).fit(model, datamodule)
    return clock


def plain_loop_steps(rb: ReplayBuffer, item: str, batch_size: int, min_seconds: float) -> float:
    """Steps per second of the same model and loader in a hand-written loop (no Trainer)."""
    model = TinyModel(FEATURE_KEY[item])
    model.log = lambda *args, **kwargs: None  # no Trainer to log to
    optimizer = model.configure_optimizers()

    def steps() -> Iterator[None]:
        for index, batch in enumerate(batch_batches(rb, batch_size)):
            loss = model.training_step(batch, index)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            yield None

    return time_batches(steps(), min_seconds)


@contextlib.contextmanager
def _quiet_lightning() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


# -- measurement -------------------------------------------------------------------------------
@dataclass
class Result:
    """Rates (items/s) per path over repeats for one shape."""

    shape: Shape
    rates: dict[str, list[float]] = field(default_factory=dict)

    def median_rate(self, path: str) -> float:
        return statistics.median(self.rates[path])

    def data_in_trainer_ratio(self) -> float:
        """Batch-loader time per batch / time the sampled data adds between Trainer steps.

        The added time is the gap between steps fed by the DataModule minus the gap
        when the same Trainer is fed one constant batch (Lightning's own bookkeeping).
        """
        ratios = []
        for batch, gap, constant in zip(
            self.rates["batch"],
            self.rates["trainer_gap"],
            self.rates["trainer_gap_constant"],
            strict=True,
        ):
            added = 1 / gap - 1 / constant
            ratios.append((1 / batch) / added if added > 0 else float("inf"))
        return statistics.median(ratios)

    def ratio(self, path: str, base: str) -> float:
        """Median of same-repeat ratios ``path / base``."""
        pairs = zip(self.rates[path], self.rates[base], strict=True)
        return statistics.median(a / b for a, b in pairs)


def _rotated(paths: tuple[str, ...], repeat: int) -> tuple[str, ...]:
    """Start each repeat with a different path, so none always runs first (or last)."""
    shift = repeat % len(paths)
    return paths[shift:] + paths[:shift]


def measure_loaders(shape: Shape, rb: ReplayBuffer, repeats: int, min_seconds: float) -> Result:
    paths = PATHS + ((INFO_PATH,) if shape.sampler == "prioritized" else ())
    result = Result(shape, {path: [] for path in paths})
    for repeat in range(repeats):
        for path in _rotated(paths, repeat):
            rate = time_batches(PATH_FACTORIES[path](rb, shape.batch_size), min_seconds)
            result.rates[path].append(rate * shape.batch_size)
    return result


def measure_trainer(shape: Shape, rb: ReplayBuffer, repeats: int, min_seconds: float) -> Result:
    result = Result(shape, {path: [] for path in TRAINER_PATHS})
    twin = prefetching_twin(rb, shape.batch_size)
    for _ in range(repeats):
        batch_rate = time_batches(batch_batches(rb, shape.batch_size), min_seconds)
        plain_rate = plain_loop_steps(rb, shape.item, shape.batch_size, min_seconds)
        steps = max(20, int(plain_rate * min_seconds))
        clock = fit_steps(rb, shape.item, shape.batch_size, steps)
        constant = fit_steps(rb, shape.item, shape.batch_size, steps, constant=True)
        rates = {
            "batch": batch_rate,
            "plain_loop": plain_rate,
            "trainer": clock.rate,
            "trainer_gap": clock.gap_rate,
            "trainer_gap_constant": constant.gap_rate,
            "trainer_pre_sampled": constant.rate,
            "trainer_prefetch": fit_steps(twin, shape.item, shape.batch_size, steps).rate,
        }
        for path, rate in rates.items():
            result.rates[path].append(rate * shape.batch_size)
    return result


# -- peak RSS, one subprocess per path ---------------------------------------------------------
def _proc_status_kb(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> int:
    """Reset the kernel's peak-RSS counter (Linux >= 4.0); return the resident size (kB)."""
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    return _proc_status_kb("VmRSS") or 0


def _peak_rss_kb() -> int:
    import resource

    return _proc_status_kb("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def rss_child(spec: dict[str, Any]) -> dict[str, float]:
    """In a fresh process: build the buffer, warm the path up (imports, first batch) and
    drop it, then report how far a new loop raises the peak resident size (MB)."""
    import gc

    shape = Shape(**spec["shape"])
    path, batches = spec["path"], spec["batches"]
    with tempfile.TemporaryDirectory() as scratch:
        rb = build_buffer(shape, scratch)
        if path == "trainer":
            fit_steps(rb, shape.item, shape.batch_size, steps=1, warmup=1)
            gc.collect()
            before_kb = _reset_peak_rss()
            fit_steps(rb, shape.item, shape.batch_size, steps=batches, warmup=1)
        else:
            warm = PATH_FACTORIES[path](rb, shape.batch_size)
            next(warm)
            del warm
            gc.collect()
            before_kb = _reset_peak_rss()
            iterator = PATH_FACTORIES[path](rb, shape.batch_size)
            for _ in range(batches):
                next(iterator)
        peak_kb = _peak_rss_kb()
    batch_mb = item_bytes(shape.item) * shape.batch_size / 2**20
    return {"growth_mb": max(0, peak_kb - before_kb) / 1024, "batch_mb": batch_mb}


def _in_subprocess(spec: dict[str, Any]) -> dict[str, Any]:
    # A fixed mmap threshold stops glibc from keeping freed batches resident for reuse
    # (its default threshold grows up to 32 MB), so RSS follows the live batches.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(f"benchmark child {spec} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_rss(shape: Shape, batches: int) -> dict[str, dict[str, float]]:
    return {
        path: _in_subprocess(
            {"task": "rss", "shape": shape.__dict__, "path": path, "batches": batches}
        )
        for path in RSS_PATHS
    }


# -- buffer-size scaling, one subprocess per buffer --------------------------------------------
def scaling_child(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: build one buffer, report its memory and raw/batch samples/s."""
    shape = Shape(**spec["shape"])
    rss_before = _proc_status_kb("VmRSS") or 0
    with tempfile.TemporaryDirectory(dir=spec.get("scratch")) as scratch:
        started = time.perf_counter()
        rb = build_buffer(shape, scratch, chunk=10_000)
        build_s = time.perf_counter() - started
        rss_mb = max(0, (_proc_status_kb("VmRSS") or 0) - rss_before) / 1024
        disk_mb = _dir_mb(rb.storage.scratch_dir) if shape.storage == "memmap" else 0.0
        result = Result(shape, {"raw": [], "batch": []})
        for repeat in range(spec["repeats"]):
            for path in _rotated(("raw", "batch"), repeat):
                rate = time_batches(PATH_FACTORIES[path](rb, shape.batch_size), spec["min_seconds"])
                result.rates[path].append(rate * shape.batch_size)
        del rb
    return {
        "storage": shape.storage,
        "size": shape.size,
        "raw": result.median_rate("raw"),
        "batch": result.median_rate("batch"),
        "ratio": result.ratio("batch", "raw"),
        "rss_mb": rss_mb,
        "disk_mb": disk_mb,
        "data_mb": item_bytes(shape.item) * shape.size / 2**20,
        "build_s": build_s,
    }


def measure_scaling(
    sizes: list[int], storages: list[str], scratch: str, repeats: int, min_seconds: float
) -> list[dict[str, Any]]:
    spec = {
        "task": "scaling",
        "scratch": scratch,
        "repeats": repeats,
        "min_seconds": min_seconds,
        "clock": _clock_name(),
    }
    return [
        _in_subprocess({**spec, "shape": Shape("rl", storage, "random", 256, size).__dict__})
        for storage, size in itertools.product(storages, sizes)
    ]


def _clock_name() -> str:
    return next(name for name, clock in CLOCKS.items() if clock is _clock)


def _dir_mb(path: str) -> float:
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, name)) for name in files)
    return total / 2**20


# -- report ------------------------------------------------------------------------------------
def _k(rate: float) -> str:
    return f"{rate / 1e6:.2f}M" if rate >= 1e6 else f"{rate / 1e3:.1f}k"


def loader_table(results: list[Result]) -> str:
    lines = [
        "| item / storage / sampler / B | raw samples/s | seed / raw | per_item / raw "
        "| batch / raw | per_item / seed | batch / raw+info |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        with_info = f"{r.ratio('batch', INFO_PATH):.2f}" if INFO_PATH in r.rates else "-"
        lines.append(
            f"| {r.shape.label} | {_k(r.median_rate('raw'))} | {r.ratio('seed', 'raw'):.3f} "
            f"| {r.ratio('per_item', 'raw'):.3f} | **{r.ratio('batch', 'raw'):.2f}** "
            f"| {r.ratio('per_item', 'seed'):.2f} | {with_info} |"
        )
    return "\n".join(lines)


def trainer_table(results: list[Result]) -> str:
    lines = [
        "| item / storage / sampler / B | batch loader steps/s | plain loop steps/s "
        "| Trainer steps/s | Trainer / batch | Trainer / plain loop "
        "| data path in Trainer / batch | Lightning's own gap per step "
        "| Trainer / pre-sampled Trainer | Trainer+prefetch / Trainer |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        b = r.shape.batch_size
        lines.append(
            f"| {r.shape.label} | {r.median_rate('batch') / b:.0f} "
            f"| {r.median_rate('plain_loop') / b:.0f} | {r.median_rate('trainer') / b:.0f} "
            f"| {r.ratio('trainer', 'batch'):.2f} | {r.ratio('trainer', 'plain_loop'):.2f} "
            f"| **{r.data_in_trainer_ratio():.2f}** "
            f"| {1e6 * b / r.median_rate('trainer_gap_constant'):.0f} us "
            f"| {r.ratio('trainer', 'trainer_pre_sampled'):.2f} "
            f"| {r.ratio('trainer_prefetch', 'trainer'):.2f} |"
        )
    return "\n".join(lines)


def rss_table(shape: Shape, rss: dict[str, dict[str, float]]) -> str:
    batch_mb = next(iter(rss.values()))["batch_mb"]
    lines = [
        f"Peak RSS growth while looping, {shape.label} (one batch = {batch_mb:.1f} MB):",
        "",
        "| path | peak RSS growth MB | in batches |",
        "|---|---|---|",
    ]
    for path, row in rss.items():
        lines.append(f"| {path} | {row['growth_mb']:.1f} | {row['growth_mb'] / batch_mb:.1f} |")
    return "\n".join(lines)


def scaling_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| storage / buffer size (RL, B=256) | raw samples/s | batch samples/s | batch / raw "
        "| data MB | RSS growth MB | on disk MB | build s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['storage']} / {row['size']:,} | {_k(row['raw'])} | {_k(row['batch'])} "
            f"| {row['ratio']:.2f} | {row['data_mb']:.0f} | {row['rss_mb']:.0f} "
            f"| {row['disk_mb']:.0f} | {row['build_s']:.1f} |"
        )
    return "\n".join(lines)


def environment_line() -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {load} at start, "
        f"python {platform.python_version()}, torch threads {torch.get_num_threads()}, "
        f"clock {_clock_name()}"
    )


# -- plans -------------------------------------------------------------------------------------
@dataclass
class Plan:
    loader_shapes: list[Shape]
    trainer_shapes: list[Shape]
    rss_shape: Shape | None
    rss_batches: int
    scaling_sizes: list[int]
    scaling_storages: list[str]
    repeats: int
    min_seconds: float


def full_plan() -> Plan:
    shapes = [
        Shape(item, storage, sampler, b, DEFAULT_SIZES[item])
        for item, storage, sampler, b in itertools.product(
            ITEMS, ("tensor", "memmap", "list"), ("random", "prioritized"), (32, 256, 1024)
        )
    ]
    return Plan(
        loader_shapes=shapes,
        trainer_shapes=[
            Shape(item, "tensor", "random", 256, DEFAULT_SIZES[item]) for item in ITEMS
        ],
        rss_shape=Shape("llm", "tensor", "random", 1024, DEFAULT_SIZES["llm"]),
        rss_batches=30,
        scaling_sizes=[10_000, 100_000, 1_000_000],
        scaling_storages=["tensor", "memmap"],
        repeats=5,
        min_seconds=0.2,
    )


def quick_plan() -> Plan:
    shapes = [
        Shape("llm", "tensor", "random", 256, DEFAULT_SIZES["llm"]),
        Shape("llm", "memmap", "prioritized", 32, DEFAULT_SIZES["llm"]),
        Shape("rl", "tensor", "random", 256, DEFAULT_SIZES["rl"]),
        Shape("rl", "list", "prioritized", 1024, 20_000),
        Shape("atari", "tensor", "random", 256, DEFAULT_SIZES["atari"]),
    ]
    return Plan(
        loader_shapes=shapes,
        trainer_shapes=[Shape("llm", "tensor", "random", 256, DEFAULT_SIZES["llm"])],
        rss_shape=Shape("llm", "tensor", "random", 1024, 4_096),
        rss_batches=20,
        scaling_sizes=[10_000, 100_000],
        scaling_storages=["tensor"],
        repeats=5,
        min_seconds=0.15,
    )


def per_plan() -> Plan:
    """The prioritized-sampler rows of the full grid only (loaders, no Trainer): ~6 min."""
    full = full_plan()
    return Plan(
        loader_shapes=[s for s in full.loader_shapes if s.sampler == "prioritized"],
        trainer_shapes=[],
        rss_shape=None,
        rss_batches=0,
        scaling_sizes=[],
        scaling_storages=[],
        repeats=full.repeats,
        min_seconds=full.min_seconds,
    )


def smoke_plan() -> Plan:
    """A tiny config that runs every code path in seconds (for the test suite)."""
    return Plan(
        loader_shapes=[Shape("rl", "tensor", "prioritized", 8, 64)],
        trainer_shapes=[Shape("rl", "tensor", "random", 8, 64)],
        rss_shape=None,
        rss_batches=0,
        scaling_sizes=[],  # subprocesses: the test calls scaling_child in-process instead
        scaling_storages=[],
        repeats=1,
        min_seconds=0.0,
    )


def run(plan: Plan, scratch: str, echo: Callable[[str], None] = print) -> str:
    """Run a plan; return the markdown report (progress goes to ``echo``)."""
    sections = [f"Environment: {environment_line()}", ""]
    loader_results = []
    with _quiet_torchrl():
        for shape in plan.loader_shapes:
            rb = build_buffer(shape, scratch)
            loader_results.append(measure_loaders(shape, rb, plan.repeats, plan.min_seconds))
            echo(f"  measured {shape.label}")
            del rb
        sections += ["### Loaders: samples/s and same-run ratios", "", loader_table(loader_results)]
        trainer_results = []
        for shape in plan.trainer_shapes:
            rb = build_buffer(shape, scratch)
            trainer_results.append(measure_trainer(shape, rb, plan.repeats, plan.min_seconds))
            echo(f"  measured Trainer {shape.label}")
            del rb
        if trainer_results:
            sections += ["", "### Inside `Trainer.fit`", "", trainer_table(trainer_results)]
        if plan.rss_shape is not None:
            rss = measure_rss(plan.rss_shape, plan.rss_batches)
            echo("  measured peak RSS")
            sections += ["", "### Peak memory", "", rss_table(plan.rss_shape, rss)]
        if plan.scaling_sizes:
            rows = measure_scaling(
                plan.scaling_sizes, plan.scaling_storages, scratch, plan.repeats, plan.min_seconds
            )
            echo("  measured scaling")
            sections += ["", "### Buffer size", "", scaling_table(rows)]
    return "\n".join(sections)


@contextlib.contextmanager
def _quiet_torchrl() -> Iterator[None]:
    log = logging.getLogger("torchrl")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="a few shapes, about 2 minutes")
    mode.add_argument("--smoke", action="store_true", help="tiny config, checks it runs")
    mode.add_argument(
        "--per", action="store_true", help="the prioritized-sampler loader rows of the full grid"
    )
    parser.add_argument("--repeats", type=int, help="override repeats per shape")
    parser.add_argument("--min-seconds", type=float, help="override seconds per measurement")
    parser.add_argument(
        "--only",
        action="append",
        metavar="LABEL",
        help='keep only shapes whose label contains LABEL, e.g. "atari / tensor / prioritized / 32" '
        "(repeatable): re-measure a single row with more repeats",
    )
    parser.add_argument("--scratch", help="directory for memmap storages (default: a temp dir)")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall time (default), or process CPU time: steadier on a loaded machine",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global _clock
    _clock = CLOCKS[args.clock]
    if args.child:
        spec = json.loads(args.child)
        _clock = CLOCKS[spec.get("clock", "wall")]
        with _quiet_torchrl():
            task = {"rss": rss_child, "scaling": scaling_child}[spec["task"]]
            report = json.dumps(task(spec))
        print(report)
        return report
    plans = {"smoke": smoke_plan, "quick": quick_plan, "per": per_plan}
    plan = next((make for name, make in plans.items() if getattr(args, name)), full_plan)()
    if args.repeats:
        plan.repeats = args.repeats
    if args.min_seconds is not None:
        plan.min_seconds = args.min_seconds
    if args.only:
        labels = [s.label for s in plan.loader_shapes + plan.trainer_shapes]
        plan.loader_shapes = [s for s in plan.loader_shapes if any(o in s.label for o in args.only)]
        plan.trainer_shapes = [
            s for s in plan.trainer_shapes if any(o in s.label for o in args.only)
        ]
        if not plan.loader_shapes and not plan.trainer_shapes:
            parser.error(
                f"--only {args.only}: no shape of this plan has such a label; its labels are "
                + ", ".join(repr(label) for label in labels)
            )
    scratch = tempfile.mkdtemp(prefix="rb_bench_", dir=args.scratch)
    try:
        started = time.perf_counter()
        report = run(plan, scratch, echo=lambda line: print(line, file=sys.stderr, flush=True))
        report += f"\n\nTotal benchmark time: {time.perf_counter() - started:.0f} s"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(report)
    return report


if __name__ == "__main__":
    main()
