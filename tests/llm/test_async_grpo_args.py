"""``AsyncGRPOModule``'s own arguments: each wrong one is a UsageError naming it."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from rb_lightning.errors import UsageError  # noqa: E402
from rb_lightning.llm.async_grpo import AsyncGRPOModule  # noqa: E402

pytestmark = pytest.mark.hf

CONFIG = transformers.LlamaConfig(
    vocab_size=18, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, max_position_embeddings=32, pad_token_id=0, bos_token_id=None,
    eos_token_id=1,
)  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "argument", "says"),
    [
        ({"beta": 0.1}, "beta", "worker computes no reference log-probs"),
        ({"weight_sync_every": 0}, "weight_sync_every", "must be an int >= 1"),
        ({"off_policy_correction": "tis"}, "off_policy_correction", "must be 'auto' or one of"),
    ],
)
def test_a_wrong_argument_names_itself_and_the_fix(kwargs, argument, says):
    with pytest.raises(UsageError, match=says) as err:
        AsyncGRPOModule(CONFIG, num_generations=2, **kwargs)
    assert err.value.argument == argument


def test_auto_is_none_until_the_fit_reads_the_bound_and_explicit_values_are_kept():
    # (tests/llm/test_grpo_async_cli.py: with max_staleness 1, the fit says it is 'decoupled'.)
    assert AsyncGRPOModule(CONFIG, num_generations=2).off_policy_correction == "none"
    module = AsyncGRPOModule(CONFIG, num_generations=2, off_policy_correction="decoupled")
    assert module.off_policy_correction == "decoupled"
