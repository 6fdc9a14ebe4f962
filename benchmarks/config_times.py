"""Wall time of each shipped config, on an idle CPU and with one core kept busy.

    python benchmarks/config_times.py                       # every config, as the README times it
    python benchmarks/config_times.py --configs llm_sft --max-steps 20   # a quick check

Each run is ``python train.py fit --config configs/<name>.yaml`` as the README's table states
it (to the goal, or a bounded number of steps), in a fresh folder, timed from start to exit.
It runs twice: once on an idle machine, once while another process spins on one core (a
busy loop, as another user's job would), to show what a shared machine costs. The table it
prints (Markdown, with the CPU's name) fills the README's shipped-configs table. Run it on an
otherwise idle machine: other load makes both columns slower.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, str(REPO / "train.py"), "fit"]
_SUMMARY = re.compile(r"fit stopped at step ([\d,]+) after ([\d.]+) s: (.*)")


@dataclass(frozen=True)
class Job:
    """One config's timed run: the extra arguments, and untimed commands run first."""

    what: str
    args: list[str] = field(default_factory=list)
    setup: list[list[str]] = field(default_factory=list)


def _sft_for_grpo() -> list[str]:
    return [*TRAIN, "--config", str(REPO / "configs/llm_sft.yaml"), "--trainer.max_steps=300",
            "--trainer.logger.init_args.name=sft_for_grpo"]  # fmt: skip


def _demo_policy() -> list[str]:
    return [*TRAIN, "--config", str(REPO / "configs/cartpole_dqn.yaml"), "--seed_everything=100",
            "--trainer.logger.init_args.name=cartpole_demo_policy"]  # fmt: skip


#: The README's table: what each config's time means. cartpole_dqn_ray needs a Ray cluster.
JOBS = {
    "cartpole_dqn": Job("to the goal, seed 0"),
    "cartpole_dqn_async": Job("to the goal, seed 0"),
    "pendulum_sac": Job("to the goal, seed 0"),
    "pendulum_sac_async": Job("to the goal, seed 0"),
    "cartpole_dqn_offline_to_online": Job(
        "to the goal, seed 0",
        setup=[
            _demo_policy(),
            [
                sys.executable,
                "-m",
                "rb_lightning.rl.make_cartpole_demos",
                "runs/cartpole_demos",
                "--checkpoint",
                "runs/cartpole_demo_policy/version_0/checkpoints/last.ckpt",
            ],
        ],  # fmt: skip
    ),
    "llm_sft": Job("1,000 steps"),
    "llm_grpo": Job(
        "200 steps from 300 of SFT",
        args=["--model.init_from=runs/sft_for_grpo/version_0/checkpoints/last.ckpt"],
        setup=[_sft_for_grpo()],
    ),
    "llm_grpo_async": Job(
        "200 steps from 300 of SFT",
        args=["--model.init_from=runs/sft_for_grpo/version_0/checkpoints/last.ckpt"],
        setup=[_sft_for_grpo()],
    ),
    "offline_from_disk": Job(
        "300 steps",
        setup=[
            [sys.executable, "-m", "rb_lightning.llm.make_offline_buffer", "runs/offline_buffer"]
        ],
    ),
}


def cpu_name() -> str:
    """The CPU's model name (``lscpu``'s), else ``platform.processor()``."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        found = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
        if found:
            return found.group(1).strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(command: list[str], cwd: Path) -> tuple[float, str]:
    """Run ``command`` in ``cwd``; its wall time and output (exit on failure)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return elapsed, done.stdout


def time_config(name: str, job: Job, folder: Path, max_steps: int | None) -> tuple[float, str]:
    """Set ``name`` up in ``folder`` and time its fit; the wall time and where it stopped."""
    folder.mkdir(parents=True)
    bounded = [] if max_steps is None else [f"--trainer.max_steps={max_steps}"]
    for command in job.setup:
        run([*command, *bounded] if command[:3] == TRAIN else command, folder)
    config = ["--config", str(REPO / "configs" / f"{name}.yaml")]
    command = [*TRAIN, *config, *job.args, *bounded, "--trainer.enable_progress_bar=false"]
    elapsed, out = run(command, folder)
    found = _SUMMARY.search(out)
    stopped = f"step {found.group(1)}, {found.group(3)}" if found else "?"
    return elapsed, stopped


def busy_core() -> subprocess.Popen:
    """Another process keeping one core busy (a pure-Python spin)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--configs", nargs="+", choices=sorted(JOBS), default=sorted(JOBS))
    parser.add_argument(
        "--max-steps", type=int, help="stop every run (and setup run) at this step: a quick check"
    )
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="config_times-") as tmp:
        for name in args.configs:
            job = JOBS[name]
            idle, stopped = time_config(name, job, Path(tmp) / name / "idle", args.max_steps)
            spinner = busy_core()
            try:
                busy, busy_stopped = time_config(
                    name, job, Path(tmp) / name / "busy", args.max_steps
                )
            finally:
                spinner.kill()
                spinner.wait()
            print(f"{name}: idle {idle:.1f} s ({stopped}); one core busy {busy:.1f} s "
                  f"({busy_stopped})", flush=True)  # fmt: skip
            what = job.what if args.max_steps is None else f"{args.max_steps} steps"
            rows.append((name, what, idle, busy))
    today = datetime.date.today().isoformat()
    print(f"\n{cpu_name()}, {os.cpu_count()} logical CPUs, {today}; wall time of "
          "`python train.py fit --config configs/<config>.yaml`")  # fmt: skip
    print("\n| config | run | idle | one core busy |\n|---|---|---|---|")
    for name, what, idle, busy in rows:
        print(f"| `{name}` | {what} | {idle:.0f} s | {busy:.0f} s |")


if __name__ == "__main__":
    main()
