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
from dataclasses import dataclass
from typing import Any

__all__ = ["ExportDefaults", "export", "register_exporter"]


@dataclass(frozen=True)
class ExportDefaults:
    """What a dataset or DataModule samples: the defaults of an export of it (a description, not a stream).

    Attributes:
        replay_buffer: The buffer sampled.
        batch_size: Items per sampling call.
        keys: Keys kept (``None``: all).
        num_batches: Sampling calls per pass (``None``: unbounded).
        min_size: Items to wait for before the first draw (``None``: one).
        wait_timeout: Seconds to wait for ``min_size``.
        streaming: Whether the source is a stream (``False``: exported as a snapshot).
    """

    replay_buffer: Any
    batch_size: int
    keys: list[Any] | None = None
    num_batches: int | None = None
    min_size: int | None = None
    wait_timeout: float = 600.0
    streaming: bool = True


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
