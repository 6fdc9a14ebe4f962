"""Each DDP rank collects its own experience (real DDP, 2 CPU ranks, gloo).

A collector's environment and exploration are seeded by (seed, rank): two ranks after the
same ``seed_everything(0)`` must not fill their buffers with the same frames (before, they
did, byte for byte: N ranks did the collecting of one).
"""

from __future__ import annotations

import pytest
from script_runs import finish_script, rank_results, start_script

pytest.importorskip("gymnasium")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_ranks_collect_different_experience(mode, tmp_path):
    finish_script(start_script("ddp_collectors.py", tmp_path, mode), 240)
    rank0, rank1 = rank_results(tmp_path)
    # The warm-up (random actions) and the policy's frames: neither may repeat across ranks.
    assert rank0["observations"][: 64 * 4] != rank1["observations"][: 64 * 4]
    assert rank0["actions"][:64] != rank1["actions"][:64]
    assert rank0["observations"][64 * 4 :] != rank1["observations"][64 * 4 :]


def test_a_goal_one_rank_sees_stops_every_rank_at_the_same_step(tmp_path):
    # Ranks collect their own episodes, so their training returns differ: StopAtGoal makes
    # every rank evaluate when one reaches the goal, and all stop together (a rank that
    # stopped alone would leave the other waiting in a collective until the timeout).
    finish_script(start_script("ddp_collectors.py", tmp_path, "goal"), 120)
    rank0, rank1 = rank_results(tmp_path)
    assert rank0["global_step"] == rank1["global_step"] == 10
