"""Where a step of the Ray config goes: the same DQN job five ways, CPU per step by process.

Runs ``--steps`` training steps (no goal: the greedy check never triggers before the
cap on these seeds) of each variant back to back, against one private Ray head
(benchmarks/ray_head.py), and samples every process's CPU time twice a second:

============== =========================================================================
variant        what runs
============== =========================================================================
one process    ``configs/cartpole_dqn.yaml``: the single-process job (the baseline)
DDP, local     the same on 2 DDP ranks, each with its own local buffer (DDP's cost alone)
Ray, 1 rank    ``configs/cartpole_dqn_ray.yaml`` on one rank (the Ray buffer's cost alone)
Ray, 2 ranks   ``configs/cartpole_dqn_ray.yaml`` as shipped
Ray, 2, quiet  as shipped, the actor's calls not reported to Ray's GCS as task events
============== =========================================================================

Columns: steps/s of the training loop (per rank: ranks step together), then CPU
milliseconds per step of each group of processes: the trainer ranks, the buffer
actor, Ray's ``gcs_server``, and the rest of Ray (raylet, agents, idle workers).

    python benchmarks/ray_overhead.py              # ~4 minutes on 2 cores
    python benchmarks/ray_overhead.py --steps 1000
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
from collections import defaultdict
from pathlib import Path

import psutil
from ray_head import private_ray_head

ROOT = Path(__file__).resolve().parents[1]
# The config's remote_config with task events off (a dict argument: the whole dict is given).
QUIET = (
    "--data.init_args.replay_buffer.init_args.service_backend_options.remote_config="
    '{"name": "cartpole_dqn", "namespace": "rb_lightning", "get_if_exists": true, '
    '"num_cpus": 0, "enable_task_events": false}'
)
VARIANTS = {
    "one process": ["--config", "configs/cartpole_dqn.yaml"],
    "DDP, local": ["--config", "configs/cartpole_dqn.yaml", "--trainer.strategy=ddp",
                   "--trainer.devices=2", "--trainer.accelerator=cpu"],
    "Ray, 1 rank": ["--config", "configs/cartpole_dqn_ray.yaml", "--trainer.strategy=auto",
                    "--trainer.devices=1"],
    "Ray, 2 ranks": ["--config", "configs/cartpole_dqn_ray.yaml"],
    "Ray, 2, quiet": ["--config", "configs/cartpole_dqn_ray.yaml", QUIET],
}  # fmt: skip


def _group(proc: psutil.Process, run_pids: set[int]) -> str:
    if proc.pid in run_pids:
        return "ranks"
    name = " ".join(proc.cmdline()[:1]) or proc.name()
    if "TensorDictReplayBuffer" in proc.name() or "TensorDictReplayBuffer" in name:
        return "actor"
    if "gcs_server" in name:
        return "gcs"
    return "other Ray"


class CpuSampler:
    """Every process's last-seen CPU time (user + system), by group, of a run and the head."""

    def __init__(self, run: psutil.Process, head: psutil.Process) -> None:
        self.run, self.head = run, head
        self.cpu: dict[int, tuple[str, float]] = {}

    def look(self) -> None:
        run_pids = {self.run.pid}
        for root in (self.run, self.head):
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            if root is self.run:
                run_pids |= {p.pid for p in procs}
            for proc in procs:
                try:
                    t = proc.cpu_times()
                    self.cpu[proc.pid] = (_group(proc, run_pids), t.user + t.system)
                except psutil.Error:
                    pass

    def totals(self, before: dict[int, tuple[str, float]]) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for pid, (group, seconds) in self.cpu.items():
            out[group] += seconds - before.get(pid, (group, 0.0))[1]
        return out


def measure(args: list[str], steps: int, head_env: dict[str, str], head_pid: int) -> dict:
    save = tempfile.mkdtemp(prefix="ray_overhead_")
    command = [sys.executable, "train.py", "fit", *args, f"--trainer.max_steps={steps}",
               f"--trainer.logger.init_args.save_dir={save}", "--trainer.enable_progress_bar=false"]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=ROOT, env={**os.environ, **head_env}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    sampler = CpuSampler(psutil.Process(process.pid), psutil.Process(head_pid))
    sampler.look()
    before = dict(sampler.cpu)  # the head's processes' CPU before this run
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.5):
            sampler.look()

    watcher = threading.Thread(target=loop, daemon=True)
    watcher.start()
    output, _ = process.communicate()
    stop.set()
    watcher.join()
    found = re.search(r"fit stopped at step ([\d,]+) after ([\d.]+) s", output)
    if process.returncode != 0 or not found:
        raise RuntimeError(f"{' '.join(command)} failed:\n{output[-2000:]}")
    done_steps, seconds = int(found.group(1).replace(",", "")), float(found.group(2))
    cpu = sampler.totals(before)
    return {"rate": done_steps / seconds, **{k: 1000 * v / done_steps for k, v in cpu.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    options = parser.parse_args()
    rows = []
    with private_ray_head() as head:
        for name in options.variants:
            print(f"{name} ...", file=sys.stderr, flush=True)
            rows.append((name, measure(VARIANTS[name], options.steps, head.env, head.process.pid)))
    groups = ["ranks", "actor", "gcs", "other Ray"]
    print("| variant | steps/s (per rank) | CPU ms / step: " + " | ".join(groups) + " | total |")
    print("|---|---|" + "---|" * (len(groups) + 1))
    for name, m in rows:
        cells = [f"{m.get(g, 0.0):.2f}" for g in groups]
        total = sum(m.get(g, 0.0) for g in groups)
        print(f"| {name} | {m['rate']:,.0f} | " + " | ".join(cells) + f" | {total:.2f} |")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\n{platform.machine()}, {os.cpu_count()} logical CPUs; {options.steps:,} steps per "
          f"variant (start-up included in CPU); load average after: {load}")  # fmt: skip


if __name__ == "__main__":
    main()
