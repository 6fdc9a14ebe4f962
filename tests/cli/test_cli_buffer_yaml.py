"""Every part of a replay buffer is configurable from YAML, and round-trips through --print_config."""

from __future__ import annotations

from pathlib import Path

import pytest
import torchrl.data as rl
from cli_helpers import run_cli, toy_config, write_config


def _cp(class_path: str, **init_args) -> dict:
    return (
        {"class_path": class_path, "init_args": init_args}
        if init_args
        else {"class_path": class_path}
    )


def _check_memmap(rb, tmp_path: Path) -> None:
    assert isinstance(rb.storage, rl.LazyMemmapStorage)
    assert Path(rb.storage.scratch_dir) == tmp_path / "scratch"
    assert any((tmp_path / "scratch").iterdir()), "the memmap files live in scratch_dir"
    assert isinstance(rb.sampler, rl.SamplerWithoutReplacement) and rb.sampler.drop_last
    assert isinstance(rb._writer, rl.TensorDictRoundRobinWriter)


def _check_prioritized(rb, tmp_path: Path) -> None:
    assert isinstance(rb.sampler, rl.PrioritizedSampler)
    assert (rb.sampler._alpha, rb.sampler._beta) == (0.7, 0.5)
    assert rb.sampler._max_capacity == 100


VARIANTS = {
    "tensor-random-roundrobin-prefetch": (
        _cp(
            "torchrl.data.TensorDictReplayBuffer",
            storage=_cp("torchrl.data.LazyTensorStorage", max_size=100),
            sampler=_cp("torchrl.data.RandomSampler"),
            writer=_cp("torchrl.data.RoundRobinWriter"),
            prefetch=2,
            batch_size=8,
        ),
        lambda rb, tmp: (
            isinstance(rb.storage, rl.LazyTensorStorage)
            and rb.storage.max_size == 100
            and rb._prefetch_cap == 2
        ),
    ),
    "memmap-scratch-without-replacement": (
        _cp(
            "torchrl.data.TensorDictReplayBuffer",
            storage=_cp("torchrl.data.LazyMemmapStorage", max_size=100, scratch_dir="SCRATCH"),
            sampler=_cp("torchrl.data.SamplerWithoutReplacement", drop_last=True, shuffle=True),
            writer=_cp("torchrl.data.TensorDictRoundRobinWriter"),
            batch_size=8,  # drop_last needs the batch size up front
        ),
        lambda rb, tmp: _check_memmap(rb, tmp) is None,
    ),
    "list-storage-plain-buffer": (
        _cp("torchrl.data.ReplayBuffer", storage=_cp("torchrl.data.ListStorage", max_size=100)),
        lambda rb, tmp: type(rb) is rl.ReplayBuffer and isinstance(rb.storage, rl.ListStorage),
    ),
    "prioritized-sampler": (
        _cp(
            "torchrl.data.TensorDictReplayBuffer",
            storage=_cp("torchrl.data.LazyTensorStorage", max_size=100),
            sampler=_cp("torchrl.data.PrioritizedSampler", max_capacity=100, alpha=0.7, beta=0.5),
        ),
        lambda rb, tmp: _check_prioritized(rb, tmp) is None,
    ),
    "prioritized-buffer": (
        _cp(
            "torchrl.data.TensorDictPrioritizedReplayBuffer",
            alpha=0.7,
            beta=0.5,
            storage=_cp("torchrl.data.LazyTensorStorage", max_size=100),
        ),
        lambda rb, tmp: _check_prioritized(rb, tmp) is None,
    ),
    "slice-sampler-nested-traj-key": (
        _cp(
            "torchrl.data.TensorDictReplayBuffer",
            storage=_cp("torchrl.data.LazyTensorStorage", max_size=100),
            sampler=_cp(
                "torchrl.data.SliceSampler",
                num_slices=2,
                traj_key=["collector", "traj_ids"],
                strict_length=False,
            ),
        ),
        lambda rb, tmp: (
            isinstance(rb.sampler, rl.SliceSampler)
            and rb.sampler.traj_key == ("collector", "traj_ids")
            and rb.sampler.num_slices == 2
        ),
    ),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_buffer_from_yaml_round_trips_and_trains(name, tmp_path, capsys):
    buffer, check = VARIANTS[name]
    text = str(buffer).replace("SCRATCH", str(tmp_path / "scratch"))
    config = write_config(toy_config(eval(text)), tmp_path, "first.yaml")  # noqa: S307 - our own literal

    with pytest.raises(SystemExit) as exit_info:
        run_cli(["fit", "--config", str(config), "--print_config"], tmp_path)
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert "Unable to serialize" not in printed
    round_trip = tmp_path / "printed.yaml"
    round_trip.write_text(printed)

    cli = run_cli(["fit", "--config", str(round_trip), "--trainer.max_steps=2"], tmp_path)

    rb = cli.datamodule.replay_buffer
    assert check(rb, tmp_path), f"{name}: built {rb}"
    assert len(rb) == 64, "the CallSource filled the buffer in setup"
    assert cli.trainer.global_step == 2
    assert cli.model.items_seen == 2 * 8
