"""Members must store the same keys, dtypes and per-item shapes: checked for all members at once."""

from __future__ import annotations

import pytest
import torch
from mixture_helpers import member
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning import BufferMixture, UsageError
from rb_lightning.errors import MissingKeyError


def rows(n: int, *, x_dtype=torch.float32, x_shape=(3,), id_dtype=torch.int64, **extra):
    data = {
        "x": torch.zeros(n, *x_shape, dtype=x_dtype),
        "id": torch.arange(n).to(id_dtype),
        **extra,
    }
    return TensorDict(data, batch_size=[n])


def mixture(offline: TensorDict, online: TensorDict | None, **composition) -> BufferMixture:
    off, on = member(False), member(True)
    off.extend(offline)
    if online is not None:
        on.extend(online)
    mix = BufferMixture({"offline": off, "online": on}, **composition)
    mix.set_rng(torch.Generator().manual_seed(0))
    return mix


@pytest.mark.parametrize(
    ("online", "key", "quoted"),
    [
        (rows(8, x_dtype=torch.float64), "'x'", ["offline", "float32", "online", "float64"]),
        (rows(8, id_dtype=torch.int32), "'id'", ["offline", "int64", "online", "int32"]),
        (rows(8, x_shape=(2,)), "'x'", ["offline", "[3]", "online", "[2]"]),
    ],
    ids=["float64-vs-float32", "int32-vs-int64", "shape-3-vs-2"],
)
def test_a_column_stored_differently_is_refused_naming_key_members_and_types(online, key, quoted):
    mix = mixture(rows(8), online)
    with pytest.raises(UsageError) as err:
        mix.sample(4)
    message = str(err.value)
    assert err.value.argument == "members"
    assert f"{key}" in message and all(text in message for text in quoted), message
    assert "cast" in message.lower() or "reshape" in message.lower()
    assert "Sizes of tensors" not in message and "\n" not in message


def test_the_check_covers_members_the_batch_does_not_draw_from():
    # The online member's share is 0: no batch concatenates it, but it is a member.
    mix = mixture(
        rows(8), rows(8, x_dtype=torch.float64), fractions={"offline": 1.0, "online": 0.0}
    )
    with pytest.raises(UsageError, match="'x'.*float64"):
        mix.sample(4)


def test_missing_keys_are_caught_at_the_first_draw_from_any_member():
    extra = {"reward": torch.ones(8)}
    mix = mixture(rows(8), rows(8, **extra), fractions={"offline": 1.0, "online": 0.0})
    with pytest.raises(MissingKeyError) as err:
        mix.sample(4)
    assert "'reward'" in str(err.value) and "online" in str(err.value)
    assert err.value.argument == "members"


def test_an_empty_member_is_checked_once_it_has_items():
    mix = mixture(rows(8), None, fractions={"offline": 1.0, "online": 0.0})
    assert mix.sample(4)["x"].dtype == torch.float32  # nothing to compare yet
    mix.member("online").extend(rows(8, id_dtype=torch.int32))
    with pytest.raises(UsageError, match="'id'.*int32"):
        mix.sample(4)


def test_members_stored_alike_mix_without_any_cast():
    # A TensorDictReplayBuffer stores its sampler's "index" in each item, a plain
    # ReplayBuffer does not: bookkeeping, not the user's columns.
    plain = ReplayBuffer(storage=LazyTensorStorage(16))
    plain.extend(rows(8, id_dtype=torch.int32, x_dtype=torch.float64))
    td = member(True)
    td.extend(rows(8, id_dtype=torch.int32, x_dtype=torch.float64))
    mix = BufferMixture({"plain": plain, "td": td})
    batch = mix.sample(8)
    assert batch["x"].dtype == torch.float64 and batch["id"].dtype == torch.int32
    assert batch["source"].tolist() == [0] * 4 + [1] * 4
