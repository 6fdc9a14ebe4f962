"""``GRPOModule`` in-process: weights from an SFT checkpoint, and the objective's ratio."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from rb_lightning.errors import UsageError  # noqa: E402
from rb_lightning.llm.grpo import GRPOModule  # noqa: E402
from rb_lightning.llm.module import CausalLMModule  # noqa: E402

pytestmark = pytest.mark.hf


def _config(hidden: int = 16) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=18, hidden_size=hidden, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, max_position_embeddings=32, pad_token_id=0, bos_token_id=None,
        eos_token_id=1,
    )  # fmt: skip


def _sft_checkpoint(tmp_path) -> tuple[str, CausalLMModule]:
    torch.manual_seed(1)
    sft = CausalLMModule(_config())
    path = tmp_path / "sft.ckpt"
    torch.save({"state_dict": sft.state_dict()}, path)  # the layout Lightning saves
    return str(path), sft


def test_init_from_loads_the_sft_weights(tmp_path):
    path, sft = _sft_checkpoint(tmp_path)
    torch.manual_seed(2)
    module = GRPOModule(_config(), init_from=path, num_generations=2)
    for (name, ours), theirs in zip(
        module.model.state_dict().items(), sft.model.state_dict().values(), strict=True
    ):
        assert torch.equal(ours, theirs), name


def test_a_missing_init_from_file_names_the_argument_and_the_command_that_makes_it():
    with pytest.raises(UsageError, match="no such file.*configs/llm_sft.yaml") as err:
        GRPOModule(_config(), init_from="nowhere/last.ckpt", num_generations=2)
    assert err.value.argument == "init_from"


def test_init_from_another_architecture_names_the_argument(tmp_path):
    path, _ = _sft_checkpoint(tmp_path)
    with pytest.raises(UsageError, match="does not fit this model") as err:
        GRPOModule(_config(hidden=32), init_from=path, num_generations=2)
    assert err.value.argument == "init_from"


def test_stored_behaviour_log_probs_give_a_ratio_of_one():
    module = GRPOModule(_config(), num_generations=4, prompts_per_step=3, beta=0.1)
    groups = module.generate_groups(0)
    assert groups.shape == (12,) and groups["group"].tolist() == [0] * 4 + [1] * 4 + [2] * 4
    loss, stats = module.grpo_loss(groups)
    assert float(stats["clip_fraction"]) == 0.0
    assert float(stats["kl"]) == pytest.approx(0.0, abs=1e-6)  # the reference is the start
    # With ratio 1 the objective is minus the token-weighted mean advantage.
    mask = groups["completion_mask"].float()
    expected = -(groups["advantage"][:, None] * mask).sum() / mask.sum()
    assert float(loss) == pytest.approx(float(expected), abs=1e-6)


def test_the_objective_clips_the_ratio_to_the_stored_behaviour_per_token():
    module = GRPOModule(_config(), num_generations=4, prompts_per_step=3, max_new_tokens=4)
    batch = module.generate_groups(0)
    # Completions of 1..4 tokens, and a behaviour policy 0.5 nats less likely on every token:
    # ratio e^0.5 = 1.65, clipped to 1.2 where the advantage is positive.
    batch["completion_mask"] = (torch.arange(4)[None, :] <= torch.arange(12)[:, None] % 4).long()
    batch["behaviour_log_probs"] = batch["behaviour_log_probs"] - 0.5
    batch["advantage"] = torch.linspace(-1.0, 1.0, 12)  # both signs (a random policy earns 0)
    loss, stats = module.grpo_loss(batch)
    advantage = batch["advantage"][:, None].expand(12, 4)
    gain = torch.where(advantage > 0, 1.2 * advantage, torch.exp(torch.tensor(0.5)) * advantage)
    mask = batch["completion_mask"].float()
    assert float(loss) == pytest.approx(float(-(gain * mask).sum() / mask.sum()), abs=1e-5)
    assert float(stats["clip_fraction"]) == pytest.approx(1.0)


def test_a_group_sampled_from_one_prompt_pass_is_the_group_sampled_from_repeated_prompts():
    from rb_lightning.llm.data import arithmetic_examples, make_tokenizer
    from rb_lightning.llm.generation import encode_prompts, sample_completions

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_config(hidden=32)).eval()
    ids, mask = encode_prompts(make_tokenizer(), [p for p, _ in arithmetic_examples(4)], width=8)
    options = dict(max_new_tokens=4, eos_token_id=1, pad_token_id=0)
    repeated = sample_completions(
        model, ids.repeat_interleave(8, 0), mask.repeat_interleave(8, 0),
        generator=torch.Generator().manual_seed(5), **options,
    )  # fmt: skip
    shared = sample_completions(
        model, ids, mask, generator=torch.Generator().manual_seed(5), completions_per_prompt=8,
        **options,
    )  # fmt: skip
    assert shared.completion_ids.shape == (32, 4)
    assert torch.equal(shared.completion_ids, repeated.completion_ids)
    assert torch.equal(shared.completion_mask, repeated.completion_mask)
    torch.testing.assert_close(shared.log_probs, repeated.log_probs, rtol=0, atol=1e-6)
    assert len(set(map(tuple, shared.completion_ids[:8].tolist()))) > 1, "a group, not 8 copies"
    with pytest.raises(UsageError, match="completions_per_prompt"):
        sample_completions(model, ids, mask, completions_per_prompt=0, **options)


def test_a_checkpoint_of_a_module_built_in_python_loads_with_weights_only(tmp_path):
    # The architecture is kept as a plain dict, the task not at all: torch's weights_only
    # unpickler reads the checkpoint (before: UnpicklingError ... LlamaConfig).
    import lightning as L
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    from rb_lightning import ReplayBufferDataModule
    from rb_lightning.llm.groups import GroupSampler

    module = GRPOModule(_config(), num_generations=2, prompts_per_step=2, seed=0)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16), sampler=GroupSampler(group_size=2))
    trainer = L.Trainer(
        max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(module, datamodule=ReplayBufferDataModule(rb, batch_size=4, num_batches=None))
    path = tmp_path / "grpo.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["hyper_parameters"]["config"]["hidden_size"] == 16
    loaded = GRPOModule.load_from_checkpoint(path)
    assert loaded.model.config.hidden_size == 16 and loaded.run_seed == 0


def test_sampled_special_tokens_stay_in_the_text_the_reward_sees():
    from rb_lightning.llm.data import make_tokenizer
    from rb_lightning.llm.generation import decode_completions

    tok = make_tokenizer()
    ids = [[tok.convert_tokens_to_ids(t) for t in row] for row in (
        ["7", "<unk>", "3", "<eos>", "<pad>"], ["1", "<eos>", "<pad>", "<pad>", "<pad>"]
    )]  # fmt: skip
    assert decode_completions(tok, torch.tensor(ids)) == ["7<unk>3", "1"]
