"""Stage `data` (notebooks/00_data): raw log -> processed sequences + stats for one scale.

The scale's data is prepared by the dataset catalogue (grlib.data.catalog) into its folder,
data/processed/<scale> (with overrides: a folder of their own); this module adds the stage's
result row, metrics and the charts and tables of the notebook.
"""
from __future__ import annotations

import json
import math

import altair as alt
import numpy as np
import polars as pl

from grlib import results
from grlib.config import Config
from grlib.data import catalog
from grlib.data.catalog import ensure_prepared  # noqa: F401  (notebooks/02_train prepares the scale's data)
from grlib.data.synthetic import PUBLISHED_27K, user_lengths


def run(cfg: Config) -> pl.DataFrame:
    """Prepares the data, appends a row to the table `data`, writes results/metrics/<scale>/data.json;
    returns that row."""
    stats = catalog.prepare(cfg)
    row = results.append_rows("data", [{"seed": cfg.data.seed, **stats}], cfg)
    results.write_metrics("data", {"scale": cfg.scale, **stats}, scale=cfg.scale)
    return row


def stats_table(row: pl.DataFrame) -> pl.DataFrame:
    """A result row of `run` as a two-column (statistic, value) table for display."""
    skip = set(results.META_COLUMNS) - {"scale", "seed"}
    return pl.DataFrame({"statistic": [c for c in row.columns if c not in skip],
                         "value": [str(row[c][0]) for c in row.columns if c not in skip]})


def _log_histogram(values: np.ndarray, label: str, bins: int = 30) -> pl.DataFrame:
    top = max(float(values.max()), 2.0)
    edges = np.unique(np.round(np.logspace(0, math.log10(top + 1), bins + 1)))
    counts, edges = np.histogram(values, bins=edges)
    return pl.DataFrame({"lo": edges[:-1], "hi": edges[1:], "users": counts, "lengths": [label] * len(counts)})


def length_chart(cfg: Config) -> alt.Chart:
    """Histogram of per-user sequence lengths on a log axis: in the log and kept (cut to max_len)."""
    seqs = pl.read_parquet(catalog.folder(cfg) / "sequences.parquet", columns=["item_ids", "n_events"])
    kept = seqs["item_ids"].list.len().to_numpy()
    hist = pl.concat([_log_histogram(seqs["n_events"].to_numpy(), "events in the log"),
                      _log_histogram(kept, f"kept (max_len {cfg.data.max_len})")])
    return (alt.Chart(hist).mark_rect(opacity=0.6)
            .encode(x=alt.X("lo:Q", scale=alt.Scale(type="log"), title="events per user (log scale)"),
                    x2="hi:Q", y=alt.Y("users:Q", title="users"), y2=alt.Y2(datum=0),
                    color=alt.Color("lengths:N", title=None))
            .properties(title=f"Sequence lengths: {cfg.data.dataset}, scale {cfg.scale}", width=420, height=200))


def popularity_chart(cfg: Config) -> alt.Chart:
    """Item popularity curve: rows per video against popularity rank (log-log)."""
    vocab = pl.read_parquet(catalog.folder(cfg) / "vocab.parquet", columns=["count"])
    curve = vocab.with_columns(pl.int_range(1, pl.len() + 1).alias("rank"))
    if curve.height > 2000:  # thin out the tail: log-spaced ranks keep the curve's shape
        keep = np.unique(np.round(np.logspace(0, math.log10(curve.height), 2000)).astype(np.int64))
        curve = curve.filter(pl.col("rank").is_in(keep.tolist()))
    return (alt.Chart(curve).mark_line()
            .encode(x=alt.X("rank:Q", scale=alt.Scale(type="log"), title="popularity rank"),
                    y=alt.Y("count:Q", scale=alt.Scale(type="log"), title="rows in the log"))
            .properties(title=f"Item popularity: {cfg.data.dataset}, scale {cfg.scale}", width=420, height=200))


def calibration_table(cfg: Config) -> pl.DataFrame:
    """Synthetic vs published KuaiRand-27K, side by side: per-user length quantiles of the
    generator's own length draw at length factor 1.0 for the published 27,285 users (seed
    cfg.data.seed), the same quantiles of this scale's log divided by its length factor, and the
    click / long-view rates of this scale's processed log."""
    processed = json.loads((catalog.folder(cfg) / "stats.json").read_text())
    full = user_lengths(PUBLISHED_27K["users"], 1.0, np.random.default_rng([cfg.data.seed, 0]))
    synthetic = cfg.data.dataset == "synthetic"
    rows = []
    for key, q in (("length_p50", 0.5), ("length_p90", 0.9), ("length_p99", 0.99)):
        value = float(np.quantile(full, q))
        rows.append({"statistic": f"events per user, {key[-3:]}", "published_27k": float(PUBLISHED_27K[key]),
                     "synthetic": value, "relative_error": value / PUBLISHED_27K[key] - 1,
                     "source": "generator, length factor 1.0, 27,285 users"})
        if synthetic:
            value = processed[f"raw_{key}"] / cfg.data.length_factor
            rows.append({"statistic": f"events per user, {key[-3:]}", "published_27k": float(PUBLISHED_27K[key]),
                         "synthetic": value, "relative_error": value / PUBLISHED_27K[key] - 1,
                         "source": f"this log / length factor {cfg.data.length_factor}"})
    for key in ("click_rate", "long_view_rate"):
        rows.append({"statistic": key.replace("_", " "), "published_27k": PUBLISHED_27K[key],
                     "synthetic": processed[key], "relative_error": processed[key] / PUBLISHED_27K[key] - 1,
                     "source": f"this log ({cfg.data.dataset})"})
    return pl.DataFrame(rows)
