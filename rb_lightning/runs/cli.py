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

import ctypes
import difflib
import importlib
import inspect
import logging
import os
import re
import shlex
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from jsonargparse.typing import register_type
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint, ProgressBar
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from tensordict.utils import NestedKey

from rb_lightning.columns import normalize_key
from rb_lightning.errors import ConfigError, RBLightningError, SourceError, UsageError
from rb_lightning.runs import shipped_configs
from rb_lightning.runs.progress import StepProgressBar
from rb_lightning.runs.report import RunReport
from rb_lightning.runs.run_files import (
    RunCheckpoint,
    RunLogger,
    latest_checkpoint,
    read_run_checkpoint,
    run_checkpoint,
    run_directories,
)
from rb_lightning.runs.startup import (
    INTERRUPT_EXIT_CODE,
    hand_ctrl_c_to_the_trainer,
    stop_at_once_on_ctrl_c,
)

#: Exit code of a run stopped by a config error (argparse's code for usage errors).
CONFIG_ERROR_EXIT_CODE = 2
_DEBUG_ENV = "RB_LIGHTNING_DEBUG"
#: Set to "1" by Lightning at import: torch.cuda.is_available() then asks NVML first.
_NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"
_SUBCOMMANDS = ("fit", "validate", "test", "predict")
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
        super().__init__(*args, **kwargs)

    def parse_arguments(self, parser: Any, args: Any) -> None:
        try:
            super().parse_arguments(parser, args)
        except Exception as err:
            if os.environ.get(_DEBUG_ENV) or not _is_argument_error(err):
                raise
            raise _parse_error(err) from err

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except Exception as err:
            if os.environ.get(_DEBUG_ENV):
                raise
            config = self.config.get(self.subcommand) if self.subcommand else self.config
            raise _instantiation_error(err, config) from err

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
        root = _run_root(trainer)
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
            if self.subcommand == "fit":
                _check_extends(found, trainer)
            in_own_run = root is not None and found.run_dir.parent.resolve() == root.resolve()
            if self.subcommand == "fit" and in_own_run:
                # The run goes on in its own directory; rows its earlier process logged
                # after this checkpoint are dropped (RunLogger's purge_step).
                _set_logger_args(trainer, version=found.run_dir.name, purge_step=found.step)
            print(_resume_line(self.subcommand, found, trainer, in_own_run), flush=True)
        if self.subcommand != "fit" and _has_logger(trainer):
            trainer.logger = False

    # Lightning's Trainer handles Ctrl-C from here on (RunReport and FinalLastCheckpoint).
    def before_fit(self) -> None:
        hand_ctrl_c_to_the_trainer()

    def before_validate(self) -> None:
        hand_ctrl_c_to_the_trainer()

    def before_test(self) -> None:
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
        explicit_dirs = _checkpoint_dirs(trainer)
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
            _check_extends(found, trainer)  # says how to extend it
        choices = "; ".join(_describe_run(run) for run in reversed(with_checkpoint[-5:]))
        if found is None:
            why = "it has no checkpoint (it stopped before its first one)"
        else:
            why = f"it finished (step {found.step:,}) and 'last' does not write into a finished run"
        example = _shown(run_checkpoint(with_checkpoint[-1]))  # type: ignore[arg-type]
        raise ConfigError(
            "ckpt_path",
            f"'last' continues the run you started last, {_shown(latest)}, but {why}. Runs with a "
            f"checkpoint: {choices}. To continue one of them, name its checkpoint "
            f"(--ckpt_path {example}); to start a new run, leave out --ckpt_path.",
        )

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The configured Trainer, plus a step-counting progress bar and a :class:`RunReport`."""
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
        if config["trainer"].get("enable_progress_bar") is not False and not any(
            isinstance(cb, ProgressBar) for cb in configured
        ):
            added.append(StepProgressBar(refresh_rate=10))  # thousands of short steps
        reports = [cb for cb in configured if isinstance(cb, RunReport)]
        if not reports:
            reports = [RunReport()]
            added += reports
        for report in reports:
            report.resume_hint = report.resume_hint or self._resume_command()
        return super().instantiate_trainer(callbacks=[*configured, *added], **kwargs)

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
        return " ".join([_program(), "fit", *map(shlex.quote, kept), "--ckpt_path", "last"])

    def _command(self, subcommand: str, *extra: str) -> str:
        configs = self.config[self.subcommand].get("config") if self.subcommand else None
        parts = [_program(), subcommand]
        for path in configs or []:
            typed = str(getattr(path, "relative", path))  # as the user typed it
            parts += ["--config", shipped_configs.name_of(typed) or typed]
        return " ".join([*parts[:2], *map(shlex.quote, parts[2:]), *extra])


def _program() -> str:
    """How the user started this process: the console script or ``python train.py``."""
    return "rb-lightning" if Path(sys.argv[0]).name == "rb-lightning" else "python train.py"


class FitConfigSaver(SaveConfigCallback):
    """Save the run's ``config.yaml`` for ``fit`` only: ``validate``/``test`` start no run."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            super().setup(trainer, pl_module, stage)


def _logger_entries(trainer: Namespace) -> list[Namespace]:
    logger = trainer.get("logger")
    entries = logger if isinstance(logger, list) else [logger]
    return [entry for entry in entries if isinstance(entry, Namespace) and "class_path" in entry]


def _has_logger(trainer: Namespace) -> bool:
    return trainer.get("logger") not in (False, None) or bool(_logger_entries(trainer))


def _run_root(trainer: Namespace) -> Path | None:
    """Where a config's run directories (``version_<N>``) are made."""
    for entry in _logger_entries(trainer):
        args = entry.get("init_args") or Namespace()
        if args.get("save_dir") is not None:
            return Path(args.save_dir) / (args.get("name") or "lightning_logs")
    if trainer.get("logger") is False:
        return None
    return Path(trainer.get("default_root_dir") or os.getcwd()) / "lightning_logs"


def _checkpoint_dirs(trainer: Namespace) -> list[Path]:
    """``dirpath`` of every checkpoint callback the config gives one explicitly."""
    callbacks = trainer.get("callbacks") or []
    dirs = []
    for entry in callbacks if isinstance(callbacks, list) else [callbacks]:
        # ModelCheckpoint and its subclasses (rb_lightning.runs.FinalLastCheckpoint).
        if isinstance(entry, Namespace) and str(entry.get("class_path", "")).endswith("Checkpoint"):
            dirpath = (entry.get("init_args") or Namespace()).get("dirpath")
            if dirpath is not None:
                dirs.append(Path(dirpath))
    return dirs


def _set_logger_args(trainer: Namespace, *, version: str, purge_step: int | None) -> None:
    for entry in _logger_entries(trainer):
        if entry.get("init_args") is None:
            entry.init_args = Namespace()
        entry.init_args.version = version
        if _import(str(entry.get("class_path"))) is RunLogger:
            entry.init_args.purge_step = purge_step


def _check_extends(found: RunCheckpoint, trainer: Namespace) -> None:
    """A run that ended at ``max_steps`` goes on only with a larger ``max_steps``."""
    max_steps = trainer.get("max_steps")
    if found.finished != "max_steps" or found.step is None:
        return
    if max_steps is None or 0 <= max_steps <= found.step:
        raise ConfigError(
            "trainer.max_steps",
            f"{_shown(found.path)} is of a run that finished at max_steps (step "
            f"{found.step:,}); fit would stop again before a step. To train it further, pass "
            f"--trainer.max_steps above {found.step:,}; to start a new run, leave out "
            "--ckpt_path.",
        )


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is below it, as a user types it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _describe_end(found: RunCheckpoint) -> str:
    step = "step ?" if found.step is None else f"step {found.step:,}"
    if found.finished == "max_steps":
        return f"finished at max_steps, {step}"
    if found.finished:
        return f"finished, {step}"
    return f"resumable from {step}"


def _describe_run(run_dir: Path) -> str:
    path = run_checkpoint(run_dir)
    return f"{_shown(path)} ({_describe_end(read_run_checkpoint(path))})" if path else f"{run_dir}"


def _resume_line(
    subcommand: str, found: RunCheckpoint, trainer: Namespace, in_own_run: bool
) -> str:
    step = "an unknown step" if found.step is None else f"step {found.step:,}"
    if subcommand != "fit":
        return f"{subcommand}: the model of {_shown(found.path)} ({step})"
    if not in_own_run:  # a checkpoint outside this config's run directories
        return f"fit: resuming from {_shown(found.path)} ({step})"
    if found.finished:
        max_steps = trainer.get("max_steps")
        bound = f" to max_steps={max_steps:,}" if max_steps is not None and max_steps > 0 else ""
        return (
            f"fit: extending the finished run {_shown(found.run_dir)} from {step}{bound} "
            f"({found.path.name})"
        )
    return f"fit: resuming {_shown(found.run_dir)} from {step} ({found.path.name})"


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
    _skip_unloadable_nvml()
    _quiet_run_log()
    stop_at_once_on_ctrl_c()
    try:
        typed = list(sys.argv[1:] if args is None else args)
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
            run=run,
            # A fresh fit gets a new run directory; a resumed one rewrites its own config.
            save_config_callback=FitConfigSaver,
            save_config_kwargs={"overwrite": True},
            typed_args=typed,
        )
    except RBLightningError as err:  # every error a user can cause: one paragraph, exit 2
        if os.environ.get(_DEBUG_ENV):
            raise
        message = _one_paragraph(str(err))
        if isinstance(err, SourceError):
            message = f"config error at data.init_args.{err.argument}: {message}"
        elif err.argument is not None and not isinstance(err, ConfigError):
            message = f"{message} (argument: {err.argument})"
        print(f"error: {message} (set {_DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
        raise SystemExit(CONFIG_ERROR_EXIT_CODE) from None
    except SystemExit as stop:
        # Lightning ends an interrupted fit with sys.exit(1) inside its KeyboardInterrupt
        # handler; the shell's convention for Ctrl-C is 128 + SIGINT.
        if stop.code == 1 and isinstance(stop.__context__, KeyboardInterrupt):
            raise SystemExit(INTERRUPT_EXIT_CODE) from None
        raise


#: Lines Lightning logs that the run's own output says better, or that say nothing here.
_SAID_BETTER = (
    "Detected KeyboardInterrupt",  # RunReport's summary says it, with the resume command
    "Restoring states from the checkpoint path",  # "fit: resuming <run> from step <S>"
    "Restored all states from the checkpoint",
    "Loaded model weights from the checkpoint",  # "test: the model of <ckpt> (step <S>)"
    "`Trainer.fit` stopped:",  # RunReport: "fit stopped at step S ...: max_steps=S reached"
    "TPU available:",
    "HPU available:",
    "\N{ELECTRIC LIGHT BULB} Tip:",  # an advertisement for a hosted logger
)
#: Warnings that third-party code raises on every run and a user can do nothing about.
_NOT_FOR_THE_USER = (
    # Lightning's own use of torch's pytree API (Lightning 2.6 with torch 2.14).
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    # Lightning's check on sized IterableDatasets: ours split work across workers and ranks.
    r"Your `IterableDataset` has `__len__` defined",
)


class _DropSaidBetter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().lstrip().startswith(_SAID_BETTER)


def _quiet_run_log() -> None:
    """Keep a run's output to the lines a user needs (the allow-list test holds it there).

    Lightning's lines that our own say better are dropped, its and torch's
    warnings about their own internals are ignored, and torchrl's INFO lines
    (storage initialised, spec checks) are raised to warnings only.
    """
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropSaidBetter) for f in logger.filters):
            logger.addFilter(_DropSaidBetter())
    for message in _NOT_FOR_THE_USER:
        warnings.filterwarnings("ignore", message=message)
    logging.getLogger("torchrl").setLevel(logging.WARNING)


def _skip_unloadable_nvml() -> None:
    """Where NVIDIA's NVML library cannot load, stop torch from trying on every optimizer step.

    Lightning sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` so that
    ``torch.cuda.is_available()`` asks NVML instead of initializing CUDA before a
    fork. Torch's Adam asks on every step (its CUDA-graph check), and each time
    torch tries to load ``libnvidia-ml.so.1``: ~4% of a CartPole DQN step on a
    machine without the driver. When the library does not load, torch falls back
    to the CUDA runtime's device count anyway, so not trying changes no answer.
    """
    if os.environ.get(_NVML_CHECK_ENV) != "1":
        return
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        os.environ[_NVML_CHECK_ENV] = "0"


def console_main() -> None:
    """``rb-lightning`` console script; ``rb-lightning configs`` lists the shipped configs."""
    if sys.argv[1:2] == ["configs"]:
        shipped_configs.main(sys.argv[2:])
    else:
        main()


# -- parse errors -------------------------------------------------------------------------------
_TOP_LEVEL_KEYS = ("seed_everything", "trainer", "model", "data", "optimizer", "lr_scheduler")
_PARSER_KEY = re.compile(r'^Parser key "([^"]+)":\s*(.*)$')
_CLASS_PATH = re.compile(r"^Problem with given class_path '([^']+)':")
_NOT_ACCEPTED = re.compile(r"^Option '([^']+)' is not accepted|does not accept option '([^']+)'")
_UNRECOGNIZED = re.compile(r"unrecognized arguments: --([^\s=]+)")
_NO_ATTRIBUTE = re.compile(r"^module '([^']+)' has no attribute '([^']+)'")


def _is_argument_error(err: BaseException) -> bool:
    return any(type(e).__name__ == "ArgumentError" for e in _causes(err))


def _causes(err: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or (None if err.__suppress_context__ else err.__context__)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0].strip() if text else type(err).__name__


def _one_paragraph(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def _parse_error(err: BaseException) -> ConfigError:
    """Turn jsonargparse's chained parse error into the key at fault and the innermost reason.

    jsonargparse chains one exception per nesting level ('Parser key "data":',
    "Problem with given class_path 'X':", ...) down to the original error.
    """
    parts: list[str] = []
    class_path: str | None = None
    previous = None
    chain = list(_causes(err))
    for e in chain:
        line = _first_line(e)
        if line == previous:
            continue
        previous = line
        if match := _PARSER_KEY.match(line):
            parts.append(match.group(1))
        elif match := _CLASS_PATH.match(line):
            class_path = match.group(1)
            parts.append("init_args")
    while parts and parts[-1] == "init_args":
        parts.pop()
    key = ".".join(parts)
    leaf = chain[-1]
    reason = _one_paragraph(str(leaf)) or type(leaf).__name__
    if match := _PARSER_KEY.match(reason):  # e.g. 'Parser key "config": File does not exist'
        key, reason = key or match.group(1), match.group(2)
    if match := _NOT_ACCEPTED.search(reason):
        return _unknown_argument(key, match.group(1) or match.group(2), class_path)
    if match := _UNRECOGNIZED.search(reason):  # a command-line option nobody takes
        return _unknown_argument(key, match.group(1), class_path)
    if match := _NO_ATTRIBUTE.match(reason):
        hint = _did_you_mean(match.group(2), _module_names(match.group(1)))
        reason = f"class_path {class_path!r} cannot be imported: {reason}.{hint}"
    elif type(leaf).__module__.startswith("yaml"):
        key, reason = key or "config", f"the YAML does not parse: {reason}"
    elif isinstance(leaf, ImportError):
        reason = f"class_path {class_path!r} cannot be imported: {reason}."
    if not reason.endswith((".", "?")):
        reason += "."
    return ConfigError(key, reason)


def _unknown_argument(key: str, option: str, class_path: str | None) -> ConfigError:
    full_key = ".".join(part for part in (key, "init_args" if class_path else "", option) if part)
    if class_path is None:  # a top-level key (trainer, model, data...) or the Trainer's own
        section, _, name = option.partition(".")
        if section == "trainer" and name:
            accepted = _parameters("lightning.pytorch.Trainer")
            return ConfigError(
                full_key,
                f"the Trainer has no argument {name!r}.{_did_you_mean(name, accepted)} "
                "Arguments are spelled out in full (no abbreviations).",
            )
        if section in _TOP_LEVEL_KEYS and name:
            return ConfigError(full_key, f"{section} has no key {name!r}.")
        hint = _did_you_mean(section, list(_TOP_LEVEL_KEYS))
        return ConfigError(
            full_key, f"unknown key {section!r} (known: {', '.join(_TOP_LEVEL_KEYS)}).{hint}"
        )
    name = option.rsplit(".", 1)[-1]
    accepted = _parameters(class_path)
    detail = f" (it takes: {', '.join(accepted)})." if accepted else "."
    return ConfigError(
        full_key,
        f"{class_path} has no parameter {name!r}{detail}{_did_you_mean(name, accepted)}",
    )


def _parameters(class_path: str) -> list[str]:
    cls = _import(class_path)
    if cls is None:
        return []
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _module_names(module_name: str) -> list[str]:
    try:
        return [n for n in dir(importlib.import_module(module_name)) if not n.startswith("_")]
    except ImportError:
        return []


def _did_you_mean(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def _import(class_path: str) -> Any:
    module_name, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return None


# -- instantiation errors -----------------------------------------------------------------------
def _instantiation_error(err: BaseException, config: Any) -> ConfigError:
    """Name the config entry whose constructor raised ``err`` (found in the traceback)."""
    leaf = list(_causes(err))[-1]
    classes = _configured_classes(config)
    key, class_path = "", None
    tb = leaf.__traceback__
    # The innermost constructor of a configured class on the stack is the one that failed
    # (a buffer may build its sampler itself, from a factory jsonargparse hands it).
    while tb is not None:
        frame = tb.tb_frame
        owner = frame.f_locals.get("self") if frame.f_code.co_name == "__init__" else None
        if isinstance(owner, Trainer):
            key, class_path = "trainer", None
        elif owner is not None:
            matches = [(k, cp) for k, cp, cls in classes if type(owner) is cls]
            if matches:
                key, class_path = matches[0]
        tb = tb.tb_next
    if isinstance(leaf, UsageError) and key and key != "trainer":
        # Our own argument check: it names the argument, so the key can too.
        return ConfigError(f"{key}.init_args.{leaf.argument}", _one_paragraph(str(leaf)))
    what = f"{class_path}(...) raised " if class_path else ""
    reason = f"{what}{type(leaf).__name__}: {_one_paragraph(str(leaf))}"
    if isinstance(leaf, ConnectionError) and "ray" in str(leaf).lower():
        reason += (
            " The config joins a running Ray cluster (ray_init_config: {address: auto}) and "
            "none is running: start one with `ray start --head` (stop it with `ray stop`), or "
            "remove `address` from ray_init_config to start a local one in this process."
        )
    return ConfigError(key, reason)


def _configured_classes(config: Any) -> list[tuple[str, str, type]]:
    """``(key, class_path, class)`` for every ``class_path`` entry in the parsed config."""
    found: list[tuple[str, str, type]] = []

    def walk(node: Any, key: str) -> None:
        if hasattr(node, "as_dict"):
            node = node.as_dict()
        if isinstance(node, dict):
            if isinstance(node.get("class_path"), str):
                cls = _import(node["class_path"])
                if cls is not None:
                    found.append((key, node["class_path"], cls))
            for name, value in node.items():
                walk(value, f"{key}.{name}" if key else name)
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{key}[{i}]")

    walk(config, "")
    return found


__all__ = [
    "CONFIG_ERROR_EXIT_CODE",
    "INTERRUPT_EXIT_CODE",
    "ConfigError",
    "FitConfigSaver",
    "ReplayBufferCLI",
    "console_main",
    "main",
]
