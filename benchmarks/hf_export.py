"""Export time of a replay buffer to Hugging Face ``datasets``, against the seed path.

Buffer: ``--items`` LLM-like items in a ``LazyTensorStorage`` (``input_ids``,
``attention_mask`` and ``labels`` int64[``--seq-len``], a ``prompt`` string,
a float ``reward``). Measured in one process, so ratios are fair:

* ``raw sample``: one ``rb.sample(batch_size)``, the ceiling for a first item.
* ``stream``: ``to_hf_dataset(rb)`` build time and first-item latency
  (build + ``next(iter(ds))``).
* ``seed stream``: torchrl's ``TorchRLBufferDataset(...).as_hf_dataset()``
  (``IterableDataset.from_generator``), same two numbers. Its build hashes the
  whole buffer for a fingerprint.
* ``snapshot``: ``to_hf_dataset(rb, streaming=False)`` total, and
  ``save_to_disk`` of it.
* ``from_generator``: ``datasets.Dataset.from_generator`` over the same rows in
  storage order (the obvious per-row snapshot), total.
* ``fingerprint``: the build time of both streams on a ``--fingerprint-items``
  buffer (hashing cost only; nothing is iterated).

Run from the repository root::

    python benchmarks/hf_export.py                 # 100k items (about 2 minutes)
    python benchmarks/hf_export.py --items 10000    # quick
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

torch.set_num_threads(1)

import datasets  # noqa: E402
from tensordict import NonTensorStack, TensorDict  # noqa: E402
from torchrl.data import LazyTensorStorage, ReplayBuffer  # noqa: E402
from torchrl.modules.llm.trl_interop import TorchRLBufferDataset  # noqa: E402

from rb_lightning import ReplayBufferPassDataset  # noqa: E402
from rb_lightning.hf.export import to_hf_dataset  # noqa: E402
from rb_lightning.llm.data import arithmetic_examples  # noqa: E402

logging.getLogger("torchrl").setLevel(logging.WARNING)
datasets.disable_progress_bars()


def llm_buffer(items: int, seq_len: int) -> ReplayBuffer:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 18, (items, seq_len), generator=generator)
    prompts = [p for p, _ in arithmetic_examples(items, seed=0)]
    rb = ReplayBuffer(storage=LazyTensorStorage(items))
    rb.extend(
        TensorDict(
            {
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "labels": ids.clone(),
                "prompt": NonTensorStack(*prompts),
                "reward": torch.rand(items, generator=generator),
            },
            batch_size=[items],
        )
    )
    return rb


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def stream_times(build: Callable[[], Any]) -> dict[str, float]:
    build_s, dataset = timed(build)
    first_s, _ = timed(lambda: next(iter(dataset)))
    return {"build_s": build_s, "first_item_s": build_s + first_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--fingerprint-items", type=int, default=50_000)
    parser.add_argument("--skip-slow", action="store_true", help="skip from_generator")
    args = parser.parse_args()

    rb = llm_buffer(args.items, args.seq_len)
    bs = args.batch_size
    results: dict[str, Any] = {
        "items": args.items,
        "seq_len": args.seq_len,
        "batch_size": bs,
        "machine": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
    }
    rb.sample(bs)  # warm-up
    results["raw_sample_s"] = timed(lambda: rb.sample(bs))[0]
    results["stream"] = stream_times(lambda: to_hf_dataset(rb, batch_size=bs, num_batches=None))
    results["seed_stream"] = stream_times(
        lambda: TorchRLBufferDataset(rb, bs, num_batches=None).as_hf_dataset()
    )
    snapshot_s, snapshot = timed(lambda: to_hf_dataset(rb, streaming=False))
    out = tempfile.mkdtemp()
    try:
        save_s, _ = timed(lambda: snapshot.save_to_disk(out))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    results["snapshot_s"] = snapshot_s
    results["snapshot_save_to_disk_s"] = save_s
    assert snapshot.features["input_ids"].feature.dtype == "int64"

    if not args.skip_slow:

        def rows():
            for cols in ReplayBufferPassDataset(rb, 4096, flatten=True):
                names = list(cols)
                for values in zip(*(cols[n] for n in names), strict=True):
                    yield {
                        n: v.tolist() if isinstance(v, torch.Tensor) else v
                        for n, v in zip(names, values, strict=True)
                    }

        cache = tempfile.mkdtemp()
        try:
            results["from_generator_s"] = timed(
                lambda: datasets.Dataset.from_generator(rows, cache_dir=cache)
            )[0]
        finally:
            shutil.rmtree(cache, ignore_errors=True)

    small = llm_buffer(args.fingerprint_items, args.seq_len)
    results["fingerprint_items"] = args.fingerprint_items
    results["fingerprint_build_s"] = timed(lambda: to_hf_dataset(small, num_batches=None))[0]
    results["seed_fingerprint_build_s"] = timed(
        lambda: TorchRLBufferDataset(small, bs, num_batches=None).as_hf_dataset()
    )[0]

    first = results["stream"]["first_item_s"]
    results["ratios"] = {
        "stream_first_item_vs_raw_sample": first / results["raw_sample_s"],
        "seed_first_item_vs_stream": results["seed_stream"]["first_item_s"] / first,
    }
    if "from_generator_s" in results:
        results["ratios"]["from_generator_vs_snapshot"] = results["from_generator_s"] / snapshot_s
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
