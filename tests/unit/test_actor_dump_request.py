"""The one dump request of buffers served by Ray actors, without Ray.

A Ray buffer and a ``ShardedRayReplayBuffer`` share ``RemoteDumpRequest``; what each
stores in the ``.ckpt`` must stay the reference they stored before (issue 46: saved
checkpoints of the current format still load). The actors are stood in for by a
function that writes a dump directory, or by an object with a sharded buffer's
``dumps``.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rb_lightning.distributed.ray_checkpoint import RemoteDumpRequest
from rb_lightning.distributed.sharded import LAYOUT, sharded_state
from rb_lightning.errors import BufferCheckpointError
from rb_lightning.persist.manifest import read_manifest, write_manifest
from rb_lightning.persist.record import BufferRecord


def _dump(length: int):
    def dump(path: Path) -> dict[str, Any]:
        path.mkdir()
        (path / "items.bin").write_bytes(bytes(length))
        return write_manifest(path, {"layout": "x", "len": length, "write_count": length}, {})

    return dump


class _Shards:
    """What sharded_state asks of a ShardedRayReplayBuffer: its dumps, length and counts."""

    num_shards = 2
    write_count = 7

    def __len__(self) -> int:
        return 5

    def dumps(self, path: Path) -> None:
        for shard in range(self.num_shards):
            (path / f"shard_{shard}").mkdir(parents=True)


def _saved(request: Any, tmp_path: Path) -> dict[str, Any]:
    reference = request.write(tmp_path / "last.ckpt.buffer")
    assert reference.pop("version")  # a new name per save
    return reference


def test_one_actor_reference_is_an_actor_record(tmp_path):
    reference = _saved(RemoteDumpRequest(None, _dump(3)), tmp_path)
    assert reference == {
        "record": 1,
        "kind": "actor",
        "dir": "last.ckpt.buffer",
        "len": 3,
        "write_count": 3,
    }


def test_a_sharded_buffer_saves_the_reference_and_manifest_it_saved_before(tmp_path):
    request = sharded_state(_Shards(), None)
    assert isinstance(request, RemoteDumpRequest)
    reference = request.write(tmp_path / "last.ckpt.buffer")
    path = BufferRecord.from_dict(reference).directory(tmp_path / "last.ckpt")
    assert {k: v for k, v in reference.items() if k != "version"} == {
        "record": 1,
        "kind": "shards",
        "dir": "last.ckpt.buffer",
        "len": 5,
        "write_count": 7,
    }
    manifest = read_manifest(path)
    assert (manifest["layout"], manifest["num_shards"], manifest["build"]) == (LAYOUT, 2, {})
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "shard_0", "shard_1"]


def test_other_ranks_store_a_placeholder():
    trainer = SimpleNamespace(global_rank=1)
    assert sharded_state(_Shards(), trainer) == {"record": 1, "kind": "elsewhere"}


@pytest.mark.parametrize(
    ("request_", "named"),
    [
        (RemoteDumpRequest(None), "Ray replay buffer"),
        (sharded_state(_Shards(), None), "ShardedRayReplayBuffer"),
    ],
)
def test_the_request_refuses_to_be_pickled_naming_its_buffer(request_, named):
    with pytest.raises(BufferCheckpointError, match=f"holds a {named},.*BufferCheckpointIO"):
        pickle.dumps(request_)
