"""``train.py fit --config configs/llm_grpo.yaml``: what a user types and reads."""

from __future__ import annotations

import os
import subprocess
from collections import Counter

import pytest
from console_scripts import command
from grpo_probe import QUIET, REPO, column, metrics, probed_config, read_probe, train

from rb_lightning import to_hf_dataset

pytestmark = pytest.mark.hf


def test_on_policy_run_trains_each_step_on_exactly_the_groups_it_generated(tmp_path):
    config = probed_config(tmp_path)
    done = train(["fit", "--config", str(config), "--trainer.max_steps=6", *QUIET], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "GRPO starts from scratch" in done.stderr
    # The message comes before anything the run itself prints (Lightning's seed and GPU lines only).
    before = done.stderr.split("GRPO starts from scratch")[0]
    assert "step" not in before and "Epoch" not in before
    rows = read_probe(tmp_path / "probe")
    assert [r["step"] for r in rows] == list(range(6))
    for row in rows:
        groups = row["groups"]
        # 8 whole groups of 8, all generated at this step, by this very policy version.
        assert len(groups) == 64
        assert sorted(set(groups)) == list(range(row["step"] * 8, row["step"] * 8 + 8))
        assert all(groups.count(g) == 8 for g in set(groups))
        assert set(row["versions"]) == {row["step"]}
    logged = metrics(tmp_path / "runs" / "llm_grpo" / "version_0")
    assert set(column(logged, "replay/staleness_mean").values()) == {0.0}
    # The importance ratio of an on-policy batch is 1: nothing is clipped.
    assert set(column(logged, "clip_fraction").values()) == {0.0}
    for name in ("reward_mean", "reward_std", "completion_length", "tokens_per_s"):
        assert len(column(logged, name)) == 6, name


def test_replay_trains_on_groups_of_the_last_max_staleness_versions(tmp_path):
    config = probed_config(tmp_path)
    sampler = "--data.init_args.replay_buffer.init_args.sampler.init_args.max_staleness=2"
    done = train(
        ["fit", "--config", str(config), "--trainer.max_steps=8", sampler,
         "--model.init_args.prompts_per_step=4", *QUIET],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = read_probe(tmp_path / "probe")
    stale = []
    for row in rows:
        ages = [row["step"] - v for v in row["versions"]]
        assert min(ages) >= 0 and max(ages) <= 2
        # Whole groups; the first steps hold fewer than 8 eligible groups, drawn again.
        assert all(row["groups"].count(g) % 8 == 0 for g in set(row["groups"]))
        assert len(set(row["groups"])) == min(8, 4 * (row["step"] + 1))
        stale.append(max(ages))
    assert max(stale) == 2  # older groups are replayed
    logged = metrics(tmp_path / "runs" / "llm_grpo" / "version_0")
    assert max(column(logged, "replay/staleness_mean").values()) > 0


def test_batch_size_not_a_multiple_of_the_group_size_is_one_paragraph_and_exit_2(tmp_path):
    # The shipped config, by name, through the console script.
    done = subprocess.run(
        [*command("rb-lightning"), "fit", "--config", "llm_grpo", "--data.init_args.batch_size=60",
         *QUIET],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    assert done.returncode == 2
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("error: data.init_args.batch_size=60 is not a multiple of")
    assert "Use data.init_args.batch_size=56 or 64" in error
    assert "Traceback" not in done.stderr


def test_seed_everything_decides_the_run(tmp_path):
    # A Lightning user changes --seed_everything to get another run (before, GRPOModule drew
    # its prompts and samples from its own seed=0 whatever the run's seed: seeds 1 and 2 logged
    # the same rewards). The prompts depend on the seed alone, not on the weights.
    prompts = {}
    for name, seed in (("one", 1), ("two", 2), ("one_again", 1)):
        (tmp_path / name).mkdir()
        config = probed_config(tmp_path / name)
        done = train(
            ["fit", "--config", str(config), "--trainer.max_steps=2", f"--seed_everything={seed}",
             f"--trainer.logger.init_args.save_dir={tmp_path / name}", *QUIET],
            tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        # As sets: the order of the groups in a batch is the sampler's (another seeded stream).
        prompts[name] = [sorted(row["prompts"]) for row in read_probe(tmp_path / name / "probe")]
    assert len(prompts["one"]) == 2
    assert prompts["one"] == prompts["one_again"]
    assert prompts["one"] != prompts["two"]


def test_accumulated_micro_batches_generate_groups_of_their_own(tmp_path):
    # accumulate_grad_batches=2: each micro-batch generates and trains on its own groups
    # (before, both regenerated the same prompts, completions and group ids, and the run
    # ended in "GroupSampler found no whole group", advising to raise max_staleness).
    config = probed_config(tmp_path)
    done = train(
        ["fit", "--config", str(config), "--trainer.max_steps=2",
         "--trainer.accumulate_grad_batches=2", *QUIET],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = read_probe(tmp_path / "probe")
    assert len(rows) == 4  # 2 optimizer steps of 2 micro-batches
    for row in rows:  # whole groups of one version (either micro-batch's of the step)
        assert all(row["groups"].count(g) == 8 for g in set(row["groups"]))
        assert len(set(row["versions"])) == 1
    # Four generations of 8 groups, each numbered on its own: ids 0-31, 8 items each.
    checkpoint = tmp_path / "runs" / "llm_grpo" / "version_0" / "checkpoints" / "last.ckpt"
    stored = to_hf_dataset(checkpoint, streaming=False, keys=["group"])["group"]
    assert Counter(stored) == {g: 8 for g in range(32)}
