"""2N steps straight vs N + resume + N under the Trainer switches where resume means something:
bf16-mixed with priorities computed in bfloat16, gradient accumulation, manual optimization,
and a model that moves its own batches (docs/datasets.md, "Trainer switches")."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from resume_helpers import Recorder, buffer_ids, make_buffer, make_trainer

from rb_lightning import ReplayBufferDataModule


class Bf16Priorities(Recorder):
    """Priorities from the network's output, computed under autocast (bfloat16)."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch["id"].tolist())
        out = self.net(batch["obs"]).squeeze(-1)
        assert out.dtype == torch.bfloat16
        priority = out.detach().abs() + (batch["id"] % 7 + 1)
        self.trainer.datamodule.update_priority(batch, priority)
        return out.float().pow(2).mean()


class Manual(Recorder):
    def __init__(self) -> None:
        super().__init__(write_per_step=2, update_priority=True)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(super().training_step(batch, batch_idx))
        optimizer.step()


class OwnTransfer(Recorder):
    def __init__(self) -> None:
        super().__init__(write_per_step=2, update_priority=True)
        self.moved = 0

    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any:
        self.moved += 1
        return batch.to(device)


CASES = {
    "bf16-mixed": (Bf16Priorities, dict(precision="bf16-mixed")),
    "accumulate_grad_batches": (
        lambda: Recorder(write_per_step=2, update_priority=True),
        dict(accumulate_grad_batches=2),
    ),
    "manual-optimization": (Manual, {}),
    "model-transfer-hook": (OwnTransfer, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_resume_is_exact_under_the_switch(tmp_path, case):
    module, switches = CASES[case]
    n = 3

    def run(root, steps, *, ckpt_path=None, filled=True):
        rb = make_buffer("prioritized", filled=filled)
        torch.manual_seed(0)  # the same initial weights in both runs
        model = module()
        trainer = make_trainer(root, steps, n, **switches)
        # Epochs of 5 batches (not "auto", which a resumed run would size from the grown buffer).
        dm = ReplayBufferDataModule(rb, batch_size=8, num_batches=5)
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
        return model, rb

    straight, straight_rb = run(tmp_path / "straight", 2 * n)
    first, _ = run(tmp_path / "resumed", n)
    resumed, resumed_rb = run(tmp_path / "resumed", 2 * n, ckpt_path="last", filled=False)

    assert first.seen + resumed.seen == straight.seen
    if case == "accumulate_grad_batches":  # 5-batch epochs: 2 + 2 + 1 batches per 3 steps
        assert len(first.seen) == 5
    assert buffer_ids(resumed_rb) == buffer_ids(straight_rb)
    for i in range(len(straight_rb)):
        assert resumed_rb.sampler._sum_tree[i] == straight_rb.sampler._sum_tree[i]
    assert torch.equal(resumed.net.weight, straight.net.weight)
    if case == "model-transfer-hook":
        assert resumed.moved == len(resumed.seen)
