"""What fills a replay buffer before and during training.

* :class:`BufferSource` and its kinds fill a buffer once, in the DataModule's
  ``setup``: :class:`LoadDirectory` (a saved ``rb.dumps`` directory),
  :class:`CallSource` (a ``"module:function"``), :class:`FillMembers` (one
  source per member of a mixture);
* :class:`BufferMixture` samples several named buffers as one (offline
  demonstrations and online experience), each batch with a ``"source"`` column.

The online collector that steps an environment during ``fit`` is
:class:`rb_lightning.rl.OnlineCollector`.
"""

from __future__ import annotations

from rb_lightning.buffers.mixture import SOURCE_KEY, BufferMixture
from rb_lightning.errors import SourceError
from rb_lightning.sources.buffer_sources import (
    BufferSource,
    CallSource,
    LoadDirectory,
    resolve_callable,
)
from rb_lightning.sources.fill_members import FillMembers

__all__ = [
    "SOURCE_KEY",
    "BufferMixture",
    "BufferSource",
    "CallSource",
    "FillMembers",
    "LoadDirectory",
    "SourceError",
    "resolve_callable",
]
