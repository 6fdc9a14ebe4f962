"""A collector on another Ray node, writing into a ShardedRayReplayBuffer's shards by name.

``python two_node_collector.py BUFFER_YAML OUT_JSON``: joins the cluster at ``RAY_ADDRESS``,
starts a Ray actor on the node that has the ``collector_node`` resource, and blocks while
that actor writes items ``{id, x, y}`` (``id`` counting up from 0) into the buffer that
BUFFER_YAML describes (the ``init_args`` of the run's ``ShardedRayReplayBuffer``, so the
actor binds the same named shards). OUT_JSON gets the actor's node id and pid once it
runs. The script ends with exit code 1 when the actor's node goes away.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import ray
import yaml

CHUNK = 8


@ray.remote(num_cpus=0)
class Collector:
    def __init__(self, buffer_args: dict[str, Any]) -> None:
        import torch

        from rb_lightning.distributed import ShardedRayReplayBuffer

        torch.set_num_threads(1)
        self.buffer = ShardedRayReplayBuffer(**buffer_args)

    def where(self) -> tuple[str, int]:
        import os

        return ray.get_runtime_context().get_node_id(), os.getpid()

    def run(self) -> None:
        import torch
        from tensordict import TensorDict

        start = 0
        while True:
            ids = torch.arange(start, start + CHUNK)
            x = torch.randn(CHUNK, 4)
            items = {"id": ids, "x": x, "y": x.sum(-1, keepdim=True)}
            self.buffer.extend(TensorDict(items, batch_size=[CHUNK]))
            start += CHUNK
            time.sleep(0.05)  # a collector steps an environment between writes


def main(buffer_yaml: Path, out: Path) -> int:
    buffer_args = yaml.safe_load(buffer_yaml.read_text())
    ray.init(address="auto", log_to_driver=False)
    collector = Collector.options(resources={"collector_node": 1}).remote(buffer_args)
    node, pid = ray.get(collector.where.remote())
    out.write_text(json.dumps({"node_id": node, "pid": pid}))
    try:
        ray.get(collector.run.remote())
    except ray.exceptions.RayError as err:
        print(f"collector stopped: {type(err).__name__}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
