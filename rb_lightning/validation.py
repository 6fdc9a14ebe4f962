"""Argument checks shared by the datasets and the DataModule.

Each check names the argument, what it got and how to fix it, so bad input
fails at construction instead of deep inside a sampler or a worker.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any, Literal, overload

import torch
from tensordict.utils import NestedKey
from torchrl.data import ReplayBuffer

from rb_lightning.columns import normalize_key
from rb_lightning.errors import ArgumentTypeError, UsageError


@overload
def check_replay_buffer(
    replay_buffer: Any, name: str = ..., *, allow_none: Literal[False] = ...
) -> ReplayBuffer: ...
@overload
def check_replay_buffer(
    replay_buffer: Any, name: str = ..., *, allow_none: bool
) -> ReplayBuffer | None: ...
def check_replay_buffer(
    replay_buffer: Any, name: str = "replay_buffer", *, allow_none: bool = False
) -> ReplayBuffer | None:
    """``replay_buffer`` itself if it is a torchrl ``ReplayBuffer`` (or ``None`` when allowed).

    Examples:
        >>> check_replay_buffer([1, 2])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        rb_lightning.errors.ArgumentTypeError: replay_buffer must be a torchrl ReplayBuffer ...
    """
    if replay_buffer is None and allow_none:
        return None
    if not isinstance(replay_buffer, ReplayBuffer):
        raise ArgumentTypeError(
            name,
            f"{name} must be a torchrl ReplayBuffer instance, got {type(replay_buffer).__name__}. "
            "Wrap your data in torchrl.data.ReplayBuffer(storage=...) first.",
        )
    return replay_buffer


def as_int(value: Any) -> int | None:
    """``value`` as a plain ``int`` for any integer (Python, numpy, a 0-d tensor), else ``None``; ``bool`` is refused (``True`` as a batch size is a bug)."""
    if isinstance(value, bool):  # numpy.bool_ is not Integral: refused below
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if (
        isinstance(value, torch.Tensor)
        and value.dim() == 0
        and not value.dtype.is_floating_point
        and not value.dtype.is_complex
        and value.dtype != torch.bool
    ):
        return int(value.item())
    return None


@overload
def check_positive_int(value: Any, name: str, *, allow_none: Literal[False] = ...) -> int: ...
@overload
def check_positive_int(value: Any, name: str, *, allow_none: bool) -> int | None: ...
def check_positive_int(value: Any, name: str, *, allow_none: bool = False) -> int | None:
    """``value`` as a positive ``int`` (``None`` passes through with ``allow_none``), else :class:`UsageError`."""
    if value is None and allow_none:
        return None
    number = as_int(value)
    if number is None or number <= 0:
        suffix = " or None (unbounded stream)" if allow_none else ""
        raise UsageError(name, f"{name} must be a positive integer{suffix}, got {value!r}.")
    return number


def check_non_negative_int(value: Any, name: str) -> int:
    """``value`` as an ``int`` >= 0, else :class:`UsageError`."""
    number = as_int(value)
    if number is None or number < 0:
        raise UsageError(name, f"{name} must be a non-negative integer, got {value!r}.")
    return number


def check_seconds(value: Any, name: str) -> float:
    """``value`` as a positive number of seconds, or a :class:`UsageError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not float(value) > 0:
        raise UsageError(name, f"{name} must be a positive number of seconds, got {value!r}.")
    return float(value)


def check_keys(keys: Any) -> list[NestedKey] | None:
    if keys is None:
        return None
    if isinstance(keys, (str, tuple)) or not isinstance(keys, Sequence):
        raise ArgumentTypeError(
            "keys",
            f"keys must be a list of keys (strings, or tuples of strings for nested keys), "
            f"got {keys!r}. Example: keys=['obs', ('next', 'reward')].",
        )
    checked: list[NestedKey] = []
    for key in keys:
        is_nested = isinstance(key, tuple) and key and all(isinstance(k, str) for k in key)
        if not (isinstance(key, str) or is_nested):
            raise ArgumentTypeError(
                "keys",
                f"keys must hold strings or tuples of strings, got {key!r} "
                f"({type(key).__name__}). Nested keys are tuples: ('next', 'reward').",
            )
        checked.append(normalize_key(key))
    if not checked:
        raise UsageError("keys", "keys must not be empty; pass keys=None to keep every key.")
    return checked


def check_device(device: Any) -> torch.device | None:
    if device is None:
        return None
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise UsageError(
            "device",
            f"device={device!r} is not a valid torch device ({err}). Pass 'cpu' or 'cuda'.",
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            "device",
            f"device={str(device)!r} was requested but CUDA is not available on this machine. "
            "Pass device=None (keep tensors on CPU) or device='cpu'.",
        )
    return device


__all__ = [
    "as_int",
    "check_device",
    "check_keys",
    "check_non_negative_int",
    "check_positive_int",
    "check_replay_buffer",
]
