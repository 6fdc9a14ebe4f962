"""``fit``, then ``validate`` and ``test`` from the checkpoint it wrote, for every shipped config.

Run as a user types it: ``python train.py <subcommand> --config configs/<run>.yaml``, with its
progress bar; every line of the output is held to the allow-list of ``tests/run_output.py``,
and so is the output of the helper scripts the configs' headers name (``make_offline_buffer``,
``make_cartpole_demos``). (``cartpole_dqn_ray.yaml`` needs a running Ray cluster: tests/scale
runs it.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from run_output import unexpected_lines

REPO = Path(__file__).resolve().parents[2]
# tests/ too: the fits run with invariants.OptimizerOnlyMoves, as a user adds a callback.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
ENV.pop("PYTHONWARNINGS", None)  # a user's environment has no filter set

# Per config: what makes fit short, and the metrics validate/test print.
CONFIGS = {
    "cartpole_dqn": (["--trainer.max_steps=20"], ["val_return"], ["test_return"]),
    "pendulum_sac": (["--trainer.max_steps=20"], ["val_return"], ["test_return"]),
    # validate/test of the asynchronous twins are their synchronous configs' (same model).
    # 100 steps: a weight sync that wrote stale weights into the learner did so every ~32.
    "cartpole_dqn_async": (["--trainer.max_steps=100"], [], []),
    "pendulum_sac_async": (["--trainer.max_steps=100"], [], []),
    "llm_sft": (
        ["--trainer.max_steps=3"],
        ["val_loss", "val_accuracy"],
        ["test_loss", "test_accuracy"],
    ),
    # 10 steps: GRPO logs every 10th (log_every_n_steps), and the summary shows those values.
    "llm_grpo": (["--trainer.max_steps=10"], ["val_accuracy"], ["test_accuracy"]),
    "offline_from_disk": (["--trainer.max_steps=3"], ["val_loss"], ["test_loss"]),
}
RL = ("cartpole_dqn", "pendulum_sac")


def _run(command: list[str], cwd: Path, env: dict[str, str] = ENV) -> str:
    """Run ``command`` as a user would; its output, after checking the exit code and the lines."""
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    assert unexpected_lines(out) == [], f"{' '.join(command[1:4])}: lines a user does not need"
    return result.stdout


def _train(args: list[str], cwd: Path) -> str:
    return _run([sys.executable, str(REPO / "train.py"), *args], cwd)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fit_then_validate_and_test_from_its_checkpoint(name, tmp_path):
    pytest.importorskip("transformers" if name.startswith(("llm", "offline")) else "gymnasium")
    fit_args, val_metrics, test_metrics = CONFIGS[name]
    config = REPO / "configs" / f"{name}.yaml"
    common = ["--config", str(config), f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}"]
    if name == "offline_from_disk":
        helper = [sys.executable, "-m", "rb_lightning.llm.make_offline_buffer", "buffer"]
        assert "saved 4096 items" in _run(helper, tmp_path)
        common.append(f"--data.init_args.source.init_args.path={tmp_path / 'buffer'}")

    # Every step starts from the weights its optimizer produced (tests/invariants.py).
    report = tmp_path / "invariants.json"
    fit = _run(
        [sys.executable, str(REPO / "train.py"), "fit", *common, *fit_args,
         "--trainer.callbacks+=invariants.OptimizerOnlyMoves"],
        tmp_path,
        env={**ENV, "RB_INVARIANT_REPORT": str(report)},
    )  # fmt: skip
    assert "fit stopped at step" in fit
    checked = json.loads(report.read_text())
    max_steps = int(fit_args[0].split("=")[1])
    assert checked == {"steps_checked": max_steps - 1, "moved_at": []}
    run_dir = tmp_path / "runs" / name / "version_0"
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    assert checkpoint.is_file()
    if name == "llm_grpo":  # a GRPO loss is ~0 by construction: the summary shows the reward
        headline = fit.split("fit stopped at step", 1)[1].splitlines()[1]
        assert "reward_mean" in headline and "train_loss" not in headline, headline
    # The header's "Each fit writes runs/<dir>/version_<N>/" is where fit wrote.
    header = config.read_text().split("\nseed_everything", 1)[0]
    for named in re.findall(r"writes runs/(\w+)/version_<N>", header):
        assert (tmp_path / "runs" / named / "version_0").is_dir(), f"the header names {named}"

    if not val_metrics:
        return
    shown = {}
    for subcommand, metrics in (("validate", val_metrics), ("test", test_metrics)):
        out = _train([subcommand, *common, "--ckpt_path", str(checkpoint)], tmp_path)
        for metric in metrics:
            assert metric in out  # Lightning's results table
        shown[subcommand] = out
    if name in RL:  # validate and test play other episodes, and say which
        assert (
            "validate: 10 episodes without exploration, environment seeds 1,000,000-"
            in (shown["validate"])
        )
        assert (
            "test: 10 episodes without exploration, environment seeds 2,000,000-" in (shown["test"])
        )
    if name == "cartpole_dqn":  # the demonstrations helper the offline-to-online config names
        demos = [
            sys.executable, "-m", "rb_lightning.rl.make_cartpole_demos", "demos",
            "--checkpoint", str(checkpoint), "--frames", "64", "--capacity", "64",
        ]  # fmt: skip
        assert "saved 64 transitions" in _run(demos, tmp_path)
    # validate/test start no run directory of their own.
    assert sorted(p.name for p in (tmp_path / "runs" / name).iterdir()) == ["version_0"]


def test_every_shipped_config_runs_torch_on_one_thread():
    # Two threads collapse when another process holds one of two cores (Pendulum SAC: 2.6 it/s
    # against 31 on one thread); the shipped models are too small to gain from a second.
    for config in sorted((REPO / "configs").glob("*.yaml")):
        callbacks = yaml.safe_load(config.read_text())["trainer"]["callbacks"]
        threads = [
            cb.get("init_args", {}).get("num_threads", 1)
            for cb in callbacks
            if cb["class_path"] == "rb_lightning.rl.TorchThreads"
        ]
        assert threads == [1], f"{config.name}: TorchThreads num_threads {threads}, not [1]"


def test_what_the_docs_commands_write_is_ignored_by_git():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    # README's wheel (dist/), docs/trl.md's exports (sft_data/, transitions/), runs/.
    paths = ["dist/rb_lightning-0.1.0-py3-none-any.whl", "sft_data/x", "transitions/x", "runs/x"]
    result = subprocess.run(
        ["git", "check-ignore", *paths], cwd=REPO, capture_output=True, text=True
    )
    assert result.stdout.split() == paths, result.stdout + result.stderr
