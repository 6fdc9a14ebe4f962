"""A resume ``train.py`` cannot make names what the user acts on: the member, the folder to copy.

A mixture saved in chunks (``BufferCheckpointIO(incremental=True)``, buffers beside the
``.ckpt``) is resumed by ``train.py fit --ckpt_path``: with a member built otherwise, with a
damaged chunk, and from a copy made without ``buffer-chunks/``. Each ends in exit 2, one
paragraph, no traceback.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from script_runs import REPO, run_train_py

from rb_lightning.runs.cli import main


def _member(max_size: int) -> dict:
    storage = {"class_path": "torchrl.data.LazyTensorStorage", "init_args": {"max_size": max_size}}
    return {"class_path": "torchrl.data.TensorDictReplayBuffer", "init_args": {"storage": storage}}


def _config(offline_size: int = 64) -> dict:
    fill = {"class_path": "rb_lightning.sources.CallSource",
            "init_args": {"function": "cli_toy:fill_regression"}}  # fmt: skip
    return {
        "seed_everything": 0,
        "trainer": {
            "max_steps": 2,
            "accelerator": "cpu",
            "logger": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "plugins": [
                {
                    "class_path": "rb_lightning.checkpoint.BufferCheckpointIO",
                    "init_args": {"incremental": True},
                }
            ],
            "callbacks": [
                {
                    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {"dirpath": "ckpt", "save_last": True, "every_n_train_steps": 2},
                }
            ],
        },
        "model": {"class_path": "cli_toy.Regressor"},
        "data": {
            "class_path": "rb_lightning.ReplayBufferDataModule",
            "init_args": {
                "batch_size": 8,
                "num_batches": None,
                "checkpoint_inline_max_bytes": 0,  # beside the .ckpt, in chunks
                "replay_buffer": {
                    "class_path": "rb_lightning.BufferMixture",
                    "init_args": {
                        "members": {"offline": _member(offline_size), "online": _member(32)}
                    },
                },  # fmt: skip
                "source": {
                    "class_path": "rb_lightning.FillMembers",
                    "init_args": {"sources": {"offline": fill, "online": fill}},
                },
            },
        },
    }


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    """A folder with run.yaml and ckpt/ (last.ckpt, last.ckpt.buffer/, buffer-chunks/)."""
    root = tmp_path_factory.mktemp("mixture_run")
    (root / "run.yaml").write_text(yaml.safe_dump(_config()))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        patch.syspath_prepend(str(REPO / "tests" / "cli"))
        patch.setattr(sys, "argv", ["train.py"])
        assert main(["fit", "--config", "run.yaml"]).trainer.global_step == 2
    assert (root / "ckpt" / "buffer-chunks").is_dir()
    return root


def _resume(run: Path, *args: str) -> str:
    """``train.py fit --config run.yaml --ckpt_path ckpt/last.ckpt ARGS``: its one error line."""
    done = run_train_py(
        ["fit", "--config", "run.yaml", "--ckpt_path", "ckpt/last.ckpt",
         "--trainer.max_steps=4", *args],
        run,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    return done.stderr.strip().splitlines()[-1]


def _version_of(run: Path, capacity: int) -> Path:
    """The version folder (a hash) of the member saved with ``capacity``."""
    for version in (run / "ckpt" / "last.ckpt.buffer").iterdir():
        if json.loads((version / "manifest.json").read_text())["capacity"] == capacity:
            return version
    raise AssertionError(f"no member of capacity {capacity}")


def test_a_member_built_otherwise_is_named(saved_run, tmp_path):
    run = shutil.copytree(saved_run, tmp_path / "run")
    (run / "run.yaml").write_text(yaml.safe_dump(_config(offline_size=128)))
    line = _resume(run)
    offline = _version_of(run, 64).resolve()
    assert f"saved in {offline} (member 'offline') was built differently" in line
    assert "(saved max_size=64, given max_size=128)" in line


def test_a_damaged_chunk_names_its_member(saved_run, tmp_path):
    run = shutil.copytree(saved_run, tmp_path / "run")
    version = _version_of(run, 32)
    chunk = next(iter(json.loads((version / "manifest.json").read_text())["chunks"]))
    column = run / "ckpt" / "buffer-chunks" / chunk / "x.memmap"
    data = bytearray(column.read_bytes())
    data[len(data) // 2] ^= 0xFF
    column.write_bytes(bytes(data))
    line = _resume(run)
    damaged = f"buffer-chunks/{chunk}/x.memmap"
    assert f"dump {version.resolve()} (member 'online') is corrupted: {damaged}" in line


def test_a_copy_without_buffer_chunks_says_to_copy_it_along(saved_run, tmp_path):
    run = shutil.copytree(saved_run, tmp_path / "run")
    shutil.rmtree(run / "ckpt" / "buffer-chunks")  # copied: the .ckpt and its .buffer only
    line = _resume(run)
    store = (run / "ckpt" / "buffer-chunks").resolve()
    assert f"keeps its rows in {store}, which is missing" in line
    assert "Copy buffer-chunks/ along with the .ckpt and its .ckpt.buffer/ folder" in line
    assert "corrupted" not in line
