"""``GRPOModule(off_policy_correction="decoupled")``: AReaL's decoupled objective with a
truncated importance weight, against the plain clipped objective."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from rb_lightning.errors import UsageError  # noqa: E402
from rb_lightning.llm.grpo import GRPOModule  # noqa: E402

pytestmark = pytest.mark.hf


def _module(correction: str, cap: float = 2.0) -> GRPOModule:
    config = transformers.LlamaConfig(
        vocab_size=18, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, max_position_embeddings=32, pad_token_id=0, bos_token_id=None,
        eos_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)  # both modules get the same weights
    return GRPOModule(
        config, num_generations=4, prompts_per_step=3, max_new_tokens=4,
        off_policy_correction=correction, importance_weight_cap=cap,
    )  # fmt: skip


def _batch(module: GRPOModule):
    batch = module.generate_groups(0)
    batch["completion_mask"] = (torch.arange(4)[None, :] <= torch.arange(12)[:, None] % 4).long()
    batch["advantage"] = torch.linspace(-1.0, 1.0, 12)  # both signs
    return batch


def _loss_and_grad(module: GRPOModule, batch) -> tuple[float, torch.Tensor]:
    module.zero_grad()
    loss, _ = module.grpo_loss(batch)
    loss.backward()
    grad = torch.cat([p.grad.reshape(-1) for p in module.model.parameters()])
    return float(loss), grad


def test_on_fresh_groups_the_correction_gives_the_on_policy_loss_and_gradient():
    plain, corrected = _module("none"), _module("decoupled")
    batch = _batch(plain)  # behaviour log-probs of these very weights
    loss_a, grad_a = _loss_and_grad(plain, batch)
    loss_b, grad_b = _loss_and_grad(corrected, batch)
    assert abs(loss_a) > 1e-3 and grad_a.norm() > 1e-3
    assert loss_b == pytest.approx(loss_a, abs=1e-5)
    assert torch.allclose(grad_b, grad_a, atol=1e-5, rtol=1e-4)


def test_on_stale_groups_the_correction_weights_each_token_by_its_truncated_ratio():
    plain, corrected = _module("none"), _module("decoupled", cap=2.0)
    batch = _batch(plain)
    # A behaviour policy 0.5 nats less likely on the first half of the rows (weight e^0.5 =
    # 1.65, under the cap) and 1.5 nats less likely on the others (e^1.5 = 4.48, capped at 2).
    shift = torch.where(torch.arange(12) < 6, 0.5, 1.5)[:, None]
    batch["behaviour_log_probs"] = batch["behaviour_log_probs"] - shift
    loss_plain, grad_plain = _loss_and_grad(plain, batch)
    loss, grad = _loss_and_grad(corrected, batch)
    # The corrected loss: - sum(w * A) / tokens, w = min(e^shift, 2) (the ratio to the
    # proximal policy is 1).
    mask = batch["completion_mask"].float()
    weight = torch.exp(shift).clamp(max=2.0).expand(12, 4)
    advantage = batch["advantage"][:, None].expand(12, 4)
    expected = -(weight * advantage * mask).sum() / mask.sum()
    assert loss == pytest.approx(float(expected), abs=1e-5)
    # The plain objective clips these ratios (all above 1.2): the tokens of positive advantage
    # give no gradient. The corrected one keeps them, so the gradients differ.
    assert (grad - grad_plain).norm() > 0.1 * grad.norm()
    # ... and the corrected gradient is that of the weighted log-likelihood.
    corrected.zero_grad()
    from rb_lightning.llm.generation import completion_log_probs

    logp = completion_log_probs(
        corrected.model, batch["input_ids"], batch["attention_mask"], corrected.prompt_width
    )
    (-(weight * advantage * logp * mask).sum() / mask.sum()).backward()
    reference = torch.cat([p.grad.reshape(-1) for p in corrected.model.parameters()])
    assert torch.allclose(grad, reference, atol=1e-5, rtol=1e-4)


def test_an_unknown_correction_names_the_argument():
    with pytest.raises(UsageError, match="off_policy_correction must be one of") as err:
        _module("areal")
    assert err.value.argument == "off_policy_correction"
    with pytest.raises(UsageError, match="importance_weight_cap must be a number > 0") as err:
        _module("decoupled", cap=0.0)
    assert err.value.argument == "importance_weight_cap"
