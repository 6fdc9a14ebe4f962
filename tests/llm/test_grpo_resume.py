"""Exact resume of GRPO: 2N steps straight == N steps + ``--ckpt_path last`` + N steps."""

from __future__ import annotations

import pytest
from grpo_probe import GRPO_CONFIG, QUIET, column, metrics, train

from rb_lightning import to_hf_dataset

pytestmark = pytest.mark.hf

# Replay (max_staleness 2, fewer prompts than a batch needs) so the resumed run must bring
# back the old groups, the sampler's consumer version and the buffer's generator too.
ARGS = [
    "fit", "--config", str(GRPO_CONFIG), *QUIET,
    "--data.init_args.replay_buffer.init_args.sampler.init_args.max_staleness=2",
    "--model.init_args.prompts_per_step=4",
    # Partial credit: a random policy's rewards differ within a group, so the losses are not 0.
    "--model.init_args.rewards=[rb_lightning.llm.data:arithmetic_partial_reward]",
]  # fmt: skip


def _buffer_rows(run_dir):
    return to_hf_dataset(run_dir / "checkpoints" / "last.ckpt", streaming=False).to_list()


def test_resumed_run_has_the_losses_and_buffer_of_the_straight_run(tmp_path):
    straight, halves = tmp_path / "straight", tmp_path / "halves"
    straight.mkdir(), halves.mkdir()
    done = train([*ARGS, "--trainer.max_steps=8"], straight)
    assert done.returncode == 0, done.stderr
    done = train([*ARGS, "--trainer.max_steps=4"], halves)
    assert done.returncode == 0, done.stderr
    done = train([*ARGS, "--trainer.max_steps=8", "--ckpt_path=last"], halves)
    assert done.returncode == 0, done.stderr
    assert "llm_grpo/version_0 from step 4" in done.stdout
    assert "starts from scratch" not in done.stderr

    run_a = straight / "runs" / "llm_grpo" / "version_0"
    run_b = halves / "runs" / "llm_grpo" / "version_0"
    loss_a, loss_b = column(metrics(run_a), "train_loss"), column(metrics(run_b), "train_loss")
    assert sorted(loss_a) == sorted(loss_b) == list(range(8))
    assert sum(abs(v) for v in loss_a.values()) > 1e-3
    for step in range(8):
        assert loss_a[step] == pytest.approx(loss_b[step], abs=1e-6), step
    reward_a, reward_b = (
        column(metrics(run_a), "reward_mean"),
        column(metrics(run_b), "reward_mean"),
    )
    assert reward_a == reward_b  # the same completions were generated after the resume

    rows_a, rows_b = _buffer_rows(run_a), _buffer_rows(run_b)
    assert len(rows_a) == len(rows_b) == 8 * 4 * 8  # 8 steps x 4 groups x 8 completions
    for a, b in zip(rows_a, rows_b, strict=True):
        assert a["group"] == b["group"] and a["input_ids"] == b["input_ids"]
        assert a["behaviour_log_probs"] == pytest.approx(b["behaviour_log_probs"], abs=1e-6)
