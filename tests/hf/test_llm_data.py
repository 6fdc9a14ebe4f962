"""The synthetic arithmetic task shared by the LLM config and the TRL tests."""

from __future__ import annotations

import pytest
import torch
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning.llm.data import (
    IGNORE_INDEX,
    arithmetic_examples,
    arithmetic_reward,
    fill_arithmetic_buffer,
    make_tokenizer,
    solve,
)

pytest.importorskip("transformers")
pytestmark = pytest.mark.hf


def test_examples_are_correct_and_reproducible():
    pairs = arithmetic_examples(50, seed=7)
    assert pairs == arithmetic_examples(50, seed=7) != arithmetic_examples(50, seed=8)
    assert all(solve(p) == int(c) for p, c in pairs)


def test_buffer_items_mask_prompt_and_padding_in_labels():
    tok = make_tokenizer()
    rb = ReplayBuffer(storage=LazyTensorStorage(32))
    fill_arithmetic_buffer(rb, 20, tok, max_length=12)
    items = rb[torch.arange(20)]
    ids, mask, labels = items["input_ids"], items["attention_mask"], items["labels"]
    assert ids.dtype == mask.dtype == labels.dtype == torch.int64 and ids.shape == (20, 12)
    for row in range(20):
        prompt, completion = items["prompt"][row], items["completion"][row]
        n_prompt, n_real = (
            len(prompt),
            len(prompt) + len(completion) + 1,
        )  # one token per char + eos
        assert tok.decode(ids[row, :n_real]) == prompt + completion + tok.eos_token
        assert mask[row].tolist() == [1] * n_real + [0] * (12 - n_real)
        assert (labels[row, :n_prompt] == IGNORE_INDEX).all()
        assert (labels[row, n_real:] == IGNORE_INDEX).all()
        assert labels[row, n_prompt:n_real].tolist() == ids[row, n_prompt:n_real].tolist()


def test_too_long_examples_raise_with_the_fix():
    with pytest.raises(ValueError, match="max_length"):
        fill_arithmetic_buffer(
            ReplayBuffer(storage=LazyTensorStorage(4)), 2, make_tokenizer(), max_length=4
        )


def test_reward_checks_answers_from_prompts_or_reference_column():
    assert arithmetic_reward(["5", "6<eos>", " 6 "], prompts=["2+3=", "3+3=", "1+1="]) == [
        1.0,
        1.0,
        0.0,
    ]
    conversational = [[{"role": "assistant", "content": "7"}]]
    assert arithmetic_reward(conversational, prompts=[[{"role": "user", "content": "3+4="}]]) == [
        1.0
    ]
    assert arithmetic_reward(["12"], completion=["12"]) == [1.0]
    with pytest.raises(ValueError, match="prompts"):
        arithmetic_reward(["1"])
