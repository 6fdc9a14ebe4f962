"""A buffer restored from a checkpoint saves again without torchrl's false "last_cursor" alarm."""

from __future__ import annotations

import warnings

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning.buffers.reader import load_buffer
from rb_lightning.persist.dumps import dump_buffer


def _wrapped_buffer() -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(TensorDict({"id": torch.arange(12)}, [12]))  # wrapped: written whole
    return rb


def test_restored_buffer_saves_again_silently_and_completely(tmp_path):
    dump_buffer(_wrapped_buffer(), tmp_path / "first")
    restored = ReplayBuffer(storage=LazyTensorStorage(8))
    load_buffer(restored, tmp_path / "first")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the resumed run's first save, before any write
        dump_buffer(restored, tmp_path / "second")
    again = ReplayBuffer(storage=LazyTensorStorage(8))
    load_buffer(again, tmp_path / "second")
    assert sorted(again[:]["id"].tolist()) == list(range(4, 12))
    assert again.writer._write_count == 12
