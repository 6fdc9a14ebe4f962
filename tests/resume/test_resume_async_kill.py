"""AsyncCheckpointIO: killed at any step of a save, every checkpoint on disk has its buffer.

Each case runs ``async_kill_train.py`` (real Trainer, Lightning's AsyncCheckpointIO)
until it SIGKILLs itself at one step of the save of step 3, then checks every
``.ckpt`` left on disk restores its buffer, and resumes a real Trainer from the newest.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from async_kill_train import CAPACITY, KILL_STEP, WRITES_PER_STEP, build
from resume_helpers import INITIAL_ITEMS, buffer_ids, make_buffer, online_ids

from rb_lightning import ReplayBufferDataModule
from rb_lightning.buffers.state import restore_buffer_state
from rb_lightning.lightning.checkpoint_io import BufferCheckpointIO

HERE = Path(__file__).parent
TIMEOUT_S = 120
CASES = [
    ("before_dump", "last"),
    ("after_dump", "last"),
    ("during_write", "step"),  # the previous top-1 file is due for removal meanwhile
    ("during_write", "last"),
    ("after_write", "last"),
    ("after_delete", "last"),
]


def _expected_ids(step: int) -> list[int]:
    return list(range(INITIAL_ITEMS)) + online_ids(step, WRITES_PER_STEP)


@pytest.fixture(scope="module")
def killed_runs(tmp_path_factory) -> dict[tuple[str, str], Path]:
    # All cases at once, each in a process forked after the imports: each mostly sleeps.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "PYTHONWARNINGS": "ignore",
    }
    roots = {case: tmp_path_factory.mktemp("-".join(case)) for case in CASES}
    launcher = subprocess.Popen(
        [sys.executable, str(HERE / "async_kill_train.py"), "--cases"]
        + [f"{point}:{target}:{root}" for (point, target), root in roots.items()],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # its children with it: killed together below
    )
    try:
        out, _ = launcher.communicate(timeout=TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 0, out[-3000:]
    for case, root in roots.items():
        output = (root / "train.log").read_text()[-3000:]
        code = int((root / "exit_code").read_text())
        assert code == -9, f"{case} was not killed at its point (exit code {code}):\n{output}"
    return roots


def _restore(path: Path) -> tuple[int, list[int]]:
    """Global step of ``path`` and the ids of the buffer it restores (no Trainer)."""
    checkpoint = BufferCheckpointIO().load_checkpoint(path, weights_only=True)
    state = checkpoint[ReplayBufferDataModule.__qualname__]
    rb = make_buffer(capacity=CAPACITY, filled=False)
    restore_buffer_state(rb, state["buffer"], path)
    return checkpoint["global_step"], buffer_ids(rb)


@pytest.mark.parametrize(("point", "target"), CASES)
def test_every_checkpoint_left_by_a_kill_has_its_buffer(killed_runs, point, target):
    root = killed_runs[(point, target)]
    checkpoints = sorted((root / "ckpt").glob("*.ckpt"))
    assert checkpoints, "the run died before any checkpoint"
    steps = {}
    for path in checkpoints:
        step, ids = _restore(path)  # raises BufferCheckpointError if its buffer is gone
        assert ids == _expected_ids(step), f"{path.name} restored another buffer"
        steps[path] = step
    # Lightning removes the previous top-1 file only once the new one is written.
    assert any(path.name.startswith("epoch=") for path in checkpoints), "no top-1 checkpoint left"
    newest = max(steps, key=steps.get)
    # Saves of steps 1 and 2 had finished before step 3's; later ones never completed.
    assert KILL_STEP - 1 <= steps[newest] <= KILL_STEP
    if point == "after_delete" and target == "last":
        assert steps[root / "ckpt" / "last.ckpt"] == KILL_STEP

    trainer, module, datamodule = build(root, max_steps=steps[newest] + 1)
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(newest))
    assert module.start_step == steps[newest]
    assert module.start_ids == _expected_ids(steps[newest])
    assert trainer.global_step == steps[newest] + 1
    # The resumed run's own (async) saves leave one version per checkpoint behind.
    last = torch.load(root / "ckpt" / "last.ckpt", weights_only=True)
    assert last["global_step"] == steps[newest] + 1
    assert len(list((root / "ckpt" / "last.ckpt.buffer").iterdir())) == 1
