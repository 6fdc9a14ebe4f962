"""Asynchronous GRPO (``configs/llm_grpo_async.yaml``) against the synchronous ``llm_grpo.yaml``.

Paired, in one run: for each seed, every arm starts from the same SFT checkpoint
(``configs/llm_sft.yaml`` for ``--sft-steps`` steps, trained once here), trains the
same number of steps on the same number of generated completions (8 prompts x 8
completions per step), with the same seed. Arms:

- ``sync``: ``llm_grpo.yaml`` (generation, then training, on one thread);
- ``async s=S, decoupled|none``: ``llm_grpo_async.yaml`` with ``max_staleness: S``, with
  and without the off-policy correction;
- ``async s=2, sync every 2``: weights pushed every 2 steps instead of every step.

Every ``--eval-every`` steps a callback copies the policy's weights (about 0.1 ms) with
the wall time since the fit started; after the fit each copy's greedy accuracy on the
256 held-out prompts of ``llm_grpo.yaml``'s ``val_buffer`` is computed (outside the
clock). Columns, per arm:

- ``accuracy``: mean final accuracy; ``diff vs sync [95% CI]``: mean of the paired
  differences (arm - sync, same seed) and its t interval;
- ``wall / sync``: median over seeds of the fit's wall time over the sync run's;
- ``trainer cpu (s)``, ``worker cpu (s)``: medians of the CPU time of the training process
  over the fit, and of the generation worker over its life (where the time goes);
- ``time to sync's final / sync``: median over seeds of the first snapshot time at which
  the arm's accuracy reached the sync run's final accuracy (same seed), over the sync
  run's wall time; ``reached``: in how many seeds it did (a seed that never reached
  counts as infinitely slow in the median).

The trainer and the sync runs use one torch thread, the worker one more (two cores).

Run from the repository root (an idle machine, `uptime` load < 1.5)::

    python benchmarks/grpo_async.py                         # 10 seeds, 100 steps
    python benchmarks/grpo_async.py --seeds 0 --steps 20    # a smoke run
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from grpo_vs_trl import HELD_OUT, QUIET, _sft_config, train_sft  # noqa: E402

from rb_lightning.llm.grpo import GRPOModule  # noqa: E402
from rb_lightning.runs.cli import main as cli_main  # noqa: E402

SAMPLER = "--data.init_args.replay_buffer.init_args.sampler.init_args.max_staleness="
#: name -> (config, extra arguments)
ARMS: dict[str, tuple[str, list[str]]] = {"sync": ("llm_grpo.yaml", [])}
for _s in (1, 2, 4):
    for _c in ("decoupled", "none"):
        ARMS[f"async s={_s}, {_c}"] = (
            "llm_grpo_async.yaml",
            [f"{SAMPLER}{_s}", f"--model.init_args.off_policy_correction={_c}"],
        )
ARMS["async s=2, decoupled, sync every 2"] = (
    "llm_grpo_async.yaml",
    [f"{SAMPLER}2", "--model.init_args.off_policy_correction=decoupled",
     "--model.init_args.weight_sync_every=2"],
)  # fmt: skip


class Snapshots(Callback):
    """Copies of the policy's weights every ``every`` steps, with the wall time since fit start."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.start = 0.0
        self.copies: list[tuple[int, float, dict[str, torch.Tensor]]] = []

    def _copy(self, trainer: Any, pl_module: Any) -> None:
        weights = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}
        self.copies.append((trainer.global_step, time.perf_counter() - self.start, weights))

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        if trainer.global_step % self.every == 0:
            self._copy(trainer, pl_module)


def _scorer() -> GRPOModule:
    return GRPOModule(_sft_config())


def run_arm(
    name: str, sft: Path, seed: int, steps: int, every: int, root: Path, scorer: GRPOModule
) -> dict[str, Any]:
    config, extra = ARMS[name]
    args = [
        "--config", str(REPO / "configs" / config), *QUIET, f"--trainer.max_steps={steps}",
        "--trainer.logger=false", "--trainer.enable_checkpointing=false",
        f"--trainer.default_root_dir={root}", f"--model.init_from={sft}",
        f"--seed_everything={seed}", f"--model.init_args.seed={seed}", *extra,
    ]  # fmt: skip
    cli = cli_main(args, run=False)
    snapshots = Snapshots(every)
    cli.trainer.callbacks.append(snapshots)
    start, cpu = time.perf_counter(), time.process_time()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    worker_cpu = getattr(cli.model, "worker_cpu_s", None) or 0.0
    curve = []
    for step, seconds, weights in snapshots.copies:
        scorer.model.load_state_dict(weights)
        curve.append((step, seconds, float(scorer.greedy_accuracy(HELD_OUT))))
    return {
        "wall": wall, "cpu": cpu, "worker_cpu": worker_cpu, "curve": curve,
        "accuracy": curve[-1][2],
    }  # fmt: skip


def _interval(values: list[float]) -> tuple[float, float, float]:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    # Two-sided 95% t quantiles for n - 1 degrees of freedom (n <= 30), else the normal one.
    t = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
         10: 2.23, 11: 2.20, 12: 2.18, 13: 2.16, 14: 2.14, 19: 2.09, 29: 2.05}  # fmt: skip
    df = len(values) - 1
    quantile = t.get(df, 2.05 if df < 30 else 1.96)
    half = quantile * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--sft", type=Path, default=None, help="an SFT checkpoint to reuse")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    options = parser.parse_args()
    torch.set_num_threads(1)
    arms = ["sync", *[a for a in options.arms if a != "sync"]]
    results: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    started = time.perf_counter()
    print(f"load average at start: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sft = options.sft or train_sft(options.sft_steps, root / "sft")
        scorer = _scorer()
        scorer.model.load_state_dict(
            {k.removeprefix("model."): v for k, v in torch.load(sft)["state_dict"].items()
             if k.startswith("model.")}
        )  # fmt: skip
        start_accuracy = float(scorer.greedy_accuracy(HELD_OUT))
        for seed in options.seeds:
            for arm in arms:
                out = run_arm(
                    arm, sft, seed, options.steps, options.eval_every, root / f"{seed}", scorer
                )
                results[arm].append(out)
                print(
                    f"seed {seed} {arm}: accuracy {out['accuracy']:.3f} wall {out['wall']:.2f}s "
                    f"trainer cpu {out['cpu']:.2f}s worker cpu {out['worker_cpu']:.2f}s",
                    flush=True,
                )
    print(
        f"\nload average at end: {os.getloadavg()}; benchmark {time.perf_counter() - started:.0f}s"
    )
    print(
        f"SFT start ({options.sft_steps} steps): held-out greedy accuracy {start_accuracy:.3f}; "
        f"{options.steps} GRPO steps x 64 completions, seeds {options.seeds}\n"
    )
    print("| arm | accuracy | diff vs sync [95% CI] | wall / sync | time to sync's final / sync "
          "| reached | trainer cpu (s) | worker cpu (s) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    sync = results["sync"]
    for arm in arms:
        runs = results[arm]
        accuracy = statistics.fmean(r["accuracy"] for r in runs)
        diff = _interval([r["accuracy"] - s["accuracy"] for r, s in zip(runs, sync, strict=True)])
        wall = statistics.median(r["wall"] / s["wall"] for r, s in zip(runs, sync, strict=True))
        reach = []
        for r, s in zip(runs, sync, strict=True):
            times = [sec for _, sec, acc in r["curve"] if acc >= s["accuracy"]]
            reach.append(times[0] / s["wall"] if times else math.inf)
        reached = sum(math.isfinite(x) for x in reach)
        cpu = statistics.median(r["cpu"] for r in runs)
        worker = statistics.median(r["worker_cpu"] for r in runs)
        print(
            f"| {arm} | {accuracy:.3f} | {diff[0]:+.3f} [{diff[1]:+.3f}, {diff[2]:+.3f}] | "
            f"{wall:.2f} | {statistics.median(reach):.2f} | {reached}/{len(runs)} | "
            f"{cpu:.2f} | {worker:.2f} |"
        )


if __name__ == "__main__":
    main()
