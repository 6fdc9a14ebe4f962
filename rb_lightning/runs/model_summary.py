"""``RunModelSummary``: Lightning's model summary without a FLOPs column of zeros.

Lightning counts FLOPs only for a module with an ``example_input_array``; for
every other module (all of the shipped configs') its summary shows a FLOPs
column of zeros and ``Total FLOPs: 0``. This summary leaves both out when
nothing was counted and is otherwise Lightning's own (the plain table its
default ``ModelSummary`` prints).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from lightning.pytorch.callbacks import ModelSummary

__all__ = ["RunModelSummary"]

_FLOPS = "FLOPs"
# The table's last line when nothing was counted, as Lightning's plain summary writes it.
_ZERO_TOTAL = re.compile(r"\n0 +Total Flops$")


class _DropZeroFlopsTotal(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = _ZERO_TOTAL.sub("", record.msg)
        return True


class RunModelSummary(ModelSummary):
    """A :class:`~lightning.pytorch.callbacks.ModelSummary` that prints FLOPs only if counted."""

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        if not total_flops:
            summary_data = [(name, values) for name, values in summary_data if name != _FLOPS]
            logger = logging.getLogger(ModelSummary.__module__)  # where Lightning logs the table
            if not any(isinstance(f, _DropZeroFlopsTotal) for f in logger.filters):
                logger.addFilter(_DropZeroFlopsTotal())
        ModelSummary.summarize(
            summary_data,
            total_parameters,
            trainable_parameters,
            model_size,
            total_training_modes,
            total_flops,
            **summarize_kwargs,
        )
