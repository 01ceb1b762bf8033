"""Altair charts from polars frames, saved as SVG and PNG (vl-convert) atomically under their scale:
results/figures/<scale>/<name>.<fmt>. Every saved chart says its scale, git commit and date
(a subtitle), so a figure can never be mistaken for another scale's.

Charts shown in a notebook render offline: use_offline_renderer() (called when grlib.experiments,
which builds every chart, is imported) switches altair from its default renderer (HTML that loads
vega from a CDN: blank without internet) to PNG images drawn in the kernel by vl-convert. PNG, not
SVG: JupyterLab shows SVG outputs only in trusted notebooks, and executed notebooks (papermill,
nbmake, DVC's results/executed/) open untrusted; a PNG output shows everywhere, with no
JavaScript. A renderer the user enabled before is kept."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import altair as alt

from grlib import io, manifest, paths, results


def use_offline_renderer() -> str:
    """Notebook charts as PNG made by vl-convert (144 ppi: twice the pixels, shown at the chart's
    size), unless a renderer other than altair's default is enabled; returns the active renderer."""
    if alt.renderers.active == "default":
        alt.renderers.enable("png", ppi=144)
    return alt.renderers.active


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
