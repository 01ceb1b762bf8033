"""Stage `report` (notebooks/99_report): latest rows per configuration, tables and figures."""
from __future__ import annotations

import altair as alt
import polars as pl

from grlib import paths, plots, results


def train_summary(scale: str | None = None) -> pl.DataFrame:
    """Mean and std over seeds of the latest run of each (scale, model)."""
    table = results.read_table("train")
    if table.height == 0:
        return table
    if scale:
        table = table.filter(pl.col("scale") == scale)
    if "dataset" not in table.columns:  # rows written before the train stage had several datasets
        table = table.with_columns(pl.lit("scale").alias("dataset"))
    latest = results.latest(table, ["dataset", "model", "seed"])
    return (latest.group_by("scale", "dataset", "model")
            .agg(pl.len().alias("seeds"),
                 pl.col("test_ndcg@10").mean().alias("ndcg@10"), pl.col("test_ndcg@10").std().alias("ndcg@10_std"),
                 pl.col("test_hr@10").mean().alias("hr@10"), pl.col("test_mrr").mean().alias("mrr"),
                 pl.col("params").first(), pl.col("tokens_per_s").mean().alias("tokens_per_s"))
            .sort("scale", "dataset", "ndcg@10", descending=[False, False, True]))


def quality_chart(summary: pl.DataFrame) -> alt.Chart:
    return (alt.Chart(summary)
            .mark_bar()
            .encode(x=alt.X("ndcg@10:Q", title="test NDCG@10"), y=alt.Y("model:N", sort="-x"),
                    color="model:N", row=alt.Row("scale:N"), column=alt.Column("dataset:N"))
            .properties(title="Full-ranking NDCG@10 (mean over seeds)", width=360))


def run(scale: str | None = None) -> dict:
    summary = train_summary(scale)
    figures = plots.save_chart(quality_chart(summary), "train_quality") if summary.height else []
    md = paths.results_dir() / "summary.md"
    results.atomic_write_bytes(md, (to_markdown(summary) + "\n").encode())
    return {"summary": summary, "figures": figures, "markdown": md}


def to_markdown(df: pl.DataFrame, digits: int = 4) -> str:
    """A GitHub markdown table of a small frame."""
    if df.height == 0:
        return "(no rows yet)"
    cols = df.columns
    fmt = lambda v: f"{v:.{digits}f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.iter_rows()]
    return "\n".join(lines)
