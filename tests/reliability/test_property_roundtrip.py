"""Random nested schemas keep names and values through every output path."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import NonTensorStack, TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning import ReplayBufferBatchDataset, ReplayBufferDataset

DTYPES = (torch.int64, torch.float32, torch.bool)
names = st.text(alphabet="abcdefgh", min_size=1, max_size=4)
leaf = st.one_of(
    st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(1, 3), max_size=2).map(tuple)),
    st.just("str"),
)


def schema(depth: int):
    child = leaf if depth >= 3 else st.one_of(leaf, st.deferred(lambda: schema(depth + 1)))
    return st.dictionaries(names, child, min_size=1, max_size=3)


def build(spec: dict, n: int, gen: torch.Generator, prefix: tuple = ()) -> tuple[dict, dict]:
    """Return (nested data for a TensorDict, flat expected columns)."""
    data, flat = {}, {}
    for name, kind in spec.items():
        path = (*prefix, name)
        if isinstance(kind, dict):
            data[name], sub = build(kind, n, gen, path)
            flat.update(sub)
        elif kind == "str":
            values = [
                f"{'.'.join(path)}-{i}-{int(torch.randint(0, 99, (), generator=gen))}"
                for i in range(n)
            ]
            data[name], flat[".".join(path)] = NonTensorStack(*values), values
        else:
            dtype, shape = kind
            value = torch.randint(0, 5, (n, *shape), generator=gen)
            value = value.to(dtype) if dtype != torch.float32 else value.float() / 3
            data[name], flat[".".join(path)] = value, value
    return data, flat


def expected_row(flat: dict, i: int) -> dict:
    return {k: v[i] for k, v in flat.items()}


def assert_same(actual, expected, name: str) -> None:
    if isinstance(expected, torch.Tensor):
        actual = torch.as_tensor(actual, dtype=expected.dtype)
        assert actual.shape == expected.shape and torch.equal(actual, expected), name
    else:
        assert actual == expected, name


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=schema(1), n=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_nested_schemas_round_trip_every_path(spec, n, seed):
    data, flat = build(spec, n, torch.Generator().manual_seed(seed))
    rb = ReplayBuffer(storage=LazyTensorStorage(16))
    rb.extend(TensorDict({**data, "row": torch.arange(n)}, batch_size=[n]))
    names_expected = set(flat) | {"row"}

    for item in ReplayBufferDataset(rb, n, num_batches=2):
        assert set(item) == names_expected
        want = expected_row(flat, int(item["row"]))
        for name, value in want.items():
            assert_same(item[name], value, name)

    batch = next(iter(ReplayBufferBatchDataset(rb, n, flatten=True)))
    assert set(batch) == names_expected
    for j, row in enumerate(batch["row"].tolist()):
        for name, value in expected_row(flat, row).items():
            assert_same(batch[name][j], value, name)

    pytest.importorskip("datasets")
    from rb_lightning.hf.export import to_hf_dataset

    snapshot = to_hf_dataset(rb, streaming=False)
    assert set(snapshot.column_names) == names_expected
    for i, record in enumerate(snapshot):
        assert record["row"] == i  # storage order
        for name, value in expected_row(flat, i).items():
            assert_same(record[name], value, name)
