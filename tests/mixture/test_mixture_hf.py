"""A BufferMixture exported to Hugging Face `datasets`: stream and snapshot, with the source column."""

from __future__ import annotations

import pytest
from mixture_helpers import ONLINE_ID0, make_mixture

from rb_lightning import ReplayBufferDataModule
from rb_lightning.hf.export import to_hf_dataset

datasets = pytest.importorskip("datasets")
pytestmark = pytest.mark.hf


def test_stream_export_keeps_the_composition_and_the_source_column():
    mix = make_mixture(offline=60, online=40)
    ds = ReplayBufferDataModule(mix, batch_size=8, num_batches=3).as_hf_dataset()
    assert isinstance(ds, datasets.IterableDataset)
    assert ds.features["source"] == datasets.Value("int64")
    rows = list(ds)
    assert len(rows) == 24
    assert sum(row["source"] for row in rows) == 12  # 4 of 8 online in every batch
    assert all((row["id"] >= ONLINE_ID0) == (row["source"] == 1) for row in rows)


def test_snapshot_export_holds_every_member_once_with_its_source():
    mix = make_mixture(offline=60, online=40)
    ds = to_hf_dataset(mix, streaming=False)
    assert isinstance(ds, datasets.Dataset)
    assert len(ds) == 100
    assert ds["source"] == [0] * 60 + [1] * 40
    assert ds["id"] == list(range(60)) + list(range(ONLINE_ID0, ONLINE_ID0 + 40))
