"""A synthetic arithmetic task for language-model training, fully offline.

Prompts look like ``"12+7="`` and completions like ``"19"``: small enough for a tiny model on
CPU and checkable by :func:`arithmetic_reward`, so the same data feeds Lightning and TRL.
:func:`make_tokenizer` builds a character-level tokenizer locally (the only function that
imports ``transformers``).

Examples:
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(100))
    >>> fill_arithmetic_buffer(rb, 8, make_tokenizer(), seed=0)
    8
    >>> item = rb[0]
    >>> item["prompt"], item["completion"], item["input_ids"].shape
    ('24+48=', '72', torch.Size([16]))
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import NonTensorStack, TensorDict
from torchrl.data import ReplayBuffer

from rb_lightning.errors import UsageError

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
#: Characters the tokenizer knows, one token each (after the special tokens).
ALPHABET = "0123456789+-*= "
#: Label value ignored by the loss (``torch.nn.CrossEntropyLoss`` default).
IGNORE_INDEX = -100

_PROMPT = re.compile(r"\s*(-?\d+)\s*([+\-*])\s*(-?\d+)\s*=\s*$")


def make_tokenizer() -> Any:
    """A character-level ``transformers`` fast tokenizer for :data:`ALPHABET`, built locally.

    Has ``pad_token="<pad>"`` (id 0), ``eos_token="<eos>"`` (id 1) and
    ``unk_token="<unk>"``; decoding joins characters without spaces.

    Examples:
        >>> tok = make_tokenizer()
        >>> ids = tok("12+7=19")["input_ids"]
        >>> tok.decode(ids), len(tok)
        ('12+7=19', 18)
    """
    try:
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            'make_tokenizer needs the "hf" extra: pip install "rb-lightning[hf]"'
        ) from err
    vocab = {token: i for i, token in enumerate([PAD_TOKEN, EOS_TOKEN, UNK_TOKEN, *ALPHABET])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN, unk_token=UNK_TOKEN
    )


def arithmetic_examples(n: int, seed: int = 0, max_operand: int = 50) -> list[tuple[str, str]]:
    """``n`` ``(prompt, completion)`` pairs such as ``("12+7=", "19")``, reproducible by ``seed``.

    Examples:
        >>> arithmetic_examples(2, seed=1)
        [('8+36=', '44'), ('48+4=', '52')]
    """
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        pairs.append((f"{a}+{b}=", str(a + b)))
    return pairs


def arithmetic_tensordict(
    examples: Sequence[tuple[str, str]], tokenizer: Any, *, max_length: int = 16
) -> TensorDict:
    """Tokenize ``(prompt, completion)`` pairs into a ``TensorDict``: the strings, ``input_ids`` (right-padded), ``attention_mask`` and ``labels`` (``-100`` but on the answer and eos)."""
    prompts = [p for p, _ in examples]
    completions = [c for _, c in examples]
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completions, add_special_tokens=False)["input_ids"]
    n = len(examples)
    input_ids = torch.full((n, max_length), tokenizer.pad_token_id, dtype=torch.int64)
    labels = torch.full((n, max_length), IGNORE_INDEX, dtype=torch.int64)
    attention_mask = torch.zeros((n, max_length), dtype=torch.int64)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        ids = [*p, *c, tokenizer.eos_token_id]
        if len(ids) > max_length:
            raise UsageError(
                "max_length",
                f"Example {examples[i]!r} needs {len(ids)} tokens, more than "
                f"max_length={max_length}. Raise max_length or lower max_operand.",
            )
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention_mask[i, : len(ids)] = 1
        labels[i, len(p) : len(ids)] = input_ids[i, len(p) : len(ids)]
    return TensorDict(
        {
            "prompt": NonTensorStack(*prompts),
            "completion": NonTensorStack(*completions),
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": labels,
        },
        batch_size=[n],
    )


def fill_arithmetic_buffer(
    rb: ReplayBuffer,
    n: int,
    tokenizer: Any = None,
    *,
    seed: int = 0,
    max_length: int = 16,
    max_operand: int = 50,
    text: bool = True,
) -> int:
    """Write ``n`` tokenized arithmetic items (see :func:`arithmetic_tensordict`) to ``rb``.

    A ``CallSource`` target: without ``tokenizer`` one is built locally, so a YAML config names
    only this function and numbers.

    Args:
        rb: The buffer to extend.
        n: Items to write.
        tokenizer: Tokenizer of the items; default :func:`make_tokenizer`.
        seed: Seed of the examples.
        max_length: Tokens per item (padded).
        max_operand: Largest operand.
        text: Also store the ``prompt`` / ``completion`` strings (a ``LazyMemmapStorage``
            keeps only a column's first string in torchrl 0.14.1).

    Returns:
        The number of items written.
    """
    tokenizer = make_tokenizer() if tokenizer is None else tokenizer
    examples = arithmetic_examples(n, seed=seed, max_operand=max_operand)
    items = arithmetic_tensordict(examples, tokenizer, max_length=max_length)
    rb.extend(items if text else items.exclude("prompt", "completion"))
    return n


def solve(prompt: str) -> int | None:
    """The answer to an arithmetic prompt such as ``"12+7="``, or ``None`` if it is not one.

    Examples:
        >>> solve("12+7="), solve("hello")
        (19, None)
    """
    match = _PROMPT.match(prompt)
    if match is None:
        return None
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
    return a + b if op == "+" else a - b if op == "-" else a * b


def _text(value: Any) -> str:
    # Conversational TRL data passes messages: [{"role": ..., "content": ...}, ...].
    if isinstance(value, list):
        return "".join(m.get("content", "") if isinstance(m, dict) else str(m) for m in value)
    return str(value)


def arithmetic_reward(
    completions: Sequence[Any], prompts: Sequence[Any] | None = None, **kwargs: Any
) -> list[float]:
    """Reward function for ``trl.GRPOTrainer``: 1.0 for a correct answer, else 0.0.

    The expected answer comes from the prompt (``"12+7="`` → 19) or, without
    prompts, from a ``completion`` column passed by TRL as a keyword.

    Examples:
        >>> arithmetic_reward(["19", " 20", "19<eos>"], prompts=["12+7="] * 3)
        [1.0, 0.0, 1.0]
    """
    if prompts is not None:
        answers = [solve(_text(p)) for p in prompts]
    elif "completion" in kwargs:
        answers = [int(c) for c in kwargs["completion"]]
    else:
        raise UsageError(
            "prompts",
            "arithmetic_reward needs the prompts (GRPOTrainer passes prompts=...) or a "
            "'completion' column with the reference answers.",
        )
    rewards = []
    for completion, answer in zip(completions, answers, strict=True):
        text = _text(completion).replace(EOS_TOKEN, "").replace(PAD_TOKEN, "").strip()
        rewards.append(1.0 if answer is not None and text == str(answer) else 0.0)
    return rewards


@torch.no_grad()
def greedy_accuracy(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    prompt_width: int = 8,
    max_new_tokens: int = 4,
) -> torch.Tensor:
    """Fraction of arithmetic ``prompts`` whose greedy completion by ``model`` is right."""
    from rb_lightning.llm.generation import greedy_completions

    completions = greedy_completions(
        model, tokenizer, prompts, prompt_width=prompt_width, max_new_tokens=max_new_tokens
    )
    correct = arithmetic_reward(completions, prompts)
    return torch.tensor(correct).mean()


def arithmetic_partial_reward(
    completions: Sequence[Any], prompts: Sequence[Any] | None = None, **kwargs: Any
) -> list[float]:
    """Partial credit, for a policy that rarely answers right yet: at most 0.5 short of exact.

    1.0 for the right answer; otherwise 0.1 for a bare number plus 0.4 times the
    fraction of the answer's digits it has in the right place (aligned on the
    units), so "18" for 19 earns 0.3. Same signature as :func:`arithmetic_reward`.

    Examples:
        >>> arithmetic_partial_reward(["19", "18", "x9", ""], prompts=["12+7="] * 4)
        [1.0, 0.30000000000000004, 0.2, 0.0]
    """
    exact = arithmetic_reward(completions, prompts, **kwargs)
    answers = [solve(_text(p)) for p in prompts] if prompts is not None else None
    if answers is None:
        answers = [int(c) for c in kwargs["completion"]]
    rewards = []
    for completion, answer, right in zip(completions, answers, exact, strict=True):
        text = _text(completion).replace(EOS_TOKEN, "").replace(PAD_TOKEN, "").strip()
        if right or answer is None or not text:
            rewards.append(right)
            continue
        target = str(answer)
        matches = sum(a == b for a, b in zip(reversed(text), reversed(target), strict=False))
        rewards.append((0.1 if text.isdigit() else 0.0) + 0.4 * matches / len(target))
    return rewards


__all__ = [
    "ALPHABET",
    "EOS_TOKEN",
    "IGNORE_INDEX",
    "PAD_TOKEN",
    "UNK_TOKEN",
    "arithmetic_examples",
    "arithmetic_partial_reward",
    "arithmetic_reward",
    "arithmetic_tensordict",
    "fill_arithmetic_buffer",
    "make_tokenizer",
    "solve",
]
