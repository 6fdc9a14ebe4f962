"""What every dump holds besides the items: sampler, writer and sampling-generator state.

The sampler and the writer are written through their own ``dumps`` (JSON and
memory-mapped tensors), the generator state as a memory-mapped tensor, and the
buffer's default batch size and ``consume_after_n_samples`` in the manifest.
:func:`ensure_generator` gives a buffer the generator a checkpoint can restore.

Examples:
    >>> import torch
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
    >>> generator = ensure_generator(rb)
    >>> generator is ensure_generator(rb), generator.device
    (True, device(type='cpu'))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import ReplayBuffer

from rb_lightning import torchrl_compat
from rb_lightning.errors import ArgumentTypeError, BufferCheckpointError
from rb_lightning.persist.build import SAME_BUILD_HINT
from rb_lightning.persist.manifest import PENDING_DIR, Digests

__all__ = [
    "dump_components",
    "dump_pending_batches",
    "ensure_generator",
    "load_components",
    "on_host",
]


def ensure_generator(replay_buffer: ReplayBuffer) -> torch.Generator | None:
    """Give ``replay_buffer`` its own ``torch.Generator`` if it has none, and return it.

    Without one, torchrl samplers draw from torch's (or numpy's) global RNG,
    which a checkpoint cannot restore. The new generator lives on the storage's
    device (samplers draw indices there) and is seeded from
    ``torch.initial_seed()`` (set by ``seed_everything``), offset so that it
    does not replay the global stream. Returns ``None`` while the device is
    still unknown (a lazy storage with ``device="auto"`` and no data yet). For
    a buffer of this process: a Ray buffer's generator lives in its actor.
    """
    generator = torchrl_compat.buffer_generator(replay_buffer)
    if generator is not None:
        return generator
    device = getattr(replay_buffer.storage, "device", None)
    if isinstance(device, str) and device == "auto":
        return None
    generator = torch.Generator(device=torch.device(device) if device is not None else "cpu")
    generator.manual_seed((torch.initial_seed() + 0x9E3779B9) % 2**63)
    replay_buffer.set_rng(generator)
    return generator


def on_host(data: TensorDictBase) -> TensorDictBase:
    """``data`` in host memory: dumps are host files, restored onto the storage's device."""
    device = data.device
    # device None: leaves may sit anywhere (a tensor storage's rows wrapped in a TensorDict).
    return data if device is not None and device.type == "cpu" else data.to("cpu")


def dump_components(replay_buffer: ReplayBuffer, root: Path, digests: Digests) -> dict[str, Any]:
    """Write sampler, writer and generator state into ``root``; return what the manifest records."""
    replay_buffer.sampler.dumps(root / "sampler")
    replay_buffer.writer.dumps(root / "writer")
    generator = torchrl_compat.buffer_generator(replay_buffer)
    if generator is not None:
        state = TensorDict(rng_state=generator.get_state(), device=generator.device)
        digests.add_written(state.memmap(root / "rng_state"))
    return {
        "batch_size": torchrl_compat.default_batch_size(replay_buffer),
        "consume_after_n_samples": torchrl_compat.consume_after_n_samples(replay_buffer),
    }


def dump_pending_batches(pending_batches: Any, root: Path, digests: Digests) -> None:
    """Write the batches read ahead of the saved step into ``root/pending_batches/<n>``.

    Raises:
        ArgumentTypeError: A batch that is not a TensorDict (it could not be saved exactly).
    """
    for number, batch in enumerate(pending_batches):
        if not isinstance(batch, TensorDictBase):
            raise ArgumentTypeError(
                "pending_batches",
                f"pending batch {number} is a {type(batch).__name__}; only TensorDict batches "
                "can be saved for an exact resume.",
            )
        digests.add_written(on_host(batch).memmap(root / PENDING_DIR / str(number)))


def load_components(
    replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any], *, sampler: bool = True
) -> None:
    """Inverse of :func:`dump_components` (after the storage was restored).

    ``sampler=False``: the sampler keeps its state (an empty buffer's sampler was
    reset with the storage).
    """
    part = "sampler"
    try:
        if sampler:
            replay_buffer.sampler.loads(root / "sampler")
        part = "writer"
        replay_buffer.writer.loads(root / "writer")
    except Exception as error:
        raise BufferCheckpointError(
            f"Could not load the {part} state saved in {root / part} into the DataModule's "
            f"buffer's {type(getattr(replay_buffer, part)).__name__} ({type(error).__name__}: "
            f"{error}). {SAME_BUILD_HINT}"
        ) from error
    if (root / "rng_state").exists():
        state = TensorDict.load_memmap(root / "rng_state", allow_pickle=False)
        generator = torch.Generator(device=state.device)
        # The state of a CUDA generator is a host byte tensor; load_memmap put it on the
        # generator's device (recorded in the dump), set_state wants it on the host.
        generator.set_state(state["rng_state"].cpu().clone())
        replay_buffer.set_rng(generator)
    if manifest.get("batch_size") is not None:
        torchrl_compat.set_default_batch_size(replay_buffer, manifest["batch_size"])
    torchrl_compat.set_consume_after_n_samples(
        replay_buffer, manifest.get("consume_after_n_samples")
    )
