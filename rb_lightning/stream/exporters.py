"""Where a dataset's ``as_hf_dataset()`` goes: the exporter a plugin registered.

The stream layer does not know Hugging Face; :mod:`rb_lightning.hf` registers
its ``to_hf_dataset`` here when imported (``import rb_lightning`` imports it),
so ``ReplayBufferDataset(...).as_hf_dataset()`` works as torchrl's
``TorchRLBufferDataset.as_hf_dataset()`` does.

Examples:
    >>> register_exporter("demo", lambda source, **options: (source, options))
    >>> export("demo", "a dataset", streaming=False)
    ('a dataset', {'streaming': False})
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["export", "register_exporter"]

_EXPORTERS: dict[str, Callable[..., Any]] = {}


def register_exporter(name: str, exporter: Callable[..., Any]) -> None:
    """Make ``export(name, source, **options)`` call ``exporter(source, **options)``."""
    _EXPORTERS[name] = exporter


def export(name: str, source: Any, **options: Any) -> Any:
    """``source`` exported by the exporter registered as ``name``."""
    exporter = _EXPORTERS.get(name)
    if exporter is None:
        raise ImportError(
            f"No {name!r} exporter is registered: import rb_lightning (which registers the "
            "Hugging Face export) before exporting, and install the extra it needs "
            "(pip install 'rb-lightning[hf]')."
        )
    return exporter(source, **options)
