"""Past one process: a replay buffer served by Ray actors (torchrl's ``RayReplayBuffer``).

:mod:`~rb_lightning.distributed.ray` builds the buffer and its view from a config;
:mod:`~rb_lightning.distributed.ray_checkpoint` checkpoints it through its actor;
:mod:`~rb_lightning.distributed.sharded` splits one buffer over several actors
(:class:`ShardedRayReplayBuffer`, also reachable from a YAML config as
``rb_lightning.distributed.ShardedRayReplayBuffer``), with its handle and its checkpoints.
DDP ranks with one buffer each need nothing from here: see
:class:`~rb_lightning.buffers.handles.RankBuffers`. Imports Ray only when used.
"""

from __future__ import annotations

from typing import Any

from rb_lightning.buffers.registry import register_buffer_kind

__all__ = ["ShardedRayReplayBuffer"]


def __getattr__(name: str) -> Any:
    # Lazy: importing the package (as the checkpoint code does) must not build Ray pieces.
    if name == "ShardedRayReplayBuffer":
        from rb_lightning.distributed.sharded import ShardedRayReplayBuffer

        return ShardedRayReplayBuffer
    raise AttributeError(f"module 'rb_lightning.distributed' has no attribute {name!r}")


def _served_by_actor(replay_buffer: Any) -> bool:
    return getattr(replay_buffer, "service_backend", "direct") != "direct"


def _remote_handle(replay_buffer: Any) -> Any:
    from rb_lightning.distributed.remote_handle import RemoteBuffer  # imports torch: on use

    return RemoteBuffer(replay_buffer)


# torchrl's Ray-served buffers (service_backend="ray", RayReplayBuffer) are this plugin's kind.
register_buffer_kind(_served_by_actor, _remote_handle)
