"""Every name users import today keeps working, wherever its module lives in the package.

The lists are the public surface as released to users' code and configs: ``from
rb_lightning import X``, the subpackages' names, and every ``class_path`` the
shipped configs use. Moving a module must not break any of them.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import rb_lightning

ROOT = Path(__file__).resolve().parents[2]

TOP_LEVEL = [
    "BufferMixture",
    "BufferStream",
    "FillMembers",
    "FinalLastCheckpoint",
    "RBLightningError",
    "ReplayBufferBatchDataset",
    "ReplayBufferDataModule",
    "ReplayBufferDataset",
    "ReplayBufferPassDataset",
    "RunLogger",
    "RunReport",
    "SAMPLER_INFO_KEYS",
    "SOURCE_KEY",
    "StepProgressBar",
    "UsageError",
    "batch_loader",
    "from_hf_dataset",
    "keep_batch",
    "to_hf_dataset",
]
IN_SUBPACKAGES = [
    "rb_lightning.rl.DQN",
    "rb_lightning.rl.SAC",
    "rb_lightning.rl.OnlineCollector",
    "rb_lightning.rl.Evaluation",
    "rb_lightning.rl.TorchThreads",
    "rb_lightning.llm.module.CausalLMModule",
    "rb_lightning.runs.FinalLastCheckpoint",
    "rb_lightning.runs.RunLogger",
    "rb_lightning.sources.CallSource",
    "rb_lightning.sources.LoadDirectory",
    "rb_lightning.sources.BufferMixture",
    "rb_lightning.stream.BufferStream",
    "rb_lightning.hf.to_hf_dataset",
    "rb_lightning.hf.from_hf_dataset",
    "rb_lightning.checkpoint.BufferCheckpointIO",
    "rb_lightning.checkpoint.BufferCheckpointError",
    "rb_lightning.checkpoint.load_buffer",
    "rb_lightning.checkpoint.dump_buffer",
    "rb_lightning.checkpoint.open_saved_buffer",
    "rb_lightning.checkpoint.SavedBuffer",
    "rb_lightning.checkpoint.load_dump",
    "rb_lightning.checkpoint.read_manifest",
    "rb_lightning.checkpoint.BufferCheckpointAdapter",
    "rb_lightning.distributed.ray_checkpoint.RemoteDumpRequest",
    "rb_lightning.distributed.ShardedRayReplayBuffer",
    "rb_lightning.distributed.sharded.ShardedRayReplayBuffer",
    "rb_lightning.distributed.sharded.ShardedBuffer",
]


def _resolve(dotted: str) -> object:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_from_rb_lightning_import(name):
    assert getattr(rb_lightning, name) is not None
    assert name in rb_lightning.__all__ and name in dir(rb_lightning)


@pytest.mark.parametrize("dotted", IN_SUBPACKAGES)
def test_subpackage_names(dotted):
    assert _resolve(dotted) is not None


def test_every_class_path_of_the_shipped_configs_imports():
    paths = set()
    for config in sorted((ROOT / "configs").glob("*.yaml")):
        paths |= set(re.findall(r"class_path:\s*([\w.]+)", config.read_text()))
    ours = sorted(p for p in paths if p.startswith("rb_lightning."))
    assert ours, "no rb_lightning class_path found in configs/"
    for dotted in ours:
        assert _resolve(dotted) is not None, dotted


def test_the_checkpoint_package_exports_what_a_user_calls():
    import rb_lightning.checkpoint as checkpoint

    assert sorted(checkpoint.__all__) == [
        "BufferCheckpointAdapter",
        "BufferCheckpointError",
        "BufferCheckpointIO",
        "NotEnoughDiskSpaceError",
        "SavedBuffer",
        "dump_buffer",
        "load_buffer",
        "load_dump",
        "open_saved_buffer",
        "read_manifest",
    ]
