"""The configs shipped with the package, run by name: ``rb-lightning fit --config cartpole_dqn``.

``configs/`` installs as ``rb_lightning/configs/``. A ``--config`` value that is no existing
file but a shipped config's name (with or without ``.yaml``) runs that config; relative
paths inside it are relative to the current folder. ``rb-lightning configs`` lists them,
``--copy NAME FILE`` copies one out to edit.

Examples:
    >>> "cartpole_dqn" in names()
    True
    >>> resolve_config_args(["fit", "--config", "cartpole_dqn.yaml"])[2] == str(path_of("cartpole_dqn"))
    True
    >>> resolve_config_args(["fit", "--config=configs/my_run.yaml"])  # a path: left as it is
    ['fit', '--config=configs/my_run.yaml']
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import sys
from pathlib import Path

from rb_lightning.errors import UsageError

__all__ = ["config_dir", "configs_main", "describe", "name_of", "names", "path_of",
           "resolve_config_args"]  # fmt: skip

#: The command that lists the shipped configs (told in messages).
LIST_COMMAND = "rb-lightning configs"
_SUFFIXES = (".yaml", ".yml")
_CONFIG_FLAGS = ("--config", "-c")
# A bare name (no folder, no YAML syntax): what --config cartpole_dqn looks like.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def config_dir() -> Path:
    """The folder holding the shipped configs.

    Installed from a wheel they are ``rb_lightning/configs/``; in a clone or an
    editable install (``pip install -e .``) they are the repository's ``configs/``.
    """
    package = Path(__file__).resolve().parents[1]  # rb_lightning/
    installed = package / "configs"
    if installed.is_dir():
        return installed
    return package.parent / "configs"


def names() -> list[str]:
    """The shipped configs' names, sorted (``cartpole_dqn``, ``llm_sft``, ...)."""
    folder = config_dir()
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.iterdir() if p.suffix in _SUFFIXES)


def path_of(name: str) -> Path:
    """The file of the shipped config ``name`` (with or without ``.yaml``).

    Raises:
        UsageError: When no shipped config has that name; the message lists them.
    """
    found = _find(name)
    if found is None:
        raise UsageError(
            "--config",
            f"{name!r} is neither a file nor the name of a shipped config.{_known(name)} "
            "Pass one of these names, or the path of your own YAML file.",
        )
    return found


def name_of(value: str) -> str | None:
    """The name a ``--config`` value resolved to by :func:`resolve_config_args`, else ``None``."""
    path = Path(value)
    if path.is_absolute() and path.parent == config_dir() and path.stem in names():
        return path.stem
    return None


def describe(name: str) -> str:
    """What the shipped config ``name`` trains: the first line of its header comment."""
    for line in path_of(name).read_text().splitlines():
        if line.startswith("#") and line.lstrip("# ").strip():
            return line.lstrip("# ").strip()
    return ""


def resolve_config_args(args: list[str]) -> list[str]:
    """``args`` with every ``--config NAME`` of a shipped config replaced by that file's path.

    A value that is an existing file, or that is not a bare name (it has a
    folder or YAML in it), is left as it is.

    Raises:
        UsageError: For a bare name that is neither a file nor a shipped config;
            the message lists the shipped names.
    """
    resolved = list(args)
    for i, arg in enumerate(resolved):
        flag, eq, value = arg.partition("=")
        if flag not in _CONFIG_FLAGS:
            continue
        if eq:
            resolved[i] = f"{flag}={_resolve(value)}"
        elif i + 1 < len(resolved):
            resolved[i + 1] = _resolve(resolved[i + 1])
    return resolved


def _resolve(value: str) -> str:
    if not _NAME.fullmatch(value) or Path(value).is_file():
        return value
    return str(path_of(value))


def _find(name: str) -> Path | None:
    stem = name.removesuffix(_suffix(name))
    for candidate in (config_dir() / f"{stem}{suffix}" for suffix in _SUFFIXES):
        if candidate.is_file():
            return candidate
    return None


def _suffix(name: str) -> str:
    return next((s for s in _SUFFIXES if name.endswith(s)), "")


def _known(name: str) -> str:
    """' Did you mean ...? Shipped configs: ...': what to tell after an unknown ``name``."""
    known = names()
    close = difflib.get_close_matches(name.removesuffix(_suffix(name)), known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    listed = ", ".join(known) or f"none found in {config_dir()}"
    return f"{hint} Shipped configs: {listed} (`{LIST_COMMAND}` says what each trains)."


# -- rb-lightning configs -----------------------------------------------------------------------
def configs_main(args: list[str]) -> None:
    """``rb-lightning configs``: list the shipped configs, or copy one out with ``--copy``.

    Args:
        args: What follows ``configs`` on the command line, e.g.
            ``["--copy", "cartpole_dqn", "my.yaml"]``.

    Raises:
        UsageError: For an unknown name, or a destination that already exists.

    Examples:
        >>> configs_main([])  # doctest: +ELLIPSIS
        Shipped configs (run one: rb-lightning fit --config NAME):
          cartpole_dqn  ...
        ...
    """
    parser = argparse.ArgumentParser(
        prog=LIST_COMMAND,
        description="List the shipped configs, or copy one out to edit it.",
    )
    parser.add_argument("--copy", metavar="NAME", help="copy the shipped config NAME out")
    parser.add_argument(
        "dest",
        nargs="?",
        metavar="DEST",
        help="where --copy writes (a file or a folder; ./NAME.yaml)",
    )
    parsed = parser.parse_args(args)
    if parsed.copy is not None:
        _copy(parsed.copy, parsed.dest)
    elif parsed.dest is not None:
        parser.error(f"DEST {parsed.dest!r} needs --copy NAME (the config to copy there).")
    else:
        _print_list()


def _print_list() -> None:
    known = names()
    width = max(map(len, known), default=0)
    print("Shipped configs (run one: rb-lightning fit --config NAME):")
    for name in known:
        print(f"  {name.ljust(width)}  {describe(name)}")
    print(f"Copy one out to edit it: {LIST_COMMAND} --copy NAME [DEST]. Folder: {config_dir()}")


def _copy(name: str, dest: str | None) -> None:
    source = _find(name)
    if source is None:
        raise UsageError("--copy", f"{name!r} is not the name of a shipped config.{_known(name)}")
    target = Path(dest) if dest is not None else Path(source.name)
    if target.is_dir():
        target = target / source.name
    if target.exists():
        raise UsageError(
            "--copy",
            f"{str(target)!r} already exists; nothing was copied. Give another DEST "
            f"(`{LIST_COMMAND} --copy {name} DEST`), or delete the file first.",
        )
    shutil.copyfile(source, target)
    print(f"copied {source.stem} to {target}; run it: rb-lightning fit --config {target}")


def main(args: list[str] | None = None) -> None:
    """``configs_main`` with a :class:`UsageError` as one paragraph on stderr and exit code 2."""
    try:
        configs_main(sys.argv[1:] if args is None else args)
    except UsageError as err:
        print(f"error: {err} (argument: {err.argument})", file=sys.stderr)
        raise SystemExit(2) from None
