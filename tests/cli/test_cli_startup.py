"""What ``rb-lightning`` and ``python train.py`` answer before importing torch.

``--help``, ``configs`` and a mistake in the files and keys typed are answered at
once (seconds sooner than after importing torch, Lightning and torchrl): each case
runs the entry point in a subprocess and checks what the user reads, the exit code,
and that ``torch`` was never imported.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import REPO
from console_scripts import command, entry_point
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningCLI

from rb_lightning.runs import preflight

SHIPPED = sorted(p.stem for p in (REPO / "configs").glob("*.yaml"))
# Says on stderr, at exit, whether torch had been imported.
_REPORT = (
    "import atexit, sys; "
    "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules, file=sys.stderr)); "
)


def _run(program: str, args: list[str], cwd: Path) -> tuple[int, str, str, bool]:
    """``program ARGS`` in ``cwd``: (exit code, stdout, stderr without the report, torch imported)."""
    if program == "rb-lightning":
        module, function = entry_point("rb-lightning")
        code = f"from {module} import {function} as main; sys.argv[0] = 'rb-lightning'; main()"
    else:
        train_py = str(REPO / "train.py")
        code = f"import runpy; sys.argv[0] = {train_py!r}; runpy.run_path(sys.argv[0], run_name='__main__')"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RB_LIGHTNING_DEBUG", None)
    result = subprocess.run(
        [sys.executable, "-c", _REPORT + code, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    *lines, report = result.stderr.rstrip("\n").split("\n")
    assert report.startswith("torch imported:"), result.stderr[-3000:]
    return result.returncode, result.stdout, "\n".join(lines), report.endswith("True")


@pytest.mark.parametrize("program", ["rb-lightning", "train.py"])
def test_help_and_configs_answer_without_torch(program, tmp_path):
    code, out, err, torch_imported = _run(program, ["--help"], tmp_path)
    assert (code, err, torch_imported) == (0, "", False)
    assert out.startswith("usage: ") and "{fit,validate,test,predict,configs}" in out
    assert "\n  configs    list the shipped configs" in out

    code, out, err, torch_imported = _run(program, ["configs"], tmp_path)
    assert (code, err, torch_imported) == (0, "", False)
    assert [line.split()[0] for line in out.splitlines()[1:-1]] == SHIPPED


# (what is typed, the files it names, what the one paragraph must say)
MISTAKES = {
    "no_config": (["fit"], {}, ["fit needs a config: --config NAME", "(argument: --config)"]),
    "no_subcommand": ([], {}, ["say what to do:", "fit --config NAME|FILE"]),
    "misspelt_subcommand": (["fitt"], {}, ["unknown subcommand 'fitt'", "Did you mean 'fit'?"]),
    "missing_file": (
        ["fit", "--config", "configs/nope.yaml"],
        {},
        [
            "config error at config: --config 'configs/nope.yaml': no such file",
            "rb-lightning configs",
        ],
    ),
    "misspelt_shipped_name": (
        ["validate", "--config", "cartpole_dqnn"],
        {},
        ["'cartpole_dqnn' is neither a file nor", "Did you mean 'cartpole_dqn'?"],
    ),
    "YAML_syntax": (
        ["fit", "--config", "run.yaml"],
        {"run.yaml": "data: [\n"},
        ["config error at config: the YAML does not parse:", '"run.yaml", line 2'],
    ),
    "misspelt_section_in_the_file": (
        ["fit", "--config", "run.yaml"],
        {"run.yaml": "trainr:\n  max_steps: 3\n"},
        ["config error at trainr: unknown key 'trainr' in run.yaml", "Did you mean 'trainer'?"],
    ),
    "misspelt_section_in_a_flag": (
        ["fit", "--config", "cartpole_dqn", "--trainr.max_steps=3"],
        {},
        ["config error at trainr.max_steps: unknown key 'trainr'", "Did you mean 'trainer'?"],
    ),
    "no_model": (
        ["fit", "--config", "run.yaml"],
        {"run.yaml": "trainer:\n  max_steps: 3\n"},
        ["config error at model: no model is given: run.yaml has no model: section"],
    ),
}


@pytest.mark.parametrize("program", ["rb-lightning", "train.py"])
@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_mistake_in_what_was_typed_is_one_paragraph_before_torch_is_imported(
    mistake, program, tmp_path
):
    args, files, expected = MISTAKES[mistake]
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    code, out, err, torch_imported = _run(program, args, tmp_path)
    assert code == 2, err[-3000:]
    assert out == "" and "\n" not in err.strip() and "Traceback" not in err
    assert err.startswith("error: ") and err.rstrip().endswith(
        "(set RB_LIGHTNING_DEBUG=1 for the traceback)"
    )
    for part in expected:
        assert part in err, f"{part!r} not in {err!r}"
    assert not torch_imported


def test_a_run_that_passes_the_checks_goes_on_to_the_cli(tmp_path):
    """A right command line is not refused: it reaches LightningCLI (here, its --help)."""
    code, out, err, torch_imported = _run("rb-lightning", ["fit", "--help"], tmp_path)
    assert code == 0, err[-3000:]
    assert "--trainer.max_steps" in out and torch_imported


@pytest.mark.parametrize("subcommand", preflight.SUBCOMMANDS)
def test_the_keys_known_without_lightning_are_lightning_clis(subcommand):
    """preflight's list of each subcommand's own keys is LightningCLI's (the Trainer method's)."""
    skipped = LightningCLI.subcommands()[subcommand]
    parameters = inspect.signature(getattr(Trainer, subcommand)).parameters
    assert set(preflight.SUBCOMMAND_KEYS[subcommand]) == set(parameters) - skipped - {"self"}
    assert set(preflight.SUBCOMMANDS) == set(LightningCLI.subcommands())


def test_configs_into_a_closed_pipe_ends_quietly(tmp_path):
    # `rb-lightning configs | head -1`: the reader is gone before the list is written.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [*command("rb-lightning"), "configs"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == 0
