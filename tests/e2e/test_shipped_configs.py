"""``fit``, then ``validate`` and ``test`` from the checkpoint it wrote, for every shipped config.

Run as a user types it: ``python train.py <subcommand> --config configs/<run>.yaml``.
(``cartpole_dqn_ray.yaml`` needs a running Ray cluster: tests/scale runs it.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Per config: what makes fit short, and the metric validate/test print.
CONFIGS = {
    "cartpole_dqn": (["--trainer.max_steps=20"], "val_return", "test_return"),
    "pendulum_sac": (["--trainer.max_steps=20"], "val_return", "test_return"),
    # validate/test of the asynchronous twins are their synchronous configs' (same model).
    "cartpole_dqn_async": (["--trainer.max_steps=20"], None, None),
    "pendulum_sac_async": (["--trainer.max_steps=20"], None, None),
    "llm_sft": (["--trainer.max_steps=3"], "val_loss", "test_loss"),
    "llm_grpo": (["--trainer.max_steps=3"], "val_accuracy", "test_accuracy"),
    "offline_from_disk": (["--trainer.max_steps=3"], "val_loss", "test_loss"),
}


def _train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fit_then_validate_and_test_from_its_checkpoint(name, tmp_path):
    pytest.importorskip("transformers" if name.startswith(("llm", "offline")) else "gymnasium")
    fit_args, val_metric, test_metric = CONFIGS[name]
    common = [
        "--config",
        str(REPO / "configs" / f"{name}.yaml"),
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        "--trainer.enable_progress_bar=false",
    ]
    if name == "offline_from_disk":
        subprocess.run(
            [sys.executable, "-m", "rb_lightning.llm.make_offline_buffer", "buffer"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            check=True,
            capture_output=True,
        )
        common.append(f"--data.init_args.source.init_args.path={tmp_path / 'buffer'}")

    fit = _train(["fit", *common, *fit_args], tmp_path)
    assert fit.returncode == 0, fit.stdout[-2000:] + fit.stderr[-3000:]
    assert "fit stopped at step" in fit.stdout
    checkpoint = tmp_path / "runs" / name / "version_0" / "checkpoints" / "last.ckpt"
    assert checkpoint.is_file()

    if val_metric is None:
        return
    for subcommand, metric in (("validate", val_metric), ("test", test_metric)):
        result = _train([subcommand, *common, "--ckpt_path", str(checkpoint)], tmp_path)
        out = result.stdout + result.stderr
        assert result.returncode == 0, out[-3000:]
        assert "Traceback" not in out
        assert metric in result.stdout  # Lightning's results table
    # validate/test start no run directory of their own.
    assert sorted(p.name for p in (tmp_path / "runs" / name).iterdir()) == ["version_0"]
