"""The Lightning layer: the DataModule, its training stream and the ``CheckpointIO``.

Everything that knows a ``Trainer`` lives here; the layers below it take plain
buffers, streams and directories.
"""
