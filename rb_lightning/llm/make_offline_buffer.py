"""Save the buffer that the ``offline_from_disk`` config trains from.

    python -m rb_lightning.llm.make_offline_buffer runs/offline_buffer
    rb-lightning fit --config offline_from_disk

The buffer is built like the config's (``TensorDictReplayBuffer``,
``LazyMemmapStorage(max_size=4096)``, default sampler and writer), filled with
tokenized arithmetic examples (tensors only: torchrl 0.14.1's ``LazyMemmapStorage``
keeps only the first string of a column), and written with ``ReplayBuffer.dumps``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torchrl.data import LazyMemmapStorage, TensorDictReplayBuffer

from rb_lightning.llm.data import fill_arithmetic_buffer
from rb_lightning.runs.run_log import quiet_run_log


def make_offline_buffer(
    path: str | Path, num_examples: int = 4096, capacity: int = 4096, seed: int = 0
) -> TensorDictReplayBuffer:
    """Fill a buffer of ``capacity`` with ``num_examples`` items and ``dumps`` it to ``path``.

    Examples:
        >>> import tempfile
        >>> len(make_offline_buffer(tempfile.mkdtemp(), num_examples=8, capacity=8))
        8
    """
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(capacity))
    fill_arithmetic_buffer(rb, num_examples, seed=seed, text=False)
    Path(path).mkdir(parents=True, exist_ok=True)
    rb.dumps(path)
    return rb


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rb_lightning.llm.make_offline_buffer",
        description=(__doc__ or "").splitlines()[0],
    )
    parser.add_argument("path", nargs="?", default="runs/offline_buffer", help="output directory")
    parser.add_argument("--num-examples", type=int, default=4096)
    parser.add_argument(
        "--capacity", type=int, default=4096, help="storage max_size; must match the config"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    quiet_run_log()  # torchrl's INFO lines (storage initialised, spec checks)
    torch.set_num_threads(1)
    rb = make_offline_buffer(args.path, args.num_examples, args.capacity, args.seed)
    print(f"saved {len(rb)} items (capacity {args.capacity}) to {args.path}")


if __name__ == "__main__":
    main()
