"""The tiny causal LM the TRL tests train (built offline, the same weights on every process)."""

from __future__ import annotations

import torch
import transformers


def tiny_model(tokenizer) -> transformers.LlamaForCausalLM:
    """A one-layer, 16-wide Llama over ``tokenizer``'s vocabulary, seeded for equal weights."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    return transformers.LlamaForCausalLM(config)
