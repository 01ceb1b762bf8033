"""Altair charts from polars frames, saved as SVG and PNG (vl-convert) atomically under their scale:
results/figures/<scale>/<name>.<fmt>. Every saved chart says its scale, git commit and date
(a subtitle), so a figure can never be mistaken for another scale's."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import altair as alt

from grlib import io, manifest, paths, results


def figures_dir(scale: str) -> Path:
    return paths.results_dir() / "figures" / results.check_scale(scale)


def stamp(chart: alt.TopLevelMixin, name: str, scale: str) -> alt.TopLevelMixin:
    """The chart with 'scale <scale> · commit <rev> · <UTC date>' as (the end of) its subtitle."""
    line = f"scale {scale} · commit {manifest.git_revision()} · {dt.datetime.now(dt.timezone.utc):%Y-%m-%d}"
    title = chart.title
    if isinstance(title, alt.TitleParams):
        old = title.subtitle
        subtitle = line if old is alt.Undefined else [*([old] if isinstance(old, str) else old), line]
        title = alt.TitleParams(**{**title.to_dict(), "subtitle": subtitle})
    else:
        title = alt.TitleParams(text=name if title is alt.Undefined else title, subtitle=line)
    return chart.properties(title=title)


def save_chart(chart: alt.TopLevelMixin, name: str, scale: str,
               formats: tuple[str, ...] = ("svg", "png")) -> list[Path]:
    """Writes results/figures/<scale>/<name>.<fmt> for each format (stamped); returns the paths."""
    folder = figures_dir(scale)
    stamped = stamp(chart, name, scale)
    options = {"png": {"scale_factor": 2}}
    return [io.atomic_write(folder / f"{name}.{fmt}",
                            lambda tmp, fmt=fmt: stamped.save(str(tmp), format=fmt, **options.get(fmt, {})))
            for fmt in formats]
