"""One quiet ``lightning.Trainer`` for tests: CPU, no logger, progress bar, model summary or checkpoints.

``quiet_trainer(max_steps=8, callbacks=[...])`` in a test file (``tests/`` is on
``sys.path``: ``from trainers import quiet_trainer``).
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Checkpoint


def quiet_trainer(**overrides: Any) -> L.Trainer:
    """``L.Trainer(**overrides)`` with the quiet defaults above; any of them can be overridden.

    Checkpointing is on only when ``callbacks`` holds a checkpoint callback
    (``ModelCheckpoint``), which Lightning refuses with ``enable_checkpointing=False``.
    """
    callbacks = overrides.get("callbacks") or []
    defaults: dict[str, Any] = dict(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=any(isinstance(c, Checkpoint) for c in callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return L.Trainer(**{**defaults, **overrides})
