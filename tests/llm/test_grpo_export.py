"""Stored GRPO groups export with ``to_hf_dataset`` to rows real TRL trainers train on."""

from __future__ import annotations

import pytest
from grpo_probe import GRPO_CONFIG, QUIET, train

from rb_lightning import to_hf_dataset
from rb_lightning.buffers.reader import open_saved_buffer
from rb_lightning.llm.data import (
    arithmetic_partial_reward,
    arithmetic_reward,
    make_tokenizer,
    solve,
)
from rb_lightning.llm.groups import GroupSampler
from rb_lightning.llm.pairs import preference_pairs, with_text

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
from hf.tiny_llm import tiny_model  # noqa: E402  (imports transformers)

pytestmark = pytest.mark.hf


def _args(tmp_path, **extra):
    return dict(
        output_dir=str(tmp_path / "trl"), max_steps=1, per_device_train_batch_size=4,
        learning_rate=1e-2, report_to=[], use_cpu=True, save_strategy="no",
        dataloader_num_workers=0, **extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo_run")
    done = train(
        ["fit", "--config", str(GRPO_CONFIG), "--trainer.max_steps=2", *QUIET,
         "--model.init_args.rewards=[rb_lightning.llm.data:arithmetic_partial_reward]"],
        root,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return root / "runs" / "llm_grpo" / "version_0"


@pytest.fixture(scope="module")
def stored_groups(grpo_run):
    run = grpo_run
    # The shipped config stores token ids, not strings: with_text decodes them.
    keys = ["input_ids", "attention_mask", "completion_mask", "reward", "group"]
    rows = with_text(to_hf_dataset(run, streaming=False, keys=keys), make_tokenizer())
    return datasets.Dataset.from_list(
        [{k: row[k] for k in ("prompt", "completion", "reward", "group")} for row in rows]
    )


def test_exported_rows_are_whole_groups_with_prompt_completion_reward(stored_groups):
    assert stored_groups.column_names == ["prompt", "completion", "reward", "group"]
    assert len(stored_groups) == 2 * 8 * 8
    groups = stored_groups["group"]
    assert all(groups.count(g) == 8 for g in set(groups))
    for row in stored_groups.select(range(0, len(stored_groups), 8)):
        assert solve(row["prompt"]) is not None  # "a+b=" with a, b <= 50
    # The stored reward is arithmetic_partial_reward of the decoded text.
    assert stored_groups["reward"] == pytest.approx(
        arithmetic_partial_reward(stored_groups["completion"], stored_groups["prompt"])
    )


def test_open_saved_buffer_is_a_replay_buffer_with_the_run_sampler(grpo_run):
    # docs/trl.md: open_saved_buffer(path) gives a ReplayBuffer built like the saved one.
    rb = open_saved_buffer(grpo_run / "checkpoints" / "last.ckpt")
    assert len(rb) == 2 * 8 * 8 and rb.storage.max_size == 1024
    assert len(rb.sample(16)["group"].unique()) == 2  # whole groups of 8
    # configs/llm_grpo.yaml's GroupSampler(group_size=8, max_staleness=0), as the run had it.
    assert isinstance(rb.sampler, GroupSampler)
    assert (rb.sampler.group_size, rb.sampler.max_staleness) == (8, 0)


def test_grpo_trainer_trains_on_the_exported_prompts(stored_groups, tmp_path):
    tokenizer = make_tokenizer()
    seen = []

    def reward(completions, prompts, **columns):
        seen.extend(columns["group"])  # the stored columns reach the reward function
        return arithmetic_reward(completions, prompts)

    trainer = trl.GRPOTrainer(
        model=tiny_model(tokenizer), reward_funcs=reward, processing_class=tokenizer,
        args=trl.GRPOConfig(**_args(tmp_path), num_generations=2, max_completion_length=3),
        train_dataset=stored_groups,
    )  # fmt: skip
    trainer.train()
    assert trainer.state.global_step == 1 and set(seen) <= set(stored_groups["group"])


def test_dpo_trainer_trains_on_preference_pairs_of_the_groups(stored_groups, tmp_path):
    pairs = preference_pairs(stored_groups)
    rewards: dict[int, dict[str, float]] = {}
    for row in stored_groups:
        rewards.setdefault(row["group"], {})[row["completion"]] = row["reward"]
    unequal = [g for g, by_text in sorted(rewards.items()) if len(set(by_text.values())) > 1]
    assert [p["group"] for p in pairs] == unequal  # one pair per group that has a preference
    for pair in pairs:  # the group's best completion against its worst
        by_text = rewards[pair["group"]]
        assert by_text[pair["chosen"]] == max(by_text.values())
        assert by_text[pair["rejected"]] == min(by_text.values())
    tokenizer = make_tokenizer()
    trainer = trl.DPOTrainer(
        model=tiny_model(tokenizer), ref_model=tiny_model(tokenizer), processing_class=tokenizer,
        args=trl.DPOConfig(**_args(tmp_path), max_length=16),
        train_dataset=datasets.Dataset.from_list(pairs),
    )  # fmt: skip
    trainer.train()
    assert trainer.state.global_step == 1
