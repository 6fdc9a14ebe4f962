"""``train.py fit --config configs/llm_grpo_async.yaml``: Ctrl-C, resume, a failing worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from grpo_probe import QUIET, REPO, column, metrics, probed_config, read_probe, train

pytestmark = pytest.mark.hf

ASYNC_CONFIG = REPO / "configs" / "llm_grpo_async.yaml"
ASYNC_KEYS = (
    "async/staleness_mean", "async/staleness_max", "async/trainer_wait_s",
    "async/generation_wait_s", "async/groups_dropped",
)  # fmt: skip


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _gone(pid: int, grace: float = 5.0) -> bool:
    """Whether ``pid`` has exited, allowing ``grace`` seconds (multiprocessing's resource
    tracker ends when it reads the end of its pipe, a moment after the run)."""
    deadline = time.monotonic() + grace
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_ctrl_c_then_ckpt_path_last_trains_every_generated_group_once_within_the_bound(tmp_path):
    config = probed_config(tmp_path, ASYNC_CONFIG)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(Path(__file__).parent), str(REPO / "tests")])
    log = tmp_path / "first.log"
    run = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), "fit", "--config", str(config), *QUIET,
         "--trainer.max_steps=100000"],
        cwd=tmp_path, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
        # A terminal's Ctrl-C reaches the whole foreground process group: the run gets its own
        # group (and Python's default Ctrl-C handling, which a background job lacks).
        preexec_fn=lambda: (os.setsid(), signal.signal(signal.SIGINT, signal.SIG_DFL)),
    )  # fmt: skip
    probe = tmp_path / "probe" / "rank0.jsonl"
    deadline = time.monotonic() + 120
    while not (probe.exists() and len(probe.read_text().splitlines()) >= 8):
        assert run.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "no 8 steps in 120 s"
        time.sleep(0.05)
    workers = psutil.Process(run.pid).children(recursive=True)
    os.killpg(run.pid, signal.SIGINT)
    run.wait(timeout=120)
    out = log.read_text()
    assert run.returncode == 130, out[-3000:]
    assert "interrupted (Ctrl-C)" in out and "Traceback" not in out
    assert "at most 1 policy version old" in out  # the contract, in the log
    assert "off-policy correction: decoupled" in out  # auto, with a bound above 0
    assert workers and all(_gone(w.pid) for w in workers)
    stopped = len(read_probe(tmp_path / "probe"))

    done = train(
        ["fit", "--config", str(config), *QUIET, f"--trainer.max_steps={stopped + 6}",
         "--ckpt_path=last"],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"from step {stopped}" in done.stdout
    rows = read_probe(tmp_path / "probe")
    assert [r["step"] for r in rows] == list(range(stopped + 6))
    # Every generated batch is trained once, in order, across the stop: the groups received and
    # not trained yet were in the checkpoint; those in flight were generated again.
    for row in rows:
        step = row["step"]
        assert sorted(set(row["groups"])) == list(range(step * 8, step * 8 + 8))
        assert all(0 <= step - v <= 1 for v in row["versions"]), row
    assert any(step - v == 1 for r in rows for step, v in [(r["step"], r["versions"][0])])

    logged = metrics(tmp_path / "runs" / "llm_grpo_async" / "version_0")
    assert sorted(column(logged, "train_loss")) == list(range(stopped + 6))  # one row a step
    for key in ASYNC_KEYS:
        assert sorted(column(logged, key)) == list(range(stopped + 6)), key
    assert max(column(logged, "async/staleness_max").values()) <= 1
    assert set(column(logged, "async/groups_dropped").values()) == {0.0}
    assert len(column(logged, "importance_weight_mean")) == stopped + 6
    assert (tmp_path / "runs" / "llm_grpo_async" / "version_0" / "curves.png").is_file()


@pytest.mark.parametrize(
    ("reward", "said"),
    [
        ("raising_reward", "worker process raised ConnectionError: the grading server"),
        ("killed_reward", "died (killed by signal 9)"),
    ],
)
def test_a_worker_that_raises_or_is_killed_ends_the_run_in_one_paragraph(tmp_path, reward, said):
    before = _shm()
    pid_file = tmp_path / "worker.pid"
    env = {"RB_TEST_WORKER_PID": str(pid_file), "RB_TEST_FAULT_AT": "12"}
    os.environ.update(env)
    try:
        done = train(
            ["fit", "--config", str(ASYNC_CONFIG), *QUIET, "--trainer.max_steps=100000",
             f"--model.init_args.rewards=[grpo_faults:{reward}]"],
            tmp_path, timeout=180,
        )  # fmt: skip
    finally:
        for key in env:
            os.environ.pop(key)
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and said in last, last
    assert "--ckpt_path last" in last
    # The trainer's own traceback is not shown (the worker's, with the reward's line, is).
    assert done.stderr.count("Traceback") == (1 if reward == "raising_reward" else 0)
    assert _gone(int(pid_file.read_text()))
    # Nothing of shared memory: torch's tensors, multiprocessing's blocks (the worker's
    # queues are of the fork context, whose semaphores have no name; other programs on a
    # shared machine leave sem.mp-* entries, not counted here), and no leak reported.
    assert not {n for n in _shm() - before if n.startswith(("torch_", "psm_"))}
    assert "leaked" not in done.stderr
