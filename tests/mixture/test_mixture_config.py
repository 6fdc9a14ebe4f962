"""The shipped offline-to-online config, run as a user runs it, and the collector's member."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mixture_helpers import items, member
from trainers import quiet_trainer

from rb_lightning import BufferMixture, ReplayBufferDataModule, UsageError

pytest.importorskip("gymnasium")

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "cartpole_dqn_offline_to_online.yaml"


def _make_demos(path: Path, frames: int) -> None:
    from rb_lightning.rl.make_cartpole_demos import make_cartpole_demos

    make_cartpole_demos(path, frames=frames, capacity=10_000, num_envs=4)


def _train(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "fit",
            "--config",
            str(CONFIG),
            f"--trainer.logger.init_args.save_dir={cwd / 'runs'}",
            "--trainer.enable_progress_bar=false",
            *args,
        ],
        cwd=cwd,  # the config's offline path, runs/cartpole_demos, is relative to it
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_offline_to_online_config_runs_from_a_small_demo_dump(tmp_path):
    _make_demos(tmp_path / "runs" / "cartpole_demos", frames=256)
    fit = _train(tmp_path, "--trainer.max_steps=20")
    assert fit.returncode == 0, fit.stdout[-2000:] + fit.stderr[-3000:]
    assert "fit stopped at step 20" in fit.stdout
    assert "max_steps=20 reached" in fit.stdout
    run = tmp_path / "runs" / "cartpole_dqn_offline_to_online" / "version_0"
    assert (run / "checkpoints" / "last.ckpt").exists()


def test_missing_offline_directory_names_the_argument_and_the_script(tmp_path, capsys, monkeypatch):
    # train.py's own entry point, in this process (a subprocess would add ~10 s of imports).
    from rb_lightning.runs.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", str(CONFIG), "--trainer.max_steps=20"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    message = err.strip().splitlines()[-1]
    assert "data.init_args.source" in message and "sources.offline" in message
    assert "runs/cartpole_demos" in message and "no such directory" in message
    assert "python -m rb_lightning.rl.make_cartpole_demos" in message


def test_collector_writes_to_its_member_and_leaves_the_others(tmp_path):
    from rb_lightning.rl import DQN, OnlineCollector

    offline = member(False)
    offline.extend(
        items(50, 0)
        .update(
            {
                "observation": torch.zeros(50, 4),
                "action": torch.zeros(50, dtype=torch.long),
                ("next", "observation"): torch.zeros(50, 4),
                ("next", "reward"): torch.ones(50, 1),
                ("next", "terminated"): torch.zeros(50, 1, dtype=torch.bool),
            }
        )
        .exclude("id", "obs")
    )
    mix = BufferMixture({"offline": offline, "online": member(True)})
    keys = ["observation", "action", ("next", "observation"), ("next", "reward"),
            ("next", "terminated")]  # fmt: skip
    collector = OnlineCollector(
        "CartPole-v1",
        env_kwargs={"categorical_action_encoding": True},
        member="online",
        init_random_frames=32,
        frames_per_step=4,
        keys=keys,
        seed=0,
    )
    before = offline[:].clone()
    trainer = quiet_trainer(max_steps=5, callbacks=[collector])
    trainer.fit(
        DQN(observation_size=4, num_actions=2),
        datamodule=ReplayBufferDataModule(mix, batch_size=16, num_batches=None),
    )
    assert len(mix.member("online")) == 32 + 5 * 4
    assert len(offline) == 50 and (offline[:] == before).all()

    unnamed = OnlineCollector("CartPole-v1", init_random_frames=8)
    with pytest.raises(UsageError, match="member='online'") as err:
        quiet_trainer(max_steps=1, callbacks=[unnamed]).fit(
            DQN(observation_size=4, num_actions=2),
            datamodule=ReplayBufferDataModule(mix, batch_size=16, num_batches=None),
        )
    assert err.value.argument == "member"


def test_workers_with_the_mixture_config_end_in_one_paragraph(tmp_path, capsys, monkeypatch):
    from rb_lightning.runs.cli import main

    demos = member(False, capacity=10_000)
    demos.extend(items(4, 0))
    (tmp_path / "runs" / "cartpole_demos").mkdir(parents=True)
    demos.dumps(tmp_path / "runs" / "cartpole_demos")  # exists; never loaded (init fails first)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", str(CONFIG), "--data.init_args.num_workers=2"])
    assert stop.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert "num_workers=2" in message and "num_workers: 0" in message
