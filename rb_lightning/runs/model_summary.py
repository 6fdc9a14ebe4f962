"""``RunModelSummary``: Lightning's model summary without a FLOPs column of zeros.

Lightning counts FLOPs only for a module with an ``example_input_array``; for
every other module (all of the shipped configs') its summary shows a FLOPs
column of zeros and ``Total FLOPs: 0``. This summary leaves both out when
nothing was counted and is otherwise Lightning's (its rich table where ``rich``
is installed).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import ModelSummary, RichModelSummary
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

__all__ = ["RunModelSummary"]

_FLOPS = "FLOPs"
_RIGHT_ALIGNED = ("Params", "Params per Device", "In sizes", "Out sizes")


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
        if total_flops:
            summarize = RichModelSummary.summarize if _RICH_AVAILABLE else ModelSummary.summarize
            summarize(
                summary_data,
                total_parameters,
                trainable_parameters,
                model_size,
                total_training_modes,
                total_flops,
                **summarize_kwargs,
            )
            return
        data = [(name, values) for name, values in summary_data if name != _FLOPS]
        if not _RICH_AVAILABLE:
            ModelSummary.summarize(
                data, total_parameters, trainable_parameters, model_size, total_training_modes, 0
            )
            return
        _rich_summary(data, total_parameters, trainable_parameters, model_size, total_training_modes)


def _rich_summary(
    data: list[tuple[str, list[str]]],
    total_parameters: int,
    trainable_parameters: int,
    model_size: float,
    total_training_modes: dict[str, int],
) -> None:
    """Lightning's rich summary table and totals, without FLOPs."""
    from lightning.pytorch.utilities.model_summary.model_summary import (
        get_formatted_model_size,
        get_human_readable_count,
    )
    from rich import get_console
    from rich.table import Table

    console = get_console()
    table = Table(header_style="bold magenta")
    for name, _ in data:
        style = "dim" if name == " " else None
        right = name in _RIGHT_ALIGNED
        table.add_column(
            name, justify="right" if right else "left", style=style, no_wrap=name == "Name"
        )
    for row in zip(*(values for _, values in data), strict=True):
        table.add_row(*row)
    console.print(table)
    grid = Table.grid(expand=True)
    grid.add_column()
    frozen = total_parameters - trainable_parameters
    for label, value in (
        ("Trainable params", get_human_readable_count(int(trainable_parameters))),
        ("Non-trainable params", get_human_readable_count(int(frozen))),
        ("Total params", get_human_readable_count(int(total_parameters))),
        ("Total estimated model params size (MB)", get_formatted_model_size(model_size)),
        ("Modules in train mode", str(total_training_modes["train"])),
        ("Modules in eval mode", str(total_training_modes["eval"])),
    ):
        grid.add_row(f"[bold]{label}[/]: {value}")
    console.print(grid)
