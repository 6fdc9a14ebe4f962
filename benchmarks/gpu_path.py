"""Trainer steps/s and GPU busy fraction of the GPU feeding paths, against a GPU-resident ceiling.

For two training steps at B=256 -- an RL MLP (a DQN-style TD loss) and a small
transformer encoder (4 layers, d=256, 64 tokens) -- the same ``Trainer.fit`` loop is
fed four ways:

* (a) ``host``: host storage (``LazyTensorStorage(N)``), the plain loader; Lightning copies
  each pageable batch to the GPU in ``transfer_batch_to_device``.
* (b) ``overlap``: host storage with ``prefetch_to_device=True``: batch n+1 is pinned and
  copied on a side CUDA stream while step n runs (rb_lightning.stream.device_prefetch).
* (c) ``gpu_storage``: ``LazyTensorStorage(N, device="cuda")``; sampled on the GPU, no copy.
* (d) ``ceiling``: the same loop fed 16 batches already on the GPU, cycled (no sampling).

Columns: steps/s (wall clock over the measured steps, after warm-up, ending with a
``cuda.synchronize``); its ratio to (d); and the GPU busy fraction, from CUDA events
recorded on the compute stream at ``on_train_batch_start`` and ``on_train_batch_end``:
the share of the measured span (first start event to last end event, GPU clock) that
the compute stream spent inside a step rather than between two steps. Time between
steps is the step waiting for its batch (sampling, copy, Lightning's bookkeeping);
gaps inside a step where the GPU waits for the host to launch kernels count as busy,
so a launch-bound step reads higher than its kernel occupancy.

Run on a machine with CUDA, from the repository root (a few minutes on one GPU)::

    python benchmarks/gpu_path.py

Without CUDA it prints one line and exits with status 2 (nothing measured).
``--device cpu`` is a smoke mode that runs every path on the CPU with shrunk models and
B=16 (a few seconds with ``--steps 3 --warmup 1 --capacity 512``; busy fraction "n/a";
on CPU ``prefetch_to_device`` does nothing and "GPU storage" is a CPU storage), used by
tests/benchmarks/test_gpu_path_smoke.py. Its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning import ReplayBufferDataModule

NO_CUDA_EXIT = 2
PATHS = ("host", "overlap", "gpu_storage", "ceiling")
LABELS = {
    "host": "(a) host storage, plain loader",
    "overlap": "(b) host storage, pinned + overlap",
    "gpu_storage": "(c) GPU-resident storage",
    "ceiling": "(d) batches already on the GPU",
}


# -- the two steps ----------------------------------------------------------------------------
class MLPStep(L.LightningModule):
    """A DQN-style step: Q(obs) vs reward + gamma * max Q_target(next_obs)."""

    obs_dim, actions = 64, 8

    def __init__(self, width: int = 512) -> None:
        super().__init__()

        def net() -> torch.nn.Module:
            return torch.nn.Sequential(
                torch.nn.Linear(self.obs_dim, width),
                torch.nn.ReLU(),
                torch.nn.Linear(width, width),
                torch.nn.ReLU(),
                torch.nn.Linear(width, self.actions),
            )

        self.q, self.target = net(), net()
        self.target.requires_grad_(False)

    @classmethod
    def items(cls, n: int) -> TensorDict:
        return TensorDict(
            {
                "obs": torch.randn(n, cls.obs_dim),
                "action": torch.randint(0, cls.actions, (n,)),
                "reward": torch.randn(n),
                "done": torch.zeros(n, dtype=torch.bool),
                "next_obs": torch.randn(n, cls.obs_dim),
            },
            batch_size=[n],
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        q = self.q(batch["obs"]).gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            best = self.target(batch["next_obs"]).max(-1).values
            target = batch["reward"] + 0.99 * best * (~batch["done"]).float()
        return torch.nn.functional.smooth_l1_loss(q, target)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-4)


class TransformerStep(L.LightningModule):
    """Next-token loss of a small transformer encoder over stored token sequences."""

    vocab, tokens = 1000, 64

    def __init__(self, d_model: int = 256, layers: int = 4) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(self.vocab, d_model)
        layer = torch.nn.TransformerEncoderLayer(
            d_model, nhead=4, dim_feedforward=4 * d_model, batch_first=True
        )
        self.encoder = torch.nn.TransformerEncoder(layer, layers)
        self.head = torch.nn.Linear(d_model, self.vocab)

    @classmethod
    def items(cls, n: int) -> TensorDict:
        return TensorDict({"tokens": torch.randint(0, cls.vocab, (n, cls.tokens))}, batch_size=[n])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        tokens = batch["tokens"]
        logits = self.head(self.encoder(self.embed(tokens[:, :-1])))
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, self.vocab), tokens[:, 1:].reshape(-1)
        )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-4)


STEPS = {"rl_mlp": MLPStep, "transformer": TransformerStep}
SMOKE_SIZES = {"rl_mlp": dict(width=32), "transformer": dict(d_model=32, layers=1)}


# -- timing ------------------------------------------------------------------------------------
class StepTimer(L.Callback):
    """Wall time of the measured steps; CUDA events at each step's start and end."""

    def __init__(self, warmup: int, cuda: bool) -> None:
        self.warmup, self.cuda = warmup, cuda
        self.started: float | None = None
        self.finished: float | None = None
        self.measured = 0
        self.events: list[tuple[Any, Any]] = []

    def _event(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.warmup:
            if self.cuda:
                torch.cuda.synchronize()
            self.started = time.perf_counter()
        if trainer.global_step >= self.warmup and self.cuda:
            self.events.append((self._event(), None))

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self.started is None:
            return
        self.measured += 1
        if self.cuda:
            start, _ = self.events[-1]
            self.events[-1] = (start, self._event())

    def on_train_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.finished = time.perf_counter()

    def steps_per_second(self) -> float:
        return self.measured / (self.finished - self.started)

    def busy_fraction(self) -> float | None:
        if not self.cuda or not self.events:
            return None
        inside = sum(start.elapsed_time(end) for start, end in self.events)
        span = self.events[0][0].elapsed_time(self.events[-1][1])
        return inside / span if span > 0 else None


class OnDevice:
    """The ceiling's loader: a few batches already on the device, cycled, ``length`` in all."""

    def __init__(self, batches: list[TensorDict], length: int) -> None:
        self.batches, self.length = batches, length

    def __iter__(self) -> Iterator[TensorDict]:
        return itertools.islice(itertools.cycle(self.batches), self.length)

    def __len__(self) -> int:
        return self.length


@dataclass
class Result:
    step: str
    path: str
    steps_per_second: float
    busy: float | None


def run_one(step: str, path: str, args: argparse.Namespace) -> Result:
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    model_cls = STEPS[step]
    storage_device = device if path in ("gpu_storage", "ceiling") else "cpu"
    rb = ReplayBuffer(storage=LazyTensorStorage(args.capacity, device=storage_device))
    rb.extend(model_cls.items(args.capacity))
    total = args.warmup + args.steps
    timer = StepTimer(args.warmup, cuda)
    trainer = L.Trainer(
        accelerator="gpu" if cuda else "cpu",
        devices=1,
        max_steps=total,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[timer],
    )
    # The CPU smoke mode shrinks the models: it checks the paths run, it measures nothing.
    model = model_cls(**SMOKE_SIZES[step]) if not cuda else model_cls()
    if path == "ceiling":
        batches = [rb.sample(args.batch_size).to(device) for _ in range(16)]
        trainer.fit(model, train_dataloaders=OnDevice(batches, total))
    else:
        datamodule = ReplayBufferDataModule(
            rb,
            batch_size=args.batch_size,
            num_batches=None,
            prefetch_to_device=path == "overlap",
        )
        trainer.fit(model, datamodule=datamodule)
    return Result(step, path, timer.steps_per_second(), timer.busy_fraction())


def table(results: list[Result], hardware: str) -> str:
    lines = [
        f"Hardware: {hardware}",
        "",
        "| step | path | steps/s | ratio to (d) | GPU busy fraction |",
        "|---|---|---:|---:|---:|",
    ]
    ceiling = {r.step: r.steps_per_second for r in results if r.path == "ceiling"}
    for r in results:
        ratio = r.steps_per_second / ceiling[r.step] if r.step in ceiling else float("nan")
        busy = "n/a" if r.busy is None else f"{r.busy:.2f}"
        lines.append(
            f"| {r.step} | {LABELS[r.path]} | {r.steps_per_second:.1f} | {ratio:.2f} | {busy} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--steps", type=int, default=500, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=50, help="steps before measuring")
    parser.add_argument("--batch-size", type=int, default=None, help="256 (16 with --device cpu)")
    parser.add_argument("--capacity", type=int, default=100_000, help="items in each buffer")
    parser.add_argument("--steps-only", nargs="*", choices=tuple(STEPS), default=list(STEPS))
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_path: no CUDA device here, nothing measured (exit 2); run it on a GPU "
            "machine, or use --device cpu for the smoke mode."
        )
        return NO_CUDA_EXIT
    if args.batch_size is None:
        args.batch_size = 256 if args.device == "cuda" else 16
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    if args.device == "cuda":
        torch.set_float32_matmul_precision("high")
        hardware = f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    else:
        hardware = f"CPU smoke mode (not a GPU measurement), torch {torch.__version__}"
    results = []
    for step in args.steps_only:
        for path in PATHS:
            result = run_one(step, path, args)
            results.append(result)
            print(f"{step:12s} {path:12s} {result.steps_per_second:9.1f} steps/s", flush=True)
    print()
    print(table(results, hardware))
    return 0


if __name__ == "__main__":
    sys.exit(main())
