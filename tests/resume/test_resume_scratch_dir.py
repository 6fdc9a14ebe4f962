"""A disk buffer with a fixed ``scratch_dir`` resumes with its own config: ``fit --ckpt_path last``.

The shipped ``pendulum_sac.yaml`` (``LazyMemmapStorage``), copied with ``scratch_dir`` set as
docs/cli.md shows, runs as a user types it. The resumed process finds the first one's files in
its scratch directory (here overwritten with garbage first): the checkpoint's content must land
in those files, whatever they held.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, RandomSampler, TensorDictReplayBuffer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.buffers.state import restore_buffer_state
from rb_lightning.lightning.checkpoint_io import BufferCheckpointIO

REPO = Path(__file__).resolve().parents[2]
FIRST_STEPS, RESUMED_STEPS = 16, 24


def _train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _config(tmp_path: Path) -> Path:
    config = yaml.safe_load((REPO / "configs" / "pendulum_sac.yaml").read_text())
    data = config["data"]["init_args"]
    data["replay_buffer"]["init_args"]["storage"]["init_args"]["scratch_dir"] = str(
        tmp_path / "scratch"
    )
    data["checkpoint_verify"] = "full"  # the option as a YAML user writes it
    for callback in config["trainer"]["callbacks"]:
        if callback["class_path"].endswith("OnlineCollector"):
            callback["init_args"]["init_random_frames"] = 256  # a short warm-up
    config["trainer"]["enable_progress_bar"] = False
    path = tmp_path / "pendulum_sac.yaml"  # same name: `--ckpt_path last` finds its runs
    path.write_text(yaml.safe_dump(config))
    return path


def _checkpoint_buffer(ckpt: Path) -> TensorDictReplayBuffer:
    """The buffer saved in ``ckpt``, restored into a buffer built like the config's."""
    state = BufferCheckpointIO().load_checkpoint(ckpt, weights_only=True)
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(100_000), sampler=RandomSampler())
    restore_buffer_state(rb, state[ReplayBufferDataModule.__qualname__]["buffer"], ckpt)
    return rb


def test_fixed_scratch_dir_resumes_into_its_own_files(tmp_path):
    pytest.importorskip("gymnasium")
    config = _config(tmp_path)
    first = _train(["fit", "--config", str(config), f"--trainer.max_steps={FIRST_STEPS}"], tmp_path)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    ckpt = tmp_path / "runs" / "pendulum_sac" / "version_0" / "checkpoints" / "last.ckpt"
    saved = _checkpoint_buffer(ckpt)[:]
    files = sorted((tmp_path / "scratch").rglob("*.memmap"))
    assert files, "the storage did not write into its scratch_dir"
    for file in files:  # whatever the old files hold
        file.write_bytes(b"\x7f" * file.stat().st_size)

    resumed = _train(
        [
            "fit",
            "--config",
            str(config),
            f"--trainer.max_steps={RESUMED_STEPS}",
            "--ckpt_path",
            "last",
        ],
        tmp_path,
    )
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert f"from step {FIRST_STEPS}" in resumed.stdout
    assert f"fit stopped at step {RESUMED_STEPS}" in resumed.stdout
    # The scratch files hold the checkpoint's items, then what the resumed run collected.
    scratch = TensorDict.load_memmap(tmp_path / "scratch")
    for key in ("observation", "action", ("next", "observation"), ("next", "reward")):
        assert torch.equal(scratch[key][: len(saved)], saved[key]), key
    after = _checkpoint_buffer(ckpt)
    assert len(after) > len(saved)
    assert torch.equal(after[:]["observation"], scratch["observation"][: len(after)])
