"""rb-lightning-export-hf: a saved buffer to `datasets.load_from_disk` in one command."""

from __future__ import annotations

import pytest
import torch
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning.hf import export_main
from rb_lightning.llm.data import fill_arithmetic_buffer, make_tokenizer

datasets = pytest.importorskip("datasets")
pytestmark = pytest.mark.hf


@pytest.fixture(scope="module")
def arithmetic_rb():
    rb = ReplayBuffer(storage=LazyTensorStorage(64))
    fill_arithmetic_buffer(rb, 40, make_tokenizer(), seed=3)
    return rb


def expected_rows(rb):
    items = rb[torch.arange(len(rb))]
    return items["prompt"], items["input_ids"].tolist()


def test_export_of_a_dumped_buffer_keeps_every_string(tmp_path, arithmetic_rb, capsys):
    arithmetic_rb.dumps(tmp_path / "buffer")
    assert export_main([str(tmp_path / "buffer"), str(tmp_path / "hf")]) == 0
    assert "Saved 40 items" in capsys.readouterr().out
    loaded = datasets.load_from_disk(str(tmp_path / "hf"))
    prompts, input_ids = expected_rows(arithmetic_rb)
    # ReplayBuffer.loads (torchrl 0.14.1) would repeat the first prompt; the export must not.
    assert list(loaded["prompt"]) == prompts and len(set(prompts)) > 1
    assert list(loaded["input_ids"]) == input_ids
    assert loaded.features["input_ids"].feature.dtype == "int64"


def test_export_of_a_saved_buffer_with_selected_keys(tmp_path, arithmetic_rb):
    torch.save(arithmetic_rb, tmp_path / "rb.pt")
    export_main([str(tmp_path / "rb.pt"), str(tmp_path / "hf"), "--keys", "prompt", "completion"])
    loaded = datasets.load_from_disk(str(tmp_path / "hf"))
    assert loaded.column_names == ["prompt", "completion"]
    assert list(loaded["prompt"]) == expected_rows(arithmetic_rb)[0]


def test_export_names_what_it_accepts(tmp_path, capsys):
    # One paragraph and exit code 2 (like argparse's own errors), naming BUFFER and the fix.
    assert export_main([str(tmp_path / "missing"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "error: BUFFER" in err and "No replay buffer" in err
    assert "rb.dumps(path)" in err and "Traceback" not in err and err.count("\n") == 1
    (tmp_path / "empty").mkdir()
    assert export_main([str(tmp_path / "empty"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "error: BUFFER" in err and "storage_metadata.json" in err and "rb.dumps(path)" in err
    assert not (tmp_path / "hf").exists()
