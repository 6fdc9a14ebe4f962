"""rb_lightning.torchrl_compat: each workaround still needed, and the fix works (torchrl 0.14.1)."""

from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, PrioritizedSampler, ReplayBuffer

from rb_lightning import torchrl_compat as compat


def _dumped(tmp_path, n: int = 4) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(TensorDict({"x": torch.arange(n), "s": [f"s{i}" for i in range(n)]}, batch_size=[n]))
    rb.dumps(tmp_path)
    return rb


def test_loads_still_breaks_strings_so_the_fix_is_needed(tmp_path):
    # When this fails, torchrl fixed loads(): delete restore_non_tensor_columns and its callers.
    _dumped(tmp_path)
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.loads(tmp_path)
    assert list(rb[:4]["s"]) != ["s0", "s1", "s2", "s3"]


def test_loads_with_strings_restores_them(tmp_path):
    _dumped(tmp_path)
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    compat.loads_with_strings(rb, tmp_path)
    assert list(rb[:4]["s"]) == ["s0", "s1", "s2", "s3"]
    assert rb[:4]["x"].tolist() == [0, 1, 2, 3]


def test_dumps_layout_helpers(tmp_path):
    assert not compat.is_dumps_directory(tmp_path)
    with pytest.raises(FileNotFoundError, match="storage_metadata.json"):
        compat.dumps_length(tmp_path)
    _dumped(tmp_path, n=3)
    assert compat.is_dumps_directory(tmp_path)
    assert compat.dumps_length(tmp_path) == 3
    items = compat.read_dumps_items(tmp_path)
    assert items["x"].tolist() == [0, 1, 2] and list(items["s"]) == ["s0", "s1", "s2"]


def test_private_accessors_read_what_torchrl_keeps():
    rb = ReplayBuffer(
        storage=LazyTensorStorage(8),
        sampler=PrioritizedSampler(8, alpha=0.6, beta=0.4, eps=1e-6),
        batch_size=2,
    )
    assert compat.storage_content(rb.storage) is None  # lazy: nothing before the first write
    rb.extend(TensorDict({"x": torch.arange(3)}, batch_size=[3]))
    assert isinstance(compat.storage_content(rb.storage), TensorDict)
    assert compat.write_count(rb) == 3
    assert compat.default_batch_size(rb) == 2
    compat.set_default_batch_size(rb, 4)
    assert compat.default_batch_size(rb) == 4
    assert compat.sampler_attribute(rb.sampler, "alpha") == pytest.approx(0.6)
    assert compat.sampler_attribute(rb.sampler, "eps") == pytest.approx(1e-6)
    assert compat.sampler_attribute(rb.sampler, "max_capacity") == 8
    assert compat.sampler_attribute(rb.sampler, "shuffle") is None
    assert not compat.has_custom_checkpointer_hooks(rb.storage)
    assert not compat.has_prefetch(rb)


def test_without_generator_detaches_only_for_the_block():
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    generator = torch.Generator().manual_seed(0)
    rb.set_rng(generator)
    with compat.without_generator(rb):
        assert compat.buffer_generator(rb) is None
    assert compat.buffer_generator(rb) is generator


def test_empty_prefetch_pickle_is_recognised_and_code_refused(tmp_path):
    empty = tmp_path / "empty.pkl"
    empty.write_bytes(pickle.dumps({"queue": []}))
    assert compat.is_empty_prefetch_pickle(empty)
    code = tmp_path / "code.pkl"
    code.write_bytes(pickle.dumps(print))  # needs a global: refused, never resolved
    assert not compat.is_empty_prefetch_pickle(code)


def test_ignore_last_cursor_warning_hides_only_that_warning():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with compat.ignore_last_cursor_warning():
            warnings.warn("last_cursor is None, so ...", stacklevel=1)
            warnings.warn("something else", stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else"]
