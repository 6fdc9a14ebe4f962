"""Real TRL / transformers trainers train from an exported replay buffer (tiny offline model, CPU)."""

from __future__ import annotations

import pytest
import torch
from tensordict import NonTensorStack, TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning import ReplayBufferDataset
from rb_lightning.hf.export import to_hf_dataset
from rb_lightning.llm.data import (
    IGNORE_INDEX,
    arithmetic_examples,
    arithmetic_reward,
    fill_arithmetic_buffer,
    make_tokenizer,
)

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")
from tiny_llm import tiny_model  # noqa: E402  (imports transformers)

pytestmark = pytest.mark.hf

TOKEN_KEYS = ["input_ids", "attention_mask", "labels"]


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="module")
def arithmetic_rb(tokenizer):
    rb = ReplayBuffer(storage=LazyTensorStorage(128))
    fill_arithmetic_buffer(rb, 64, tokenizer, seed=0)
    return rb


def train_args(tmp_path, **extra):
    return dict(
        output_dir=str(tmp_path),
        max_steps=2,  # streaming datasets have no length: trainers need max_steps
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        dataloader_num_workers=0,
        **extra,
    )


def weights(model):
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


def assert_trained(trainer, before):
    assert trainer.state.global_step == 2
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    assert not torch.equal(weights(trainer.model), before)


def test_sft_trains_on_prompt_completion_strings(tmp_path, tokenizer, arithmetic_rb):
    dataset = to_hf_dataset(
        arithmetic_rb, keys=["prompt", "completion"], batch_size=8, num_batches=4
    )
    assert dataset.column_names == ["prompt", "completion"]
    model = tiny_model(tokenizer)
    before = weights(model)
    trainer = trl.SFTTrainer(
        model=model,
        args=trl.SFTConfig(**train_args(tmp_path), max_length=16),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    assert_trained(trainer, before)


def test_sft_trains_on_pretokenized_rows_without_learning_pads(tmp_path, tokenizer, arithmetic_rb):
    dataset = to_hf_dataset(arithmetic_rb, keys=TOKEN_KEYS, streaming=False)
    assert dataset.features["input_ids"].feature.dtype == "int64"
    model = tiny_model(tokenizer)
    before = weights(model)
    trainer = trl.SFTTrainer(
        model=model,
        args=trl.SFTConfig(**train_args(tmp_path), max_length=16),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    # SFTTrainer ignores a given attention_mask; our -100 labels keep prompt and pads out of the loss.
    batch = next(iter(trainer.get_train_dataloader()))
    pads = batch["input_ids"] == tokenizer.pad_token_id
    assert (batch["labels"][pads] == IGNORE_INDEX).all()
    assert (batch["labels"][:, 0] == IGNORE_INDEX).all()  # prompt tokens
    trainer.train()
    assert_trained(trainer, before)


def test_grpo_trains_from_streamed_prompts_with_a_python_reward(tmp_path, tokenizer, arithmetic_rb):
    dataset = to_hf_dataset(arithmetic_rb, keys=["prompt"], batch_size=8, num_batches=4)
    stored_prompts = set(arithmetic_rb[torch.arange(len(arithmetic_rb))]["prompt"])
    seen: list[str] = []

    def reward(completions, prompts, **kwargs):
        seen.extend(prompts)
        return arithmetic_reward(completions, prompts=prompts, **kwargs)

    model = tiny_model(tokenizer)
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=trl.GRPOConfig(**train_args(tmp_path), num_generations=2, max_completion_length=3),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert len(seen) >= 8 and set(seen) <= stored_prompts
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    assert len(rewards) == 2


def test_dpo_trains_on_prompt_chosen_rejected_strings(tmp_path, tokenizer):
    pairs = arithmetic_examples(16, seed=1)
    rb = ReplayBuffer(storage=LazyTensorStorage(16))
    rb.extend(
        TensorDict(
            {
                "prompt": NonTensorStack(*[p for p, _ in pairs]),
                "chosen": NonTensorStack(*[c for _, c in pairs]),
                "rejected": NonTensorStack(*[str(int(c) + 1) for _, c in pairs]),
            },
            batch_size=[16],
        )
    )
    dataset = to_hf_dataset(rb, streaming=False)
    model = tiny_model(tokenizer)
    before = weights(model)
    trainer = trl.DPOTrainer(
        model=model,
        ref_model=tiny_model(
            tokenizer
        ),  # an instance model has no hub name to load a reference from
        args=trl.DPOConfig(**train_args(tmp_path), max_length=16),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    assert_trained(trainer, before)


def test_transformers_trainer_on_the_torch_dataset(tmp_path, tokenizer, arithmetic_rb):
    dataset = ReplayBufferDataset(arithmetic_rb, batch_size=8, keys=TOKEN_KEYS, num_batches=None)
    model = tiny_model(tokenizer)
    before = weights(model)
    trainer = transformers.Trainer(
        model=model,
        args=transformers.TrainingArguments(**train_args(tmp_path)),
        train_dataset=dataset,
        data_collator=transformers.default_data_collator,
    )
    trainer.train()
    assert_trained(trainer, before)
