"""Fractions are exact shares of every batch: they sum to 1, and errors quote what was typed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mixture_helpers import items, make_mixture, member

from rb_lightning import BufferMixture, UsageError

#: Ids of member ``m``'s items start at ``m * ID_STRIDE``; an item's id is its member's
#: base plus its slot, so a batch row says which member and slot it came from.
ID_STRIDE = 1_000


@pytest.mark.parametrize(
    ("fractions", "total"),
    [((0.1, 0.3), "0.4"), ((0.25, 0.8), "1.05"), ((0.5, 0.6), "1.1")],
)
def test_fractions_that_do_not_sum_to_one_are_refused_with_what_was_typed(fractions, total):
    typed = dict(zip(["offline", "online"], fractions, strict=True))
    with pytest.raises(UsageError) as err:
        make_mixture(fractions=typed)
    message = str(err.value)
    assert err.value.argument == "fractions"
    assert repr(typed) in message  # the values as typed
    assert f"add up to {total}, not 1" in message
    assert "weights=" in message  # the other way to say it
    # Nothing the user did not type: no rescaled shares (0.25 -> 0.238..., 0.1 -> 0.25).
    rescaled = [f / sum(fractions) for f in fractions]
    assert all(repr(r) not in message for r in rescaled if r not in fractions), message
    assert "\n" not in message


def test_fractions_within_a_millionth_of_one_are_taken():
    mix = make_mixture(fractions={"offline": 0.3333333, "online": 0.6666667})
    assert mix.sample(3)["source"].tolist() == [0, 1, 1]
    assert mix.fractions == {"offline": 0.3333333, "online": 0.6666667}


def test_a_batch_size_the_fractions_do_not_split_quotes_only_typed_values():
    mix = make_mixture(fractions={"offline": 0.25, "online": 0.75})
    with pytest.raises(UsageError) as err:
        mix.sample(10)
    message = str(err.value)
    assert err.value.argument == "batch_size"
    assert "{'offline': 0.25, 'online': 0.75}" in message and "batch_size=10" in message
    assert "batch_size=4" in message  # the smallest that splits
    assert "2.5" not in message and "7.5" not in message
    assert mix.sample(4)["source"].tolist() == [0, 1, 1, 1]


def test_equal_shares_by_default_need_a_batch_size_every_member_divides():
    mix = BufferMixture({name: member(False) for name in ("a", "b", "c")})
    for rb in mix.members.values():
        rb.extend(items(10, 0))
    assert mix.fractions == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    assert mix.sample(6)["source"].bincount().tolist() == [2, 2, 2]
    with pytest.raises(UsageError, match="batch_size=3"):
        mix.sample(8)


@st.composite
def composition(draw):
    """Per-member counts of a batch, and the fractions ``count / batch_size`` a user types."""
    members = draw(st.integers(1, 4))
    batch_size = draw(st.integers(1, 96))
    cuts = sorted(draw(st.lists(st.integers(0, batch_size), min_size=members - 1,
                                max_size=members - 1)))  # fmt: skip
    counts = [b - a for a, b in zip([0, *cuts], [*cuts, batch_size], strict=True)]
    sizes = draw(st.lists(st.integers(1, 60), min_size=members, max_size=members))
    return batch_size, counts, sizes


def _mixture(counts: list[int], sizes: list[int], batch_size: int, seed: int) -> BufferMixture:
    names = [f"m{i}" for i in range(len(counts))]
    buffers = {}
    for number, (name, size) in enumerate(zip(names, sizes, strict=True)):
        rb = member(prioritized=number % 2 == 1, capacity=64)
        rb.extend(items(size, number * ID_STRIDE))
        buffers[name] = rb
    fractions = {name: count / batch_size for name, count in zip(names, counts, strict=True)}
    mix = BufferMixture(buffers, fractions=fractions)
    mix.set_rng(torch.Generator().manual_seed(seed))
    return mix


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(composition(), st.integers(0, 2**16))
def test_every_batch_holds_exactly_the_fraction_of_each_member(case, seed):
    batch_size, counts, sizes = case
    mix = _mixture(counts, sizes, batch_size, seed)
    for _ in range(3):
        batch = mix.sample(batch_size)
        assert batch.batch_size == torch.Size([batch_size])
        assert mix.counts(batch_size) == counts
        source = batch["source"]
        assert source.bincount(minlength=len(counts)).tolist() == counts
        # Each row's source and index name the member and slot that hold it.
        assert torch.equal(batch["id"], source * ID_STRIDE + batch["index"])
        assert bool((batch["index"] < torch.tensor(sizes)[source]).all())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 1000), min_size=1, max_size=4).filter(lambda v: sum(v) > 0),
    st.integers(1, 1000),
)
def test_fractions_off_one_are_always_refused_naming_the_typed_values(thousandths, scale):
    # Typed values such as 0.137; the same shares over another total (e.g. counts / 997).
    fractions = {f"m{i}": v / 1000 * scale / 1000 for i, v in enumerate(thousandths)}
    total = sum(fractions.values())
    buffers = {name: member(False, capacity=4) for name in fractions}
    if abs(total - 1) <= 1e-6:
        BufferMixture(buffers, fractions=fractions)
        return
    with pytest.raises(UsageError) as err:
        BufferMixture(buffers, fractions=fractions)
    assert err.value.argument == "fractions"
    assert repr(fractions) in str(err.value)
    assert f"add up to {total:.12g}, not 1" in str(err.value)
