"""``TorchThreads``: pin torch's intra-op thread count for the duration of a run."""

from __future__ import annotations

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from rb_lightning.validation import check_positive_int


class TorchThreads(Callback):
    """Set ``torch.set_num_threads`` while the Trainer runs, restore it afterwards.

    Small RL networks gain little from intra-op threads, and on a busy CPU extra threads spin
    against the environment (a CartPole DQN step measured 5x slower with torch's default on a
    busy 2-core machine), so every shipped config sets one.

    Args:
        num_threads: Intra-op threads for the run.

    Examples:
        >>> import torch
        >>> before = torch.get_num_threads()
        >>> cb = TorchThreads(1)
        >>> cb.setup(None, None, "fit"); torch.get_num_threads()
        1
        >>> cb.teardown(None, None, "fit"); torch.get_num_threads() == before
        True
    """

    def __init__(self, num_threads: int = 1) -> None:
        super().__init__()
        self.num_threads = check_positive_int(num_threads, "num_threads")
        self._previous: int | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._previous = torch.get_num_threads()
        torch.set_num_threads(self.num_threads)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._previous is not None:
            torch.set_num_threads(self._previous)
            self._previous = None


__all__ = [
    "TorchThreads",
]
