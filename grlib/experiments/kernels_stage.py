"""Stage `kernels` (notebooks/01_kernels): jagged HSTU attention implementations against padding.

Runs `bench kernels` at the scale's sizes (grlib.bench.kernels: the method), appends the rows
to the table `kernels`, writes results/metrics/<scale>/kernels.json and the figures
(results/figures/<scale>/).
"""
from __future__ import annotations

import math

import altair as alt
import polars as pl

from grlib import plots, results
from grlib.bench import kernels as bench
from grlib.config import Config, KernelsAblation
from grlib.experiments import claims


def run(cfg: Config, ablation: KernelsAblation, threads: int | None = None) -> pl.DataFrame:
    rows = bench.measure(cfg, ablation, table="kernels", threads=threads)
    df = pl.DataFrame(rows).with_columns(pl.lit(cfg.scale).alias("scale"))  # the figures' scale
    results.write_metrics("kernels", metrics(df, cfg.scale), scale=cfg.scale)
    return df


def comparison(df: pl.DataFrame) -> pl.DataFrame:
    """The same-batch attention comparison rows, one per (regime, max_len, impl)."""
    return (df.filter(~pl.col("whole_batch") & (pl.col("op") == "hstu_attention"))
            .select("regime", "max_len", "impl", "batch", "tokens", "fill", "fwd_ms", "fwd_bwd_ms",
                    "peak_mem_mb", "gflops", "frac_of_peak", "speedup_vs_reference", "mem_reduction_vs_reference")
            .sort("regime", "max_len", "impl"))


def whole_batch(df: pl.DataFrame) -> pl.DataFrame:
    """The compiled kernel alone on a whole batch at the largest max_len (no padded run: it would not fit)."""
    return (df.filter(pl.col("whole_batch"))
            .select("impl", "regime", "max_len", "batch", "tokens", "fwd_ms", "fwd_bwd_ms", "peak_mem_mb",
                    "reference_estimate_mb", "gflops", "frac_of_peak"))


def fused(df: pl.DataFrame) -> pl.DataFrame:
    """The fused LayerNorm(x) * u against torch's LayerNorm then multiply, same tokens."""
    return (df.filter(pl.col("op") == "layer_norm_mul")
            .select("op", "impl", "tokens", "fwd_ms", "fwd_bwd_ms", "peak_mem_mb", "speedup_vs_reference",
                    "mem_reduction_vs_reference"))


def acceptance(df: pl.DataFrame) -> pl.DataFrame:
    """The checks of claim C1 on this run: cpu vs reference (scaled, max_len 1024) and vs fbgemm."""
    cmp = comparison(df)
    checks = []
    speed, memory, fbgemm = (claims.target(f"C1.{k}") for k in ("speedup", "memory", "vs_fbgemm"))
    at = cmp.filter((pl.col("regime") == "scaled") & (pl.col("max_len") == 1024) & (pl.col("impl") == "cpu"))
    if at.height:
        r = at.row(0, named=True)
        checks.append({"target": speed.key, "check": f"scaled, max_len 1024: cpu fwd+bwd {speed.threshold}",
                       "value": r["speedup_vs_reference"], "met": speed.met(r["speedup_vs_reference"])})
        checks.append({"target": memory.key, "check": f"scaled, max_len 1024: cpu {memory.threshold}",
                       "value": r["mem_reduction_vs_reference"], "met": memory.met(r["mem_reduction_vs_reference"])})
    wide = cmp.pivot(on="impl", index=["regime", "max_len"], values="fwd_bwd_ms")
    if {"cpu", "fbgemm"} <= set(wide.columns):
        for r in wide.iter_rows(named=True):
            ratio = r["fbgemm"] / r["cpu"]
            checks.append({"target": fbgemm.key, "check": f"{r['regime']}, max_len {r['max_len']}: fwd+bwd "
                           f"{fbgemm.threshold}", "value": ratio, "met": fbgemm.met(ratio)})
    return pl.DataFrame(checks, schema={"target": pl.String, "check": pl.String, "value": pl.Float64,
                                        "met": pl.Boolean})


def metrics(df: pl.DataFrame, scale: str) -> dict:
    out: dict = {"scale": scale}
    for r in comparison(df).filter(pl.col("impl") != "reference").iter_rows(named=True):
        key = f"{r['impl']}_{r['regime']}_{r['max_len']}"
        out[key] = {"speedup_vs_reference": _num(r["speedup_vs_reference"]),
                    "mem_reduction_vs_reference": _num(r["mem_reduction_vs_reference"])}
    for r in fused(df).filter(pl.col("impl") == "cpu").iter_rows(named=True):
        out["layer_norm_mul_cpu"] = {"speedup_vs_reference": _num(r["speedup_vs_reference"]),
                                     "mem_reduction_vs_reference": _num(r["mem_reduction_vs_reference"])}
    for r in whole_batch(df).iter_rows(named=True):
        out[f"whole_batch_{r['max_len']}"] = {"batch": r["batch"], "peak_mem_mb": _num(r["peak_mem_mb"]),
                                              "reference_estimate_mb": _num(r["reference_estimate_mb"])}
    return out


def _num(x: float) -> float | None:
    return None if x is None or math.isnan(x) else round(float(x), 4)


def latency_memory_chart(df: pl.DataFrame) -> alt.VConcatChart:
    """Forward+backward latency and peak memory vs max_len per implementation (log scales)."""
    data = comparison(df)
    base = alt.Chart(data).mark_line(point=True).encode(
        x=alt.X("max_len:O", title="max_len"), color=alt.Color("impl:N", title="implementation"))
    latency = base.encode(y=alt.Y("fwd_bwd_ms:Q", scale=alt.Scale(type="log"), title="fwd+bwd ms (median)"))
    memory = base.encode(y=alt.Y("peak_mem_mb:Q", scale=alt.Scale(type="log"), title="peak memory MB"))
    return alt.vconcat(
        latency.properties(width=220, height=160).facet(column=alt.Column("regime:N", title="lengths")),
        memory.properties(width=220, height=160).facet(column=alt.Column("regime:N", title="lengths")),
    ).properties(title="Jagged HSTU attention: latency and memory (same batch per max_len)")


def ratio_chart(df: pl.DataFrame) -> alt.VConcatChart:
    """Speedup and memory reduction vs the padded reference, with the paper's 2.2x and 70% as rules."""
    data = comparison(df).filter(pl.col("impl") != "reference")

    def panel(field: str, title: str, claim: float, fmt: str, log: bool) -> alt.FacetChart:
        scale = alt.Scale(type="log") if log else alt.Scale()
        line = alt.Chart().mark_line(point=True).encode(
            x=alt.X("max_len:O"), y=alt.Y(f"{field}:Q", title=title, scale=scale, axis=alt.Axis(format=fmt)),
            color=alt.Color("impl:N", title="implementation"))
        one = {"groupby": [], "aggregate": [{"op": "count", "as": "n"}]}  # one mark per facet
        rule = alt.Chart().transform_aggregate(**one).mark_rule(strokeDash=[4, 3], color="black").encode(
            y=alt.datum(claim, scale=scale) if log else alt.datum(claim))
        text = alt.Chart().transform_aggregate(**one).mark_text(align="left", dx=2, dy=-6, fontSize=10).encode(
            x=alt.value(0), y=alt.datum(claim), text=alt.value(f"paper: {claim:{fmt}}"))
        return (alt.layer(line, rule, text, data=data).properties(width=220, height=160)
                .facet(column=alt.Column("regime:N", title="lengths")))

    speed, memory = claims.target("C1.speedup").paper, claims.target("C1.memory").paper
    return alt.vconcat(panel("speedup_vs_reference", "fwd+bwd speedup vs reference (log)", speed.number, ".1f",
                             log=True),
                       panel("mem_reduction_vs_reference", "peak-memory reduction", memory.number, ".0%",
                             log=False),
                       ).properties(title=f"Against padding (TurboGR C1: {speed} lower latency, {memory} less memory)")


def save_figures(df: pl.DataFrame, scale: str | None = None) -> list:
    """Both charts under results/figures/<scale>/ (default: the one scale of `df`, as `run` returns it)."""
    if scale is None:
        scales = df["scale"].unique().to_list() if "scale" in df.columns else []
        if len(scales) != 1:
            raise ValueError(f"kernels_stage.save_figures: pass scale=...; the rows carry scales {scales}")
        scale = scales[0]
    return (plots.save_chart(latency_memory_chart(df), "kernels_latency_memory", scale)
            + plots.save_chart(ratio_chart(df), "kernels_vs_reference", scale))
