"""Past one process: a replay buffer served by a Ray actor (torchrl's ``RayReplayBuffer``).

:mod:`~rb_lightning.distributed.ray` builds the buffer and its view from a config;
:mod:`~rb_lightning.distributed.ray_checkpoint` checkpoints it through its actor.
DDP ranks with one buffer each need nothing from here: see
:class:`~rb_lightning.stream.handles.RankBuffers`. Imports Ray only when used.
"""
