"""A run with Lightning's AsyncCheckpointIO that SIGKILLs itself at one step of a save.

Every step writes 2 items and is checkpointed twice (the top-1 ``epoch=0-step=N.ckpt``,
whose predecessor Lightning removes, and ``last.ckpt``, overwritten), buffers beside
the ``.ckpt``. At the save of step :data:`KILL_STEP` the process kills itself at
``KILL_POINT``:

* ``before_dump``: Lightning is building the checkpoint dict; nothing written yet.
* ``after_dump``: the buffer version is written and renamed; the ``.ckpt`` is not
  handed to the async writer yet (save of ``KILL_TARGET``).
* ``during_write``: in the async writer thread, a slow write (1 s) that dies before the
  ``.ckpt`` is on disk; training goes on meanwhile (save of ``KILL_TARGET``).
* ``after_write``: in the writer thread, Lightning's writer has written the ``.ckpt`` (to the
  partial name rb_lightning renames into place), older versions not yet deleted (save of
  ``KILL_TARGET``).
* ``after_delete``: at the next step, once the older versions and the previous top-1
  checkpoint are gone.

The hooks are a real ``CheckpointIO`` under the async layer, an ``AsyncCheckpointIO``
subclass and a callback: nothing of Lightning or rb_lightning is replaced.

Usage: ``KILL_POINT=<point> KILL_TARGET=last|step python async_kill_train.py ROOT``, or
``python async_kill_train.py --cases POINT:TARGET:ROOT ...``: one process per case, each
forked from this one once the imports are done (they were most of each run's time), its
output in ``ROOT/train.log`` and its exit code (``-9``: killed) in ``ROOT/exit_code``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from resume_helpers import Recorder, make_buffer

from rb_lightning import ReplayBufferDataModule

CAPACITY = 4096
WRITES_PER_STEP = 2
KILL_STEP = 3
MAX_STEPS = 6
POINT = os.environ.get("KILL_POINT", "none")
TARGET = os.environ.get("KILL_TARGET", "last")


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _targeted(checkpoint: dict[str, Any], path: Any, point: str) -> bool:
    name = Path(path).name
    is_target = name == "last.ckpt" if TARGET == "last" else name.startswith("epoch=")
    return POINT == point and checkpoint.get("global_step") == KILL_STEP and is_target


class KillingTorchIO(TorchCheckpointIO):
    """Lightning's own ``.ckpt`` writer, dying during or right after the targeted write."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options=None) -> None:
        if _targeted(checkpoint, path, "during_write"):
            time.sleep(1.0)  # a slow filesystem: the training thread moves on meanwhile
            _die()
        after = _targeted(checkpoint, path, "after_write")
        super().save_checkpoint(checkpoint, path, storage_options=storage_options)
        if after:
            _die()


class KillingAsyncIO(AsyncCheckpointIO):
    """Lightning's AsyncCheckpointIO, dying when it is handed the targeted checkpoint."""

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        checkpoint = kwargs.get("checkpoint", args[0] if args else {})
        path = kwargs.get("path", args[1] if len(args) > 1 else "")
        if _targeted(checkpoint, path, "after_dump"):
            _die()
        super().save_checkpoint(*args, **kwargs)


class KillAround(Callback):
    """``before_dump``: die while Lightning builds the dict; ``after_delete``: once cleaned."""

    def __init__(self, ckpt_dir: Path) -> None:
        self.ckpt_dir = ckpt_dir

    def on_save_checkpoint(self, trainer: L.Trainer, *args: Any) -> None:
        if POINT == "before_dump" and trainer.global_step == KILL_STEP:
            _die()

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if POINT != "after_delete" or trainer.global_step != KILL_STEP:
            return
        # Step KILL_STEP's saves are done once the step-(KILL_STEP - 1) file is removed and
        # last.ckpt keeps one buffer version; they run in the writer thread.
        previous = self.ckpt_dir / f"epoch=0-step={KILL_STEP - 1}.ckpt"
        versions = self.ckpt_dir / "last.ckpt.buffer"
        deadline = time.monotonic() + 60
        while previous.exists() or len(list(versions.iterdir())) != 1:
            if time.monotonic() > deadline:
                raise RuntimeError("the async saves of the kill step never finished")
            time.sleep(0.01)
        _die()


def build(root: Path, max_steps: int) -> tuple[L.Trainer, Recorder, ReplayBufferDataModule]:
    """Trainer, module and DataModule of the run; the resume builds the same."""
    rb = make_buffer(capacity=CAPACITY)
    datamodule = ReplayBufferDataModule(
        rb, batch_size=8, num_batches=None, checkpoint_inline_max_bytes=0
    )
    ckpt_dir = Path(root) / "ckpt"
    trainer = L.Trainer(
        default_root_dir=str(root),
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[
            ModelCheckpoint(dirpath=ckpt_dir, save_last=True, every_n_train_steps=1),
            KillAround(ckpt_dir),
        ],
        plugins=[KillingAsyncIO(KillingTorchIO())],
    )
    return trainer, Recorder(write_per_step=WRITES_PER_STEP), datamodule


def _run(root: Path) -> None:
    trainer, module, datamodule = build(root, max_steps=MAX_STEPS)
    trainer.fit(module, datamodule=datamodule)


def _fork_cases(cases: list[str]) -> None:
    """Run each ``POINT:TARGET:ROOT`` in a child of this process, all at once."""
    global POINT, TARGET
    children = {}
    for case in cases:
        point, target, root = case.split(":", 2)
        sys.stdout.flush(), sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: a whole run, as ``KILL_POINT=point ... ROOT`` would do
            log = os.open(Path(root) / "train.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(log, 1), os.dup2(log, 2)
            code = 1
            try:
                POINT, TARGET = point, target
                _run(Path(root))
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush(), sys.stderr.flush()
                os._exit(code)
        children[pid] = Path(root)
    for pid, root in children.items():
        _, status = os.waitpid(pid, 0)
        (root / "exit_code").write_text(str(os.waitstatus_to_exitcode(status)))


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "--cases":
        _fork_cases(sys.argv[2:])
    else:
        _run(Path(sys.argv[1]))
