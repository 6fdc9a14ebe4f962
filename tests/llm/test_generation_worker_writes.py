"""The GRPO generation worker writes its groups into the replay buffer itself.

What a user relies on: with a buffer torchrl can share (the shipped ``LazyTensorStorage``)
and no text columns, the groups a worker generates are in the very buffer the trainer
samples, whole, with their versions; with text columns they come back through a pipe.
"""

from __future__ import annotations

import torch
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from transformers import LlamaConfig

from rb_lightning.llm.generation_worker import GenerationWorker
from rb_lightning.llm.groups import GroupSampler
from rb_lightning.llm.grpo import GRPOModule

CONFIG = LlamaConfig(
    vocab_size=18, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, pad_token_id=0, eos_token_id=1,
)  # fmt: skip


def _buffer_with_columns(policy: GRPOModule) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(64), sampler=GroupSampler(group_size=2))
    rb.extend(policy.generate_groups(0, version=0, scored=False))  # the storage's columns
    rb.empty()
    return rb


def _worker(policy: GRPOModule, rb, store_text: bool) -> GenerationWorker:
    kwargs = dict(
        config=CONFIG, num_generations=2, prompts_per_step=2, store_text=store_text, seed=0
    )
    worker = GenerationWorker(
        kwargs, max_staleness=1, first_batch=0, start_method="fork", write_into=rb
    )
    worker.push_weights(policy.model.state_dict(), version=0)
    return worker


def test_the_worker_writes_whole_groups_into_the_buffer_the_trainer_samples():
    policy = GRPOModule(CONFIG, num_generations=2, prompts_per_step=2, store_text=False, seed=0)
    rb = _buffer_with_columns(policy)
    worker = _worker(policy, rb, store_text=False)
    try:
        assert worker.writes is not None
        for expected in range(3):
            worker.push_weights(policy.model.state_dict(), version=expected)  # within the bound
            index, groups, _ = worker.receive(timeout=120)
            assert index == expected
            # Handed back from the buffer, not through the pipe: the rows it wrote.
            assert groups["group"].tolist() == [2 * index, 2 * index, 2 * index + 1, 2 * index + 1]
            assert torch.equal(rb[4 * index : 4 * index + 4]["input_ids"], groups["input_ids"])
            # The generator is seeded by the batch: what the trainer would have made.
            made = policy.generate_groups(index, version=0)
            assert torch.equal(groups["input_ids"], made["input_ids"])
        assert rb.write_count >= 12 and worker.writes.rows_learned == 12
        batch = rb.sample(4)
        assert batch["group"][0] == batch["group"][1]  # whole groups
    finally:
        worker.close()
    assert not rb.shared


def test_groups_with_text_come_back_through_the_pipe():
    policy = GRPOModule(CONFIG, num_generations=2, prompts_per_step=2, store_text=True, seed=0)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(64))
    rb.extend(policy.generate_groups(0, version=0, scored=False))
    rb.empty()
    worker = _worker(policy, rb, store_text=True)
    try:
        assert worker.writes is None
        _, groups, _ = worker.receive(timeout=120)
        assert len(rb) == 0 and len(groups) == 4  # the trainer writes them
    finally:
        worker.close()
