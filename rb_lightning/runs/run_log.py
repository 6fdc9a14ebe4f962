"""The run log: only the lines a user needs, from Lightning, torchrl and third-party code.

Lightning says some things the run's own output says better (the resume line,
RunReport's summary); some warnings come from code a user cannot change. They
are dropped here, once, when the command line starts.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import warnings
from typing import Any

#: Set to "1" by Lightning at import: torch.cuda.is_available() then asks NVML first.
_NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"

#: Lines Lightning and Ray log that the run's own output says better, or that say nothing here.
_SAID_BETTER = (
    "Initializing distributed:",  # each DDP rank's number: the config says how many
    "-" * 100 + "\ndistributed_backend=",  # Lightning's banner when the DDP ranks have met
    "Using address ",  # ray.init, when RAY_ADDRESS gives the address
    "Connecting to existing Ray cluster at address:",  # "Ray cluster at <address>: buffer actor"
    "Connected to Ray cluster.",
    "Started a local Ray instance.",
    "Detected KeyboardInterrupt",  # RunReport's summary says it, with the resume command
    "Restoring states from the checkpoint path",  # "fit: resuming <run> from step <S>"
    "Restored all states from the checkpoint",
    "Loaded model weights from the checkpoint",  # "test: the model of <ckpt> (step <S>)"
    "`Trainer.fit` stopped:",  # RunReport: "fit stopped at step S ...: max_steps=S reached"
    "Seed set to",  # the seed is in the run's config.yaml
    "GPU available: False, used: False",  # a CPU run; "GPU available: True" is kept
    "TPU available:",
    "Trainer already configured with model summary callbacks",  # the CLI's RunModelSummary
    "HPU available:",
    "\N{ELECTRIC LIGHT BULB} Tip:",  # an advertisement for a hosted logger
)
#: Warnings that third-party code raises on every run and a user can do nothing about.
_NOT_FOR_THE_USER = (
    # Lightning's own use of torch's pytree API (Lightning 2.6 with torch 2.14).
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    # Lightning's check on sized IterableDatasets: ours split work across workers and ranks.
    r"Your `IterableDataset` has `__len__` defined",
)


#: Lightning's prefix on a line another DDP rank than 0 logs ("[rank: 1] Seed set to 0").
_RANK_PREFIX = re.compile(r"\[rank: \d+\] ")


class _DropSaidBetter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = _RANK_PREFIX.sub("", record.getMessage().lstrip(), count=1)
        return not message.startswith(_SAID_BETTER)


def quiet_run_log() -> None:
    """Keep a run's output to the lines a user needs (the allow-list test holds it there).

    Lightning's lines that our own say better are dropped, its and torch's
    warnings about their own internals are ignored, and torchrl's INFO lines
    (storage initialised, spec checks) are raised to warnings only.
    """
    for name in (
        "lightning.pytorch.utilities.rank_zero",
        "lightning.fabric.utilities.rank_zero",
        "lightning.fabric.utilities.seed",  # "Seed set to 0"
        "lightning.fabric.utilities.distributed",  # "Initializing distributed: ..."
        "ray._private.worker",  # ray.init's "Connecting to existing Ray cluster ..."
    ):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropSaidBetter) for f in logger.filters):
            logger.addFilter(_DropSaidBetter())
    for message in _NOT_FOR_THE_USER:
        warnings.filterwarnings("ignore", message=message)
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    # The same for torchrl in the processes a run starts (an asynchronous collector's
    # worker reads this when it imports torchrl).
    os.environ.setdefault("RL_LOGGING_LEVEL", "WARNING")


def say_where_the_buffer_runs(datamodule: Any) -> None:
    """One line, from global rank 0, when the run's buffer is not in its processes
    (``Ray cluster at <address>: buffer actor <name>``); nothing otherwise."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    from rb_lightning.buffers.handles import resolve_buffer

    replay_buffer = getattr(datamodule, "replay_buffer", None)
    # Lightning reads the rank from the environment its DDP launcher gives each rank.
    if replay_buffer is None or getattr(rank_zero_only, "rank", 0) != 0:
        return
    line = resolve_buffer(replay_buffer).where()
    if line is not None:
        print(line, flush=True)


def skip_unloadable_nvml() -> None:
    """Where NVIDIA's NVML library cannot load, stop torch from trying on every optimizer step.

    Lightning sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` so that
    ``torch.cuda.is_available()`` asks NVML instead of initializing CUDA before a
    fork. Torch's Adam asks on every step (its CUDA-graph check), and each time
    torch tries to load ``libnvidia-ml.so.1``: ~4% of a CartPole DQN step on a
    machine without the driver. When the library does not load, torch falls back
    to the CUDA runtime's device count anyway, so not trying changes no answer.
    """
    if os.environ.get(_NVML_CHECK_ENV) != "1":
        return
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        os.environ[_NVML_CHECK_ENV] = "0"


__all__ = ["quiet_run_log", "say_where_the_buffer_runs", "skip_unloadable_nvml"]
