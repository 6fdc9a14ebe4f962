"""What kind of buffer a run trains from: handles registered by kind, mixtures, priorities.

:func:`~rb_lightning.buffers.handles.resolve_buffer` asks the kind once; a
plugin (the Ray buffers of :mod:`rb_lightning.distributed`) registers its own
kind with :func:`~rb_lightning.buffers.handles.register_buffer_kind`.
"""
