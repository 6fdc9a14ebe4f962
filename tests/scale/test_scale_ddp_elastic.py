"""DDP resumed on another number of ranks: every saved item, with its priority, on one rank.

Real gloo DDP on CPU (scripts/ddp_elastic.py), a prioritized buffer per rank. A run on 2
ranks saves at step 4; it is resumed on 3 ranks (which save at step 8) and on 1 rank; the
3-rank checkpoint is resumed on 2 ranks. After each resume the new ranks together hold
exactly the items the saved ranks held, each once, with the saved priority-tree value,
spread evenly. Through ``train.py``: a run on 2 ranks resumed on 1 whose buffer is too small
stops with one paragraph and exit code 2, and the fix it names works.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from script_runs import finish_script, rank_results, run_train_py, start_script

from rb_lightning.buffers.reader import read_torch_file
from rb_lightning.persist.record import find_record


def _start(out_dir: Path, world_size: int, tag: int, steps: int, ckpt: Path | None = None):
    args = (out_dir, world_size, tag, steps, *([ckpt] if ckpt else []))
    return start_script("ddp_elastic.py", *args), out_dir, world_size


def _finish(started) -> list[dict]:
    proc, out_dir, world_size = started
    finish_script(proc)
    return rank_results(out_dir, world_size)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[dict]]:
    dirs = {name: tmp_path_factory.mktemp(name) for name in ("on2", "on3", "on1", "back_on2")}
    results = {"on2": _finish(_start(dirs["on2"], 2, 1, 4))}
    saved_on2 = dirs["on2"] / "ckpt" / "last.ckpt"
    on3 = _start(dirs["on3"], 3, 2, 8, saved_on2)
    on1 = _start(dirs["on1"], 1, 4, 6, saved_on2)
    results["on3"], results["on1"] = _finish(on3), _finish(on1)
    saved_on3 = dirs["on3"] / "ckpt" / "last.ckpt"
    results["back_on2"] = _finish(_start(dirs["back_on2"], 2, 3, 10, saved_on3))
    return results


def _check_redistributed(saved: list[dict], resumed: list[dict], step: int) -> None:
    priority = {}
    for rank in saved:
        priority.update(zip(rank["final"]["ids"], rank["final"]["tree"], strict=True))
    held = [i for rank in resumed for i in rank["start"]["ids"]]
    duplicated = [i for i, n in Counter(held).items() if n > 1]
    assert not duplicated, f"held by more than one rank: {duplicated[:5]}"
    assert sorted(held) == sorted(priority), "items lost or added by the resume"
    sizes = [len(rank["start"]["ids"]) for rank in resumed]
    assert max(sizes) - min(sizes) <= 1, sizes
    for rank in resumed:
        assert rank["start_step"] == step
        restored = dict(zip(rank["start"]["ids"], rank["start"]["tree"], strict=True))
        assert restored == {i: priority[i] for i in restored}, "a priority changed"


def test_two_ranks_resumed_on_three(runs):
    _check_redistributed(runs["on2"], runs["on3"], step=4)
    assert [rank["global_step"] for rank in runs["on3"]] == [8, 8, 8]
    draws = [rank["seen"] for rank in runs["on3"]]
    assert len({json.dumps(d) for d in draws}) == 3, "two ranks drew the same batches"


def test_three_ranks_resumed_on_two(runs):
    _check_redistributed(runs["on3"], runs["back_on2"], step=8)
    assert [rank["global_step"] for rank in runs["back_on2"]] == [10, 10]


def test_two_ranks_resumed_on_one(runs):
    _check_redistributed(runs["on2"], runs["on1"], step=4)
    (only,) = runs["on1"]
    assert only["global_step"] == 6 and len(only["start"]["ids"]) == 20 + 25 + 2 * 2 * 4


def test_train_py_run_on_two_ranks_resumed_on_one(tmp_path):
    config = {
        "seed_everything": 0,
        "trainer": {
            "max_steps": 2,
            "accelerator": "cpu",
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "logger": {
                "class_path": "rb_lightning.runs.RunLogger",
                "init_args": {"save_dir": "runs", "name": "toy"},
            },
            "callbacks": [{"class_path": "rb_lightning.runs.FinalLastCheckpoint"}],
        },
        "model": {"class_path": "cli_toy.Regressor"},
        "data": {
            "class_path": "rb_lightning.ReplayBufferDataModule",
            "init_args": {
                "batch_size": 8,
                "num_batches": None,
                "replay_buffer": {
                    "class_path": "torchrl.data.ReplayBuffer",
                    "init_args": {
                        "storage": {
                            "class_path": "torchrl.data.LazyTensorStorage",
                            "init_args": {"max_size": 100},
                        }
                    },
                },
                "source": {  # 64 items on every rank
                    "class_path": "rb_lightning.sources.CallSource",
                    "init_args": {"function": "cli_toy:fill_regression"},
                },
            },
        },
    }
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump(config))
    saved = run_train_py(
        ["fit", "--config", "toy.yaml", "--trainer.strategy=ddp", "--trainer.devices=2"], tmp_path
    )
    assert saved.returncode == 0, saved.stderr[-3000:]

    resume = ["fit", "--config", "toy.yaml", "--trainer.devices=1", "--trainer.max_steps=4"]
    short = run_train_py([*resume, "--ckpt_path=last"], tmp_path)
    assert short.returncode == 2 and "Traceback" not in short.stderr, short.stderr[-3000:]
    message = short.stderr.strip().splitlines()[-1]
    assert message.startswith(
        "error: The checkpoint holds 128 replay-buffer items saved by 2 process(es) (64, 64)"
    ), message
    assert "max_size of at least 128" in message and "data.init_args.resume_keep: newest" in message

    kept = run_train_py(
        [*resume, "--ckpt_path=last", "--data.init_args.resume_keep=newest"], tmp_path
    )
    assert kept.returncode == 0, kept.stderr[-3000:]
    assert "fit stopped at step 4" in kept.stdout + kept.stderr
    last = tmp_path / "runs" / "toy" / "version_0" / "checkpoints" / "last.ckpt"
    assert find_record(read_torch_file(last)).len == 100
