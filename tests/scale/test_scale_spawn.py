"""``strategy="ddp_spawn"`` and ``"ddp_notebook"`` (2 CPU ranks) with a prioritized buffer.

Both start their ranks from this process's objects (pickled or forked), not by re-running
the script: each rank must get its own copy of the buffer, sample its own batches, update
its own priorities, and resume exactly from its own saved buffer.
"""

from __future__ import annotations

import json

import pytest
from script_runs import finish_script, rank_results, start_script

TIMEOUT_S = 240


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    dirs = {name: tmp_path_factory.mktemp(name) for name in ("spawn", "notebook", "resumed")}
    started = {
        "spawn": start_script("ddp_spawn_run.py", dirs["spawn"], "ddp_spawn", 4),
        "notebook": start_script("ddp_spawn_run.py", dirs["notebook"], "ddp_notebook", 4),
    }
    for proc in started.values():
        finish_script(proc, TIMEOUT_S)
    step2 = dirs["spawn"] / "ckpt" / "epoch=0-step=2.ckpt"
    finish_script(
        start_script("ddp_spawn_run.py", dirs["resumed"], "ddp_spawn", 4, step2), TIMEOUT_S
    )
    return {
        name: {
            "ranks": rank_results(out),
            "launcher": json.loads((out / "launcher.json").read_text()),
        }
        for name, out in dirs.items()
    }


@pytest.mark.parametrize("strategy", ["spawn", "notebook"])
def test_each_rank_samples_and_prioritizes_its_own_copy(runs, strategy):
    rank0, rank1 = runs[strategy]["ranks"]
    assert (rank0["world_size"], rank0["global_step"], rank1["global_step"]) == (2, 4, 4)
    shared = {tuple(b) for b in rank0["ids"]} & {tuple(b) for b in rank1["ids"]}
    assert not shared, "two ranks drew the same batch"
    launcher = runs[strategy]["launcher"]
    for rank in (rank0, rank1):
        assert rank["priority_total"] != pytest.approx(launcher["before"])  # updated there
    assert launcher["after"] == launcher["before"]  # the launching process's buffer: untouched


def test_a_spawned_run_resumes_each_rank_exactly(runs):
    straight, resumed = runs["spawn"]["ranks"], runs["resumed"]["ranks"]
    for rank in (0, 1):
        assert resumed[rank]["ids"] == straight[rank]["ids"][2:]
        assert resumed[rank]["priority_total"] == pytest.approx(straight[rank]["priority_total"])
