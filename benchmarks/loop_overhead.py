"""What the DataModule costs per training step, split into sampling and plumbing.

Four Trainers run the same one-parameter model (``throughput.TinyModel``), with
the same Lightning, in the same process, interleaved, medians of ``--repeats``:

1. ``datamodule``: ``ReplayBufferDataModule`` over a real buffer (RL transitions);
2. ``datamodule_per_draw``: the same with ``batches_per_draw=K`` (``--batches-per-draw``,
   default 32): one ``rb.sample(K * B)`` per K steps;
3. ``fixed_sample``: the same DataModule over a buffer whose ``sample`` returns
   one pre-drawn batch: every piece of rb_lightning's loop (stream, loader,
   resume bookkeeping, batch transfer), but no sampling;
4. ``pre_sampled``: Lightning fed one pre-drawn batch by a plain loader (no
   rb_lightning in the loop at all).

``plumbing = 1/fixed_sample - 1/pre_sampled`` is what rb_lightning adds per step;
``sampling = 1/datamodule - 1/fixed_sample`` is what drawing a fresh batch costs
inside the loop (the raw ``rb.sample`` rate is printed next to it). ``--profile``
adds a cProfile of the ``datamodule`` path: the functions of rb_lightning by
their own time per step.

Run from the repository root::

    python benchmarks/loop_overhead.py                 # 400 steps x 3 repeats, ~20 s
    python benchmarks/loop_overhead.py --profile       # and where the time goes
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import throughput as tp  # noqa: E402  (sets torch to one intra-op thread)
from torchrl.data import ReplayBuffer  # noqa: E402

PATHS = ("datamodule", "datamodule_per_draw", "fixed_sample", "pre_sampled")


class FixedSampleBuffer(ReplayBuffer):
    """A buffer whose every ``sample`` is one batch drawn once: sampling costs nothing."""

    def __init__(self, source: ReplayBuffer, batch_size: int) -> None:
        super().__init__(storage=source.storage, sampler=source.sampler)
        self._batch, self._info = source.sample(batch_size, return_info=True)

    def sample(self, batch_size: int | None = None, return_info: bool = False) -> Any:
        return (self._batch, self._info) if return_info else self._batch


def measure(steps: int, repeats: int, batch_size: int, per_draw: int) -> dict[str, list[float]]:
    shape = tp.Shape("rl", "tensor", "random", batch_size, 100_000)
    rb = tp.build_buffer(shape, "/tmp")
    fixed = FixedSampleBuffer(rb, batch_size)
    rates: dict[str, list[float]] = {path: [] for path in (*PATHS, "raw_sample")}
    for repeat in range(repeats):
        runs = {
            "datamodule": lambda: tp.fit_steps(rb, "rl", batch_size, steps).rate,
            "datamodule_per_draw": lambda: (
                tp.fit_steps(rb, "rl", batch_size, steps, batches_per_draw=per_draw).rate
            ),
            "fixed_sample": lambda: tp.fit_steps(fixed, "rl", batch_size, steps).rate,
            "pre_sampled": lambda: tp.fit_steps(rb, "rl", batch_size, steps, constant=True).rate,
        }
        for path in tp._rotated(PATHS, repeat):
            rates[path].append(runs[path]())
        rates["raw_sample"].append(tp.time_batches(tp.raw_batches(rb, batch_size), 1.0))
    return rates


def _of_pre_sampled(rates: dict[str, list[float]], path: str) -> float:
    """Median over repeats of ``path``'s rate over the pre-sampled rate of the same repeat."""
    pairs = zip(rates[path], rates["pre_sampled"], strict=True)
    return statistics.median(rate / pre for rate, pre in pairs)


def report(rates: dict[str, list[float]], steps: int, batch_size: int, per_draw: int) -> str:
    med = {path: statistics.median(values) for path, values in rates.items()}
    ms = {path: 1e3 / rate for path, rate in med.items()}
    ratio = _of_pre_sampled(rates, "datamodule")
    fixed_ratio = _of_pre_sampled(rates, "fixed_sample")
    per_draw_ratio = _of_pre_sampled(rates, "datamodule_per_draw")
    bound = 1 / (1 / med["raw_sample"] + 1 / med["pre_sampled"])
    lines = [
        f"RL transitions, batch {batch_size}, {steps} steps, one intra-op thread, "
        f"medians of {len(rates['datamodule'])} repeats; {tp.environment_line()}",
        "",
        "| path | steps/s | ms/step | of pre_sampled |",
        "|---|---:|---:|---:|",
        f"| pre_sampled (Lightning alone) | {med['pre_sampled']:.0f} | {ms['pre_sampled']:.3f} | 1.00 |",
        f"| fixed_sample (rb_lightning's loop, no sampling) | {med['fixed_sample']:.0f} | "
        f"{ms['fixed_sample']:.3f} | {fixed_ratio:.2f} |",
        f"| datamodule (real sampling) | {med['datamodule']:.0f} | {ms['datamodule']:.3f} | "
        f"{ratio:.2f} |",
        f"| datamodule, batches_per_draw={per_draw} | {med['datamodule_per_draw']:.0f} | "
        f"{ms['datamodule_per_draw']:.3f} | {per_draw_ratio:.2f} |",
        "",
        f"plumbing per step: {ms['fixed_sample'] - ms['pre_sampled']:.3f} ms; sampling in the "
        f"loop: {ms['datamodule'] - ms['fixed_sample']:.3f} ms (raw rb.sample: "
        f"{ms['raw_sample']:.3f} ms); serial bound 1/(1/sample + 1/pre_sampled) = "
        f"{bound:.0f} steps/s, reached {med['datamodule'] / bound:.2f} of it.",
    ]
    return "\n".join(lines)


def profile(steps: int, batch_size: int, top: int = 15) -> str:
    shape = tp.Shape("rl", "tensor", "random", batch_size, 100_000)
    rb = tp.build_buffer(shape, "/tmp")
    profiler = cProfile.Profile()
    profiler.enable()
    tp.fit_steps(rb, "rl", batch_size, steps)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    ours = [
        (own, calls, f"{Path(file).name}:{line}({name})")
        for (file, line, name), (_, calls, own, _, _) in stats.items()
        if "/rb_lightning/" in file
    ]
    ours.sort(reverse=True)
    lines = [f"rb_lightning's own time per step (cProfile, {steps} steps; profiling inflates it):"]
    lines += [f"  {1e6 * own / steps:7.1f} us  {label}" for own, _, label in ours[:top]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches-per-draw", type=int, default=32)
    parser.add_argument("--profile", action="store_true", help="also profile the datamodule path")
    args = parser.parse_args()
    rates = measure(args.steps, args.repeats, args.batch_size, args.batches_per_draw)
    print(report(rates, args.steps, args.batch_size, args.batches_per_draw))
    if args.profile:
        print()
        print(profile(5 * args.steps, args.batch_size))


if __name__ == "__main__":
    main()
