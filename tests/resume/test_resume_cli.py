"""``train.py fit --ckpt_path last`` through LightningCLI brings the buffer back."""

from __future__ import annotations

import sys

import yaml
from resume_helpers import INITIAL_ITEMS, online_ids

from rb_lightning.runs.cli import main


def _config(root) -> dict:
    return {
        "seed_everything": 0,
        "trainer": {
            "max_steps": 4,
            "accelerator": "cpu",
            "logger": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "default_root_dir": str(root),
            "callbacks": [
                {
                    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {
                        "dirpath": str(root / "ckpt"),
                        "save_last": True,
                        "every_n_train_steps": 2,
                    },
                }
            ],
        },
        "model": {
            "class_path": "resume_helpers.Recorder",
            "init_args": {"write_per_step": 2, "prefill": INITIAL_ITEMS},
        },
        "data": {
            "class_path": "rb_lightning.ReplayBufferDataModule",
            "init_args": {
                "batch_size": 8,
                "num_batches": None,
                "checkpoint_inline_max_bytes": 0,
                "replay_buffer": {
                    "class_path": "torchrl.data.ReplayBuffer",
                    "init_args": {
                        "storage": {
                            "class_path": "torchrl.data.LazyTensorStorage",
                            "init_args": {"max_size": 256},
                        }
                    },
                },
            },
        },
    }


def test_cli_fit_ckpt_path_last_restores_buffer_and_step(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py"])  # not pytest's own arguments
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(_config(tmp_path)))

    first = main(["fit", "--config", str(config)])
    assert first.trainer.global_step == 4
    assert (tmp_path / "ckpt" / "last.ckpt.buffer").is_dir()

    resumed = main(["fit", "--config", str(config), "--trainer.max_steps=6", "--ckpt_path=last"])
    model = resumed.model
    assert model.start_step == 4
    # The prefill ran again at start-up; the checkpoint's content replaced it.
    assert model.start_ids == list(range(INITIAL_ITEMS)) + online_ids(4, 2)
    assert resumed.trainer.global_step == 6
    assert len(model.seen) == 2
