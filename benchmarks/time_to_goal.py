"""Time to the goal: our shipped RL configs against simple reference agents, side by side.

For each task, runs N seeds of a reference agent and N seeds of our config back to back
in the same invocation, each run in its own subprocess (a fresh interpreter), and prints
one markdown table per task:

========== ====================================================================================
task       reference (``benchmarks/reference_agents.py``) / ours
========== ====================================================================================
cartpole   a Lightning DQN shaped like Lightning's domain template ``reinforce_learn_Qnet.py``
           / ``python train.py fit --config configs/cartpole_dqn.yaml``; goal: mean return of
           the last 10 episodes >= 475
pendulum   a CleanRL-style single-file SAC with the SAC paper's hyperparameters
           / ``python train.py fit --config configs/pendulum_sac.yaml``; goal: >= -200
========== ====================================================================================

Ours is run from the repository root as::

    python train.py fit --config configs/<task>.yaml --seed_everything <seed> \\
        --trainer.logger.init_args.save_dir=<tmpdir>

Columns:

- ``reached``: the run stopped because the goal was reached (not at its step cap).
- ``return``: the mean return of the last 10 episodes when the run stopped.
- ``frames``: environment frames collected, warm-up frames included.
- ``steps``: gradient steps.
- ``wall (s)``: **the whole subprocess**, from launching the interpreter to its exit,
  timed by this script with ``time.perf_counter`` in the same way for both (imports,
  environment and network construction, warm start, training, and the shutdown after
  the goal included). The ratio row uses this column.
- ``fit (s)``: the program's own clock, from its summary line (``fit stopped at step
  ... after X s``): ours times ``Trainer.fit`` (``RunReport``: fit start to fit end);
  the reference times its run function (start to the moment the goal was reached).
- ``steps/s``: ``steps / fit (s)``: the training loop's rate (per rank: DDP ranks step
  together).
- ``CPU s / 1k steps``: user + system CPU of the run's processes (every rank, the
  collector's worker) per 1,000 steps; for ``ours_ray`` also the Ray head's processes
  (``gcs_server``, ``raylet``, the buffer actor). On a busy machine wall times stretch,
  CPU per step much less: it says what a step costs, wherever the time went.

``ours_ray`` (CartPole): ``configs/cartpole_dqn_ray.yaml`` against a private Ray head
that this script starts once, before the first seed (``benchmarks/ray_head.py``: ``ray
start --head --block`` with its own temp directory and token), as a user's ``ray start``;
the head's start is not in any run's wall time::

    python benchmarks/time_to_goal.py --task cartpole --runs ours ours_ray --seeds 0 1 2 3 4

Summary rows: the median of each column over the seeds of each side, and ``ours /
reference``, the ratio of those medians for wall time and frames (below 1: ours is
better). Results from runs that did not reach the goal are lower bounds; the ``reached``
cell of a median row says how many did.

Each run's output is parsed from its summary lines (also printed by the reference)::

    fit stopped at step 9,800 after 41.2 s: goal reached, episode_return 482.30 >= 475.0
      episode_return 482.30 | frames 39,424

and, for ours, ``<save_dir>/<name>/version_*/metrics.csv`` (columns ``step``, ``frames``,
``episode_return``) fills in whatever the summary lacks.

Run from the repository root (the machine should be otherwise idle; the load average
before and after is printed under the tables)::

    python benchmarks/time_to_goal.py                                # both tasks, seeds 0 1 2
    python benchmarks/time_to_goal.py --task cartpole --seeds 0 1 2
    python benchmarks/time_to_goal.py --task pendulum --seeds 0
    python benchmarks/time_to_goal.py --quick --runs reference        # smoke run: tiny caps

CartPole has two reference rows. ``template``: the reference DQN as Lightning's template
behaves, its single old-gym ``done`` ending bootstrapping at the 500-step time limit as if
the pole had fallen (the issue's measured reference, ~50k frames). ``reference``: the same
agent with gymnasium's ``terminated``, bootstrapping through the time limit, which needs
far fewer frames. The table has a ratio row against each.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_SCRIPT = ROOT / "benchmarks" / "reference_agents.py"
# "template": the reference DQN as Lightning's template behaves (old gym's single `done`
# ends bootstrapping at CartPole's time limit too); "reference": the same agent with
# gymnasium's terminated/truncated, which needs far fewer frames. SAC has one reference.
# "sb3": Stable-Baselines3's DQN with rl-baselines3-zoo's CartPole hyperparameters
# (benchmarks/sb3_anchor.py; needs `pip install stable-baselines3`).
REFERENCE_SIDES = ("template", "reference", "sb3")
# "ours_async": the task's asynchronous twin config (acting in a worker process).
# "ours_ray": the task's Ray config (two DDP ranks, the buffer in a Ray actor), run against
# a private Ray head this script starts once (benchmarks/ray_head.py), as a user's cluster.
SIDES = (*REFERENCE_SIDES, "ours", "ours_async", "ours_ray")
OURS = ("ours", "ours_async", "ours_ray")


@dataclass(frozen=True)
class Task:
    """One comparison: a reference agent and one of our configs, with the same goal."""

    name: str
    reference_agent: str
    reference_label: str
    config: str
    goal: float
    max_steps: int  # reference safety cap (gradient steps); ours has its config's max_steps
    quick_steps: int  # both sides, under --quick
    async_config: str | None = None  # the "ours_async" side
    ray_config: str | None = None  # the "ours_ray" side


TASKS = {
    "cartpole": Task(
        "cartpole",
        "dqn",
        "reference DQN (Lightning template)",
        "configs/cartpole_dqn.yaml",
        475.0,
        200_000,
        300,
        "configs/cartpole_dqn_async.yaml",
        "configs/cartpole_dqn_ray.yaml",
    ),
    "pendulum": Task(
        "pendulum",
        "sac",
        "reference SAC (CleanRL-style)",
        "configs/pendulum_sac.yaml",
        -200.0,
        100_000,
        200,
        "configs/pendulum_sac_async.yaml",
    ),
}


@dataclass
class RunResult:
    """One subprocess run, as read back from its output."""

    side: str  # one of SIDES
    seed: int
    returncode: int
    wall: float
    reached: bool | None = None
    mean_return: float | None = None
    frames: int | None = None
    steps: int | None = None
    fit_seconds: float | None = None
    reason: str | None = None
    cpu: float | None = None  # CPU seconds of the run's processes (and the Ray head's)
    notes: list[str] = field(default_factory=list)

    @property
    def steps_per_s(self) -> float | None:
        if self.steps is None or not self.fit_seconds:
            return None
        return self.steps / self.fit_seconds

    @property
    def cpu_per_1k_steps(self) -> float | None:
        if self.cpu is None or not self.steps:
            return None
        return 1000 * self.cpu / self.steps


# --------------------------------------------------------------------------------------
# Reading a run's output
# --------------------------------------------------------------------------------------

_NUMBER = r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?nan|[-+]?inf"
STOP_LINE = re.compile(
    rf"fit stopped at step (?P<step>{_NUMBER}) after (?P<seconds>{_NUMBER}) s: (?P<reason>.*)$",
    re.MULTILINE | re.IGNORECASE,
)
METRIC_PAIR = re.compile(rf"(?P<name>[A-Za-z_][\w/.]*)\s+(?P<value>{_NUMBER})\s*$")


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_summary(output: str) -> dict[str, object]:
    """Read the summary lines that end a ``fit`` from a run's output.

    Returns a dict with any of ``step`` (int), ``seconds`` (float), ``reason`` (str),
    ``reached`` (bool) and the headline metrics of the line after it (``episode_return``:
    float, ``frames``: int, ...); empty when the output has no summary. The last summary
    wins when there are several.

    Examples:
        >>> out = '''noise
        ... fit stopped at step 9,800 after 41.2 s: goal reached, episode_return 482.30 >= 475.0
        ...   episode_return 482.3 | frames 39,424
        ...   metrics     runs/x/metrics.csv'''
        >>> summary = parse_summary(out)
        >>> summary["step"], summary["seconds"], summary["reached"], summary["frames"]
        (9800, 41.2, True, 39424)
        >>> summary["episode_return"]
        482.3
        >>> parse_summary("no summary here")
        {}
    """
    matches = list(STOP_LINE.finditer(output))
    if not matches:
        return {}
    last = matches[-1]
    reason = last.group("reason").strip()
    summary: dict[str, object] = {
        "step": int(_number(last.group("step"))),
        "seconds": _number(last.group("seconds")),
        "reason": reason,
        "reached": reason.lower().startswith("goal reached"),
    }
    following = output[last.end() :].lstrip("\r\n").splitlines()
    if following and following[0][:1].isspace():  # the indented headline-metrics line
        for part in following[0].split("|"):
            pair = METRIC_PAIR.search(part.strip())
            if pair is None:
                continue
            value = _number(pair.group("value"))
            name = pair.group("name")
            if name in ("frames", "step") and math.isfinite(value):
                summary[name] = int(value)
            else:
                summary[name] = value
    return summary


def read_metrics_csv(save_dir: Path) -> dict[str, float]:
    """The last logged ``step``, ``frames`` and ``episode_return`` in a run's ``metrics.csv``.

    Looks for ``<save_dir>/<name>/version_*/metrics.csv`` (the newest when there are
    several); returns an empty dict when there is none.

    Examples:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / "run" / "version_0").mkdir(parents=True)
        >>> _ = (d / "run" / "version_0" / "metrics.csv").write_text(
        ...     "episode_return,frames,loss,step\\n20.5,1256,,99\\n,,0.3,99\\n480.1,2048,,199\\n")
        >>> read_metrics_csv(d)
        {'step': 199.0, 'frames': 2048.0, 'episode_return': 480.1}
    """
    files = sorted(save_dir.glob("*/version_*/metrics.csv"), key=lambda p: p.stat().st_mtime)
    if not files:
        files = sorted(save_dir.glob("**/metrics.csv"), key=lambda p: p.stat().st_mtime)
    if not files:
        return {}
    found: dict[str, float] = {}
    with open(files[-1], newline="") as handle:
        for row in csv.DictReader(handle):
            for key in ("step", "frames", "episode_return"):
                value = (row.get(key) or "").strip()
                if value:
                    try:
                        found[key] = float(value)
                    except ValueError:
                        pass
    return found


# --------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------


def _command(task: Task, side: str, seed: int, save_dir: Path, cap: int | None) -> list[str]:
    if side == "sb3":
        script = ROOT / "benchmarks" / "sb3_anchor.py"
        return [
            sys.executable,
            str(script),
            "--seed",
            str(seed),
            "--max-steps",
            str(cap or 200_000),
        ]
    if side in REFERENCE_SIDES:
        command = [
            sys.executable,
            str(REFERENCE_SCRIPT),
            task.reference_agent,
            "--seed",
            str(seed),
            "--max-steps",
            str(cap or task.max_steps),
        ]
        if side == "template":
            command.append("--old-gym-done")
        return command
    command = [
        sys.executable,
        "train.py",
        "fit",
        "--config",
        {"ours_async": task.async_config, "ours_ray": task.ray_config}.get(side) or task.config,
        "--seed_everything",
        str(seed),
        f"--trainer.logger.init_args.save_dir={save_dir}",
    ]
    if cap is not None:
        command.append(f"--trainer.max_steps={cap}")
    return command


def run_one(
    task: Task,
    side: str,
    seed: int,
    *,
    cap: int | None,
    scratch: Path,
    timeout: float,
    log_dir: Path | None = None,
    extra_env: dict[str, str] | None = None,
    other_cpu: Callable[[], float] | None = None,
) -> RunResult:
    """Run one seed of one side in a fresh interpreter and read back where it got."""
    save_dir = scratch / f"{task.name}_{side}_seed{seed}"
    save_dir.mkdir(parents=True, exist_ok=True)
    command = _command(task, side, seed, save_dir, cap)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    cpu_before = _children_cpu() + (other_cpu() if other_cpu else 0.0)
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        returncode, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as expired:
        returncode = -9

        def text(data: str | bytes | None) -> str:
            return data.decode(errors="replace") if isinstance(data, bytes) else data or ""

        stdout, stderr = text(expired.stdout), text(expired.stderr)
    wall = time.perf_counter() - started
    cpu = _children_cpu() + (other_cpu() if other_cpu else 0.0) - cpu_before
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        log = log_dir / f"{task.name}_{side}_seed{seed}.log"
        log.write_text(
            f"$ {' '.join(command)}\n# exit {returncode}, {wall:.1f} s\n"
            f"## stdout\n{stdout}\n## stderr\n{stderr}"
        )

    result = RunResult(side, seed, returncode, wall, cpu=cpu)
    summary = parse_summary(stdout) or parse_summary(stderr)
    if summary:
        result.steps = summary.get("step")  # type: ignore[assignment]
        result.fit_seconds = summary.get("seconds")  # type: ignore[assignment]
        result.reason = summary.get("reason")  # type: ignore[assignment]
        result.reached = summary.get("reached")  # type: ignore[assignment]
        result.mean_return = summary.get("episode_return")  # type: ignore[assignment]
        result.frames = summary.get("frames")  # type: ignore[assignment]
    else:
        result.notes.append("no summary line")
    if side in OURS and (
        result.frames is None or result.steps is None or result.mean_return is None
    ):
        logged = read_metrics_csv(save_dir)
        if logged:
            result.notes.append("from metrics.csv")
        if result.frames is None and "frames" in logged:
            result.frames = int(logged["frames"])
        if result.steps is None and "step" in logged:
            result.steps = int(logged["step"]) + 1  # logged at the step's index, 0-based
        if result.mean_return is None and "episode_return" in logged:
            result.mean_return = logged["episode_return"]
        if result.reached is None and result.mean_return is not None and returncode == 0:
            result.reached = result.mean_return >= task.goal
    if returncode != 0:
        result.reached = False
        tail = (stderr or stdout).strip().splitlines()[-1:] or ["(no output)"]
        result.notes.append(f"exit {returncode}: {tail[0][:120]}")
    return result


# --------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------

HEADER = (
    "| run | seed | reached | return | frames | steps | wall (s) | fit (s) | steps/s "
    "| CPU s / 1k steps |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def _children_cpu() -> float:
    """User + system CPU of this script's finished subprocesses and what they waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _fmt(value: float | None, digits: int = 1, thousands: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if thousands:
        return f"{round(value):,}"
    return f"{value:,.{digits}f}"


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(present) if present else None


def _ratio(ours: float | None, reference: float | None) -> str:
    if ours is None or not reference:
        return "–"
    return f"**{ours / reference:.2f}×**"


def format_table(task: Task, results: list[RunResult]) -> str:
    """One task's markdown table: a row per run, medians per side, and ours / reference."""
    labels = {
        "template": f"{task.reference_label}, time limit terminal (as the template on old gym)",
        "reference": task.reference_label
        + (", time limit bootstrapped (gymnasium)" if task.reference_agent == "dqn" else ""),
        "sb3": "Stable-Baselines3 DQN, rl-zoo hyperparameters (stops on 10 greedy episodes)",
        "ours": f"ours (`{task.config}`)",
        "ours_async": f"ours, asynchronous (`{task.async_config}`)",
        "ours_ray": f"ours, Ray buffer, 2 DDP ranks (`{task.ray_config}`)",
    }
    rows = [f"### {task.name}: time to mean return ≥ {task.goal:g} over 10 episodes", "", HEADER]
    for r in sorted(results, key=lambda r: (SIDES.index(r.side), r.seed)):
        reached = {True: "yes", False: "no", None: "?"}[r.reached]
        if r.notes:
            reached += f" ({'; '.join(r.notes)})"
        rows.append(
            f"| {labels[r.side]} | {r.seed} | {reached} | {_fmt(r.mean_return)} "
            f"| {_fmt(r.frames, thousands=True)} | {_fmt(r.steps, thousands=True)} "
            f"| {_fmt(r.wall)} | {_fmt(r.fit_seconds)} | {_fmt(r.steps_per_s, 0)} "
            f"| {_fmt(r.cpu_per_1k_steps, 2)} |"
        )
    medians: dict[str, dict[str, float | None]] = {}
    for side in SIDES:
        mine = [r for r in results if r.side == side]
        if not mine:
            continue
        m = {
            "return": _median([r.mean_return for r in mine]),
            "frames": _median([r.frames for r in mine]),
            "steps": _median([r.steps for r in mine]),
            "wall": _median([r.wall for r in mine]),
            "fit": _median([r.fit_seconds for r in mine]),
            "rate": _median([r.steps_per_s for r in mine]),
            "cpu": _median([r.cpu_per_1k_steps for r in mine]),
        }
        medians[side] = m
        count = sum(bool(r.reached) for r in mine)
        rows.append(
            f"| **median**, {side} | – | {count}/{len(mine)} | {_fmt(m['return'])} "
            f"| {_fmt(m['frames'], thousands=True)} | {_fmt(m['steps'], thousands=True)} "
            f"| {_fmt(m['wall'])} | {_fmt(m['fit'])} | {_fmt(m['rate'], 0)} "
            f"| {_fmt(m['cpu'], 2)} |"
        )
    pairs = [(mine, side) for mine in ("ours", "ours_async") for side in REFERENCE_SIDES]
    for mine, side in [*pairs, ("ours_async", "ours"), ("ours_ray", "ours")]:
        if side not in medians or mine not in medians:
            continue
        ref, ours = medians[side], medians[mine]
        rows.append(
            f"| **{mine} / {side}** | – | – | – | {_ratio(ours['frames'], ref['frames'])} "
            f"| {_ratio(ours['steps'], ref['steps'])} | {_ratio(ours['wall'], ref['wall'])} "
            f"| {_ratio(ours['fit'], ref['fit'])} | {_ratio(ours['rate'], ref['rate'])} "
            f"| {_ratio(ours['cpu'], ref['cpu'])} |"
        )
    return "\n".join(rows)


def _load() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def main(argv: list[str] | None = None) -> str:
    """Run the comparison and print (and return) the markdown report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=[*TASKS, "both"], default="both")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--runs",
        nargs="+",
        choices=list(SIDES),
        default=list(SIDES),
        help="which sides to run (template: the reference DQN with the time limit terminal, "
        "as Lightning's template on old gym; CartPole only)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="cap every run at a few hundred steps (a smoke run, not a result)",
    )
    parser.add_argument(
        "--max-steps", type=int, default=None, help="cap every run at this many gradient steps"
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    parser.add_argument(
        "--log-dir", type=Path, default=None, help="keep each run's full output here"
    )
    args = parser.parse_args(argv)

    tasks = list(TASKS.values()) if args.task == "both" else [TASKS[args.task]]
    load_before = _load()
    scratch = Path(tempfile.mkdtemp(prefix="time_to_goal_"))
    sections = []
    try:
        for task in tasks:
            cap = args.max_steps or (task.quick_steps if args.quick else None)
            results = []
            # Seed by seed, the sides back to back: a change in machine load between phases
            # would otherwise favour one side.
            sides = [
                side
                for side in SIDES
                if side in args.runs
                and not (side in ("template", "sb3") and task.reference_agent != "dqn")
                and not (side == "ours_async" and task.async_config is None)
                and not (side == "ours_ray" and task.ray_config is None)
            ]
            stack = ExitStack()
            head = None
            if "ours_ray" in sides:
                from ray_head import private_ray_head

                head = stack.enter_context(private_ray_head())
            for seed in args.seeds:
                for side in sides:
                    print(f"[{task.name}] {side} seed {seed} ...", file=sys.stderr, flush=True)
                    ray = side == "ours_ray" and head is not None
                    result = run_one(
                        task,
                        side,
                        seed,
                        cap=cap,
                        scratch=scratch,
                        timeout=args.timeout,
                        log_dir=args.log_dir,
                        extra_env=head.env if ray and head else None,
                        other_cpu=head.cpu_seconds if ray and head else None,
                    )
                    print(
                        f"[{task.name}] {side} seed {seed}: reached={result.reached} "
                        f"steps={result.steps} frames={result.frames} wall={result.wall:.1f}s",
                        file=sys.stderr,
                        flush=True,
                    )
                    results.append(result)
            stack.close()
            sections.append(format_table(task, results))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    machine = (
        f"{platform.machine()}, {os.cpu_count()} logical CPUs, Python "
        f"{platform.python_version()}; load average (1, 5, 15 min) "
        f"before: {load_before}, after: {_load()}"
    )
    note = " `--quick`: capped runs, not a result." if args.quick else ""

    report = "\n\n".join(sections) + f"\n\n{machine}.{note}\n"
    print(report, flush=True)
    return report


if __name__ == "__main__":
    main()
