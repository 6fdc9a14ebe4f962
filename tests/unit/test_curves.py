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


ASYNC_GRPO_CURVES = [  # configs/llm_grpo_async.yaml's RunReport curves
    "reward_mean",
    "val_accuracy",
    "async/staleness_mean",
    "async/staleness_max",
    "async/trainer_wait_s",
    "async/generation_wait_s",
    "async/groups_dropped",
]


@pytest.mark.parametrize("curves", [ASYNC_GRPO_CURVES, ["loss"]], ids=["seven", "one"])
def test_the_title_overlaps_no_panel(tmp_path, curves):
    # The async GRPO curves.png once had its title across its first panel (issue 55).
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from rb_lightning.runs.curves import curves_figure

    path = tmp_path / "metrics.csv"
    rows = [
        f"{step},0," + ",".join(str(step / 100 + i) for i in range(len(curves)))
        for step in (0, 10, 20)
    ]
    path.write_text("step,epoch," + ",".join(curves) + "\n" + "\n".join(rows) + "\n")
    title = "AsyncGRPOModule, llm_grpo_async/version_0"
    figure = curves_figure(path, metrics=curves, title=title)
    canvas = FigureCanvasAgg(figure)
    canvas.draw()  # lays the figure out as savefig does
    renderer = canvas.get_renderer()
    [suptitle] = [text for text in figure.texts if text.get_text() == title]
    box = suptitle.get_window_extent(renderer)
    overlapped = [
        axis.get_ylabel() for axis in figure.axes if axis.get_tightbbox(renderer).overlaps(box)
    ]
    assert not overlapped, f"the title overlaps the panels {overlapped}"
