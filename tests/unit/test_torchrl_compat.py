"""rb_lightning.torchrl_compat: each workaround still needed, and the fix works (torchrl 0.14.1).

A ``test_..._still_...`` test checks that torchrl's bug is still there: when one fails after
the pin moves, delete the workaround of ``rb_lightning/torchrl_compat/workarounds.py`` that
names it.
"""

from __future__ import annotations

import pickle
import warnings

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, PrioritizedSampler, ReplayBuffer

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
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with compat.ignore_last_cursor_warning():
            warnings.warn("last_cursor is None, so ...", stacklevel=1)
            warnings.warn("something else", stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else"]


def test_dumps_after_loads_still_warns_about_last_cursor(tmp_path):
    # When this fails, torchrl no longer warns: delete ignore_last_cursor_warning.
    _dumped(tmp_path / "first")
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.loads(tmp_path / "first")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rb.dumps(tmp_path / "again")
    assert any("last_cursor is None" in str(w.message) for w in caught)


def test_dumps_still_pickles_an_empty_prefetch_state(tmp_path):
    # When this fails, dumps writes no pickle without prefetch: delete is_empty_prefetch_pickle.
    _dumped(tmp_path)
    assert compat.is_empty_prefetch_pickle(tmp_path / "prefetch.pkl")


def _memmap_buffer(scratch_dir) -> ReplayBuffer:
    return ReplayBuffer(storage=LazyMemmapStorage(4, scratch_dir=scratch_dir))


def test_lazy_memmap_still_refuses_its_scratch_files(tmp_path):
    # When this fails, a storage reuses its scratch_dir's files: delete overwriting_scratch_files.
    data = TensorDict({"x": torch.arange(2)}, batch_size=[2])
    _memmap_buffer(tmp_path).extend(data)  # a previous process's files
    with pytest.raises(RuntimeError, match="already exists"):
        _memmap_buffer(tmp_path).extend(data)


def test_overwriting_scratch_files_lets_a_restore_write_them(tmp_path):
    data = TensorDict({"x": torch.arange(2)}, batch_size=[2])
    _memmap_buffer(tmp_path).extend(data)
    rb = _memmap_buffer(tmp_path)
    with compat.overwriting_scratch_files(rb.storage):
        rb.extend(data + 5)
    assert rb[:2]["x"].tolist() == [5, 6] and rb.storage.existsok is False


def test_priority_tree_readers_read_the_sampler_trees():
    mass, stored = compat.priority_tree_readers()
    rb = ReplayBuffer(
        storage=LazyTensorStorage(4), sampler=PrioritizedSampler(4, alpha=1.0, beta=0.4, eps=0)
    )
    rb.extend(TensorDict({"x": torch.arange(3)}, batch_size=[3]))
    rb.update_priority(torch.arange(3), torch.tensor([1.0, 2.0, 4.0]))
    assert mass(rb.sampler, 3) == (7.0, 1.0)
    assert stored(rb.sampler, torch.tensor([2, 0])).tolist() == [4.0, 1.0]
    uniform = ReplayBuffer(storage=LazyTensorStorage(4))
    assert mass(uniform.sampler, 3) is None and stored(uniform.sampler, torch.arange(1)) is None
