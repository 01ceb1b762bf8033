"""Stage `negatives` (notebooks/04_negative_sampling): the negative-path ablation, its table,
the checks of claim C6 and a speed-quality chart."""
from __future__ import annotations

import dataclasses

import altair as alt
import polars as pl

from grlib import plots, results
from grlib.config import Config, NegativesAblation
from grlib.negatives import ablation

TABLE = "negatives"


def quick(ab: NegativesAblation) -> NegativesAblation:
    """The notebook's default (smoke, JupyterLab, nbmake) grid: every kind of row once, fewer of each,
    on the synthetic twin only."""
    datasets = ["synthetic"] if "synthetic" in ab.datasets else ab.datasets[:1]
    return dataclasses.replace(ab, shared_sizes=[128, 2048], samplers=["in-batch"], seeds=ab.seeds[:1],
                               datasets=datasets, timing_steps=3, timing_rounds=1, train_steps=min(ab.train_steps, 5))


def run(cfg: Config, ab: NegativesAblation) -> dict:
    """Runs the grid; appends rows to the table `negatives`; writes metrics and figure (per scale)."""
    rows, notes = ablation.run(cfg, ab)
    if not rows:
        raise RuntimeError("stage negatives: no dataset could be loaded; " + "; ".join(notes))
    table = results.append_rows(TABLE, rows, cfg)
    checks = pl.DataFrame(ablation.acceptance(rows, ab))
    results.write_metrics(TABLE, {"scale": cfg.scale, "notes": notes, "acceptance": checks.to_dicts(),
                                  "rows": {f"{r['dataset']} | {r['variant']}": {
                                      k: r[k] for k in ("step_ratio", "memory_ratio", "negatives_ratio", "ndcg@10")}
                                      for r in rows}}, scale=cfg.scale)
    figures = plots.save_chart(speed_quality_chart(table), "negatives_speed_quality", cfg.scale)
    return {"table": table, "acceptance": checks, "notes": notes, "figures": figures}


def ablation_view(table: pl.DataFrame) -> pl.DataFrame:
    """The columns a reader compares, one row per dataset x variant."""
    return table.select("dataset", "variant", "step_ms", "step_ratio", "neg_path_mb", "memory_ratio", "queue_mb",
                        "negatives_per_token", "negatives_ratio", "distinct_negatives_per_token", "rows_per_step",
                        "rows_ratio", "ndcg@10", "ndcg@10_std", "quality_seeds")


def family(variant: str) -> str:
    if " fp16 " in variant or " bf16 " in variant:
        return "half precision"
    if variant.startswith("per-token"):
        return "per-token"
    return "shared pool" if variant.endswith("sync") else "shared pool, other sampler"


def speed_quality_chart(table: pl.DataFrame) -> alt.Chart:
    """Step time (ratio to the baseline) against NDCG@10, point size = negatives per token."""
    trained = table.filter(pl.col("ndcg@10").is_not_nan()).with_columns(
        pl.col("variant").map_elements(family, return_dtype=pl.String).alias("family"))
    return (alt.Chart(trained).mark_point(filled=True, opacity=0.8)
            .encode(x=alt.X("step_ratio:Q", title="step time / per-token baseline", scale=alt.Scale(zero=False)),
                    y=alt.Y("ndcg@10:Q", title="test NDCG@10 (fixed budget)", scale=alt.Scale(zero=False)),
                    size=alt.Size("negatives_per_token:Q", title="negatives / token", scale=alt.Scale(type="log")),
                    color=alt.Color("family:N"), tooltip=["variant", "step_ms", "neg_path_mb", "ndcg@10"])
            .properties(width=300, height=220)
            .facet(column=alt.Column("dataset:N"))
            .properties(title="Negative sampling: speed vs quality"))
