"""A live buffer as a ``datasets.IterableDataset``: one Arrow table per sampling call.

``ranks="identical"`` streams draw the same batches on every process (each batch
seeded from its position), so Accelerate slices every global batch across
processes; ``ranks="per_rank"`` streams give each process and DataLoader worker
its own random stream from its own shards.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import count
from typing import TYPE_CHECKING, Any, Final, Literal

import numpy as np
from tensordict.utils import NestedKey
from torchrl.data import ReplayBuffer

from rb_lightning.buffers.handles import resolve_buffer
from rb_lightning.errors import UsageError
from rb_lightning.hf.arrow import arrow_table, require_hf
from rb_lightning.stream.sampling import BufferStream
from rb_lightning.stream.sharding import Shard, current_shard
from rb_lightning.validation import check_positive_int

if TYPE_CHECKING:  # pragma: no cover
    pass

logger = logging.getLogger(__name__)

#: Shards of an unbounded ``ranks="per_rank"`` stream: enough for DataLoader workers x ranks.
DEFAULT_STREAM_SHARDS = 8
#: Every process draws the same stream (same seed, same buffer content); Accelerate
#: hands each process its slice of each global batch.
IDENTICAL: Final = "identical"
#: Every process (and DataLoader worker) draws its own random stream from its own shards.
PER_RANK: Final = "per_rank"
RANKS = (IDENTICAL, PER_RANK)


@dataclass
class _StreamSpec:
    """Everything a shard generator needs; pickled into DataLoader workers."""

    sampler: BufferStream
    columns: dict[str, NestedKey]
    schema: Any
    num_batches: int | None
    n_shards: int
    ranks: str = PER_RANK
    seed: int = 0
    #: Passes started in this process (identical streams: part of each batch's seed).
    passes: int = 0


def _batch_seed(seed: int, pass_: int, batch: int) -> int:
    """A seed for one batch of an identical stream: a function of its position only."""
    state = np.random.SeedSequence([seed, pass_, batch]).generate_state(1, np.uint64)[0]
    return int(state) & (2**63 - 1)


def _sampled_tables(shards: list[int], spec: tuple[_StreamSpec]) -> Iterator[tuple[str, Any]]:
    """Generate one Arrow table per sampling call for the given shards."""
    (spec_,) = spec
    sampler = spec_.sampler
    shard = current_shard()
    identical = spec_.ranks == IDENTICAL
    if identical:
        pass_ = spec_.passes
        spec_.passes += 1
    else:
        # A copy of the buffer in a worker process or on another rank: draw its own stream.
        sampler.seed_replica(shard)
    sampler.wait_until_ready()
    budget = None
    if spec_.num_batches is not None:
        total = spec_.num_batches
        budget = sum(Shard(worker_id=s, num_workers=spec_.n_shards).share(total) for s in shards)
    for drawn in count():
        if budget is not None and drawn >= budget:
            return
        if identical:
            # Re-seeded per batch, from (seed, pass, batch) only: every process draws the
            # same batch whatever else sampled this buffer in between.
            sampler.reseed(_batch_seed(spec_.seed, pass_, drawn))
        batch = sampler.sample()
        yield f"{shards[0]}_{drawn}", arrow_table(batch, spec_.columns, spec_.schema)


def check_ranks(
    ranks: Any, seed: Any, n_shards: Any
) -> tuple[Literal["identical", "per_rank"], int]:
    if ranks not in RANKS:
        raise UsageError(
            "ranks",
            f"ranks must be 'identical' (every process draws the same stream and takes its slice "
            f"of each global batch) or 'per_rank' (each process its own stream), got {ranks!r}.",
        )
    if ranks == PER_RANK:
        if seed is not None:
            raise UsageError(
                "seed",
                "seed applies to ranks='identical' streams; ranks='per_rank' streams are seeded "
                "per rank and DataLoader worker from torch's RNG. Drop seed, or pass "
                "ranks='identical'.",
            )
        return ranks, 0
    if n_shards not in (None, 1):
        raise UsageError(
            "n_shards",
            f"n_shards={n_shards} with ranks='identical': an identical stream is one shard, so that "
            "Accelerate slices each global batch across processes instead of giving each process "
            "whole shards. Drop n_shards, or pass ranks='per_rank' to shard the stream.",
        )
    if seed is None:
        return ranks, 0
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UsageError("seed", f"seed must be a non-negative int, got {seed!r}.")
    return ranks, seed


def _check_identical_source(replay_buffer: ReplayBuffer) -> None:
    """An identical stream needs draws that depend on the generator and the content only."""
    from torchrl.data.replay_buffers.samplers import (
        PrioritizedSampler,
        RandomSampler,
        SamplerWithoutReplacement,
        SliceSampler,
    )

    handle = resolve_buffer(replay_buffer)
    if not handle.samples_in_process:
        raise UsageError(
            "ranks",
            "ranks='identical' needs a local copy of the buffer on every process, but this buffer "
            "is served by a Ray actor that all processes share, so each process would draw "
            "different batches. Dump it once and load_buffer the dump on every process, or "
            "export a snapshot with streaming=False.",
        )
    stateless = (RandomSampler, PrioritizedSampler, SliceSampler)
    for sampler in [rb.sampler for rb in handle.in_process_buffers()]:
        if isinstance(sampler, SamplerWithoutReplacement) or not isinstance(sampler, stateless):
            raise UsageError(
                "ranks",
                f"ranks='identical' re-seeds the buffer before every batch so that all processes draw "
                f"the same one, but {type(sampler).__name__} also draws from its own state (what it "
                "already handed out), which a read-ahead on one process can advance more than on "
                "another. To read every item once, export a snapshot (streaming=False); to sample, "
                "use RandomSampler or PrioritizedSampler; or pass ranks='per_rank' (not for GRPO on "
                "several processes).",
            )


def stream_dataset(
    stream: BufferStream,
    num_batches: int | None,
    features: Any,
    columns: dict[str, NestedKey],
    n_shards: Any,
    ranks: str,
    seed: int,
) -> Any:
    datasets, _ = require_hf()
    from datasets.iterable_dataset import ArrowExamplesIterable

    if ranks == IDENTICAL:
        _check_identical_source(stream.replay_buffer)
        n_shards = 1
    elif n_shards is None:
        n_shards = DEFAULT_STREAM_SHARDS
        if num_batches is not None:
            n_shards = min(num_batches, DEFAULT_STREAM_SHARDS)
    n_shards = check_positive_int(n_shards, "n_shards")
    if num_batches is not None and n_shards > num_batches:
        raise UsageError(
            "n_shards",
            f"n_shards={n_shards} exceeds num_batches={num_batches}: some shards would be "
            "empty. Lower n_shards, or raise num_batches.",
        )
    spec = _StreamSpec(stream, columns, features.arrow_schema, num_batches, n_shards, ranks, seed)
    # Lists in the kwargs are shards for `datasets`; everything else goes in a tuple.
    iterable = ArrowExamplesIterable(
        _sampled_tables, {"shards": list(range(n_shards)), "spec": (spec,)}
    )
    if num_batches is None:
        description = (
            "Unbounded stream sampled from a live torchrl replay buffer: trainers need "
            "max_steps (e.g. TrainingArguments(max_steps=...)) to stop."
        )
        logger.info("to_hf_dataset: %s", description)
    else:
        description = (
            f"{num_batches} batches of {stream.batch_size} items sampled from a torchrl "
            "replay buffer per pass; trainers still need max_steps (no __len__)."
        )
    info = datasets.DatasetInfo(description=description, features=features)
    return datasets.IterableDataset(iterable, info=info)


__all__ = [
    "DEFAULT_STREAM_SHARDS",
    "IDENTICAL",
    "PER_RANK",
    "RANKS",
    "check_ranks",
    "stream_dataset",
]
