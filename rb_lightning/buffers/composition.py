"""A :class:`~rb_lightning.BufferMixture`'s composition: exact fractions or random weights.

:class:`Composition` keeps the values as typed (errors and checkpoints quote those), says
how many items of each member a batch holds and refuses a resume with other shares.
``fractions`` must add up to 1 and make whole counts, to within :data:`FRACTION_TOLERANCE`
(the rounding of typed decimals); ``weights`` are relative.

Examples:
    >>> c = Composition.of(["offline", "online"], fractions={"offline": 0.25, "online": 0.75})
    >>> c.counts(8, None), c.describe()
    ([2, 6], "fractions={'offline': 0.25, 'online': 0.75}")
    >>> Composition.of(["a", "b"], fractions={"a": 0.1, "b": 0.3})
    Traceback (most recent call last):
    ...
    rb_lightning.errors.UsageError: BufferMixture(fractions={'a': 0.1, 'b': 0.3}): the fractions add up to 0.4, not 1. ...
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rb_lightning.errors import BufferCheckpointError, UsageError

#: How far from 1 the fractions may add up, and ``fraction * batch_size`` from a whole
#: number: the rounding of typed decimals (``0.1 + 0.2``, ``0.3333333``), nothing more.
FRACTION_TOLERANCE = 1e-6
#: Batch sizes searched for the smallest one a mixture's fractions split exactly.
_LARGEST_SUGGESTED_BATCH = 100_000

__all__ = ["FRACTION_TOLERANCE", "Composition"]


def _typed(given: Mapping[str, float]) -> dict[str, float]:
    """The values as the user typed them (an int stays an int), as plain Python numbers."""
    return {
        str(name): int(value) if isinstance(value, int) and not isinstance(value, bool)
        else float(value)
        for name, value in given.items()
    }  # fmt: skip


def _checked(names: list[str], given: Mapping[str, float], what: str) -> list[float]:
    """One finite, non-negative value per member, in ``names`` order (fractions: sum 1)."""
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise UsageError(
            what,
            f"BufferMixture({what}=...) names {unknown}, which are not members; the members "
            f"are {names}. Give one {what[:-1]} per member name.",
        )
    missing = [name for name in names if name not in given]
    if missing:
        raise UsageError(
            what,
            f"BufferMixture({what}=...) has no value for {missing}. Give one per member "
            f"({names}), 0 to leave a member out of sampling.",
        )
    values = [float(given[name]) for name in names]
    if any(not math.isfinite(v) or v < 0 for v in values) or sum(values) <= 0:
        raise UsageError(
            what,
            f"BufferMixture({what}={dict(given)!r}): values must be finite, >= 0 and not all 0.",
        )
    if what == "fractions" and abs(math.fsum(values) - 1) > FRACTION_TOLERANCE:
        typed = _typed(given)
        raise UsageError(
            "fractions",
            f"BufferMixture(fractions={typed!r}): the fractions add up to "
            f"{math.fsum(values):.12g}, not 1. Each fraction is an exact share of every batch "
            "(a member with fraction f gives f * batch_size items), so together they must be "
            f"1: give shares that add up to 1, or pass these values as weights={typed!r} to "
            "draw each item's member at random with these relative weights.",
        )
    return values


def whole_counts(fractions: list[float], batch_size: int) -> list[int] | None:
    """Items of each member in a batch of ``batch_size``: each ``f * batch_size`` rounded,
    when each is within :data:`FRACTION_TOLERANCE` of a whole number and they add up to
    ``batch_size``; else ``None``.

    Examples:
        >>> whole_counts([0.25, 0.75], 8), whole_counts([0.25, 0.75], 10)
        ([2, 6], None)
    """
    exact = [f * batch_size for f in fractions]
    counts = [round(e) for e in exact]
    if sum(counts) != batch_size or any(
        abs(c - e) > FRACTION_TOLERANCE for c, e in zip(counts, exact, strict=True)
    ):
        return None
    return counts


@dataclass(frozen=True)
class Composition:
    """Fractions or weights of named members, as given (see the module's docstring).

    Attributes:
        names: The members, in source-id order.
        kind: ``"fractions"`` or ``"weights"``.
        given: The values as typed; ``None`` for the default, equal fractions.
        shares: One value per member summing to 1: the fractions, or the weights'
            probabilities.
    """

    names: tuple[str, ...]
    kind: str
    given: dict[str, float] | None
    shares: tuple[float, ...]

    @classmethod
    def of(
        cls,
        names: list[str],
        fractions: Mapping[str, float] | None = None,
        weights: Mapping[str, float] | None = None,
    ) -> Composition:
        """Check ``fractions`` or ``weights`` (neither: equal fractions) for ``names``."""
        if fractions is not None and weights is not None:
            raise UsageError(
                "fractions",
                "BufferMixture takes fractions= (exact shares of every batch) or weights= "
                "(random per item), not both.",
            )
        if weights is not None:
            raw = _checked(names, weights, "weights")
            total = sum(raw)
            return cls(tuple(names), "weights", _typed(weights), tuple(w / total for w in raw))
        if fractions is not None:  # as typed: they add up to 1 (checked), nothing is rescaled
            shares = _checked(names, fractions, "fractions")
            return cls(tuple(names), "fractions", _typed(fractions), tuple(shares))
        return cls(tuple(names), "fractions", None, tuple([1 / len(names)] * len(names)))

    @classmethod
    def from_saved(cls, names: list[str], saved: Mapping[str, Any]) -> Composition:
        """The composition a checkpoint keeps (:meth:`to_saved`), for ``names``."""
        kind, values = next(iter(saved.items()))
        if values is None:
            return cls.of(names)
        shares = [float(values.get(name, 0.0)) for name in names]
        total = sum(shares) or 1.0
        return cls(tuple(names), str(kind), dict(values), tuple(s / total for s in shares))

    def to_saved(self) -> dict[str, Any]:
        """``{"fractions": {...}}``, ``{"weights": {...}}`` or ``{"fractions": None}``
        (the default): plain values a ``weights_only`` checkpoint holds."""
        return {self.kind: None if self.given is None else dict(self.given)}

    def describe(self) -> str:
        """``fractions={...}`` / ``weights={...}`` as typed; the default in words."""
        if self.given is None:
            return "equal fractions (neither fractions= nor weights= given)"
        return f"{self.kind}={self.given!r}"

    @property
    def fixed(self) -> bool:
        """Whether every batch holds exact counts (fractions), not random ones (weights)."""
        return self.kind == "fractions"

    def counts(self, batch_size: int, generator: torch.Generator | None) -> list[int]:
        """Items of each member in a batch of ``batch_size`` (weights: drawn with ``generator``)."""
        if self.fixed:
            counts = whole_counts(list(self.shares), batch_size)
            if counts is None:
                raise UsageError("batch_size", self._split_error(batch_size))
            return counts
        probabilities = torch.tensor(self.shares, dtype=torch.float)
        drawn = torch.multinomial(probabilities, batch_size, True, generator=generator)
        return drawn.bincount(minlength=len(self.names)).tolist()

    def _split_error(self, batch_size: int) -> str:
        """Why ``batch_size`` is refused, quoting only what was typed."""
        smallest = next(
            (
                size
                for size in range(1, _LARGEST_SUGGESTED_BATCH + 1)
                if whole_counts(list(self.shares), size) is not None
            ),
            None,
        )
        fix = (
            f"Choose a batch_size they split exactly: batch_size={smallest} or a multiple of it"
            if smallest is not None
            else "Choose fractions that split your batch_size exactly"
        )
        return (
            f"BufferMixture with {self.describe()} and batch_size={batch_size}: every batch "
            "holds exactly fraction * batch_size items of each member, and for this "
            f"batch_size some of those are not whole numbers. {fix}, or use weights= to draw "
            "each item's member at random (the counts then vary per batch)."
        )

    def check_resumed(self, saved: Mapping[str, Any] | None) -> None:
        """Refuse to resume a checkpoint whose mixture drew with other shares (weights compared as shares: ``{1, 3}`` is ``{2, 6}``; ``saved=None`` is taken)."""
        if saved is None:
            return
        before = Composition.from_saved(list(self.names), saved)
        if before.kind == self.kind and all(
            abs(a - b) <= 1e-9 for a, b in zip(before.shares, self.shares, strict=True)
        ):
            return
        raise BufferCheckpointError(
            f"The checkpoint's BufferMixture of {list(self.names)} was saved with "
            f"{before.describe()}, and the DataModule's mixture is given {self.describe()}. "
            "A resumed run continues the saved one (the batches it read ahead and its "
            "generator are in the checkpoint), so it keeps the shares it was saved with: "
            f"build the mixture with {before.describe()} to resume, or start a new run (no "
            "ckpt_path) to train with other shares."
        )
