"""``rb-lightning-export-hf``: the replay buffer of a Lightning run (or any saved buffer) to a ``datasets`` folder.

    rb-lightning-export-hf runs/llm_sft/version_0 sft_data --keys prompt completion
    # in the TRL script: train_dataset = datasets.load_from_disk("sft_data")

Reads through :meth:`rb_lightning.buffers.reader.SavedBuffer.read` and exports with
:func:`rb_lightning.hf.to_hf_dataset` (``streaming=False``), both imported only once a
buffer is read, so ``--help`` answers without loading torch.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]

PROG = "rb-lightning-export-hf"

_EPILOG = """\
examples:
  rb-lightning-export-hf runs/llm_sft/version_0 sft_data     # a run: its checkpoints/last.ckpt
  rb-lightning-export-hf runs/llm_sft/version_0/checkpoints/last.ckpt sft_data
  rb-lightning-export-hf runs/llm_sft/version_0 sft_data --keys prompt completion
  rb-lightning-export-hf runs/cartpole_dqn/version_0 --list  # what it holds; writes nothing
  rb-lightning-export-hf path/to/dump_buffer_dir out         # dump_buffer(rb, path) / rb.dumps(path)

Then, in the TRL script: datasets.load_from_disk("sft_data").
Columns are the buffer's keys ("a.b" for nested keys), except torchrl's bookkeeping
(index, priority_weight), which only --keys brings back. A checkpoint is read with
torch.load(weights_only=True): nothing in it is unpickled.
"""

#: How each argument of open_saved_buffer / to_hf_dataset is spelled on this command line.
_FLAGS = {"member": "--member", "rank": "--rank"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Export the replay buffer of a Lightning run (or any saved replay buffer)\n"
        "to a Hugging Face dataset on disk, for datasets.load_from_disk in a TRL script.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "buffer",
        metavar="BUFFER",
        help="a run directory (runs/<config>/version_<N>: its checkpoints/last.ckpt), a .ckpt "
        "of a run with a ReplayBufferDataModule, a dump_buffer(rb, path) or rb.dumps(path) "
        "directory, or a torch.save(rb, path) file (with --allow-pickle)",
    )
    parser.add_argument(
        "output",
        metavar="OUT",
        nargs="?",
        help="new directory to write with Dataset.save_to_disk (not needed with --list)",
    )
    parser.add_argument(
        "--keys",
        nargs="+",
        metavar="KEY",
        help="columns to export, nested keys as 'a.b' (default: all but torchrl's bookkeeping)",
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="print what the buffer holds (item count, columns, dtypes, shapes) and exit",
    )
    parser.add_argument(
        "--member",
        metavar="NAME",
        help="a BufferMixture checkpoint: export this member only (default: all, with a "
        "'source' column)",
    )
    parser.add_argument(
        "--rank",
        type=int,
        metavar="R",
        help="a DDP run's checkpoint: export rank R's buffer only (default: all ranks, with a "
        "'source' column holding the rank)",
    )
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="UNSAFE: read a torch.save(rb, path) file, which unpickles it and can run any "
        "code in it; only for files you made. Never needed for a run's checkpoint or a dump.",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``rb-lightning-export-hf`` with ``argv`` (default: ``sys.argv[1:]``); return its exit code.

    Examples:
        >>> main(["--help"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        SystemExit: 0
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.output is None and not args.list:
        return _usage_error(
            "OUT: where to write the dataset is missing. Pass OUT, or --list to "
            "see what BUFFER holds without exporting."
        )
    from pathlib import Path

    out = None if args.output is None else Path(args.output)
    if out is not None and (out.is_file() or (out.is_dir() and any(out.iterdir()))):
        return _usage_error(
            f"OUT {args.output!r} exists and is not an empty directory; save_to_disk would "
            "replace what is there. Pass a new directory, or remove that one first."
        )
    # Heavy imports from here on: torch, torchrl, and datasets for the export.
    import logging

    from rb_lightning.buffers.reader import SavedBuffer
    from rb_lightning.errors import BufferCheckpointError, UsageError

    # torchrl logs every storage it initialises at INFO (set when torchrl is imported);
    # the summary printed below says what matters.
    logging.getLogger("torchrl").setLevel(logging.WARNING)

    try:
        saved = SavedBuffer.read(
            args.buffer, member=args.member, rank=args.rank, allow_pickle=args.allow_pickle
        )
    except UsageError as error:
        flag = _FLAGS.get(error.argument)
        return _usage_error(f"{flag}: {error}" if flag else f"BUFFER {args.buffer!r}: {error}")
    except BufferCheckpointError as error:
        return _usage_error(f"BUFFER {args.buffer!r}: {error}")
    if args.list:
        print(saved.describe())
        return 0
    return _export(saved, args.keys, args.output)


def _export(saved: Any, keys_given: list[str] | None, output: str) -> int:
    from rb_lightning.columns import KEY_SEPARATOR, flat_name, normalize_key

    try:
        import datasets

        from rb_lightning.hf.arrow import BOOKKEEPING_KEYS
        from rb_lightning.hf.export import to_hf_dataset
    except ImportError as error:  # pragma: no cover - the hf extra is missing
        return _usage_error(
            f"{error}. Exporting needs the hf extra: pip install 'rb-lightning[hf]'."
        )
    if len(saved.replay_buffer) == 0:
        return _usage_error(
            f"BUFFER {str(saved.path)!r} is {saved.kind}, and it holds no items yet: nothing "
            "to export. Export a checkpoint written after the buffer was filled."
        )
    names = [flat_name(k) for k in saved.keys()]
    keys = None
    # The export's own warning about left-out bookkeeping: this command's summary says it.
    logging.getLogger("rb_lightning.hf.arrow").setLevel(logging.ERROR)
    if keys_given is not None:
        missing = [
            k
            for k in keys_given
            if k not in names and not any(n.startswith(f"{k}.") for n in names)
        ]
        if missing:
            return _usage_error(
                f"--keys: {', '.join(missing)} not in the buffer, whose items have: "
                f"{', '.join(names)}. Nested keys are written 'a.b'."
            )
        keys = [normalize_key(tuple(k.split(KEY_SEPARATOR))) for k in keys_given]
    datasets.disable_progress_bars()  # saving takes well under a second per million rows
    try:
        dataset = to_hf_dataset(saved.replay_buffer, streaming=False, keys=keys)
    except (TypeError, ValueError) as error:  # a column Arrow cannot hold: named, with the fix
        return _usage_error(f"{error} (On this command line: --keys KEY ... to leave it out.)")
    dataset.save_to_disk(output)
    left_out = [n for n in names if n in BOOKKEEPING_KEYS and n not in dataset.column_names]
    lines = [
        f"Saved {len(dataset):,} items to {output}, columns: {', '.join(dataset.column_names)}",
        f"  from        {saved.path}: {saved.kind}",
    ]
    if left_out:
        lines.append(f"  left out    {', '.join(left_out)} (torchrl's bookkeeping; --keys adds it)")
    lines.append(f"  load with   datasets.load_from_disk({output!r})")
    print("\n".join(lines))
    return 0


def _usage_error(message: str) -> int:
    # One paragraph and exit code 2, like argparse's own errors, without the usage block.
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":  # python -m rb_lightning.hf.cli BUFFER OUT
    raise SystemExit(main())
