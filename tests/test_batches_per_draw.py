"""``batches_per_draw``: several training batches from one ``rb.sample`` call.

Exact resume with batches drawn ahead is in tests/resume/test_resume_stream.py.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
import yaml
from script_runs import run_train_py
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.errors import UsageError
from rb_lightning.stream.sampling import BufferStream


def _buffer(sampler=None, n: int = 64) -> ReplayBuffer:
    kwargs = {} if sampler is None else {"sampler": sampler}
    rb = ReplayBuffer(
        storage=LazyTensorStorage(n), generator=torch.Generator().manual_seed(0), **kwargs
    )
    rb.extend(TensorDict({"id": torch.arange(n), "x": torch.randn(n, 3)}, batch_size=[n]))
    return rb


def test_a_draw_of_k_batches_is_k_draws_of_one_with_a_random_sampler():
    one, four = BufferStream(_buffer(), 8), BufferStream(_buffer(), 8)
    four.batches_per_draw = 4
    for step in range(10):
        batch = four.sample()
        assert batch.batch_size == torch.Size([8])
        assert torch.equal(batch["id"], one.sample()["id"]), step
        assert len(four.drawn_ahead()) == 3 - step % 4
    assert four.batches_drawn == one.batches_drawn == 10


class _Recorder(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 1)
        self.seen: list[list[int]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch["id"].tolist())
        return self.net(batch["x"]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_datamodule_trains_on_the_same_batches_with_batches_drawn_ahead():
    def seen(per_draw: int) -> list[list[int]]:
        model = _Recorder()
        datamodule = ReplayBufferDataModule(
            _buffer(), batch_size=8, num_batches=None, batches_per_draw=per_draw
        )
        quiet_trainer(max_steps=11).fit(model, datamodule=datamodule)
        return model.seen

    assert seen(4) == seen(1)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (dict(batches_per_draw=0), "batches_per_draw must be a positive integer"),
        (dict(batches_per_draw=4, num_workers=1), "could not be saved in a checkpoint"),
    ],
)
def test_bad_batches_per_draw_is_refused_when_built(options, named):
    with pytest.raises(UsageError, match=named) as error:
        ReplayBufferDataModule(_buffer(), batch_size=8, **options)
    assert error.value.argument == "batches_per_draw"


def test_a_sampler_whose_batches_depend_on_each_other_is_refused():
    stream = BufferStream(_buffer(SamplerWithoutReplacement()), 8)
    with pytest.raises(UsageError, match="SamplerWithoutReplacement") as error:
        stream.batches_per_draw = 2
    assert "batches_per_draw=1" in str(error.value)


def _config(directory, name: str, sampler: str | None = None, **data: Any):
    """The CLI tests' toy regression (tests/cli/cli_toy.py) with ``data`` options."""
    storage = {"class_path": "torchrl.data.LazyTensorStorage", "init_args": {"max_size": 100}}
    buffer: dict[str, Any] = {
        "class_path": "torchrl.data.TensorDictReplayBuffer",
        "init_args": {"storage": storage},
    }
    if sampler is not None:
        buffer["init_args"]["sampler"] = {"class_path": f"torchrl.data.{sampler}"}
    source = {
        "class_path": "rb_lightning.sources.CallSource",
        "init_args": {"function": "cli_toy:fill_regression"},
    }
    init = {"replay_buffer": buffer, "batch_size": 8, "source": source, **data}
    config = {
        "model": {"class_path": "cli_toy.Regressor"},
        "data": {"class_path": "rb_lightning.ReplayBufferDataModule", "init_args": init},
    }
    path = directory / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_train_py_runs_with_batches_per_draw_and_refuses_what_it_cannot_draw(tmp_path):
    good = _config(tmp_path, "ok.yaml", batches_per_draw=4, num_batches=None)
    result = run_train_py(
        [
            "fit",
            "--config",
            str(good),
            "--trainer.max_steps=6",
            "--trainer.enable_progress_bar=false",
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    refused = {
        "workers": (
            _config(tmp_path, "w.yaml", batches_per_draw=4, num_workers=1),
            "num_workers=0",
        ),
        "sampler": (
            _config(tmp_path, "s.yaml", "SamplerWithoutReplacement", batches_per_draw=4),
            "its sampler is a SamplerWithoutReplacement",
        ),
    }
    for case, (config, named) in refused.items():
        result = run_train_py(["fit", "--config", str(config)], tmp_path)
        assert result.returncode == 2, (case, result.stderr)
        assert "Traceback" not in result.stderr
        assert "Modules in train mode" not in result.stdout + result.stderr  # before fit starts
        last = [line for line in result.stderr.splitlines() if line.strip()][-1]
        assert "at data.init_args.batches_per_draw:" in last and named in last, (case, last)
        assert "batches_per_draw=1" in last or "num_workers=0" in last, last
