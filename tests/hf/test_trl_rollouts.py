"""RolloutRecorder: GRPO rollouts into a torchrl buffer, through a checkpoint and a resume (1 process)."""

from __future__ import annotations

import math

import pytest
import torch
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.hf.export import to_hf_dataset
from rb_lightning.llm.data import arithmetic_reward, fill_arithmetic_buffer, make_tokenizer

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")
from tiny_llm import tiny_model  # noqa: E402

from rb_lightning.hf.trl_rollouts import ROLLOUTS_DIR, RolloutRecorder  # noqa: E402

pytestmark = pytest.mark.hf

BATCH, GENERATIONS = 4, 2  # per step: 2 prompts x 2 completions
# Room for every rollout of the test (4 steps x BATCH) without a wrap; the default 100,000
# rows cost seconds per extend (a NonTensorStack as long as the storage).
CAPACITY = 64


def grpo(output_dir, tokenizer, prompts_rb, seen, max_steps):
    def reward(completions, prompts, trainer_state, **kwargs):
        scores = arithmetic_reward(completions, prompts=prompts)
        seen.extend(
            (trainer_state.global_step + 1, p, c, r)
            for p, c, r in zip(prompts, completions, scores, strict=True)
        )
        return scores

    args = trl.GRPOConfig(
        output_dir=str(output_dir),
        max_steps=max_steps,
        per_device_train_batch_size=BATCH,
        num_generations=GENERATIONS,
        max_completion_length=3,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        save_strategy="steps",
        save_steps=2,
        logging_steps=1,
        seed=0,
    )
    return trl.GRPOTrainer(
        model=tiny_model(tokenizer),
        reward_funcs=reward,
        args=args,
        train_dataset=to_hf_dataset(prompts_rb, keys=["prompt"], batch_size=8),
        processing_class=tokenizer,
    )


def rows(rb):
    items = rb[: len(rb)]
    return [
        (
            int(items["step"][i]),
            int(items["index"][i]),
            items["prompt"][i],
            items["completion"][i],
            float(items["reward"][i]),
            float(items["advantage"][i]),
        )
        for i in range(len(rb))
    ]


def test_rollouts_survive_a_checkpoint_and_resume_once_each(tmp_path):
    tokenizer = make_tokenizer()
    prompts_rb = ReplayBuffer(storage=LazyTensorStorage(64))
    fill_arithmetic_buffer(prompts_rb, 64, tokenizer, seed=0)
    out = tmp_path / "run"

    # Run 1: 3 steps, checkpoint at step 2; step 3 is lost as if the job died after it.
    seen_first: list = []
    first = grpo(out, tokenizer, prompts_rb, seen_first, max_steps=3)
    recorder = RolloutRecorder(capacity=CAPACITY).attach(first)
    first.train()
    recorded = rows(recorder.replay_buffer)
    assert len(recorded) == 3 * BATCH and recorder.generations == 3
    # What the reward function was called with, in order, with its rewards.
    assert [(s, p, c, r) for s, _, p, c, r, _ in recorded] == [
        (s, p, c, r) for s, p, c, r in seen_first
    ]
    items = recorder.replay_buffer[: len(recorder.replay_buffer)]
    groups = {}
    for g, p in zip(items["group"].tolist(), items["prompt"], strict=True):
        groups.setdefault(g, set()).add(p)
    assert len(groups) == 3 * BATCH // GENERATIONS and all(len(p) == 1 for p in groups.values())
    assert all(math.isfinite(a) for *_, a in recorded)
    assert torch.equal(items["rewards", "reward"], items["reward"])
    assert (out / "checkpoint-2" / ROLLOUTS_DIR / "manifest.json").is_file()
    before_checkpoint = [r for r in recorded if r[0] <= 2]

    # Run 2: a new process would build everything again; resume from checkpoint-2 to step 4.
    seen_second: list = []
    second = grpo(out, tokenizer, prompts_rb, seen_second, max_steps=4)
    resumed = RolloutRecorder(capacity=CAPACITY).attach(second)
    second.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert second.state.global_step == 4
    final = rows(resumed.replay_buffer)
    for rollout in before_checkpoint:
        assert final.count(rollout) == 1  # every earlier rollout, exactly once
    assert sorted((s, i) for s, i, *_ in final) == [
        (s, i) for s in (1, 2, 3, 4) for i in range(BATCH)
    ]
    assert [(s, p, c, r) for s, _, p, c, r, _ in final if s > 2] == [
        (s, p, c, r) for s, p, c, r in seen_second
    ]
    assert resumed.generations == 4
    assert resumed.replay_buffer[: len(final)]["generation"].tolist() == [
        g for g in range(4) for _ in range(BATCH)
    ]

    # The same rollouts replay in Lightning and export again.
    module = ReplayBufferDataModule(
        resumed.replay_buffer, batch_size=4, keys=["prompt", "completion", "advantage"]
    )
    module.setup("fit")
    batch = next(iter(module.train_dataloader()))
    assert batch["advantage"].shape == (4,)
    snapshot = to_hf_dataset(resumed.replay_buffer, streaming=False)
    assert snapshot.num_rows == 4 * BATCH and "rewards.reward" in snapshot.column_names


def test_resume_without_a_saved_rollout_buffer_is_an_error(tmp_path):
    tokenizer = make_tokenizer()
    prompts_rb = ReplayBuffer(storage=LazyTensorStorage(16))
    fill_arithmetic_buffer(prompts_rb, 16, tokenizer, seed=0)
    out = tmp_path / "run"
    first = grpo(out, tokenizer, prompts_rb, [], max_steps=2)
    first.train()  # no recorder: checkpoint-2 has no rollouts
    second = grpo(out, tokenizer, prompts_rb, [], max_steps=3)
    RolloutRecorder().attach(second)
    with pytest.raises(
        FileNotFoundError, match="checkpoint-2/rb_lightning_rollouts does not exist"
    ):
        second.train(resume_from_checkpoint=str(out / "checkpoint-2"))


def test_attach_names_what_it_needs(tmp_path):
    trainer = transformers.Trainer(
        model=tiny_model(make_tokenizer()),
        args=transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True),
    )
    with pytest.raises(TypeError, match="needs a trl.GRPOTrainer"):
        RolloutRecorder().attach(trainer)
