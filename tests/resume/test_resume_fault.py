"""A run killed with SIGKILL resumes from its last complete checkpoint, buffer intact."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from fault_train import WRITES_PER_STEP, build
from resume_helpers import INITIAL_ITEMS, buffer_ids, online_ids

HERE = Path(__file__).parent
WAIT_FOR_CHECKPOINT_S = 120


def _run_until_checkpointed_then_kill(root: Path) -> None:
    last = root / "ckpt" / "last.ckpt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    with open(root / "train.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "fault_train.py"), str(root)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            deadline = time.monotonic() + WAIT_FOR_CHECKPOINT_S
            saves = set()
            # Wait for a few saves of last.ckpt so the kill lands while later ones are written.
            while len(saves) < 3:
                assert proc.poll() is None, (root / "train.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "no checkpoint written in time"
                if last.exists():
                    saves.add(last.stat().st_mtime_ns)
                time.sleep(0.005)
        finally:
            proc.kill()  # SIGKILL: no cleanup, no final save
            proc.wait(timeout=30)
    assert proc.returncode == -9


def test_sigkill_then_resume_loses_and_duplicates_nothing(tmp_path):
    _run_until_checkpointed_then_kill(tmp_path)
    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    saved_step = checkpoint["global_step"]
    assert saved_step >= 2

    trainer, module, datamodule = build(tmp_path, max_steps=saved_step + 4)
    trainer.fit(module, datamodule=datamodule, ckpt_path="last")

    expected = list(range(INITIAL_ITEMS)) + online_ids(saved_step, WRITES_PER_STEP)
    assert module.start_step == saved_step
    assert module.start_ids == expected  # every item once, in write order: none lost or doubled
    assert trainer.global_step == saved_step + 4
    final = list(range(INITIAL_ITEMS)) + online_ids(saved_step + 4, WRITES_PER_STEP)
    assert buffer_ids(datamodule.replay_buffer) == final
