"""Hugging Face: a replay buffer exported to ``datasets`` for TRL, and back.

:func:`to_hf_dataset` streams or snapshots a buffer (or a saved run) as a
``datasets`` dataset; :func:`from_hf_dataset` fills a buffer from one. Both
import ``datasets`` when called (the ``hf`` extra), and the names here are
imported on first use, so ``rb-lightning-export-hf --help`` answers at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rb_lightning.namespaces import lazy_names
from rb_lightning.stream import exporters

if TYPE_CHECKING:  # pragma: no cover
    from rb_lightning.hf.arrow import BOOKKEEPING_KEYS, infer_features
    from rb_lightning.hf.export import SupportsHFExport, to_hf_dataset
    from rb_lightning.hf.load import from_hf_dataset
    from rb_lightning.hf.streaming import IDENTICAL, PER_RANK

_HOMES = {
    "BOOKKEEPING_KEYS": "rb_lightning.hf.arrow",
    "IDENTICAL": "rb_lightning.hf.streaming",
    "PER_RANK": "rb_lightning.hf.streaming",
    "SupportsHFExport": "rb_lightning.hf.export",
    "from_hf_dataset": "rb_lightning.hf.load",
    "infer_features": "rb_lightning.hf.arrow",
    "to_hf_dataset": "rb_lightning.hf.export",
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


def _to_hf_dataset(source: Any, **options: Any) -> Any:
    from rb_lightning.hf.export import to_hf_dataset  # imports `datasets`: only when asked

    return to_hf_dataset(source, **options)


# A dataset's or DataModule's as_hf_dataset() (the stream layer) exports through this.
exporters.register_exporter("hf", _to_hf_dataset)
