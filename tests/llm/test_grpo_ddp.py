"""GRPO under DDP (gloo, 2 CPU processes): each rank trains on whole groups of its own."""

from __future__ import annotations

from collections import Counter

import pytest
from grpo_probe import QUIET, probed_config, read_probe, train

from rb_lightning import to_hf_dataset

pytestmark = pytest.mark.hf


def test_each_rank_trains_on_whole_groups_it_generated_itself_and_ids_survive_a_resume_on_one(
    tmp_path,
):
    config = probed_config(tmp_path)
    done = train(
        ["fit", "--config", str(config), "--trainer.max_steps=3", "--trainer.strategy=ddp",
         "--trainer.devices=2", *QUIET],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ranks = [read_probe(tmp_path / "probe", rank) for rank in (0, 1)]
    for rank, rows in enumerate(ranks):
        assert [r["step"] for r in rows] == [0, 1, 2]
        for row in rows:
            groups = row["groups"]
            assert all(groups.count(g) == 8 for g in set(groups)), (rank, row)
            # Group ids (step * world_size + rank) * prompts + j: this rank's, this step's.
            first = (row["step"] * 2 + rank) * 8
            assert sorted(set(groups)) == list(range(first, first + 8))
            assert set(row["versions"]) == {row["step"]}
    for step in range(3):
        assert not set(ranks[0][step]["groups"]) & set(ranks[1][step]["groups"])
        # The ranks generated from different prompts (seeded by rank), not copies of one another.
        assert set(ranks[0][step]["prompts"]) != set(ranks[1][step]["prompts"])

    # Resumed on one rank: the new groups are numbered on from the ids the two ranks used,
    # so no id holds items of two groups (before: (step * world + rank) * prompts collided
    # with stored ids, and each such id held 16 items, never drawn as a group of 8).
    done = train(
        ["fit", "--config", str(config), "--trainer.max_steps=5", "--ckpt_path=last", *QUIET],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    before = {g for rows in ranks for row in rows for g in row["groups"]}
    resumed = read_probe(tmp_path / "probe", 0)[3:]
    assert [r["step"] for r in resumed] == [3, 4]
    for row in resumed:
        assert all(row["groups"].count(g) == 8 for g in set(row["groups"]))
        assert set(row["versions"]) == {row["step"]}
        assert not set(row["groups"]) & before
    checkpoint = tmp_path / "runs" / "llm_grpo" / "version_0" / "checkpoints" / "last.ckpt"
    stored = to_hf_dataset(checkpoint, streaming=False, keys=["group"])["group"]
    assert set(Counter(stored).values()) == {8}
