"""Stage `report` (notebooks/99_report): latest rows per configuration, claims and figures of one
scale, written to results/summary/<scale>.md and results/figures/<scale>/ (never another scale's)."""
from __future__ import annotations

from pathlib import Path

import altair as alt
import polars as pl

from grlib import io, paths, plots, results


def train_summary(scale: str | None = None) -> pl.DataFrame:
    """Mean and std over seeds of the latest run of each (scale, model)."""
    table = results.read_table("train", scale)
    if table.height == 0:
        return table
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


def _latest_run(name: str, scale: str | None) -> pl.DataFrame:
    """Every row of the newest run (run_id) of table `name` at `scale` (the newest scale if None)."""
    table = results.read_table(name, scale)
    if table.height == 0:
        return table
    newest = table.with_row_index("_i").sort("timestamp", "_i").row(-1, named=True)["run_id"]  # ties: table order
    return table.filter(pl.col("run_id") == newest)


def claims(scale: str | None = None) -> pl.DataFrame:
    """The paper's claims this workbench measures, read from the newest run of each stage's table:
    one row per check with the measured figure, the paper's figure and whether this run meets it."""
    rows: list[dict] = []
    kern = _latest_run("kernels", scale)
    if kern.height:
        from grlib.experiments import kernels_stage
        for r in kernels_stage.acceptance(kern).iter_rows(named=True):
            rows.append({"claim": "C1 fused jagged attention", "check": r["check"],
                         "figure": f"{r['value']:.3g}", "paper": "2.2x faster, 70% less memory", "met": r["met"]})
    neg = _latest_run("negatives", scale)
    if neg.height:
        from grlib.config import load_ablation
        from grlib.negatives import ablation
        for r in ablation.acceptance(neg.to_dicts(), load_ablation("negatives")):
            rows.append({"claim": f"C6 negatives ({r['dataset']})", "check": r["check"], "figure": r["figure"],
                         "paper": "wider negatives at no extra lookups", "met": r["met"]})
    train = train_summary(scale)
    if train.height:
        for ds in train["dataset"].unique(maintain_order=True):
            sub = train.filter(pl.col("dataset") == ds)
            pop = sub.filter(pl.col("model") == "popularity")["ndcg@10"]
            for r in sub.filter(pl.col("model") != "popularity").iter_rows(named=True):
                if pop.len() and pop[0] > 0:
                    ratio = r["ndcg@10"] / pop[0]
                    rows.append({"claim": f"model quality ({ds})", "check": f"{r['model']} NDCG@10 >= 1.5x popularity",
                                 "figure": f"{ratio:.2f}x ({r['ndcg@10']:.4f}, {r['seeds']} seeds)",
                                 "paper": "(workbench target)", "met": ratio >= 1.5})
    return pl.DataFrame(rows, schema={"claim": pl.String, "check": pl.String, "figure": pl.String,
                                      "paper": pl.String, "met": pl.Boolean})


def summary_path(scale: str) -> Path:
    return paths.results_dir() / "summary" / f"{results.check_scale(scale)}.md"


def run(scale: str) -> dict:
    """Summary, claims and quality figure of `scale` from the result tables."""
    md = summary_path(scale)
    summary = train_summary(scale)
    checks = claims(scale)
    figures = plots.save_chart(quality_chart(summary), "train_quality", scale) if summary.height else []
    text = (f"# Summary ({scale})\n\n## Claims measured by the newest run of each stage\n\n"
            f"{to_markdown(checks)}\n\n## Model quality (test, full ranking, mean over seeds)\n\n{to_markdown(summary)}\n")
    io.atomic_write_text(md, text)
    return {"summary": summary, "claims": checks, "figures": figures, "markdown": md}


def to_markdown(df: pl.DataFrame, digits: int = 4) -> str:
    """A GitHub markdown table of a small frame."""
    if df.height == 0:
        return "(no rows yet)"
    cols = df.columns
    fmt = lambda v: f"{v:.{digits}f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.iter_rows()]
    return "\n".join(lines)
