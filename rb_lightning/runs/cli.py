"""LightningCLI entry point: ``python train.py fit --config configs/<run>.yaml``.

Any ``LightningModule`` (``model:``) and any ``LightningDataModule`` (``data:``)
is selected by ``class_path``; the replay buffer and each of its parts
(storage, sampler, writer, ``prefetch``...) are ``class_path`` entries of their
own under ``data.init_args.replay_buffer``, and where the data comes from is
``data.init_args.source`` (:mod:`rb_lightning.sources`) or a collector callback
under ``trainer.callbacks``.

A mistake in a config (an unknown class, an unknown or mistyped argument, a
missing file, a constructor that rejects its arguments) ends the run with one
paragraph on stderr naming the config key, and exit code 2, instead of a usage
dump or a traceback. Set ``RB_LIGHTNING_DEBUG=1`` to get the traceback.
"""

from __future__ import annotations

import os
import shlex
import sys
import warnings
from pathlib import Path
from typing import Any

import jsonargparse
from jsonargparse import Namespace
from jsonargparse.typing import register_type
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint, ModelSummary, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from tensordict.utils import NestedKey

from rb_lightning.columns import normalize_key
from rb_lightning.errors import ConfigError, RBLightningError, UsageError
from rb_lightning.persist.run_dirs import (
    RunCheckpoint,
    describe_run,
    latest_checkpoint,
    read_run_checkpoint,
    remove_unstarted_run,
    run_checkpoint,
    run_directories,
    shown,
)
from rb_lightning.runs import preflight, shipped_configs
from rb_lightning.runs.config_errors import (
    instantiation_error,
    is_argument_error,
    parse_error,
)
from rb_lightning.runs.model_summary import RunModelSummary
from rb_lightning.runs.progress import StepProgressBar, progress_bars_lock_threads_only
from rb_lightning.runs.report import RunReport
from rb_lightning.runs.resume import (
    check_extends,
    checkpoint_dirs,
    has_logger,
    resume_line,
    run_root,
    set_logger_args,
)
from rb_lightning.runs.run_failures import buffer_actor_lost, quiet_exit
from rb_lightning.runs.run_log import quiet_run_log, say_where_the_buffer_runs, skip_unloadable_nvml
from rb_lightning.runs.startup import (
    INTERRUPT_EXIT_CODE,
    hand_ctrl_c_to_the_trainer,
    stop_at_once_on_ctrl_c,
)
from rb_lightning.runs.user_errors import CONFIG_ERROR_EXIT_CODE, DEBUG_ENV, exit_with, program

_SUBCOMMANDS = preflight.SUBCOMMANDS
_DESCRIPTION = (
    "Train, validate or test a run described by a LightningCLI config. A shipped config runs "
    "by name (--config cartpole_dqn); `rb-lightning configs` lists them and copies one out."
)


# -- nested keys --------------------------------------------------------------------------------
# torchrl types key arguments (SliceSampler(traj_key=...), TensorDictReplayBuffer(priority_key=...))
# as tensordict's NestedKey, which jsonargparse can neither check nor print ("Unable to
# serialize instance"). In YAML a nested key is a string or a list of strings: [next, done].
def _nested_key_to_yaml(key: NestedKey) -> str | list[str]:
    return key if isinstance(key, str) else list(key)


def _nested_key_from_yaml(value: Any) -> NestedKey:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return normalize_key(tuple(value))
    raise UsageError("key", f"a nested key is a string or a list of strings, got {value!r}.")


register_type(
    NestedKey,
    _nested_key_to_yaml,
    _nested_key_from_yaml,
    type_check=lambda value, _type: isinstance(value, NestedKey),
)


# -- the CLI ------------------------------------------------------------------------------------
class ReplayBufferCLI(LightningCLI):
    """``LightningCLI`` that reports config errors as :class:`ConfigError` naming the key."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Parse errors are raised (not printed with a usage wall and exited) so that
        # main() can name the key in one paragraph. No prefix abbreviations: argparse
        # would silently read --trainer.max_step as --trainer.max_steps.
        strict = {"exit_on_error": False, "allow_abbrev": False}
        parser_kwargs: dict[str, Any] = dict(strict)
        parser_kwargs.update({name: dict(strict) for name in _SUBCOMMANDS})
        for key, value in (kwargs.pop("parser_kwargs", None) or {}).items():
            if key in _SUBCOMMANDS:
                parser_kwargs[key] = {**parser_kwargs[key], **value}
            else:
                parser_kwargs[key] = value
        kwargs["parser_kwargs"] = parser_kwargs
        # The command line as the user typed it (shipped config names unresolved), for the
        # resume hint; None where a dict or Namespace was given.
        self._argv: list[str] | None = kwargs.pop("typed_args", None)
        try:
            super().__init__(*args, **kwargs)
        except BaseException as err:
            self._remove_unstarted_run()
            told = self._told_failure(err)
            if told is not None:
                raise told from None
            raise

    def _remove_unstarted_run(self) -> None:
        """After a ``fit`` that failed to start, remove the run directory it made for nothing."""
        trainer = getattr(self, "trainer", None)  # set once the classes were built
        if getattr(self, "subcommand", None) != "fit" or trainer is None:
            return
        # The logger's directory, not trainer.log_dir: that one is a DDP broadcast, which
        # waits forever on a rank whose peer failed elsewhere.
        log_dir = trainer.logger.log_dir if trainer.logger is not None else None
        if trainer.is_global_zero and log_dir is not None:
            remove_unstarted_run(Path(log_dir))

    def _told_failure(self, err: BaseException) -> BaseException | None:
        """A failure of a running fit as one paragraph (rank 0), or a quiet exit (the other
        ranks): :mod:`rb_lightning.runs.run_failures`."""
        trainer = getattr(self, "trainer", None)
        if trainer is None or os.environ.get(DEBUG_ENV) or not isinstance(err, Exception):
            return None
        if quiet_exit(err, global_zero=trainer.is_global_zero):
            return SystemExit(CONFIG_ERROR_EXIT_CODE)
        buffer = getattr(getattr(self, "datamodule", None), "replay_buffer", None)
        last = next(
            (cb.last_model_path for cb in trainer.checkpoint_callbacks
             if getattr(cb, "last_model_path", "")), None,
        )  # fmt: skip
        return buffer_actor_lost(
            err,
            step=trainer.global_step,
            last_checkpoint=os.path.relpath(last) if last else None,
            resume=self._resume_command(),
            ask_buffer=None if buffer is None else lambda: len(buffer),
        )

    def parse_arguments(self, parser: Any, args: Any) -> None:
        try:
            super().parse_arguments(parser, args)
        except Exception as err:
            if os.environ.get(DEBUG_ENV) or not is_argument_error(err):
                raise
            raise parse_error(err) from err
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path is not None and Path(ckpt_path).is_file():
            # Checked here: LightningCLI reads a --ckpt_path file's hyperparameters next.
            _check_readable(read_run_checkpoint(ckpt_path))

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except Exception as err:
            if os.environ.get(DEBUG_ENV):
                raise
            config = self.config.get(self.subcommand) if self.subcommand else self.config
            raise instantiation_error(err, config) from err

    def before_instantiate_classes(self) -> None:
        """Resolve ``--ckpt_path`` and choose the run directory before anything is built.

        ``last`` is the checkpoint of the run started last (:meth:`_last_checkpoint`);
        ``fit`` resumed from a run's checkpoint logs into that run's directory.
        ``validate``/``test`` write no run directory of their own (they print
        their metrics).
        """
        if self.subcommand is None:
            return
        config = self.config[self.subcommand]
        trainer = config.trainer
        ckpt_path = config.get("ckpt_path")
        root = run_root(trainer)
        if ckpt_path == "last":
            found = self._last_checkpoint(trainer, root)
            config.ckpt_path = str(found.path)
        elif ckpt_path not in (None, "best", "hpc") and not str(ckpt_path).startswith("registry"):
            if not Path(ckpt_path).is_file():
                raise ConfigError(
                    "ckpt_path",
                    f"{ckpt_path!r} is not a file. Pass a .ckpt written by fit (they are in "
                    "runs/<config>/version_<N>/checkpoints/), or 'last' for the latest run.",
                )
            found = read_run_checkpoint(ckpt_path)
        else:
            found = None
        if found is not None:
            _check_readable(found)
            if self.subcommand == "fit":
                check_extends(found, trainer)
            in_own_run = root is not None and found.run_dir.parent.resolve() == root.resolve()
            if self.subcommand == "fit" and in_own_run:
                # The run goes on in its own directory; rows its earlier process logged
                # after this checkpoint are dropped (RunLogger's purge_step).
                set_logger_args(trainer, version=found.run_dir.name, purge_step=found.step)
            print(resume_line(self.subcommand, found, trainer, in_own_run), flush=True)
        if self.subcommand != "fit" and has_logger(trainer):
            trainer.logger = False

    # Lightning's Trainer handles Ctrl-C from here on (RunReport and FinalLastCheckpoint).
    def before_fit(self) -> None:
        say_where_the_buffer_runs(self.datamodule)
        hand_ctrl_c_to_the_trainer()

    def before_validate(self) -> None:
        say_where_the_buffer_runs(self.datamodule)
        hand_ctrl_c_to_the_trainer()

    def before_test(self) -> None:
        say_where_the_buffer_runs(self.datamodule)
        hand_ctrl_c_to_the_trainer()

    def before_predict(self) -> None:
        hand_ctrl_c_to_the_trainer()

    def _last_checkpoint(self, trainer: Namespace, root: Path | None) -> RunCheckpoint:
        """``--ckpt_path last``: the checkpoint of the run the user started last.

        ``fit`` continues that run only if it can go on: it was interrupted or
        killed, or it ended at ``max_steps`` and the new ``max_steps`` is larger.
        Anything else stops with a paragraph naming the runs and how to pick one,
        so that ``last`` never writes into another or a finished run.
        """
        explicit_dirs = checkpoint_dirs(trainer)
        if explicit_dirs or root is None:  # checkpoints outside run directories
            path = latest_checkpoint(root, extra_dirs=explicit_dirs)
            if path is None:
                raise ConfigError(
                    "ckpt_path",
                    "'last' resumes the latest run of this config, but there is no last.ckpt "
                    f"in the checkpoint dirpath yet. Start the run first "
                    f"({self._command('fit')}), or pass the path of a .ckpt file.",
                )
            return read_run_checkpoint(path)
        runs = run_directories(root)
        with_checkpoint = [run for run in runs if run_checkpoint(run) is not None]
        if not with_checkpoint:
            raise ConfigError(
                "ckpt_path",
                f"'last' resumes the latest run of this config, but there is no last.ckpt in "
                f"{root}/version_*/checkpoints/ yet. Start the run first "
                f"({self._command('fit')}), or pass the path of a .ckpt file.",
            )
        if self.subcommand != "fit":  # scoring writes nothing: the newest checkpointed run
            return read_run_checkpoint(run_checkpoint(with_checkpoint[-1]))  # type: ignore[arg-type]
        latest = runs[-1]
        path = run_checkpoint(latest)
        found = read_run_checkpoint(path) if path is not None else None
        max_steps = trainer.get("max_steps")
        if found is not None and found.finished is None:
            return found
        if found is not None and found.finished == "max_steps" and found.step is not None:
            if max_steps is not None and (max_steps < 0 or max_steps > found.step):
                return found  # extending a run that ended at max_steps: asked for
            check_extends(found, trainer)  # says how to extend it
        choices = "; ".join(describe_run(run) for run in reversed(with_checkpoint[-5:]))
        if found is None:
            why = "it has no checkpoint (it stopped before its first one)"
        else:
            why = f"it finished (step {found.step:,}) and 'last' does not write into a finished run"
        example = shown(run_checkpoint(with_checkpoint[-1]))  # type: ignore[arg-type]
        raise ConfigError(
            "ckpt_path",
            f"'last' continues the run you started last, {shown(latest)}, but {why}. Runs with a "
            f"checkpoint: {choices}. To continue one of them, name its checkpoint "
            f"(--ckpt_path {example}); to start a new run, leave out --ckpt_path.",
        )

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The configured Trainer, plus a step-counting progress bar, a model summary without
        FLOPs nobody counted, and a :class:`RunReport`."""
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        configured = config["trainer"].get("callbacks") or []
        configured = configured if isinstance(configured, list) else [configured]
        if config["trainer"].get("enable_checkpointing") is False or self.subcommand != "fit":
            # `--trainer.enable_checkpointing=false` on a config that lists a ModelCheckpoint
            # means "no checkpoints for this run", not Lightning's error about the conflict;
            # validate and test write none (theirs would only warn that its dirpath moved).
            configured = [cb for cb in configured if not isinstance(cb, Checkpoint)]
        if self.subcommand != "fit":  # ...nor restore any callback's state: only the weights
            warnings.filterwarnings("ignore", message=r"Be aware that when using `ckpt_path`")
        added: list[Any] = []
        bar: list[Any] = []
        if config["trainer"].get("enable_progress_bar") is not False and not any(
            isinstance(cb, ProgressBar) for cb in configured
        ):
            bar.append(StepProgressBar(refresh_rate=10))  # thousands of short steps
        if config["trainer"].get("enable_model_summary") is not False and not any(
            isinstance(cb, ModelSummary) for cb in configured
        ):
            added.append(RunModelSummary())  # no FLOPs column of zeros
        reports = [cb for cb in configured if isinstance(cb, RunReport)]
        if not reports:
            reports = [RunReport()]
            added += reports
        for report in reports:
            report.resume_hint = report.resume_hint or self._resume_command()
        # The bar first: on Ctrl-C it ends its line before RunReport prints the summary.
        return super().instantiate_trainer(callbacks=[*bar, *configured, *added], **kwargs)

    def _resume_command(self) -> str:
        """The command line of this run with ``--ckpt_path last``: its overrides carry over."""
        argv = self._argv
        if not argv or argv[0] != "fit":
            return self._command("fit", "--ckpt_path last")
        kept: list[str] = []
        skip = False
        for arg in argv[1:]:
            if skip:
                skip = False
            elif arg == "--ckpt_path":
                skip = True
            elif not arg.startswith("--ckpt_path="):
                kept.append(arg)
        return " ".join([program(), "fit", *map(shlex.quote, kept), "--ckpt_path", "last"])

    def _command(self, subcommand: str, *extra: str) -> str:
        configs = self.config[self.subcommand].get("config") if self.subcommand else None
        parts = [program(), subcommand]
        for path in configs or []:
            typed = str(getattr(path, "relative", path))  # as the user typed it
            parts += ["--config", shipped_configs.name_of(typed) or typed]
        return " ".join([*parts[:2], *map(shlex.quote, parts[2:]), *extra])


def _check_readable(found: RunCheckpoint) -> None:
    """Refuse a ``--ckpt_path`` that is no checkpoint: Lightning would end in a traceback."""
    if found.problem is not None:
        raise ConfigError(
            "ckpt_path",
            f"{shown(found.path)} is not a Lightning checkpoint: {found.problem}. Pass "
            "--ckpt_path a .ckpt written by fit (they are in "
            "runs/<config>/version_<N>/checkpoints/), or --ckpt_path last for the latest run.",
        )


_JSONARGPARSE_VERSION = tuple(int(part) for part in jsonargparse.__version__.split(".")[:2])


class RunParser(LightningArgumentParser):
    """The CLI's parser; ``save`` (a run's ``config.yaml``) skips validation by default.

    The config was validated when it was parsed; validating it again on save took 0.1-0.4 s of
    every ``fit`` (about 5% of the shipped GRPO run) and writes the same file.
    """

    def save(self, *args: Any, skip_validation: bool = True, **kwargs: Any) -> None:
        # Lightning's SaveConfigCallback passes skip_none, which jsonargparse 4.49 renamed
        # skip_unset (and warns of); the older jsonargparse this package allows has no skip_unset.
        if "skip_none" in kwargs and _JSONARGPARSE_VERSION >= (4, 49):
            kwargs["skip_unset"] = kwargs.pop("skip_none")
        super().save(*args, skip_validation=skip_validation, **kwargs)


class FitConfigSaver(SaveConfigCallback):
    """Save the run's ``config.yaml`` for ``fit`` only: ``validate``/``test`` start no run."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            super().setup(trainer, pl_module, stage)


def main(args: list[str] | None = None, *, run: bool = True) -> ReplayBufferCLI:
    """Run the CLI; a config error prints one paragraph to stderr and exits with code 2.

    Args:
        args: Command-line arguments (``sys.argv[1:]`` when ``None``), e.g.
            ``["fit", "--config", "configs/llm_sft.yaml", "--trainer.max_steps=3"]``.
        run: ``False`` instantiates the classes without running a subcommand
            (then ``args`` has no subcommand).

    Returns:
        The CLI, with ``.model``, ``.datamodule`` and ``.trainer`` after the run.

    Examples:
        A typo ends the run with exit code 2 and, on stderr, ``error: config error
        at model: class_path 'torch.nn.Linearr' cannot be imported: ... Did you
        mean 'Linear'?``:

        >>> try:
        ...     main(["fit", "--model=torch.nn.Linearr"])
        ... except SystemExit as stop:
        ...     print(stop.code)
        2
    """
    skip_unloadable_nvml()
    quiet_run_log()
    progress_bars_lock_threads_only()
    stop_at_once_on_ctrl_c()
    try:
        typed = list(sys.argv[1:] if args is None else args)
        preflight.check(typed)  # what is known without building anything
        # A shipped config's name (--config cartpole_dqn) becomes its file's path; in sys.argv
        # itself when that is what is parsed (DDP starts the other ranks with sys.argv).
        if args is None:
            sys.argv[1:] = shipped_configs.resolve_config_args(sys.argv[1:])
        else:
            args = shipped_configs.resolve_config_args(args)
        return ReplayBufferCLI(
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=args,
            parser_kwargs={"description": _DESCRIPTION},
            parser_class=RunParser,
            run=run,
            # A fresh fit gets a new run directory; a resumed one rewrites its own config.
            save_config_callback=FitConfigSaver,
            save_config_kwargs={"overwrite": True},
            typed_args=typed,
        )
    except RBLightningError as err:  # every error a user can cause: one paragraph, exit 2
        exit_with(err)
    except SystemExit as stop:
        # Lightning ends an interrupted fit with sys.exit(1) inside its KeyboardInterrupt
        # handler; the shell's convention for Ctrl-C is 128 + SIGINT.
        if stop.code == 1 and isinstance(stop.__context__, KeyboardInterrupt):
            raise SystemExit(INTERRUPT_EXIT_CODE) from None
        raise


def console_main() -> None:
    """``rb-lightning`` console script; ``rb-lightning configs`` lists the shipped configs."""
    if sys.argv[1:2] == ["configs"]:
        shipped_configs.main(sys.argv[2:])
    else:
        main()


__all__ = [
    "CONFIG_ERROR_EXIT_CODE",
    "INTERRUPT_EXIT_CODE",
    "ConfigError",
    "FitConfigSaver",
    "RunParser",
    "ReplayBufferCLI",
    "console_main",
    "main",
]
