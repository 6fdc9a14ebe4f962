"""Ctrl-C (SIGINT) during fit: a clean exit, and the last checkpoint's buffer loads."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning import ReplayBufferDataModule

SCRIPT = Path(__file__).parent / "scripts" / "train_until_interrupted.py"


def test_sigint_during_fit_exits_cleanly_and_checkpoint_loads(tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(ckpt_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A background job of a non-interactive shell inherits SIGINT ignored (no Ctrl-C
        # handler in the child): give it the default so the test means the same everywhere.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 180
        while not list(ckpt_dir.glob("epoch=*.ckpt")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.2)
        assert list(ckpt_dir.glob("epoch=*.ckpt")), "no checkpoint was written in time"
        time.sleep(1.0)  # interrupt mid-run, not right at a save
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Lightning's graceful shutdown: it runs the on_exception hooks, then exits with
    # status 1 (Lightning 2.6), without a traceback and without hanging.
    assert "Detected KeyboardInterrupt, attempting graceful shutdown" in output, output[-2000:]
    assert "Traceback" not in output, output[-2000:]
    assert proc.returncode == 1, output[-2000:]

    last = ckpt_dir / "last.ckpt"
    checkpoint = torch.load(last, weights_only=False, map_location="cpu")
    state = checkpoint[ReplayBufferDataModule.__qualname__]
    fresh = ReplayBuffer(storage=LazyTensorStorage(100_000))
    dm = ReplayBufferDataModule(fresh, batch_size=8, num_batches=None)
    dm.load_state_dict(state)
    # The buffer grows by 4 rows per step from 64: what was saved is consistent and whole.
    step = checkpoint["global_step"]
    assert len(fresh) >= 64 + 4 * (step - 1)
    ids = fresh[: len(fresh)]["id"]
    assert torch.equal(ids, torch.arange(len(fresh))), "rows lost or duplicated"
