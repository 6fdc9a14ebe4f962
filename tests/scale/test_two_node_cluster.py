"""Two Ray nodes on this machine: the buffer on one, a collector on the other, 2 DDP ranks.

A cluster of two ``ray start`` nodes (tests/scale/ray_nodes.py): the head has the
``buffer_node`` resource and the second node ``collector_node``. The run's config places a
2-shard ``ShardedRayReplayBuffer`` on the head (``actor_options.resources``, detached so it
outlives whoever created it); a collector (scripts/two_node_collector.py) runs as a Ray
actor on the other node and writes items with increasing ids. ``train.py fit`` trains 2
gloo DDP ranks from the shards and saves ``last.ckpt``; the collector goes on writing, then
its node is killed (every process of it, SIGKILL), and ``train.py fit --ckpt_path last``
resumes: the buffer holds exactly the items saved with the checkpoint, the run goes on to
its new ``max_steps`` and exits 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from ray_nodes import TwoNodeCluster
from script_runs import REPO, run_train_py

from rb_lightning.distributed.shard_actor import shard_actor_class

pytest.importorskip("ray")
pytestmark = pytest.mark.ray

SCRIPTS = Path(__file__).parent / "scripts"
WAIT_S = 60

BUFFER = {
    "capacity": 256,
    "num_shards": 2,
    "name": "two_node",
    "ray_init_config": {"address": "auto", "log_to_driver": False},
    # detached: the shards stay up when the process that created them (the first of the
    # collector and the ranks to start) goes away with its node
    "actor_options": {"resources": {"buffer_node": 1}, "lifetime": "detached"},
}

CONFIG = {
    "seed_everything": 0,
    "trainer": {
        "strategy": "ddp",
        "devices": 2,
        "accelerator": "cpu",
        "max_steps": 4,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "logger": {
            "class_path": "rb_lightning.runs.RunLogger",
            "init_args": {"save_dir": "runs", "name": "two_node"},
        },
        "callbacks": [
            {
                "class_path": "rb_lightning.runs.FinalLastCheckpoint",
                "init_args": {"every_n_train_steps": 2},
            }
        ],
    },
    "model": {"class_path": "cli_toy.Regressor"},
    "data": {
        "class_path": "rb_lightning.ReplayBufferDataModule",
        "init_args": {
            "batch_size": 8,
            "num_batches": None,
            "min_size": 64,  # wait for the collector
            "replay_buffer": {
                "class_path": "rb_lightning.distributed.ShardedRayReplayBuffer",
                "init_args": BUFFER,
            },
        },
    },
}


@pytest.fixture
def cluster():
    started = TwoNodeCluster("buffer_node", "collector_node", pythonpath=str(REPO))
    try:
        yield started
    finally:
        started.stop()


class Probe:
    """scripts/two_node_probe.py: the nodes and the buffer's content, one line per ask."""

    def __init__(self, buffer_yaml: Path, env: dict[str, str]) -> None:
        command = [sys.executable, str(SCRIPTS / "two_node_probe.py"), str(buffer_yaml)]
        self.process = subprocess.Popen(
            command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def state(self) -> dict:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("?\n")
        self.process.stdin.flush()
        while True:  # Ray may print lines of its own (a node's death) to stdout
            line = self.process.stdout.readline()
            assert line, "the probe process ended"
            if line.startswith("{"):
                return json.loads(line)

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def _saved_ids(checkpoint: Path) -> tuple[list[int], int]:
    """Ids of the items in the shards' dump beside ``checkpoint``, and its write count."""
    (meta,) = Path(f"{checkpoint}.buffer").glob("*/shards.json")
    saved = json.loads(meta.read_text())
    ids = []
    for shard in range(saved["num_shards"]):
        reader = shard_actor_class()(saved["stride"], False, 1.0, 0.4, 1e-8, 0)
        reader.rb.loads(str(meta.parent / f"shard_{shard}"))
        items, _ = reader.read(None, 0.0)
        ids += items["id"].tolist()
    return sorted(ids), sum(saved["write_counts"])


def _wait(probe: Probe, done, what: str) -> dict:
    deadline = time.monotonic() + WAIT_S
    while True:
        state = probe.state()
        if done(state):
            return state
        assert time.monotonic() < deadline, f"no {what} after {WAIT_S}s: {state}"
        time.sleep(0.2)


def test_collector_node_killed_and_run_resumed_from_its_checkpoint(cluster, tmp_path):
    (tmp_path / "two_node.yaml").write_text(yaml.safe_dump(CONFIG))
    (tmp_path / "buffer.yaml").write_text(yaml.safe_dump(BUFFER))
    collector = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "two_node_collector.py"), "buffer.yaml", "where.json"],
        cwd=tmp_path,
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    probe = Probe(tmp_path / "buffer.yaml", cluster.env)
    try:
        first = run_train_py(["fit", "--config", "two_node.yaml"], tmp_path, env=cluster.env)
        assert first.returncode == 0, first.stderr[-4000:]
        assert "fit stopped at step 4" in first.stdout + first.stderr

        (checkpoint,) = tmp_path.glob("runs/two_node/version_*/checkpoints/last.ckpt")
        saved_ids, saved_writes = _saved_ids(checkpoint)
        assert len(saved_ids) >= 64
        # the collector writes on after the checkpoint: the buffer moves past it
        before_kill = _wait(probe, lambda s: s["write_count"] > saved_writes + 16, "writes")
        assert before_kill["ids"] != saved_ids

        # Placement: the shards live in processes of the head node, the collector on the other.
        where = json.loads((tmp_path / "where.json").read_text())
        by_resource = {
            resource: node["node_id"]
            for node in before_kill["nodes"]
            for resource in node["resources"]
            if resource.endswith("_node")
        }
        assert where["node_id"] == by_resource["collector_node"] != by_resource["buffer_node"]
        assert where["pid"] in cluster.other.pids()
        assert set(before_kill["shard_pids"]) <= cluster.head.pids()

        cluster.other.kill()
        assert collector.wait(timeout=WAIT_S) == 1, collector.communicate()[0][-3000:]

        resume = ["fit", "--config", "two_node.yaml", "--ckpt_path", "last"]
        second = run_train_py([*resume, "--trainer.max_steps", "6"], tmp_path, env=cluster.env)
        assert second.returncode == 0, second.stderr[-4000:]
        assert "fit stopped at step 6" in second.stdout + second.stderr

        after = _wait(probe, lambda s: sum(n["alive"] for n in s["nodes"]) == 1, "node death")
        # Nothing lost, nothing from after the checkpoint: the saved items, restored.
        assert after["ids"] == saved_ids
        assert set(after["shard_pids"]) <= cluster.head.pids()
        alive = {node["node_id"]: node["alive"] for node in after["nodes"]}
        assert alive == {by_resource["buffer_node"]: True, by_resource["collector_node"]: False}
    finally:
        probe.close()
        collector.kill()
        collector.wait()
