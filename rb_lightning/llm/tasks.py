"""What a GRPO run trains on: prompts, the tokenizer, and what a right answer is.

:class:`PromptTask` takes each as an object or a ``"module:function"`` path a YAML config
can name; :class:`ArithmeticTask` is the shipped task. Rewards stay on the module.

Examples:
    A task of your own: reverse a string, with the shipped character tokenizer.

    >>> import torch
    >>> task = PromptTask(
    ...     prompts=["abc=", "hello=", "xyz="],
    ...     tokenizer="rb_lightning.llm.data:make_tokenizer",
    ...     correct=lambda prompt, completion: completion == prompt[:-1][::-1],
    ... )
    >>> task.draw(2, torch.Generator().manual_seed(0)), task.is_correct("abc=", "cba")
    (['xyz=', 'abc='], True)
    >>> ArithmeticTask(max_operand=9).draw(2, torch.Generator().manual_seed(0))
    ['4+9=', '3+0=']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from rb_lightning.errors import ArgumentTypeError, UsageError
from rb_lightning.sources import resolve_callable

__all__ = ["ArithmeticTask", "PromptTask"]

#: ``prompts`` as a function: ``f(n, generator) -> list[str]`` (draw ``n`` with ``generator``).
PromptFunction = Callable[[int, torch.Generator], list[str]]


def _callable(value: Any, argument: str) -> Any:
    if isinstance(value, str):
        return resolve_callable(value, argument)
    if not callable(value):
        raise ArgumentTypeError(
            argument,
            f"{argument} must be a callable or a 'module:function' path, got "
            f"{type(value).__name__}.",
        )
    return value


class PromptTask:
    """Prompts, a tokenizer and (optionally) a correctness check, for GRPO on any task.

    Args:
        prompts: A list (each step draws uniformly with its generator), or
            ``f(n, generator) -> list[str]`` / its ``"module:function"`` path.
        tokenizer: A ``transformers`` tokenizer with ``pad_token`` and ``eos_token``, or a
            function returning one / its path (built when first needed).
        correct: ``f(prompt, completion) -> bool`` / its path: what ``validate`` and ``test``
            count as right. ``None``: they log the mean greedy reward (``val_reward``).
    """

    def __init__(
        self,
        # Any: a "module:function" string reaches the task as it is (jsonargparse would try
        # a Callable type first, and warn that it cannot serialize it); the types are above.
        prompts: Any,
        tokenizer: Any,
        correct: Any = None,
    ) -> None:
        if isinstance(prompts, str):
            self._prompts: Sequence[str] | PromptFunction = resolve_callable(prompts, "prompts")
        elif callable(prompts):
            self._prompts = prompts
        else:
            listed = list(prompts)
            if not listed or not all(isinstance(p, str) for p in listed):
                raise ArgumentTypeError(
                    "prompts",
                    "prompts must be a non-empty list of strings, a function "
                    "f(n, generator) -> list[str], or its 'module:function' path.",
                )
            self._prompts = listed
        self._tokenizer_source = tokenizer
        self._tokenizer: Any = None
        self._correct = None if correct is None else _callable(correct, "correct")

    @property
    def tokenizer(self) -> Any:
        """The task's tokenizer (built on first use when given as a function or a path)."""
        if self._tokenizer is None:
            source = self._tokenizer_source
            if isinstance(source, str) or (callable(source) and not hasattr(source, "decode")):
                source = _callable(source, "tokenizer")()
            for name in ("pad_token_id", "eos_token_id"):
                if getattr(source, name, None) is None:
                    raise UsageError(
                        "tokenizer",
                        f"The task's tokenizer has no {name[:-3]}: GRPO pads prompts and ends "
                        f"completions with it. Set tokenizer.{name[:-3]} (e.g. "
                        "tokenizer.pad_token = tokenizer.eos_token).",
                    )
            self._tokenizer = source
        return self._tokenizer

    def draw(self, n: int, generator: torch.Generator) -> list[str]:
        """``n`` prompts, drawn with ``generator``."""
        if callable(self._prompts):
            drawn = list(self._prompts(n, generator))
            if len(drawn) != n or not all(isinstance(p, str) for p in drawn):
                raise UsageError(
                    "prompts",
                    f"The task's prompts function must return a list of {n} strings, got "
                    f"{len(drawn)} items.",
                )
            return drawn
        index = torch.randint(0, len(self._prompts), (n,), generator=generator, device=generator.device)
        return [self._prompts[i] for i in index.tolist()]

    @property
    def has_answers(self) -> bool:
        """Whether :meth:`is_correct` can judge a completion (``correct`` given)."""
        return self._correct is not None

    def is_correct(self, prompt: str, completion: str) -> bool:
        """Whether ``completion`` answers ``prompt`` (needs ``correct``)."""
        if self._correct is None:
            raise UsageError("correct", "This task has no `correct` function to judge answers.")
        return bool(self._correct(prompt, completion))

    def check_eval_prompts(self, prompts: list[str]) -> None:
        """Refuse evaluation prompts this task cannot judge (none, for a generic task)."""

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if not hasattr(self._tokenizer_source, "decode"):  # rebuilt where it is used
            state["_tokenizer"] = None
        return state


class ArithmeticTask(PromptTask):
    """The shipped task: ``"a+b="`` with operands up to ``max_operand``, the exact sum right.

    Args:
        max_operand: Largest operand of the prompts.
    """

    def __init__(self, max_operand: int = 50) -> None:
        self.max_operand = int(max_operand)
        super().__init__(
            prompts=self._arithmetic_prompts,
            tokenizer="rb_lightning.llm.data:make_tokenizer",
            correct=_exact_sum,
        )

    def _arithmetic_prompts(self, n: int, generator: torch.Generator) -> list[str]:
        top = self.max_operand + 1
        pairs = torch.randint(0, top, (n, 2), generator=generator, device=generator.device).tolist()
        return [f"{a}+{b}=" for a, b in pairs]

    def check_eval_prompts(self, prompts: list[str]) -> None:
        """Refuse evaluation prompts that are not arithmetic."""
        from rb_lightning.llm.data import solve

        if any(solve(p) is None for p in prompts):
            raise UsageError(
                "data.init_args.val_buffer",
                "ArithmeticTask evaluates arithmetic prompts ('12+7='); the evaluation buffer's "
                "'prompt' column holds others. Fill it with "
                "rb_lightning.llm.data:fill_arithmetic_buffer, or give GRPOModule the task "
                "those prompts belong to (model.init_args.task).",
            )


def _exact_sum(prompt: str, completion: str) -> bool:
    from rb_lightning.llm.data import arithmetic_reward

    return arithmetic_reward([completion], prompts=[prompt])[0] == 1.0
