"""Altair charts from polars frames, saved as SVG and PNG (vl-convert) atomically."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import altair as alt

from grlib import paths


def figures_dir() -> Path:
    return paths.results_dir() / "figures"


def save_chart(chart: alt.TopLevelMixin, name: str, formats: tuple[str, ...] = ("svg", "png")) -> list[Path]:
    """Writes results/figures/<name>.<fmt> for each format; returns the paths."""
    out = []
    folder = figures_dir()
    folder.mkdir(parents=True, exist_ok=True)
    for fmt in formats:
        path = folder / f"{name}.{fmt}"
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=f".{fmt}")
        os.close(fd)
        try:
            chart.save(tmp, format=fmt, **({"scale_factor": 2} if fmt == "png" else {}))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        out.append(path)
    return out
