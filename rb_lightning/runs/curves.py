"""Learning curves from a run's ``metrics.csv`` (Lightning's ``CSVLogger``), drawn with matplotlib.

matplotlib is optional (``pip install "rb-lightning[plot]"``) and imported only
when a curve is drawn.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["curves_figure", "draw_curves", "read_metrics"]

_NOT_CURVES = {"step", "epoch"}


def read_metrics(csv_path: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Every metric of a ``CSVLogger`` file as ``(step, value)`` pairs, in step order (empty cells skipped; a step logged twice keeps its last value)."""
    by_metric: dict[str, dict[int, float]] = {}
    with open(csv_path, newline="") as file:
        for row in csv.DictReader(file):
            step = row.get("step")
            if not step:
                continue
            for name, cell in row.items():
                if name in _NOT_CURVES or cell in (None, ""):
                    continue
                try:
                    value = float(cell)
                except ValueError:
                    continue
                by_metric.setdefault(name, {})[int(float(step))] = value
    return {name: sorted(points.items()) for name, points in by_metric.items()}


def draw_curves(
    csv_path: str | os.PathLike,
    png_path: str | os.PathLike,
    *,
    metrics: list[str] | None = None,
    x: str = "step",
    title: str | None = None,
) -> Path | None:
    """Draw one panel per metric of ``csv_path`` against ``x`` into ``png_path``.

    Args:
        csv_path: A ``metrics.csv`` written by Lightning's ``CSVLogger``.
        png_path: The PNG to write.
        metrics: Metrics to draw, in panel order; ``None``: every logged metric.
            Names that were never logged are skipped.
        x: ``"step"`` (optimizer steps) or a logged metric that grows with the
            steps, e.g. ``"frames"``; its value at each step is interpolated
            between the steps where it was logged.
        title: Figure title.

    Returns:
        The PNG path, or ``None`` when there was nothing to draw.

    Raises:
        ImportError: matplotlib is not installed (the ``plot`` extra).

    Examples:
        >>> import tempfile, pathlib
        >>> tmp = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (tmp / "metrics.csv").write_text("step,loss,frames\\n0,1.0,10\\n10,0.5,30\\n")
        >>> draw_curves(tmp / "metrics.csv", tmp / "curves.png", x="frames").name
        'curves.png'
    """
    figure = curves_figure(csv_path, metrics=metrics, x=x, title=title)
    if figure is None:
        return None
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png_path, dpi=100)
    return png_path


def curves_figure(
    csv_path: str | os.PathLike,
    *,
    metrics: list[str] | None = None,
    x: str = "step",
    title: str | None = None,
) -> Figure | None:
    """The figure :func:`draw_curves` saves (``None`` when there is nothing to draw).

    Arguments as :func:`draw_curves`'. The figure's layout is matplotlib's
    ``"constrained"`` one, which keeps the title, the panels and their labels apart.

    Examples:
        >>> import tempfile, pathlib
        >>> csv_path = pathlib.Path(tempfile.mkdtemp()) / "metrics.csv"
        >>> _ = csv_path.write_text("step,loss\\n0,1.0\\n10,0.5\\n")
        >>> len(curves_figure(csv_path, title="a run").axes)
        1
    """
    try:
        # A Figure of its own, not pyplot: no backend switch and no global figure state in
        # the caller's process (a notebook keeps its backend).
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError(
            "Drawing learning curves needs matplotlib: pip install 'rb-lightning[plot]'."
        ) from err
    series = read_metrics(csv_path)
    names = [m for m in (metrics if metrics is not None else sorted(series)) if m in series]
    names = [m for m in names if m != x]
    if not names:
        return None
    to_x = _step_to(series.get(x)) if x != "step" else (lambda step: float(step))
    # Constrained, not tight_layout: tight_layout leaves no room for a suptitle, which then
    # overlapped the first panel.
    figure = Figure(figsize=(7, 2.6 * len(names)), layout="constrained")
    axes = figure.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
    for axis, name in zip(axes, names, strict=True):
        points = series[name]
        axis.plot([to_x(s) for s, _ in points], [v for _, v in points], linewidth=1.2)
        axis.set_ylabel(name)
        axis.grid(alpha=0.3)
    axes[-1].set_xlabel(x)
    if title:
        figure.suptitle(title)
    return figure


def _step_to(points: list[tuple[int, float]] | None) -> Callable[[int], float]:
    if not points:
        return lambda step: math.nan
    steps = np.array([s for s, _ in points], dtype=float)
    values = np.array([v for _, v in points], dtype=float)
    return lambda step: float(np.interp(step, steps, values))  # linear, clamped at the ends
