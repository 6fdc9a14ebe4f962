"""Old home of :class:`ShardedBuffer`: kept for one release (issue 46).

The DataModule's handle on a ``ShardedRayReplayBuffer`` lives with the buffer in
:mod:`rb_lightning.distributed.sharded`; import it from there.

Examples:
    >>> from rb_lightning.distributed import sharded
    >>> ShardedBuffer is sharded.ShardedBuffer
    True
"""

from __future__ import annotations

from rb_lightning.distributed.sharded import ShardedBuffer

__all__ = ["ShardedBuffer"]
