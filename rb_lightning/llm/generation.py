"""Seeded sampling of completions from a causal LM, and the per-token log-probs of a completion.

Sequences are ``[left-padded prompt | completion, eos, right padding]`` with a fixed prompt
width, so completion token ``t`` is at column ``prompt_width + t``; position ids count
attended tokens only. Generation, behaviour log-probs and training use this one layout, so
the policy's log-probs on its own completions match the stored ones. Sampling draws from
an explicit ``torch.Generator`` (``transformers``' ``generate`` uses the global RNG).

Examples:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from rb_lightning.llm.data import make_tokenizer
    >>> tok = make_tokenizer()
    >>> _ = torch.manual_seed(0)
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=18, hidden_size=16,
    ...     intermediate_size=32, num_hidden_layers=1, num_attention_heads=2))
    >>> ids, mask = encode_prompts(tok, ["1+2=", "12+30="], width=8)
    >>> out = sample_completions(model, ids, mask, max_new_tokens=3, eos_token_id=1,
    ...                          pad_token_id=0, generator=torch.Generator().manual_seed(0))
    >>> out.completion_ids.shape, out.completion_mask.shape
    (torch.Size([2, 3]), torch.Size([2, 3]))
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rb_lightning.errors import UsageError


@dataclass
class Completions:
    """Sampled completions: token ids ``[N, C]`` (padded after eos), their mask (1 up to eos),
    and the log-probability of each token under the sampling distribution."""

    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    log_probs: torch.Tensor


def encode_prompts(
    tokenizer: Any, prompts: Sequence[str], width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask of ``prompts``, left-padded to ``width`` columns."""
    encoded = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    ids = torch.full((len(encoded), width), tokenizer.pad_token_id, dtype=torch.int64)
    mask = torch.zeros((len(encoded), width), dtype=torch.int64)
    for row, tokens in enumerate(encoded):
        if len(tokens) > width:
            raise UsageError(
                "prompt_width",
                f"The prompt {prompts[row]!r} has {len(tokens)} tokens, more than "
                f"prompt_width={width}. Raise prompt_width (and the model's "
                "max_position_embeddings if needed) or use shorter prompts.",
            )
        if tokens:
            ids[row, width - len(tokens) :] = torch.tensor(tokens)
            mask[row, width - len(tokens) :] = 1
    return ids, mask


def _position_ids(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _logits(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, attention_mask=mask, position_ids=_position_ids(mask)).logits


def _cache_argument(model: Any) -> str:
    # transformers 5 names the key/value cache "cache"; 4.x "past_key_values".
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


@torch.no_grad()
def sample_completions(
    model: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    generator: torch.Generator | None = None,
    temperature: float = 1.0,
    greedy: bool = False,
    completions_per_prompt: int = 1,
) -> Completions:
    """Sample (or, ``greedy``, decode) up to ``max_new_tokens`` tokens after each prompt.

    With ``completions_per_prompt = G`` prompt ``i`` gets rows ``i * G`` to ``i * G + G - 1``,
    from one pass over the prompt with its key/value cache repeated. A completion ends with
    its eos (masked 1), then ``pad_token_id`` (masked 0). Draws come from ``generator``; the
    log-probs are the drawn tokens' under the sampling distribution, equal to
    :func:`completion_log_probs` up to float rounding.
    """
    if completions_per_prompt < 1:
        raise UsageError(
            "completions_per_prompt",
            f"completions_per_prompt={completions_per_prompt}: each prompt needs at least one "
            "completion. Pass 1 or more.",
        )
    repeats = completions_per_prompt
    n = prompt_ids.shape[0] * repeats
    device = prompt_ids.device
    ids, mask = prompt_ids, prompt_mask
    completion = torch.full((n, max_new_tokens), pad_token_id, dtype=torch.int64, device=device)
    completion_mask = torch.zeros((n, max_new_tokens), dtype=torch.int64, device=device)
    log_probs = torch.zeros((n, max_new_tokens), dtype=torch.float32, device=device)
    running = torch.ones(n, dtype=torch.bool, device=device)
    # A key/value cache: each step after the first feeds only the token just drawn (a third
    # of the time of recomputing the whole sequence, for the shipped model).
    cache_argument = _cache_argument(model)
    cache: Any = None
    for t in range(max_new_tokens):
        positions = _position_ids(mask)
        if cache is None:
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
            cache, logits = out[cache_argument], out.logits[:, -1]
            if repeats > 1:  # every completion of a prompt continues the same prompt pass
                cache.batch_repeat_interleave(repeats)
                logits = logits.repeat_interleave(repeats, dim=0)
                ids = ids.repeat_interleave(repeats, dim=0)
                mask = mask.repeat_interleave(repeats, dim=0)
        else:
            out = model(
                input_ids=ids[:, -1:], attention_mask=mask, position_ids=positions[:, -1:],
                use_cache=True, **{cache_argument: cache},
            )  # fmt: skip
            cache, logits = out[cache_argument], out.logits[:, -1]
        logits = logits.float()
        scaled = torch.log_softmax(logits / temperature, dim=-1)
        if greedy:
            token = logits.argmax(-1)
        else:
            token = torch.multinomial(scaled.exp(), 1, generator=generator).squeeze(-1)
        token = torch.where(running, token, torch.full_like(token, pad_token_id))
        log_probs[:, t] = scaled.gather(-1, token[:, None]).squeeze(-1)
        completion[:, t] = token
        completion_mask[:, t] = running.long()
        running = running & (token != eos_token_id)
        ids = torch.cat([ids, token[:, None]], dim=1)
        mask = torch.cat([mask, completion_mask[:, t : t + 1]], dim=1)
        if not running.any():
            break
    return Completions(completion, completion_mask, log_probs)


def completion_log_probs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_width: int,
    *,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Log-probability ``[N, C]`` of each completion token under ``model`` (``C = L - prompt_width``).

    ``input_ids`` / ``attention_mask`` are whole sequences in this module's
    layout; the values at masked completion positions are meaningless (mask them).
    """
    logits = _logits(model, input_ids, attention_mask)[:, prompt_width - 1 : -1].float()
    log_probs = torch.log_softmax(logits / temperature, dim=-1)
    targets = input_ids[:, prompt_width:]
    return log_probs.gather(-1, targets[..., None]).squeeze(-1)


def greedy_completions(
    model: Any, tokenizer: Any, prompts: Sequence[str], *, prompt_width: int, max_new_tokens: int
) -> list[str]:
    """The greedy completion of each of ``prompts`` by ``model`` (:func:`decode_text`'d)."""
    device = next(model.parameters()).device
    ids, mask = encode_prompts(tokenizer, list(prompts), prompt_width)
    out = sample_completions(
        model, ids.to(device), mask.to(device),
        max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, greedy=True,
    )  # fmt: skip
    return decode_completions(tokenizer, out.completion_ids)


def decode_text(tokenizer: Any, ids: list[int], *, until_eos: bool = True) -> str:
    """The text of ``ids``: up to the first eos (``until_eos``), padding left out.

    Other special tokens stay: a sampled ``<unk>`` is part of what was sampled, and the
    reward and the stored text must see it (``skip_special_tokens=True`` would drop it).

    Examples:
        >>> from rb_lightning.llm.data import make_tokenizer
        >>> tok = make_tokenizer()
        >>> decode_text(tok, [tok.convert_tokens_to_ids(t) for t in ["7", "<unk>", "3", "<eos>", "<pad>"]])
        '7<unk>3'
    """
    if until_eos and tokenizer.eos_token_id in ids:
        ids = ids[: ids.index(tokenizer.eos_token_id)]
    pad = tokenizer.pad_token_id
    return str(tokenizer.decode([t for t in ids if t != pad], skip_special_tokens=False))


def decode_completions(tokenizer: Any, completion_ids: torch.Tensor) -> list[str]:
    """The text of each completion, up to its eos, without padding (:func:`decode_text`)."""
    return [decode_text(tokenizer, row) for row in completion_ids.cpu().tolist()]


__all__ = [
    "Completions",
    "completion_log_probs",
    "decode_completions",
    "decode_text",
    "encode_prompts",
    "greedy_completions",
    "sample_completions",
]
