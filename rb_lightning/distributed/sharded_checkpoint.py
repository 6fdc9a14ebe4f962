"""Old home of a ``ShardedRayReplayBuffer``'s checkpoints: kept for one release (issue 46).

The sharded buffer is one module now, its checkpoints included:
:func:`~rb_lightning.distributed.sharded.sharded_state`,
:func:`~rb_lightning.distributed.sharded.restore_sharded_state` and
:func:`~rb_lightning.distributed.sharded.dump_shards` live in
:mod:`rb_lightning.distributed.sharded`; import them from there. Its dump request is
the one every actor-served buffer uses,
:class:`~rb_lightning.distributed.ray_checkpoint.RemoteDumpRequest`
(``ShardedDumpRequest`` is that class's old name here; build a sharded buffer's
request with ``sharded_state``).

Examples:
    >>> from rb_lightning.distributed import sharded
    >>> sharded_state is sharded.sharded_state and ShardedDumpRequest is RemoteDumpRequest
    True
"""

from __future__ import annotations

from rb_lightning.distributed.ray_checkpoint import RemoteDumpRequest
from rb_lightning.distributed.sharded import (
    KIND,
    dump_shards,
    restore_sharded_state,
    sharded_state,
)

#: The old name of the one actor dump request (one release).
ShardedDumpRequest = RemoteDumpRequest

__all__ = ["KIND", "ShardedDumpRequest", "dump_shards", "restore_sharded_state", "sharded_state"]
