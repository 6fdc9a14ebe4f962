"""Hugging Face: a replay buffer exported to ``datasets`` for TRL, and back.

:func:`to_hf_dataset` streams or snapshots a buffer (or a saved run) as a
``datasets`` dataset; :func:`from_hf_dataset` fills a buffer from one. Both
import ``datasets`` when called (the ``hf`` extra), and the names here are
imported on first use, so ``rb-lightning-export-hf --help`` answers at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rb_lightning._lazy import lazy_names

if TYPE_CHECKING:  # pragma: no cover
    from rb_lightning.hf.export import (
        BOOKKEEPING_KEYS,
        IDENTICAL,
        PER_RANK,
        SupportsHFExport,
        from_hf_dataset,
        infer_features,
        to_hf_dataset,
    )

_HOMES = {
    name: "rb_lightning.hf.export"
    for name in (
        "BOOKKEEPING_KEYS",
        "IDENTICAL",
        "PER_RANK",
        "SupportsHFExport",
        "from_hf_dataset",
        "infer_features",
        "to_hf_dataset",
    )
}
__all__ = [
    "BOOKKEEPING_KEYS",
    "IDENTICAL",
    "PER_RANK",
    "SupportsHFExport",
    "from_hf_dataset",
    "infer_features",
    "to_hf_dataset",
]
__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
