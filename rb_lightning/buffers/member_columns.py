"""The columns of a :class:`~rb_lightning.BufferMixture`'s members: alike, or refused.

``torch.cat`` of two dtypes casts to the wider one silently, and fails on other per-item
shapes naming neither key nor member; :func:`check_alike` compares the members' keys,
dtypes and shapes first and names the key, the members and the fix.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> a, b = ReplayBuffer(storage=LazyTensorStorage(4)), ReplayBuffer(storage=LazyTensorStorage(4))
    >>> _ = a.extend(TensorDict({"x": torch.zeros(2, 3)}, batch_size=[2]))
    >>> _ = b.extend(TensorDict({"x": torch.zeros(2, 3, dtype=torch.float64)}, batch_size=[2]))
    >>> schema("a", a)
    {'x': ('float32', (3,))}
    >>> check_alike({"a": schema("a", a), "b": schema("b", b)})
    Traceback (most recent call last):
    ...
    rb_lightning.errors.UsageError: The mixture's members store 'x' differently: a float32 ...
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.data import ReplayBuffer

from rb_lightning.columns import SAMPLER_INFO_KEYS, leaf_keys
from rb_lightning.errors import ArgumentTypeError, MissingKeyError, UsageError
from rb_lightning.torchrl_compat import GENERATION_KEY

#: Columns torchrl or the mixture adds to items (a ``TensorDictReplayBuffer`` stores its
#: sampler's ``"index"`` in each), not the members' own data: not compared.
BOOKKEEPING_KEYS = frozenset({*SAMPLER_INFO_KEYS, GENERATION_KEY, "source"})

__all__ = ["BOOKKEEPING_KEYS", "Schema", "check_alike", "not_tensordicts", "schema"]

#: A member's columns: key -> (dtype name, per-item shape).
Schema = dict[Any, tuple[str, tuple[int, ...]]]


def not_tensordicts(name: str, got: Any) -> ArgumentTypeError:
    """The error for a member whose items are not TensorDicts (``got``: what it returned)."""
    return ArgumentTypeError(
        "members",
        f"The mixture's member {name!r} returned a {type(got).__name__}; a "
        "BufferMixture mixes TensorDict items only (TensorDictReplayBuffer, or a "
        "ReplayBuffer over a tensor storage).",
    )


def schema(name: str, rb: ReplayBuffer) -> Schema:
    """The columns of ``rb``'s items, read from its first item (as sampling reads it)."""
    item = rb[torch.zeros(1, dtype=torch.long)]
    if not isinstance(item, TensorDictBase):
        raise not_tensordicts(name, item)
    columns: Schema = {}
    for key in leaf_keys(item):
        if key in BOOKKEEPING_KEYS:
            continue
        value = item.get(key)
        if isinstance(value, torch.Tensor):
            columns[key] = (str(value.dtype).removeprefix("torch."), tuple(value.shape[1:]))
        else:
            columns[key] = ("non-tensor", ())
    return columns


def _column(kind: tuple[str, tuple[int, ...]]) -> str:
    dtype, shape = kind
    return f"{dtype} of shape {list(shape)} per item"


def check_alike(schemas: dict[str, Schema]) -> None:
    """Refuse members whose columns differ in key set, dtype or per-item shape."""
    names = list(schemas)
    keys = list(dict.fromkeys(key for columns in schemas.values() for key in columns))
    missing = {key: [n for n in names if key not in schemas[n]] for key in keys}
    missing = {key: absent for key, absent in missing.items() if absent}
    if missing:
        where = "; ".join(
            f"{key!r} is in {[n for n in names if n not in absent]} but not in {absent}"
            for key, absent in missing.items()
        )
        raise MissingKeyError(
            "members",
            f"The mixture's members store different keys: {where}. A batch concatenates "
            "the members' items, so store the same keys in every member (e.g. "
            "OnlineCollector(keys=[...]) as in the offline data, or drop the extra keys "
            "before writing).",
        )
    differing = [key for key in keys if len({schemas[n][key] for n in names}) > 1]
    if not differing:
        return
    key, first = differing[0], names[0]
    want = schemas[first][key]
    odd = [n for n in names if schemas[n][key] != want]
    held = ", ".join(f"{n} {_column(schemas[n][key])}" for n in names)
    if "non-tensor" in {schemas[n][key][0] for n in names}:
        fix = f"Store {key!r} as a tensor in every member, or as strings in every member"
    elif all(schemas[n][key][0] != want[0] for n in odd):
        fix = (
            f"Cast when writing: td[{key!r}] = td[{key!r}].to(torch.{want[0]}) before "
            f"mixture.member({odd[0]!r}).extend(td)"
        )
    else:
        fix = f"Write {odd} items whose {key!r} has {first}'s per-item shape {list(want[1])}"
    also = (
        f" (also different: {', '.join(repr(k) for k in differing[1:])})" if differing[1:] else ""
    )
    raise UsageError(
        "members",
        f"The mixture's members store {key!r} differently: {held}{also}. A batch "
        "concatenates the members' items, so each key needs one dtype and per-item shape in "
        "every member (torch.cat would silently cast to the wider dtype, or fail on the "
        f"shapes). {fix}, so that every member holds what {first!r} does.",
    )
