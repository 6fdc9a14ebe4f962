"""rb-lightning-export-hf: whatever a run or a user saved, to `datasets.load_from_disk` in one command.

Checkpoints are written by a real ``lightning.Trainer`` fitting a real
``ReplayBufferDataModule`` (a few steps); each kind the checkpoint code writes
(inside the ``.ckpt``, memory-mapped beside it, a ``ListStorage``, a mixture) is
exported and compared with the buffer that was saved. Per-rank (DDP) and Ray
checkpoints are exported in tests/scale, where those runs are made; the
console script itself, from ``train.py fit`` to a TRL trainer, in
tests/e2e/test_run_to_trl.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from console_scripts import entry_point
from lightning.pytorch.callbacks import ModelCheckpoint
from tensordict import TensorDict
from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    ReplayBuffer,
    TensorDictReplayBuffer,
)
from trainers import LinearOnX, quiet_trainer

from rb_lightning import BufferMixture, ReplayBufferDataModule
from rb_lightning.buffers.reader import SavedBuffer, load_buffer
from rb_lightning.errors import BufferCheckpointError
from rb_lightning.hf.cli import main
from rb_lightning.lightning.checkpoint_io import BufferCheckpointIO
from rb_lightning.llm.data import fill_arithmetic_buffer, make_tokenizer
from rb_lightning.persist.dumps import dump_buffer

datasets = pytest.importorskip("datasets")
pytestmark = pytest.mark.hf
REPO = Path(__file__).resolve().parents[2]


def _items(start: int, n: int) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict(
        {"x": ids, "obs": ids.float().unsqueeze(-1).expand(n, 3), "next": {"reward": -ids.float()}},
        batch_size=[n],
    )


def _fit(root: Path, replay_buffer, steps: int = 2, **datamodule) -> Path:
    """Fit a few steps with a ModelCheckpoint that saves last.ckpt; return its path."""
    checkpoints = ModelCheckpoint(dirpath=root, save_last=True, save_top_k=0)
    trainer = quiet_trainer(max_steps=steps, callbacks=[checkpoints])
    dm = ReplayBufferDataModule(replay_buffer, batch_size=4, num_batches=None, **datamodule)
    trainer.fit(LinearOnX(), datamodule=dm)
    return root / "last.ckpt"


def _export(capsys, *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _column(path: Path, name: str) -> list:
    return list(datasets.load_from_disk(str(path))[name])


@pytest.mark.parametrize(
    "storage, inline_max_bytes, kind",
    [
        (lambda: LazyTensorStorage(64), None, "its buffer inside the .ckpt"),
        (lambda: LazyMemmapStorage(64), 0, "its buffer saved beside it"),
        (lambda: ListStorage(64), None, "its buffer inside the .ckpt"),
    ],
    ids=["inline", "memmap-beside", "list-storage"],
)
def test_a_run_checkpoint_exports_as_saved(tmp_path, capsys, storage, inline_max_bytes, kind):
    rb = TensorDictReplayBuffer(storage=storage())
    rb.extend(_items(0, 20))
    options = {} if inline_max_bytes is None else {"checkpoint_inline_max_bytes": inline_max_bytes}
    checkpoint = _fit(tmp_path / "ckpt", rb, **options)
    code, out, err = _export(capsys, checkpoint, tmp_path / "hf")
    assert code == 0, err
    assert kind in out and "datasets.load_from_disk" in out
    # torchrl's bookkeeping (TensorDictReplayBuffer stores an "index" per item) is left out.
    loaded = datasets.load_from_disk(str(tmp_path / "hf"))
    assert loaded.column_names == ["x", "obs", "next.reward"]
    assert "left out    index (torchrl's bookkeeping" in out
    assert list(loaded["x"]) == list(range(20))
    assert list(loaded["next.reward"]) == [-float(i) for i in range(20)]
    # ...unless asked for.
    code, out, err = _export(capsys, checkpoint, tmp_path / "hf2", "--keys", "x", "index")
    assert code == 0, err
    assert datasets.load_from_disk(str(tmp_path / "hf2")).column_names == ["x", "index"]


def test_a_mixture_exports_one_member_or_all_with_a_source_column(tmp_path, capsys):
    offline = TensorDictReplayBuffer(storage=LazyTensorStorage(32))
    online = TensorDictReplayBuffer(
        storage=LazyTensorStorage(32), sampler=PrioritizedSampler(32, 0.6, 0.4)
    )
    offline.extend(_items(0, 12))
    online.extend(_items(100, 8))
    mixture = BufferMixture({"offline": offline, "online": online})
    checkpoint = _fit(tmp_path / "ckpt", mixture, checkpoint_inline_max_bytes=0)

    code, out, err = _export(capsys, checkpoint, "--list")
    assert code == 0, err
    assert "BufferMixture of ['offline', 'online']" in out
    assert "20 items" in out and "0 = offline (12), 1 = online (8)" in out
    assert "obs" in out and "float32  [3]" in out

    code, out, err = _export(capsys, checkpoint, tmp_path / "all")
    assert code == 0, err
    assert _column(tmp_path / "all", "source") == [0] * 12 + [1] * 8
    assert _column(tmp_path / "all", "x") == [*range(12), *range(100, 108)]
    # The prioritized member's sampling bookkeeping is not a column.
    assert "priority_weight" not in datasets.load_from_disk(str(tmp_path / "all")).column_names

    code, out, err = _export(capsys, checkpoint, tmp_path / "online", "--member", "online")
    assert code == 0, err
    assert _column(tmp_path / "online", "x") == list(range(100, 108))

    code, out, err = _export(capsys, checkpoint, tmp_path / "nope", "--member", "demos")
    assert code == 2 and "--member" in err and "['offline', 'online']" in err
    assert err.count("\n") == 1 and not (tmp_path / "nope").exists()


def test_a_chunked_checkpoint_exports_in_storage_order(tmp_path, capsys):
    # BufferCheckpointIO(incremental=True): the buffer wraps between the two saves, so last.ckpt's
    # rows come from chunks of both; the export reads them in storage order.
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16))
    rb.extend(_items(0, 12))
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=1)

    class Writes(LinearOnX):
        def training_step(self, batch, batch_idx):
            rb.extend(_items(100 + 4 * self.global_step, 4))
            return super().training_step(batch, batch_idx)

    trainer = quiet_trainer(
        max_steps=2, callbacks=[checkpoints], plugins=[BufferCheckpointIO(incremental=True)]
    )
    dm = ReplayBufferDataModule(rb, batch_size=4, num_batches=None, checkpoint_inline_max_bytes=0)
    trainer.fit(Writes(), datamodule=dm)
    assert len(list((tmp_path / "ckpt" / "buffer-chunks").iterdir())) > 1
    code, out, err = _export(capsys, tmp_path / "ckpt" / "last.ckpt", tmp_path / "hf")
    assert code == 0, err
    assert _column(tmp_path / "hf", "x") == [104, 105, 106, 107, *range(4, 12), *range(100, 104)]


def test_dumps_and_saved_files_export_as_before(tmp_path, capsys):
    rb = ReplayBuffer(storage=LazyTensorStorage(64))
    fill_arithmetic_buffer(rb, 40, make_tokenizer(), seed=3)
    prompts = list(rb[:40]["prompt"])

    dump_buffer(rb, tmp_path / "dump")  # what docs/trl.md recommends for several processes
    code, out, err = _export(capsys, tmp_path / "dump", tmp_path / "a", "--keys", "prompt")
    assert code == 0, err
    assert "a dump_buffer directory" in out and _column(tmp_path / "a", "prompt") == prompts

    rb.dumps(tmp_path / "dumps")
    code, out, err = _export(capsys, tmp_path / "dumps", tmp_path / "b")
    assert code == 0, err
    # ReplayBuffer.loads (torchrl 0.14.1) would repeat the first prompt; the export must not.
    assert _column(tmp_path / "b", "prompt") == prompts and len(set(prompts)) > 1

    torch.save(rb, tmp_path / "rb.pt")
    code, out, err = _export(capsys, tmp_path / "rb.pt", tmp_path / "c")
    # A pickle is refused unless the user says they trust it.
    assert code == 2 and "--allow-pickle" in err and "ReplayBuffer" in err
    assert err.count("\n") == 1 and not (tmp_path / "c").exists()
    code, out, err = _export(capsys, tmp_path / "rb.pt", tmp_path / "c", "--allow-pickle")
    assert code == 0, err
    assert _column(tmp_path / "c", "prompt") == prompts


def test_a_run_directory_means_its_last_checkpoint(tmp_path, capsys):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16))
    rb.extend(_items(0, 10))
    run = tmp_path / "runs" / "toy" / "version_0"
    _fit(run / "checkpoints", rb)
    for given in (run, run.parent):  # runs/<config>/version_0, runs/<config>: the newest run
        saved = SavedBuffer.read(given)
        assert saved.path == run / "checkpoints" / "last.ckpt"
        assert saved.replay_buffer[:]["x"].tolist() == list(range(10))
    # load_buffer takes a checkpoint or a run directory as well as a dump.
    restored = TensorDictReplayBuffer(storage=LazyTensorStorage(16))
    load_buffer(restored, run)
    assert restored[:]["x"].tolist() == list(range(10))


def test_errors_say_what_the_input_is_and_what_works(tmp_path, capsys):
    def error(*args) -> str:
        code, out, err = _export(capsys, *args)
        assert code == 2 and out == "" and "Traceback" not in err
        assert err.startswith("rb-lightning-export-hf: error: ") and err.count("\n") == 1
        return err

    err = error(tmp_path / "missing", tmp_path / "hf")
    assert "no such file or directory" in err and "runs/<config>/version_<N>" in err
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x")
    err = error(tmp_path / "notes", tmp_path / "hf")
    assert "no checkpoints/last.ckpt" in err and "todo.txt" in err
    torch.save({"state_dict": {}, "epoch": 0}, tmp_path / "model.ckpt")
    err = error(tmp_path / "model.ckpt", tmp_path / "hf")
    assert "Lightning checkpoint without a replay buffer" in err

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16))
    rb.extend(_items(0, 10))
    checkpoint = _fit(tmp_path / "ckpt", rb)
    assert "--member" in error(checkpoint, tmp_path / "hf", "--member", "online")
    assert "--rank" in error(checkpoint, tmp_path / "hf", "--rank", "1")
    err = error(checkpoint, tmp_path / "hf", "--keys", "prompt")
    assert "--keys: prompt not in the buffer" in err and "x, obs, index, next.reward" in err
    assert "OUT" in error(checkpoint)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "data").write_text("keep me")
    assert "not an empty directory" in error(checkpoint, tmp_path / "full")
    assert not (tmp_path / "hf").exists()

    # In Python, the dump reader says what a .ckpt is and what reads it.
    with pytest.raises(BufferCheckpointError, match=r"is a file.*checkpoint\.load_buffer"):
        from rb_lightning.persist.dumps import load_dump

        load_dump(TensorDictReplayBuffer(storage=LazyTensorStorage(16)), checkpoint)


def test_help_comes_without_torch_and_shows_the_checkpoint_case_first():
    # The console script's own entry point, as pip installs it from pyproject.toml.
    module, function = entry_point("rb-lightning-export-hf")
    assert (module, function) == ("rb_lightning.hf.cli", "main")
    probe = (
        "import sys\n"
        f"from {module} import {function}\n"
        f"try:\n    {function}(['--help'])\nexcept SystemExit as stop:\n    code = stop.code\n"
        "print('exit', code, [m for m in ('torch', 'torchrl', 'datasets') if m in sys.modules])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("exit 0 []")  # nothing heavy imported
    examples = result.stdout.split("examples:")[1].strip().splitlines()
    assert examples[0].split()[:2] == ["rb-lightning-export-hf", "runs/llm_sft/version_0"]
    assert "--allow-pickle" in result.stdout and "UNSAFE" in result.stdout
