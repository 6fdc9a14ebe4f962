"""A mixture with one prioritized member: 2N steps straight == N + resume + N, batch by batch."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from mixture_helpers import items, make_mixture
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.errors import BufferCheckpointError

N = 4
WRITE_ID0 = 200_000


class Learner(L.LightningModule):
    """Records batches; writes 3 items a step to the online member; updates priorities."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.seen: list[tuple[list[int], list[int]]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append((batch["id"].tolist(), batch["source"].tolist()))
        dm = self.trainer.datamodule
        dm.replay_buffer.member("online").extend(items(3, WRITE_ID0 + 3 * self.global_step))
        dm.update_priority(batch, (batch["id"] % 7 + 1).float())
        return self.net(batch["obs"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(root: Path, steps: int, *, filled: bool, ckpt_path=None, composition=None, **dm):
    mix = make_mixture(
        offline=60 if filled else 0, online=40 if filled else 0, seed=0, **(composition or {})
    )
    datamodule = ReplayBufferDataModule(mix, batch_size=8, num_batches=5, **dm)
    model = Learner()
    checkpoint = ModelCheckpoint(dirpath=root / "ckpt", save_last=True, every_n_train_steps=N)
    trainer = quiet_trainer(
        default_root_dir=str(root), max_steps=steps, num_sanity_val_steps=0, callbacks=[checkpoint]
    )
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return model, mix


@pytest.mark.parametrize("inline_max_bytes", [64 * 1024**2, 0], ids=["inline", "beside"])
def test_resumed_mixture_matches_straight_run(tmp_path, inline_max_bytes):
    dm = dict(checkpoint_inline_max_bytes=inline_max_bytes)
    straight, straight_mix = _fit(tmp_path / "straight", 2 * N, filled=True, **dm)
    first, _ = _fit(tmp_path / "resumed", N, filled=True, **dm)
    # The resumed process starts from empty members: everything comes from the checkpoint.
    resumed, resumed_mix = _fit(tmp_path / "resumed", 2 * N, filled=False, ckpt_path="last", **dm)
    assert first.seen == straight.seen[:N]
    assert resumed.seen == straight.seen[N:]
    for name in ("offline", "online"):
        a, b = straight_mix.member(name), resumed_mix.member(name)
        assert a[:]["id"].tolist() == b[:]["id"].tolist()
        assert a.write_count == b.write_count
    tree_a = straight_mix.member("online").sampler._sum_tree
    tree_b = resumed_mix.member("online").sampler._sum_tree
    assert [tree_a[i] for i in range(64)] == [tree_b[i] for i in range(64)]


def test_resume_into_other_member_names_says_so(tmp_path):
    _fit(tmp_path, N, filled=True)
    from mixture_helpers import member

    from rb_lightning import BufferMixture

    other = BufferMixture({"demos": member(False), "online": member(True)})
    dm = ReplayBufferDataModule(other, batch_size=8, num_batches=5)
    trainer = quiet_trainer(max_steps=2 * N, num_sanity_val_steps=0)
    with pytest.raises(BufferCheckpointError, match="same member names"):
        trainer.fit(Learner(), datamodule=dm, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))


@pytest.mark.parametrize(
    ("saved", "given", "quoted"),
    [
        (
            {"fractions": {"offline": 0.5, "online": 0.5}},
            {"fractions": {"offline": 0.25, "online": 0.75}},
            [
                "fractions={'offline': 0.5, 'online': 0.5}",
                "fractions={'offline': 0.25, 'online': 0.75}",
            ],
        ),
        (
            {"fractions": {"offline": 0.5, "online": 0.5}},
            {"weights": {"offline": 1, "online": 1}},
            ["fractions={'offline': 0.5, 'online': 0.5}", "weights={'offline': 1, 'online': 1}"],
        ),
        (
            {"weights": {"offline": 1, "online": 3}},
            {"weights": {"offline": 1, "online": 2}},
            ["weights={'offline': 1, 'online': 3}", "weights={'offline': 1, 'online': 2}"],
        ),
        (
            {"fractions": None},  # neither: equal fractions
            {"fractions": {"offline": 0.75, "online": 0.25}},
            ["equal fractions", "fractions={'offline': 0.75, 'online': 0.25}"],
        ),
    ],
    ids=["fractions", "fractions-to-weights", "weights", "default-to-fractions"],
)
def test_resume_with_another_composition_names_the_saved_and_the_given(
    tmp_path, saved, given, quoted
):
    _fit(tmp_path, N, filled=True, composition=saved)
    with pytest.raises(BufferCheckpointError) as err:
        _fit(tmp_path, 2 * N, filled=False, ckpt_path="last", composition=given)
    message = str(err.value)
    assert all(text in message for text in quoted), message
    assert "saved" in message and "\n" not in message


def test_resume_with_the_same_shares_written_alike_is_taken(tmp_path):
    # Weights are relative: {1, 3} and {2, 6} draw alike; so do the default and equal fractions.
    _fit(tmp_path / "w", N, filled=True, composition={"weights": {"offline": 1, "online": 3}})
    _fit(tmp_path / "w", N + 1, filled=False, ckpt_path="last",
         composition={"weights": {"offline": 2, "online": 6}})  # fmt: skip
    _fit(tmp_path / "f", N, filled=True)
    _fit(tmp_path / "f", N + 1, filled=False, ckpt_path="last",
         composition={"fractions": {"offline": 0.5, "online": 0.5}})  # fmt: skip
