"""What a Ray cluster and its named ShardedRayReplayBuffer look like, on request.

``python two_node_probe.py BUFFER_YAML``: joins the cluster at ``RAY_ADDRESS``, binds the
buffer that BUFFER_YAML describes (the ``init_args`` of the run's ``ShardedRayReplayBuffer``)
and, for every line read on stdin, prints one JSON line: the cluster's nodes (id, alive,
custom resources), the shard actors' process ids, the buffer's write count and the ``id``
of every item it holds. One process for the whole test: joining costs seconds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ray
import yaml

from rb_lightning.distributed import ShardedRayReplayBuffer


def main(buffer_yaml: Path) -> None:
    ray.init(address="auto", log_to_driver=False)
    rb = ShardedRayReplayBuffer(**yaml.safe_load(buffer_yaml.read_text()))
    for _ in sys.stdin:
        nodes = [
            {"node_id": n["NodeID"], "alive": n["Alive"], "resources": sorted(n["Resources"])}
            for n in ray.nodes()
        ]
        items, _ = rb.contents()
        state = {
            "nodes": nodes,
            "shard_pids": rb.shard_pids(),
            "write_count": rb.write_count,
            "ids": sorted(items["id"].tolist()),
        }
        print(json.dumps(state), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
