"""The ``rb-lightning`` console script, with its start-up guarded (:mod:`rb_lightning.runs.startup`)."""

from __future__ import annotations

from rb_lightning.runs.startup import stop_at_once_on_ctrl_c

__all__ = ["main"]


def main() -> None:
    """``rb-lightning``: Ctrl-C during the imports ends in one line, then the CLI runs."""
    stop_at_once_on_ctrl_c()
    from rb_lightning.runs.cli import console_main  # torch, Lightning, torchrl: seconds

    console_main()
