"""Loading a checkpoint never unpickles: a buffer file carrying a pickle is refused, not run.

Each test plants a pickle whose ``__reduce__`` creates a marker file, in the places a
dump could carry one, and shows the load raises and the marker never appears.
"""

from __future__ import annotations

import contextlib
import json
import pickle
from pathlib import Path

import pytest
import torch
import xxhash
from resume_helpers import Recorder, buffer_ids, items, make_buffer, make_trainer
from tensordict import TensorDict
from torchrl.data import ListStorage, ReplayBuffer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.buffers.reader import load_buffer
from rb_lightning.errors import BufferCheckpointError
from rb_lightning.persist.dumps import dump_buffer
from rb_lightning.persist.files import pack_directory, unpack_directory


class Payload:
    """Unpickling it creates ``marker``: the code a malicious checkpoint would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _reseal(root: Path) -> None:
    """Rewrite the manifest to match the tampered files, as an attacker would."""
    manifest = json.loads((root / "manifest.json").read_text())
    files = {
        p.relative_to(root).as_posix(): p.stat().st_size
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }
    manifest["files"] = files
    manifest["xxh3_64"] = {
        name: xxhash.xxh3_64_hexdigest((root / name).read_bytes()) for name in files
    }
    (root / "manifest.json").write_text(json.dumps(manifest))


def _plant_string_pickle(root: Path, marker: Path) -> None:
    """Make the stored strings a NonTensorStack 'pickle.pkl' sidecar (tensordict's format)."""
    text = root / "storage" / "text"
    meta = json.loads((text / "meta.json").read_text())
    meta["data"] = "pickle.pkl"
    (text / "meta.json").write_text(json.dumps(meta))
    (text / "pickle.pkl").write_bytes(pickle.dumps(Payload(marker)))
    _reseal(root)


def test_malicious_pickle_in_a_trainer_checkpoint_is_refused_not_run(tmp_path):
    datamodule = ReplayBufferDataModule(make_buffer(), batch_size=8, num_batches=None)
    make_trainer(tmp_path, max_steps=2, every=2).fit(Recorder(), datamodule=datamodule)
    path = tmp_path / "ckpt" / "last.ckpt"
    checkpoint = torch.load(path, weights_only=True)
    state = checkpoint["ReplayBufferDataModule"]["buffer"]
    assert state["kind"] == "inline"

    marker = tmp_path / "code-ran"
    dump = tmp_path / "dump"
    unpack_directory(state["archive"], dump)
    _plant_string_pickle(dump, marker)
    state["archive"] = pack_directory(dump)
    torch.save(checkpoint, path)

    resumed = ReplayBufferDataModule(make_buffer(filled=False), batch_size=8, num_batches=None)
    trainer = make_trainer(tmp_path, max_steps=4, every=2)
    with pytest.raises(BufferCheckpointError, match=r"(?s)pickle\.pkl.*refused"):
        trainer.fit(Recorder(), datamodule=resumed, ckpt_path=path, weights_only=True)
    assert not marker.exists(), "loading the checkpoint ran the planted code"
    # The payload is live: a loader that allows pickle runs it (then fails on its result).
    with contextlib.suppress(Exception):
        TensorDict.load_memmap(dump / "storage", allow_pickle=True)
    assert marker.exists()


def test_wrapped_buffer_dump_with_a_pickle_sidecar_is_refused(tmp_path):
    rb = make_buffer(capacity=50)
    rb.extend(items(20, 100))  # wrapped: written whole by the storage's checkpointer
    dump_buffer(rb, tmp_path / "dump")
    marker = tmp_path / "code-ran"
    _plant_string_pickle(tmp_path / "dump", marker)
    with pytest.raises(BufferCheckpointError, match="refused"):
        load_buffer(make_buffer(capacity=50, filled=False), tmp_path / "dump")
    assert not marker.exists()


def test_actor_dump_prefetch_pickle_is_checked_without_running_code(tmp_path):
    # torchrl's own dumps layout, as a Ray buffer's actor writes it: a prefetch.pkl beside
    # the storage, read here when a Ray run's buffer is exported.
    marker = tmp_path / "code-ran"
    rb = make_buffer(capacity=50)
    rb.extend(items(20, 100))
    root = tmp_path / "torchrl"
    dump_buffer(rb, root)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["layout"] = "torchrl_dumps"
    (root / "manifest.json").write_text(json.dumps(manifest))
    (root / "prefetch.pkl").write_bytes(pickle.dumps({"version": 1, "queue": ()}))
    _reseal(root)
    restored = make_buffer(capacity=50, filled=False)
    load_buffer(restored, root)  # an empty prefetch state of plain containers is fine
    assert buffer_ids(restored) == buffer_ids(rb)
    (root / "prefetch.pkl").write_bytes(pickle.dumps({"queue": [Payload(marker)]}))
    _reseal(root)
    with pytest.raises(BufferCheckpointError, match=r"prefetch\.pkl"):
        load_buffer(make_buffer(capacity=50, filled=False), root)
    assert not marker.exists()


def test_list_storage_dump_is_tensors_and_json(tmp_path):
    rb = ReplayBuffer(storage=ListStorage(10), generator=torch.Generator().manual_seed(1))
    for i in range(5):
        rb.add(TensorDict({"id": torch.tensor(i), "tokens": torch.arange(i + 1), "s": f"t{i}"}))
    rb.add(torch.arange(3))
    dump_buffer(rb, tmp_path / "dump")
    suffixes = {p.suffix for p in (tmp_path / "dump").rglob("*") if p.is_file()}
    assert suffixes <= {".json", ".memmap"}, suffixes
    restored = ReplayBuffer(storage=ListStorage(10))
    load_buffer(restored, tmp_path / "dump")
    assert [restored[i]["tokens"].tolist() for i in range(5)] == [
        list(range(i + 1)) for i in range(5)
    ]
    assert restored[2]["s"] == "t2" and restored[5].tolist() == [0, 1, 2]
    assert restored.writer._write_count == rb.writer._write_count == 6


@pytest.mark.parametrize("inline_max_bytes", [0, 64 * 1024**2])
def test_trainer_checkpoint_is_weights_only_loadable(tmp_path, inline_max_bytes):
    # What our state_dict puts in the .ckpt: plain containers, tensors and primitives, so
    # Trainer.fit(..., weights_only=True) resumes from it.
    def run(steps, **kw):
        rb = make_buffer(filled=not kw)
        datamodule = ReplayBufferDataModule(
            rb, batch_size=8, num_batches=None, checkpoint_inline_max_bytes=inline_max_bytes
        )
        module = Recorder(write_per_step=1)
        make_trainer(tmp_path, max_steps=steps, every=2).fit(module, datamodule=datamodule, **kw)
        return module, rb

    run(2)
    torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    module, rb = run(4, ckpt_path="last", weights_only=True)
    assert module.start_step == 2
    assert buffer_ids(rb) == list(range(40)) + list(range(10_000, 10_004))
