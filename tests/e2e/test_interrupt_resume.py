"""Ctrl-C, kill and resume as a user lives them, through ``python train.py`` in a subprocess.

What is checked is what the user reads (exit code, the lines printed) and what
the run leaves on disk (run directories, ``last.ckpt`` and its step,
``metrics.csv`` row by row against an uninterrupted run).
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from console_scripts import command as console_command

REPO = Path(__file__).resolve().parents[2]
MAIN_JOB = str(REPO / "configs" / "cartpole_dqn.yaml")
LLM_SFT = str(REPO / "configs" / "llm_sft.yaml")
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def _with_callback_args(tmp_path: Path, config: str, **changes: dict) -> str:
    """A copy of a shipped config whose callbacks (by class name) take other arguments."""
    loaded = yaml.safe_load(Path(config).read_text())
    for callback in loaded["trainer"]["callbacks"]:
        name = callback["class_path"].rsplit(".", 1)[-1]
        callback.setdefault("init_args", {}).update(changes.get(name, {}))
    path = tmp_path / Path(config).name
    path.write_text(yaml.safe_dump(loaded, sort_keys=False))
    return str(path)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def _start(args: list[str], cwd: Path, log: Path, errors: Path | None = None) -> subprocess.Popen:
    """``train.py ARGS`` in the background, stdout to ``log``, stderr too unless ``errors``."""
    return subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=cwd,
        env=_env(),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT if errors is None else errors.open("w"),
        # A background job of a non-interactive shell inherits SIGINT ignored: give the
        # run Python's default Ctrl-C handling, as in a terminal.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _wait(process: subprocess.Popen, log: Path, timeout: float = 120) -> str:
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(f"no exit in {timeout}s:\n{log.read_text()[-4000:]}") from None
    return log.read_text()


def _wait_for(condition, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, "the run ended before the test stopped it"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)["global_step"]


def _rows(metrics: Path) -> list[dict[str, str]]:
    with metrics.open(newline="") as file:
        return list(csv.DictReader(file))


def _shape(rows: list[dict[str, str]]) -> list[tuple[str, str, tuple[str, ...]]]:
    """(epoch, step, filled columns) of every row: what an uninterrupted run must match."""
    return [(r["epoch"], r["step"], tuple(k for k, v in r.items() if v)) for r in rows]


def _assert_one_history(rows: list[dict[str, str]]) -> None:
    keys = [(r["step"], tuple(k for k, v in r.items() if v and k != "epoch")) for r in rows]
    assert len(keys) == len(set(keys)), "a step logged twice: two histories in one file"
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(steps)


@pytest.mark.parametrize("program", ["train.py", "rb-lightning"])
def test_ctrl_c_during_start_up_prints_one_line_and_exits_130(tmp_path, program):
    log = tmp_path / "out.log"
    if program == "train.py":
        run = _start(["fit", "--config", MAIN_JOB], tmp_path, log)
    else:
        run = subprocess.Popen(
            [*console_command("rb-lightning"), "fit", "--config", "cartpole_dqn"],
            cwd=tmp_path,
            env=_env(),
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    time.sleep(0.5)  # importing torch and Lightning
    run.send_signal(signal.SIGINT)
    out = _wait(run, log)
    assert run.returncode == 130, out
    assert out.strip().splitlines() == [
        "stopped by Ctrl-C before training started: nothing to save or resume"
    ]
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_ctrl_c_before_the_first_step_leaves_no_run_directory(tmp_path):
    pytest.importorskip("gymnasium")
    log = tmp_path / "out.log"
    # A long warm-up (random frames collected before the first step) is the window.
    config = _with_callback_args(
        tmp_path, MAIN_JOB, OnlineCollector={"init_random_frames": 1_000_000}
    )
    big_buffer = [
        "--data.replay_buffer.init_args.storage.init_args.max_size=1000000",
        "--data.replay_buffer.init_args.sampler.init_args.max_capacity=1000000",
    ]
    run = _start(["fit", "--config", config, *QUIET, *big_buffer], tmp_path, log)
    run_dir = tmp_path / "runs" / "cartpole_dqn" / "version_0"
    _wait_for(lambda: (run_dir / "config.yaml").is_file(), run)
    time.sleep(1.0)
    run.send_signal(signal.SIGINT)
    out = _wait(run, log)
    assert run.returncode == 130, out
    assert "Traceback" not in out and "Detected KeyboardInterrupt" not in out
    assert (
        f"fit stopped by Ctrl-C before its first step: nothing to resume (removed {Path('runs/cartpole_dqn/version_0')})"
        in out
    )
    assert not run_dir.exists()


@pytest.mark.slow
def test_ctrl_c_writes_a_checkpoint_of_its_step_and_the_printed_command_resumes_it(tmp_path):
    pytest.importorskip("gymnasium")
    run_dir = tmp_path / "runs" / "cartpole_dqn" / "version_0"
    log = tmp_path / "first.log"
    # Checkpoints every 1,000 steps: Ctrl-C comes before the first one.
    first = _start(["fit", "--config", MAIN_JOB, *QUIET], tmp_path, log)
    _wait_for(lambda: (run_dir / "metrics.csv").is_file(), first)  # written at step 100
    first.send_signal(signal.SIGINT)
    out = _wait(first, log)
    assert first.returncode == 130, out
    assert "Traceback" not in out
    last = run_dir / "checkpoints" / "last.ckpt"
    step = _step(last)
    assert 100 <= step < 1000
    assert f"fit stopped at step {step:,} after" in out and "interrupted (Ctrl-C)" in out
    assert (
        f"checkpoint  {Path('runs/cartpole_dqn/version_0/checkpoints/last.ckpt')} (step {step:,})"
        in out
    )
    hint = [line for line in out.splitlines() if line.strip().startswith("resume")]
    assert hint and hint[0].split(None, 1)[1].endswith("--ckpt_path last"), out

    # The printed command, with a bound so that the test ends.
    command = hint[0].split(None, 1)[1].split()[2:]  # without "python train.py"
    resumed = _train([*command, f"--trainer.max_steps={step + 150}"], tmp_path)
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert (
        f"fit: resuming {Path('runs/cartpole_dqn/version_0')} from step {step:,} (last.ckpt)" in out
    )
    assert f"fit stopped at step {step + 150:,}" in out
    assert not (tmp_path / "runs" / "cartpole_dqn" / "version_1").exists()
    _assert_one_history(_rows(run_dir / "metrics.csv"))


@pytest.mark.slow
def test_after_ctrl_c_the_summary_starts_on_its_own_line_below_the_progress_bar(tmp_path):
    pytest.importorskip("gymnasium")
    run_dir = tmp_path / "runs" / "cartpole_dqn" / "version_0"
    # stdout redirected alone (stderr, where the Ctrl-C notice goes, is the terminal's).
    log = tmp_path / "out.log"
    args = ["fit", "--config", MAIN_JOB, "--trainer.enable_model_summary=false"]
    run = _start(args, tmp_path, log, errors=tmp_path / "err.log")
    _wait_for(lambda: (run_dir / "metrics.csv").is_file(), run)
    run.send_signal(signal.SIGINT)
    out = _wait(run, log)
    assert run.returncode == 130, out[-3000:]
    lines = out.split("\n")
    assert "\r" not in out  # into a file: plain progress lines, no bar updates
    summary = [i for i, line in enumerate(lines) if "fit stopped at step" in line]
    assert len(summary) == 1, out[-3000:]
    assert lines[summary[0]].startswith("fit stopped at step"), lines[summary[0]][-300:]
    # The progress where the run stopped, on the line above.
    stopped_at = lines[summary[0]].split("fit stopped at step ")[1].split(" ")[0]
    assert lines[summary[0] - 1].startswith(f"step {stopped_at}/"), lines[summary[0] - 1]


@pytest.mark.slow
def test_ckpt_path_last_never_writes_into_an_older_finished_run(tmp_path):
    runs = tmp_path / "runs" / "llm_sft"
    short = ["--trainer.max_steps=20", "--trainer.log_every_n_steps=5", *QUIET]
    finished = _train(["fit", "--config", LLM_SFT, *short], tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    old_checkpoint = runs / "version_0" / "checkpoints" / "last.ckpt"
    before = (old_checkpoint.stat().st_mtime_ns, (runs / "version_0" / "metrics.csv").read_text())

    # The same config again, killed before its first checkpoint.
    log = tmp_path / "killed.log"
    killed = _start(["fit", "--config", LLM_SFT, *QUIET], tmp_path, log)
    _wait_for(lambda: (runs / "version_1" / "config.yaml").is_file(), killed)
    killed.kill()
    killed.wait(timeout=60)

    again = _train(["fit", "--config", LLM_SFT, "--ckpt_path", "last", *short], tmp_path)
    message = [line for line in again.stderr.splitlines() if line.startswith("error:")]
    assert again.returncode == 2, again.stdout[-2000:] + again.stderr[-2000:]
    assert "Traceback (most recent call last)" not in again.stderr and len(message) == 1
    assert (
        "error: config error at ckpt_path: 'last' continues the run you started last" in message[0]
    )
    assert f"{Path('runs/llm_sft/version_1')}, but it has no checkpoint" in message[0]
    assert f"{old_checkpoint.relative_to(tmp_path)} (finished at max_steps, step 20)" in message[0]
    assert "leave out --ckpt_path" in message[0]
    assert before == (
        old_checkpoint.stat().st_mtime_ns,
        (runs / "version_0" / "metrics.csv").read_text(),
    )

    # Naming the finished run continues it, with a larger max_steps: it ended at max_steps.
    named = ["fit", "--config", LLM_SFT, "--ckpt_path", str(old_checkpoint), *short]
    same_bound = _train(named, tmp_path)
    assert same_bound.returncode == 2
    assert "pass --trainer.max_steps above 20" in same_bound.stderr
    extended = _train([*named, "--trainer.max_steps=30"], tmp_path)
    assert extended.returncode == 0, extended.stderr[-3000:]
    assert (
        f"fit: extending the finished run {Path('runs/llm_sft/version_0')} from step 20 to "
        "max_steps=30 (last.ckpt)" in extended.stdout
    )
    assert "fit stopped at step 30" in extended.stdout


@pytest.mark.slow
def test_extending_or_interrupting_an_llm_run_logs_what_the_straight_run_logs(tmp_path):
    pytest.importorskip("transformers")
    cadence = [
        "--trainer.log_every_n_steps=10",
        "--trainer.val_check_interval=50",
        *QUIET,
    ]
    runs = tmp_path / "runs" / "llm_sft"
    straight = _train(["fit", "--config", LLM_SFT, "--trainer.max_steps=100", *cadence], tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    reference = _rows(runs / "version_0" / "metrics.csv")

    # version_1: ended at max_steps=50, then extended to 100.
    first = _train(["fit", "--config", LLM_SFT, "--trainer.max_steps=50", *cadence], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    to_100 = [
        "fit",
        "--config",
        LLM_SFT,
        "--trainer.max_steps=100",
        "--ckpt_path",
        "last",
        *cadence,
    ]
    extended = _train(to_100, tmp_path)
    assert extended.returncode == 0, extended.stderr[-3000:]
    assert (
        f"fit: extending the finished run {Path('runs/llm_sft/version_1')} from step 50 to "
        "max_steps=100" in extended.stdout
    )
    _assert_same_log(reference, _rows(runs / "version_1" / "metrics.csv"))

    # version_2: Ctrl-C at whatever step it has reached, then resumed to 100.
    log = tmp_path / "interrupted.log"
    flush_often = ["--trainer.logger.init_args.flush_logs_every_n_steps=10"]
    interrupted = _start(
        ["fit", "--config", LLM_SFT, "--trainer.max_steps=100", *cadence, *flush_often],
        tmp_path,
        log,
    )
    _wait_for(lambda: (runs / "version_2" / "metrics.csv").is_file(), interrupted)
    interrupted.send_signal(signal.SIGINT)
    out = _wait(interrupted, log)
    assert interrupted.returncode == 130, out
    step = _step(runs / "version_2" / "checkpoints" / "last.ckpt")
    assert 0 < step < 100, out
    resumed = _train(to_100, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"fit: resuming {Path('runs/llm_sft/version_2')} from step {step}" in resumed.stdout
    _assert_same_log(reference, _rows(runs / "version_2" / "metrics.csv"))


def _assert_same_log(reference: list[dict[str, str]], rows: list[dict[str, str]]) -> None:
    assert _shape(rows) == _shape(reference)  # the same rows at the same steps and epochs
    for row_a, row_b in zip(reference, rows, strict=True):
        for key, value in row_a.items():
            if value and key not in ("epoch", "step"):
                assert float(row_b[key]) == pytest.approx(float(value), abs=1e-6), (key, row_a)


@pytest.mark.slow
def test_extending_and_killing_the_main_job_keep_the_straight_runs_rows(tmp_path):
    pytest.importorskip("gymnasium")
    runs = tmp_path / "runs" / "cartpole_dqn"
    straight = _train(["fit", "--config", MAIN_JOB, "--trainer.max_steps=500", *QUIET], tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]

    # version_1: 300 steps, extended; killed after its checkpoint of step 400 and after
    # it had written rows past it; then resumed to 500.
    first = _train(["fit", "--config", MAIN_JOB, "--trainer.max_steps=300", *QUIET], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    metrics = runs / "version_1" / "metrics.csv"
    log = tmp_path / "killed.log"
    saves_at_400_and_800 = _with_callback_args(
        tmp_path, MAIN_JOB, FinalLastCheckpoint={"every_n_train_steps": 400}
    )
    killed = _start(
        [
            "fit",
            "--config",
            saves_at_400_and_800,
            "--ckpt_path",
            "last",
            "--trainer.max_steps=100000",
            "--trainer.logger.init_args.flush_logs_every_n_steps=10",
            *QUIET,
        ],
        tmp_path,
        log,
    )
    # Lightning's CSV writer rewrites the whole file when a new column appears: a read can
    # meet it empty.
    _wait_for(lambda: max((int(r["step"]) for r in _rows(metrics)), default=-1) >= 499, killed)
    killed.kill()
    killed.wait(timeout=60)
    assert _step(runs / "version_1" / "checkpoints" / "last.ckpt") == 400, log.read_text()[-2000:]
    dead_rows = _rows(metrics)
    finished = _train(
        ["fit", "--config", MAIN_JOB, "--ckpt_path", "last", "--trainer.max_steps=500", *QUIET],
        tmp_path,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert f"fit: resuming {Path('runs/cartpole_dqn/version_1')} from step 400" in finished.stdout

    a = _rows(runs / "version_0" / "metrics.csv")
    b = _rows(metrics)
    # The environment restarts on resume, so values differ; the rows, columns and epochs
    # do not, and the killed process's rows after step 400 are gone.
    assert _shape(a) == _shape(b)
    _assert_one_history(b)
    assert [r for r in b if int(r["step"]) >= 400] != [
        r for r in dead_rows if int(r["step"]) >= 400
    ]


def _safe_step(path: Path) -> int:
    try:
        return _step(path)
    except Exception:  # not there yet, or being written
        return -1
