"""A collector process: connects to the shared Ray buffer by name and extends it.

``python ray_collector.py RAY_ADDRESS BUFFER_NAME TOTAL_ITEMS``
"""

from __future__ import annotations

import sys
import time

import torch
from tensordict import TensorDict

from rb_lightning.distributed.ray import RayReplayBufferView

torch.set_num_threads(1)

CHUNK = 20


def main(address: str, name: str, total: int) -> None:
    buffer = RayReplayBufferView(name, address=address, ray_init_config={"log_to_driver": False})
    for start in range(0, total, CHUNK):
        ids = torch.arange(start, start + CHUNK)
        buffer.extend(TensorDict({"id": ids, "obs": ids.float().unsqueeze(-1)}, batch_size=[CHUNK]))
        time.sleep(0.05)  # a collector steps an environment between writes


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
