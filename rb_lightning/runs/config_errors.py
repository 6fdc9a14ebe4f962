"""A config mistake, told as the key at fault and one paragraph, not a parser dump or a traceback.

jsonargparse reports a bad config as a chain of errors (one per nesting level)
and a constructor that rejects its arguments as a traceback. These functions
find the config key at fault and the innermost reason, and suggest the name the
user probably meant.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
from collections.abc import Iterator
from typing import Any

from lightning.pytorch import Trainer

from rb_lightning.errors import ConfigError, UsageError
from rb_lightning.runs.preflight import SECTIONS
from rb_lightning.runs.user_errors import one_paragraph

# -- parse errors -------------------------------------------------------------------------------
_TOP_LEVEL_KEYS = SECTIONS
_PARSER_KEY = re.compile(r'^Parser key "([^"]+)":\s*(.*)$')
_CLASS_PATH = re.compile(r"^Problem with given class_path '([^']+)':")
_NOT_ACCEPTED = re.compile(r"^Option '([^']+)' is not accepted|does not accept option '([^']+)'")
_UNRECOGNIZED = re.compile(r"unrecognized arguments: --([^\s=]+)")
_NO_ATTRIBUTE = re.compile(r"^module '([^']+)' has no attribute '([^']+)'")
_NO_MODULE = re.compile(r"No module named '([^'.]+)")
#: The extra (pyproject's optional dependencies) that brings each optional package.
_EXTRA_OF = {
    "transformers": "hf", "datasets": "hf", "trl": "hf", "accelerate": "hf", "tokenizers": "hf",
    "gymnasium": "rl", "matplotlib": "plot", "ray": "ray",
}  # fmt: skip


def is_argument_error(err: BaseException) -> bool:
    return any(type(e).__name__ == "ArgumentError" for e in exception_chain(err))


def exception_chain(err: BaseException | None) -> Iterator[BaseException]:
    """``err``, then what it was raised from or during, as Python's traceback shows them."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or (None if err.__suppress_context__ else err.__context__)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0].strip() if text else type(err).__name__


def parse_error(err: BaseException) -> ConfigError:
    """Turn jsonargparse's chained parse error (one exception per nesting level) into the key at fault and the innermost reason."""
    parts: list[str] = []
    class_path: str | None = None
    previous = None
    chain = list(exception_chain(err))
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
    reason = one_paragraph(str(leaf)) or type(leaf).__name__
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
    if (match := _NO_MODULE.search(reason)) and match.group(1) in _EXTRA_OF:
        extra = _EXTRA_OF[match.group(1)]
        reason += (
            f' {match.group(1)} comes with the {extra} extra: pip install "rb-lightning[{extra}]".'
        )
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
    cls = import_class(class_path)
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


def import_class(class_path: str) -> Any:
    """The class a ``class_path`` names, or ``None`` if it cannot be imported."""
    module_name, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return None


# -- instantiation errors -----------------------------------------------------------------------
def instantiation_error(err: BaseException, config: Any) -> ConfigError:
    """Name the config entry whose constructor raised ``err`` (found in the traceback)."""
    leaf = list(exception_chain(err))[-1]
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
        return ConfigError(f"{key}.init_args.{leaf.argument}", one_paragraph(str(leaf)))
    what = f"{class_path}(...) raised " if class_path else ""
    reason = f"{what}{type(leaf).__name__}: {one_paragraph(str(leaf))}"
    if "InvalidAuthToken" in str(leaf):  # Ray's message embeds a traceback: not repeated
        return ConfigError(key, RAY_TOKEN_NEEDED)
    if isinstance(leaf, ConnectionError) and "ray" in str(leaf).lower():
        reason += (
            " The config joins a running Ray cluster (ray_init_config: {address: auto}) and "
            "none is running: start one with `ray start --head` (stop it with `ray stop`), or "
            "remove `address` from ray_init_config to start a local one in this process."
        )
    return ConfigError(key, reason)


#: A cluster made by ``ray start`` (Ray 2.60) refuses processes that do not send its token.
RAY_TOKEN_NEEDED = (
    "the Ray cluster refused this process: it uses token authentication (`ray start` turns "
    "it on and writes the token to ~/.ray/auth_token). Run with RAY_AUTH_MODE=token, e.g. "
    "`export RAY_AUTH_MODE=token` before `ray start` and `python train.py fit ...`; on a "
    "machine without that file, also set RAY_AUTH_TOKEN to the cluster's token."
)


def _configured_classes(config: Any) -> list[tuple[str, str, type]]:
    """``(key, class_path, class)`` for every ``class_path`` entry in the parsed config."""
    found: list[tuple[str, str, type]] = []

    def walk(node: Any, key: str) -> None:
        if hasattr(node, "as_dict"):
            node = node.as_dict()
        if isinstance(node, dict):
            if isinstance(node.get("class_path"), str):
                cls = import_class(node["class_path"])
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
    "exception_chain",
    "import_class",
    "instantiation_error",
    "is_argument_error",
    "one_paragraph",
    "parse_error",
]
