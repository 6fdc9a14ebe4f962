"""rb_lightning.columns: flat names, leaf keys, columns and rows of a sampled batch."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rb_lightning import columns


def _batch() -> TensorDict:
    return TensorDict(
        {
            "obs": torch.arange(6.0).reshape(3, 2),
            "next": {"reward": torch.ones(3)},
            "text": ["a", "b", "c"],
        },
        batch_size=[3],
    )


def test_flat_name_and_normalize_key():
    assert columns.flat_name(("next", "reward")) == "next.reward"
    assert columns.flat_name("obs") == "obs"
    assert columns.normalize_key(("obs",)) == "obs"
    assert columns.normalize_key(("a", "b")) == ("a", "b")


def test_leaf_keys_of_tensordict_and_mapping_agree():
    batch = _batch()
    keys = columns.leaf_keys(batch)
    assert set(keys) == {"obs", ("next", "reward"), "text"}
    assert set(columns.leaf_keys(batch.to_dict())) == set(keys)


def test_leaf_keys_refuses_other_types():
    with pytest.raises(TypeError, match="TensorDicts or mappings"):
        columns.leaf_keys([1, 2])


def test_check_unique_names_refuses_a_collision():
    with pytest.raises(ValueError, match="both flatten to the name 'a.b'"):
        columns.check_unique_names(["a.b", ("a", "b")])


def test_columns_and_rows():
    batch = _batch()
    cols = columns.columns(batch, columns.leaf_keys(batch))
    assert cols["text"] == ["a", "b", "c"]
    assert torch.equal(cols["next.reward"], torch.ones(3))
    assert columns.batch_length(batch) == 3
    rows = list(columns.rows(cols, 3, device=None))
    assert len(rows) == 3 and rows[1]["text"] == "b"
    assert rows[2]["obs"].tolist() == [4.0, 5.0]


def test_batch_length_of_a_mapping():
    assert columns.batch_length({"x": torch.zeros(5)}) == 5
    assert columns.batch_length({}) == 0
