"""Asynchronous collection: a torchrl collector beside training, in a process or a thread.

What a user relies on: frames keep arriving while the trainer trains, each stamped
with the version of the weights that collected it; a rate limiter keeps the ratio;
a failing environment ends the run with its traceback instead of a hang; and no
thread or process outlives ``fit``, however it ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import lightning as L
import psutil
import pytest
import torch
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from rb_lightning import ReplayBufferDataModule, SamplesPerInsert
from rb_lightning.errors import CollectorError
from rb_lightning.rl import DQN, OnlineCollector

CARTPOLE = {"categorical_action_encoding": True}
REPO = Path(__file__).resolve().parents[2]


def _fit(collector: OnlineCollector, max_steps: int, rate_limiter=None, callbacks=()):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(5_000))
    dm = ReplayBufferDataModule(rb, batch_size=16, num_batches=None, rate_limiter=rate_limiter)
    trainer = L.Trainer(
        max_steps=max_steps,
        callbacks=[collector, *callbacks],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(DQN(observation_size=4, num_actions=2, eps_decay_steps=50), datamodule=dm)
    return rb


def _children() -> list[psutil.Process]:
    # multiprocessing's resource tracker, and the forkserver a test of the same pytest process
    # may have started (conftest's workers_from_a_forkserver), live as long as the
    # interpreter, by design: neither is a collector's worker.
    children = psutil.Process().children(recursive=True)
    kept = ("resource_tracker", "forkserver")
    return [c for c in children if not any(k in " ".join(c.cmdline()) for k in kept)]


_THREADS_BEFORE_THIS_TEST: set[threading.Thread] = set()


@pytest.fixture(autouse=True)
def _threads_before_this_test():
    # A collecting thread blocked on a dead worker's acknowledgement outlives its test.
    _THREADS_BEFORE_THIS_TEST.clear()
    _THREADS_BEFORE_THIS_TEST.update(threading.enumerate())


def _collection_threads() -> list[threading.Thread]:
    """The collecting threads this test started that are still alive."""
    return [
        t
        for t in threading.enumerate()
        if t.name == "rb-lightning-collection" and t not in _THREADS_BEFORE_THIS_TEST
    ]


def _async(env="CartPole-v1", run_in="thread", **kwargs) -> OnlineCollector:
    options = dict(init_random_frames=64, frames_per_step=16, seed=0, num_envs=4)
    options.update(kwargs)
    return OnlineCollector(env, env_kwargs=CARTPOLE, asynchronous=True, run_in=run_in, **options)


def test_frames_carry_the_version_of_the_weights_that_collected_them():
    collector = _async(sync_every_n_steps=5)
    # The limiter makes the trainer wait for frames: 16 frames pay for 4 batches.
    limiter = SamplesPerInsert(samples_per_insert=4, min_size=64, error_buffer=64)
    rb = _fit(collector, max_steps=60, rate_limiter=limiter)
    versions = rb[: len(rb)]["policy_version"]
    collected = versions[64:]  # after the warm-up's (version 0)
    assert len(collected) > 0 and collector.frames == len(rb)
    # Weights go out every 5 steps, and each frame names the sync it was collected with.
    assert set(collected.unique().tolist()) <= set(range(0, 61, 5))
    assert collected.max() > 0
    assert _collection_threads() == []


@pytest.mark.parametrize("run_in", ["thread", "process"])
def test_the_rate_limiter_holds_the_ratio(run_in):
    limiter = SamplesPerInsert(samples_per_insert=4, min_size=64, error_buffer=64)
    collector = _async(run_in=run_in)
    threads = torch.get_num_threads()
    _fit(collector, max_steps=80, rate_limiter=limiter)
    # torchrl's multi-process collectors lower the parent's thread count unless told not to.
    assert torch.get_num_threads() == threads
    owed = (limiter.inserted - limiter.min_size) * 4
    # The trainer never runs more than error_buffer/2 ahead; the collector starts a
    # batch (16 frames: 64 samples) only while it is not ahead, so at most one batch more.
    assert -(16 * 4 + 32) <= limiter.sampled - owed <= 32
    assert limiter.sampled >= 80 * 16
    assert limiter.collector_wait_s > 0  # CartPole outruns the trainer: the limiter held it
    assert _children() == []


def test_a_failing_environment_ends_the_run_with_its_traceback():
    from torchrl.envs import Transform

    from rb_lightning.rl.acting import collection_env

    class FailAfter(Transform):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def _step(self, tensordict, next_tensordict):
            self.calls += 1
            if self.calls > 100:
                raise RuntimeError("the cart left the track")
            return next_tensordict

    env = collection_env("CartPole-v1", env_kwargs=CARTPOLE).append_transform(FailAfter())
    collector = OnlineCollector(
        env, asynchronous=True, run_in="thread", init_random_frames=32, frames_per_step=8, seed=0
    )
    with pytest.raises(CollectorError, match="environment or the acting policy raised") as err:
        _fit(collector, max_steps=100_000)
    assert "the cart left the track" in str(err.value.__cause__)
    assert _collection_threads() == []


def test_a_dying_worker_process_ends_the_run_and_leaves_nothing_behind():
    from tests.rl.failing_env import FAIL_AFTER

    collector = OnlineCollector(
        "tests.rl.failing_env:FailingCartPole-v0",
        env_kwargs=CARTPOLE,
        asynchronous=True,
        run_in="process",
        init_random_frames=32,
        frames_per_step=8,
        seed=0,
        max_frames_per_traj=FAIL_AFTER * 2,
    )
    with pytest.raises(CollectorError, match="worker process died"):
        _fit(collector, max_steps=100_000)
    assert _children() == []
    # (The collecting thread may stay blocked in torchrl's weight sync, waiting for the
    # dead worker's acknowledgement: a daemon, gone with the interpreter.)


def test_ctrl_c_of_train_py_leaves_no_process_or_semaphore(tmp_path):
    """The user's Ctrl-C during an asynchronous fit: exit 130, the worker gone, nothing leaked."""
    command = [
        sys.executable,
        str(REPO / "train.py"),
        "fit",
        "--config",
        str(REPO / "configs" / "cartpole_dqn_async.yaml"),
        "--trainer.enable_progress_bar=false",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # A terminal's Ctrl-C reaches the whole foreground process group, the collector's
        # worker included: the run gets its own group (and Python's default Ctrl-C handling).
        preexec_fn=lambda: (os.setsid(), signal.signal(signal.SIGINT, signal.SIG_DFL)),
    )  # fmt: skip
    workers: list[psutil.Process] = []
    deadline = time.monotonic() + 120
    while not workers and time.monotonic() < deadline:  # training has started once it exists
        time.sleep(0.5)
        workers = psutil.Process(run.pid).children(recursive=True)
        workers = [w for w in workers if "resource_tracker" not in " ".join(w.cmdline())]
    assert workers, "the collector's worker process never started"
    time.sleep(3)  # inside fit, past the warm-up
    os.killpg(run.pid, signal.SIGINT)
    stdout, stderr = run.communicate(timeout=120)
    assert run.returncode == 130, stdout[-2000:] + stderr[-3000:]
    assert "Traceback" not in stderr
    # multiprocessing's resource tracker reports semaphores and shared memory left behind.
    assert "leaked" not in stderr, stderr[-2000:]
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    assert _collection_threads() == []


def test_process_mode_needs_a_gymnasium_id():
    from rb_lightning.errors import UsageError
    from rb_lightning.rl.acting import collection_env

    with pytest.raises(UsageError, match="run_in='thread'"):
        OnlineCollector(collection_env("CartPole-v1"), asynchronous=True, run_in="process")


def test_the_async_main_job_resumes_and_keeps_the_ratio(tmp_path):
    """configs/cartpole_dqn_async.yaml as a user runs it: 100 steps, then --ckpt_path last to 200."""
    import csv

    repo = REPO
    common = [
        "--config",
        str(repo / "configs" / "cartpole_dqn_async.yaml"),
        "--trainer.log_every_n_steps=50",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]

    def train(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(repo / "train.py"), "fit", *common, *args],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(repo)},
            capture_output=True,
            text=True,
            timeout=300,
        )

    first = train("--trainer.max_steps=100")
    assert first.returncode == 0, first.stderr[-3000:]
    second = train("--trainer.max_steps=200", "--ckpt_path", "last")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "cartpole_dqn_async/version_0 from step 100" in second.stdout
    run = tmp_path / "runs" / "cartpole_dqn_async" / "version_0"
    checkpoint = torch.load(
        run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True, mmap=True
    )
    # The worker wrote the frames itself; the trainer had learned all but the last batch or two
    # it wrote (a resumed run learns those first).
    collector = next(
        v for k, v in checkpoint["callbacks"].items() if k.startswith("OnlineCollector")
    )
    saved_writes = checkpoint["ReplayBufferDataModule"]["buffer"]["write_count"]
    assert 0 <= saved_writes - collector["rows_learned"] <= 2 * 64
    state = checkpoint["ReplayBufferDataModule"]["rate_limiter"]
    # 200 batches of 16 over both processes, and the one Lightning may have drawn ahead.
    assert 200 * 16 <= state["sampled"] <= 201 * 16
    owed = (state["inserted"] - 1000) * 8  # the config: 8 samples per insert past min_size
    # Trainer at most error_buffer/2 (16) ahead; collector at most one 64-frame batch ahead.
    assert -(64 * 8 + 16) <= state["sampled"] - owed <= 16
    with (run / "metrics.csv").open() as file:
        rows = [row for row in csv.DictReader(file) if row.get("replay/inserted")]
    assert [row["step"] for row in rows] == ["49", "99", "149", "199"]
    for column in ("replay/collector_wait_s", "replay/trainer_wait_s", "replay/staleness_mean"):
        assert all(row[column] != "" for row in rows), column
    assert _children() == []


def test_a_forked_worker_collects_and_the_programs_start_method_is_left_as_it_was():
    import multiprocessing

    before = multiprocessing.get_start_method(allow_none=True)
    seen: dict[str, list[str]] = {}

    class WorkerCommandLines(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 20:
                seen["workers"] = [" ".join(child.cmdline()) for child in _children()]

    collector = _async(run_in="process", start_method="fork")
    rb = _fit(collector, max_steps=40, callbacks=[WorkerCommandLines()])
    assert len(rb) > 64 + 16, "no frames came from the worker"
    assert seen["workers"], "no worker process during fit"
    # A spawned worker runs multiprocessing's spawn_main; a forked one is a copy of this process.
    assert not any("spawn_main" in line for line in seen["workers"]), seen["workers"]
    assert multiprocessing.get_start_method(allow_none=True) == before
    assert _children() == []


def test_start_method_of_a_synchronous_collector_is_one_paragraph_from_train_py(tmp_path):
    config = (REPO / "configs" / "cartpole_dqn.yaml").read_text()
    anchor = "        env: CartPole-v1\n"
    assert anchor in config
    (tmp_path / "sync_fork.yaml").write_text(
        config.replace(anchor, anchor + "        start_method: fork\n", 1)
    )
    run = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "fit", "--config", "sync_fork.yaml"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    assert "start_method applies to asynchronous collection in a worker process" in run.stderr


UNGUARDED_SCRIPT = """
import lightning as L
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from rb_lightning import ReplayBufferDataModule, SamplesPerInsert
from rb_lightning.rl import DQN, OnlineCollector

# No `if __name__ == "__main__":`: a spawned worker runs this file again and fails.
collector = OnlineCollector(
    "CartPole-v1", env_kwargs={"categorical_action_encoding": True}, asynchronous=True,
    run_in="process", start_method="spawn", init_random_frames=32, frames_per_step=8,
)
limiter = SamplesPerInsert(samples_per_insert=16, min_size=32, timeout=10)
rb = TensorDictReplayBuffer(storage=LazyTensorStorage(1_000))
dm = ReplayBufferDataModule(rb, batch_size=16, num_batches=None, rate_limiter=limiter)
trainer = L.Trainer(max_steps=20, callbacks=[collector], logger=False,
                    enable_checkpointing=False, enable_progress_bar=False)
trainer.fit(DQN(observation_size=4, num_actions=2), datamodule=dm)
"""


def test_a_spawned_worker_that_cannot_start_ends_the_run_instead_of_hanging(tmp_path):
    """A script without the main guard: the worker never starts; torchrl would wait forever."""
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED_SCRIPT)
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 1, run.stderr[-3000:]
    last = [line for line in run.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("rb_lightning.errors.CollectorError: The asynchronous collector's")
    assert "did not start within 10s" in last and '__name__ == "__main__"' in last
    assert "leaked" not in run.stderr  # no semaphore or shared memory left to the tracker
