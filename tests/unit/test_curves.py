"""rb_lightning.runs.curves: metrics read from a CSVLogger file, drawn to a PNG."""

from __future__ import annotations

import pytest

from rb_lightning.runs.curves import draw_curves, read_metrics

CSV = "step,epoch,loss,frames\n0,0,1.0,\n0,0,,10\n10,0,0.5,30\n10,0,0.25,\n"


def test_read_metrics_skips_empty_cells_and_keeps_the_last_value(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text(CSV)
    metrics = read_metrics(path)
    assert metrics["loss"] == [(0, 1.0), (10, 0.25)]
    assert metrics["frames"] == [(0, 10.0), (10, 30.0)]
    assert "step" not in metrics and "epoch" not in metrics


def test_draw_curves_writes_a_png_or_nothing(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "metrics.csv"
    path.write_text(CSV)
    png = draw_curves(path, tmp_path / "c.png", x="frames")
    assert png is not None and png.read_bytes()[:4] == b"\x89PNG"
    assert draw_curves(path, tmp_path / "none.png", metrics=["missing"]) is None
