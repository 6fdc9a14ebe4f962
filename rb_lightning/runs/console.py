"""The start of ``rb-lightning`` and ``python train.py``: what is answered before torch is imported.

Importing torch, Lightning and torchrl takes seconds; ``--help``, ``configs`` and
the mistakes :mod:`rb_lightning.runs.preflight` finds need none of them, so they are
answered first (:func:`answer_early`), with Ctrl-C guarded
(:mod:`rb_lightning.runs.startup`). Everything else goes to the CLI
(:mod:`rb_lightning.runs.cli`).
"""

from __future__ import annotations

import os
import sys

from rb_lightning.errors import RBLightningError, UsageError
from rb_lightning.runs import preflight, shipped_configs
from rb_lightning.runs.startup import send_ray_start_token, stop_at_once_on_ctrl_c
from rb_lightning.runs.user_errors import exit_with, program

__all__ = ["answer_early", "main", "overview"]


def overview(prog: str) -> str:
    """What ``PROG --help`` prints: the subcommands, ``configs`` among them.

    Examples:
        >>> print(overview("rb-lightning").splitlines()[0])
        usage: rb-lightning {fit,validate,test,predict,configs} [--config NAME|FILE] ...
    """
    return f"""\
usage: {prog} {{fit,validate,test,predict,configs}} [--config NAME|FILE] ...

Train, validate or test a run described by a LightningCLI config. A shipped config runs by
name (--config cartpole_dqn_async); `{shipped_configs.LIST_COMMAND}` lists them.

subcommands:
  fit        train: {prog} fit --config NAME|FILE [--ckpt_path last] [--KEY VALUE ...]
  validate   score a checkpoint on the validation data: ... --ckpt_path last|FILE
  test       score a checkpoint on the test data: ... --ckpt_path last|FILE
  predict    run a checkpoint's model on the predict data
  configs    list the shipped configs and what each trains; --copy NAME [DEST] copies one out

`{prog} SUBCOMMAND --help` lists the subcommand's options (every config key); `--print_config`
after a subcommand prints its whole config. Docs: docs/cli.md.
"""


def answer_early(args: list[str]) -> None:
    """Answer ``args`` and exit where no torch is needed (``--help``, ``configs``, a :func:`preflight.check` mistake: exit 2); else return."""
    if args[:1] in (["-h"], ["--help"]):
        print(overview(program()), end="")
        raise SystemExit(0)
    if args[:1] == ["configs"]:
        try:
            shipped_configs.main(args[1:])
            sys.stdout.flush()
        except BrokenPipeError:  # `rb-lightning configs | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0)
    try:
        if not args:
            raise UsageError(
                "subcommand",
                f"say what to do: {program()} fit --config NAME|FILE trains "
                f"(`{program()} --help` lists the subcommands, `{shipped_configs.LIST_COMMAND}` "
                "the shipped configs).",
            )
        preflight.check(args)
    except RBLightningError as err:
        exit_with(err)
    send_ray_start_token()  # before torchrl imports Ray, which reads it then


def main() -> None:
    """``rb-lightning``: Ctrl-C during the imports ends in one line, then the CLI runs."""
    stop_at_once_on_ctrl_c()
    answer_early(sys.argv[1:])
    from rb_lightning.runs.cli import main as cli_main  # torch, Lightning, torchrl: seconds

    cli_main()
