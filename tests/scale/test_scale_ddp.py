"""Real DDP (2 CPU ranks, gloo) over local per-rank buffers, run as a script in a subprocess.

Lightning's DDP launcher re-runs the launching script for every rank, so the runs live in
``scripts/ddp_local.py``; each rank writes what it drew to a JSON file checked here.
"""

from __future__ import annotations

import pytest
from script_runs import finish_script, rank_results, start_script

TIMEOUT_S = 240  # a rank stuck in a collective (epoch length mismatch) ends the run here


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory) -> dict[str, list[dict]]:
    # Both runs at once: most of their time is process start-up, which overlaps well.
    dirs = {mode: tmp_path_factory.mktemp(mode) for mode in ("same", "uneven", "without")}
    runs = {mode: start_script("ddp_local.py", out_dir, mode) for mode, out_dir in dirs.items()}
    results = {}
    for mode, proc in runs.items():
        finish_script(proc, TIMEOUT_S)
        results[mode] = rank_results(dirs[mode])
    return results


def test_each_rank_draws_its_own_stream_and_limit_counts_per_rank(ddp_runs):
    rank0, rank1 = ddp_runs["same"]
    assert (rank0["rank"], rank1["rank"], rank0["world_size"]) == (0, 1, 2)
    # limit_train_batches=3, max_epochs=2: 6 batches on *each* rank, as Lightning counts.
    for rank in (rank0, rank1):
        assert rank["global_step"] == 6
        assert rank["batches_served"] == 6
        assert len(rank["ids"]) == 6
    # Identical buffers and the same global seed on both ranks: only rank-aware
    # seeding makes their batches differ.
    shared = {tuple(b) for b in rank0["ids"]} & {tuple(b) for b in rank1["ids"]}
    assert not shared, "two ranks drew the same batch"


def test_uneven_local_buffers_get_one_epoch_length_on_all_ranks(ddp_runs):
    rank0, rank1 = ddp_runs["uneven"]
    # Local buffers of 100 and 160 items, batch 10: "auto" would be 10 and 16 batches;
    # all ranks agree on the smaller, so the run ends instead of hanging in a collective.
    for rank in (rank0, rank1):
        assert rank["global_step"] == 20
        assert rank["batches_served"] == 20
    assert max(max(b) for b in rank0["ids"]) < 100
    assert max(max(b) for b in rank1["ids"]) >= 100, "rank 1 samples its own, larger buffer"


def test_ranks_sharing_a_buffer_draw_each_item_once_per_epoch(ddp_runs):
    # Without replacement, the ranks deal out one order of their (identical) buffers: per
    # epoch, the 200 items exactly once between them (before, each rank permuted its own).
    rank0, rank1 = ddp_runs["without"]
    for epoch in range(2):
        drawn = [
            i for r in (rank0, rank1) for b in r["ids"][epoch * 10 : epoch * 10 + 10] for i in b
        ]
        assert sorted(drawn) == list(range(200)), f"epoch {epoch}"
