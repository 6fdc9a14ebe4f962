"""DDP resume: each rank's buffer is saved by that rank and restored to it.

Real 2-rank gloo DDP on CPU (scripts/ddp_resume.py); each rank collects rank-tagged
items into its own buffer. 8 steps straight vs 4 + resume + 4: every rank gets its own
buffer back and draws the same batches as in the straight run. Resumes on another
number of ranks: test_scale_ddp_elastic.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from script_runs import finish_script, rank_results, start_script
from torchrl.data import LazyTensorStorage, ReplayBuffer
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.errors import BufferCheckpointError

RANK_TAG = 100_000


def _start(out_dir: Path, max_steps: int, ckpt: str | None = None) -> subprocess.Popen:
    return start_script("ddp_resume.py", out_dir, max_steps, *([ckpt] if ckpt else []))


def _finish(proc: subprocess.Popen, out_dir: Path) -> list[dict]:
    finish_script(proc)
    return rank_results(out_dir)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, object]:
    straight_dir = tmp_path_factory.mktemp("straight")
    resumed_dir = tmp_path_factory.mktemp("resumed")
    # The straight run and the first half at once: process start-up overlaps well.
    straight, first = _start(straight_dir, 8), _start(resumed_dir, 4)
    results = {"straight": _finish(straight, straight_dir), "first": _finish(first, resumed_dir)}
    last = resumed_dir / "ckpt" / "last.ckpt"
    results["resumed"] = _finish(_start(resumed_dir, 8, str(last)), resumed_dir)
    results["ckpt"] = last
    return results


def test_each_rank_gets_its_own_buffer_back_and_the_same_stream(runs):
    for rank in (0, 1):
        straight, first, resumed = (runs[k][rank] for k in ("straight", "first", "resumed"))
        assert resumed["rank"] == rank and resumed["start_step"] == 4
        # What this rank held at the checkpoint: its own items only, all of them.
        assert resumed["start_ids"] == first["final_ids"]
        assert {i // RANK_TAG for i in resumed["start_ids"]} == {rank}
        assert len(resumed["start_ids"]) == 40 + 10 * rank + 2 * 4
        assert first["seen"] == straight["seen"][:4]
        assert resumed["seen"] == straight["seen"][4:], f"rank {rank} diverged after the resume"
        assert resumed["final_ids"] == straight["final_ids"]
    assert runs["straight"][0]["seen"] != runs["straight"][1]["seen"]


def test_checkpoint_has_one_buffer_per_rank_and_records_the_world_size(runs):
    checkpoint = torch.load(runs["ckpt"], weights_only=True)
    reference = checkpoint["ReplayBufferDataModule"]["buffer"]
    assert reference["kind"] == "ranks" and reference["world_size"] == 2
    version = Path(f"{runs['ckpt']}.buffer") / reference["version"]
    assert sorted(p.name for p in version.iterdir()) == ["rank0", "rank1"]
    for rank in (0, 1):
        manifest = json.loads((version / f"rank{rank}" / "manifest.json").read_text())
        assert (manifest["rank"], manifest["world_size"]) == (rank, 2)
    assert not (runs["ckpt"].parent / ".rb_lightning-staging").exists()


def test_resuming_on_fewer_ranks_without_room_is_a_clear_error(runs, tmp_path):
    import lightning as L

    class Collector(L.LightningModule):  # never trains: the restore fails first
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch["obs"]).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    # The 2 saved buffers hold 56 + 66 items: more than one buffer of 64 holds.
    datamodule = ReplayBufferDataModule(
        ReplayBuffer(storage=LazyTensorStorage(64)), batch_size=8, num_batches=None
    )
    trainer = quiet_trainer(max_steps=8, default_root_dir=tmp_path)
    with pytest.raises(
        BufferCheckpointError,
        match=r"(?s)122 replay-buffer items saved by 2 process\(es\) \(56, 66\).*max_size=64"
        r".*max_size of at least 122.*resume_keep='newest'",
    ):
        trainer.fit(Collector(), datamodule=datamodule, ckpt_path=runs["ckpt"])
    assert len(datamodule.replay_buffer) == 0


def test_export_reads_one_rank_or_all_with_the_rank_as_source(runs, tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    from rb_lightning.hf.cli import main

    finals = [runs["resumed"][rank]["final_ids"] for rank in (0, 1)]
    assert main([str(runs["ckpt"]), str(tmp_path / "all")]) == 0
    assert "one buffer per DDP rank (2 ranks)" in capsys.readouterr().out
    exported = datasets.load_from_disk(str(tmp_path / "all"))
    assert list(exported["id"]) == finals[0] + finals[1]
    assert list(exported["source"]) == [0] * len(finals[0]) + [1] * len(finals[1])
    assert main([str(runs["ckpt"]), str(tmp_path / "one"), "--rank", "1"]) == 0
    assert list(datasets.load_from_disk(str(tmp_path / "one"))["id"]) == finals[1]
    assert main([str(runs["ckpt"]), str(tmp_path / "bad"), "--rank", "2"]) == 2
    assert "ranks 0 to 1, not rank 2" in capsys.readouterr().err
