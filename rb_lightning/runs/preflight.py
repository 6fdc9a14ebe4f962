"""What the command line checks before importing torch: the config files and the keys typed.

A missing config file, YAML that does not parse, a misspelt top-level key and a ``fit``
without a config are refused at once (:func:`check`); what needs a class to know is left
to :mod:`rb_lightning.runs.config_errors`.

Examples:
    >>> check(["fit", "--model=torch.nn.Linear"])  # nothing to refuse
    >>> check(["fit", "--trainr.max_steps=3"])
    Traceback (most recent call last):
    ...
    rb_lightning.errors.ConfigError: config error at trainr.max_steps: unknown key 'trainr' (known: seed_everything, trainer, model, data, optimizer, lr_scheduler, ckpt_path, weights_only). Did you mean 'trainer'?
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from rb_lightning.errors import ConfigError, UsageError
from rb_lightning.runs import shipped_configs
from rb_lightning.runs.user_errors import one_paragraph

__all__ = ["SECTIONS", "SUBCOMMANDS", "SUBCOMMAND_KEYS", "check"]

#: The CLI's subcommands (LightningCLI's, one per Trainer method).
SUBCOMMANDS = ("fit", "validate", "test", "predict")
#: The sections of every subcommand's config.
SECTIONS = ("seed_everything", "trainer", "model", "data", "optimizer", "lr_scheduler")
#: The arguments of each Trainer method that LightningCLI adds to its subcommand's keys
#: (Lightning 2.6; tests/cli/test_cli_startup.py checks them against Lightning's signatures).
SUBCOMMAND_KEYS = {
    "fit": ("ckpt_path", "weights_only"),
    "validate": ("ckpt_path", "verbose", "weights_only"),
    "test": ("ckpt_path", "verbose", "weights_only"),
    "predict": ("ckpt_path", "return_predictions", "weights_only"),
}
_CONFIG_FLAGS = ("--config", "-c")
_HELP_FLAGS = ("-h", "--help")
# Options of every subcommand that are not config keys.
_OPTIONS = ("help", "config", "print_config")


def check(args: list[str]) -> None:
    """Refuse what is wrong in ``args`` (``sys.argv[1:]``) and known without importing torch.

    Raises:
        UsageError: A ``--config`` name that is neither a file nor a shipped config,
            or a subcommand without a config (naming ``--config``).
        ConfigError: A config file that does not exist or does not parse, an unknown
            subcommand, or an unknown top-level key in a config file or a flag.
    """
    args = shipped_configs.resolve_config_args(args)
    if not args or args[0].startswith("-"):
        return  # a config before the subcommand, --print_config: LightningCLI's to read
    subcommand, rest = args[0], args[1:]
    if subcommand not in SUBCOMMANDS:
        hint = _did_you_mean(subcommand, [*SUBCOMMANDS, "configs"])
        raise ConfigError(
            "",
            f"unknown subcommand {subcommand!r}: give one of {', '.join(SUBCOMMANDS)} (or "
            f"configs, which lists the shipped configs).{hint}",
        )
    if any(arg in _HELP_FLAGS for arg in rest):
        return
    known = [*SECTIONS, *SUBCOMMAND_KEYS[subcommand]]
    configs = [_read(value) for value in _config_values(rest)]
    for path, content in configs:
        for key in content:
            if key not in known:
                raise _unknown_key(str(key), str(key), known, f" in {path}")
    flags = [arg[2:].partition("=")[0] for arg in rest if arg.startswith("--") and len(arg) > 2]
    for name in flags:
        section = name.partition(".")[0].rstrip("+")
        if section not in known and section not in _OPTIONS:
            raise _unknown_key(name, section, known, "")
    given_model = any(name.partition(".")[0] == "model" for name in flags)
    if given_model or "print_config" in flags or any("model" in c for _, c in configs):
        return
    if not configs:
        raise UsageError(
            "--config",
            f"{subcommand} needs a config: --config NAME runs a shipped one (`"
            f"{shipped_configs.LIST_COMMAND}` lists them: {', '.join(shipped_configs.names())}), "
            "--config FILE.yaml your own (or give the model with --model CLASS_PATH).",
        )
    files = ", ".join(str(path) for path, _ in configs)
    raise ConfigError(
        "model",
        f"no model is given: {files} has no model: section and no --model was passed. Add "
        "one (model: {class_path: ..., init_args: {...}}), or pass --model CLASS_PATH.",
    )


def _config_values(args: list[str]) -> Iterator[str]:
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in _CONFIG_FLAGS:
            if eq:
                yield value
            elif i + 1 < len(args):
                yield args[i + 1]


def _read(value: str) -> tuple[str, dict[str, Any]]:
    """``(value, its top-level mapping)``; ``{}`` for what LightningCLI reads its own way."""
    if "://" in value or value.lstrip().startswith(("{", "[")) or "\n" in value:
        return value, {}  # a URL or the config itself on the command line
    path = Path(value)
    if not path.is_file():
        raise ConfigError(
            "config",
            f"--config {value!r}: no such file (in {Path.cwd()}). Pass the path of a YAML "
            f"file, or the name of a shipped config (`{shipped_configs.LIST_COMMAND}` lists "
            "them).",
        )
    try:
        with path.open() as file:  # a parse error then names the file, not "<unicode string>"
            content = yaml.safe_load(file)
    except yaml.YAMLError as err:
        raise ConfigError("config", f"the YAML does not parse: {one_paragraph(str(err))}.") from err
    return value, content if isinstance(content, dict) else {}


def _unknown_key(key: str, section: str, known: list[str], where: str) -> ConfigError:
    hint = _did_you_mean(section, known)
    return ConfigError(key, f"unknown key {section!r}{where} (known: {', '.join(known)}).{hint}")


def _did_you_mean(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1)
    return f" Did you mean {close[0]!r}?" if close else ""
