"""Shipped configs by name through the ``rb-lightning`` console script, from a folder that is not
the repository: ``rb-lightning fit --config cartpole_dqn``, ``rb-lightning configs``.

(``.ci/run`` runs the same from an installed wheel; here the console script of the
development install runs this checkout's package.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from cli_helpers import REPO

from rb_lightning.runs import shipped_configs
from rb_lightning.runs.cli import main

CONSOLE_SCRIPT = Path(sys.executable).parent / "rb-lightning"
SHIPPED = sorted(p.stem for p in (REPO / "configs").glob("*.yaml"))
README = (REPO / "README.md").read_text()


def _rb_lightning(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    assert CONSOLE_SCRIPT.is_file(), "the install (pip install -e .) makes the rb-lightning script"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RB_LIGHTNING_DEBUG", None)
    return subprocess.run(
        [str(CONSOLE_SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_a_shipped_config_runs_by_name_from_any_folder_and_resumes_by_name(tmp_path):
    pytest.importorskip("gymnasium")
    quiet = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]

    fit = _rb_lightning("fit", "--config", "cartpole_dqn", "--trainer.max_steps=20", *quiet,
                        cwd=tmp_path)  # fmt: skip
    assert fit.returncode == 0, fit.stdout[-2000:] + fit.stderr[-3000:]
    assert "fit stopped at step 20" in fit.stdout
    # The config's runs/ is relative to the folder the command runs in, as in a clone.
    checkpoint = tmp_path / "runs" / "cartpole_dqn" / "version_0" / "checkpoints" / "last.ckpt"
    assert checkpoint.is_file()

    test = _rb_lightning("test", "--config", "cartpole_dqn.yaml", "--ckpt_path", "last", *quiet,
                         cwd=tmp_path)  # fmt: skip
    assert test.returncode == 0, test.stdout[-2000:] + test.stderr[-3000:]
    assert "test: the model of runs/cartpole_dqn/version_0/checkpoints/last.ckpt (step 20)" in (
        test.stdout + test.stderr
    )
    assert "test_return" in test.stdout


def test_an_unknown_name_lists_the_shipped_ones_in_one_paragraph(tmp_path):
    result = _rb_lightning("validate", "--config", "cartpole_dqnn", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    paragraph = result.stderr.strip()
    assert "\n" not in paragraph
    assert paragraph.startswith("error: 'cartpole_dqnn' is neither a file nor the name of a")
    assert "Did you mean 'cartpole_dqn'?" in paragraph
    assert f"Shipped configs: {', '.join(SHIPPED)} (`rb-lightning configs`" in paragraph
    assert "(argument: --config)" in paragraph
    # docs/cli.md quotes this paragraph: it must be what the command says today.
    assert f"\n{paragraph}\n" in (REPO / "docs" / "cli.md").read_text()


def test_configs_lists_every_shipped_config_with_what_it_trains(tmp_path):
    result = _rb_lightning("configs", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "Shipped configs (run one: rb-lightning fit --config NAME):"
    listed = {line.split()[0]: line.split(None, 1)[1] for line in lines[1:-1]}
    assert sorted(listed) == SHIPPED
    for name, summary in listed.items():
        header = (REPO / "configs" / f"{name}.yaml").read_text().splitlines()[0]
        assert header == f"# {summary}"
        assert summary.endswith("."), f"{name}: a summary is a whole sentence, not cut: {summary!r}"
    # The main job is the README's first command's config; the synchronous one says it is not.
    quickstart = re.search(r"python train.py fit --config configs/(\w+)\.yaml", README).group(1)
    assert listed[quickstart].startswith("The main job")
    assert [name for name, summary in listed.items() if "main job" in summary] == [
        "cartpole_dqn", quickstart
    ]  # fmt: skip
    assert listed["cartpole_dqn"].startswith("The synchronous main job")
    assert f"Folder: {REPO / 'configs'}" in lines[-1]


def test_copy_writes_the_shipped_file_and_never_overwrites(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shipped_configs.main(["--copy", "llm_sft"])
    original = (REPO / "configs" / "llm_sft.yaml").read_text()
    assert (tmp_path / "llm_sft.yaml").read_text() == original
    (tmp_path / "mine").mkdir()
    shipped_configs.main(["--copy", "llm_sft.yaml", "mine"])
    assert (tmp_path / "mine" / "llm_sft.yaml").read_text() == original
    out = capsys.readouterr().out
    assert "run it: rb-lightning fit --config mine/llm_sft.yaml" in out

    (tmp_path / "mine.yaml").write_text("edited")
    for args, argument, fix in (
        (["--copy", "llm_sft", "mine.yaml"], "--copy", "already exists; nothing was copied"),
        (["--copy", "llm_sf"], "--copy", "Did you mean 'llm_sft'?"),
    ):
        with pytest.raises(SystemExit) as stop:
            shipped_configs.main(args)
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and fix in err and f"(argument: {argument})" in err
    assert (tmp_path / "mine.yaml").read_text() == "edited"


def test_a_users_own_file_of_a_shipped_name_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cartpole_dqn").write_text("trainer: {max_steps: 1}\n")
    assert shipped_configs.resolve_config_args(["fit", "-c", "cartpole_dqn"]) == [
        "fit", "-c", "cartpole_dqn"
    ]  # fmt: skip
    assert shipped_configs.resolve_config_args(["fit", "-c=llm_sft"]) == [
        "fit", f"-c={REPO / 'configs' / 'llm_sft.yaml'}"
    ]  # fmt: skip


def test_the_commands_a_run_tells_name_the_config_as_typed(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RB_LIGHTNING_DEBUG", raising=False)
    for program, expected in (
        ("/venv/bin/rb-lightning", "(rb-lightning fit --config cartpole_dqn)"),
        ("train.py", "(python train.py fit --config cartpole_dqn)"),
    ):
        with mock.patch.object(sys, "argv", [program]), pytest.raises(SystemExit) as stop:
            main(["validate", "--config", "cartpole_dqn", "--ckpt_path", "last"])
        assert stop.value.code == 2
        assert expected in capsys.readouterr().err
