"""Stage `semi_async` (notebooks/06_semi_async): claim C4, semi-asynchronous training keeps convergence.

Two gloo ranks train the scale's HSTU with a row-sharded item table under semisync(k)
(grlib.distributed.schedules): the input item rows of batch i+k are looked up before the updates of batches
i..i+k-1 land; dense weights and the loss's rows stay synchronous; k = 0 is sync (bit for bit).
The grid: staleness k x seeds x datasets, each run trained for the dataset's step budget, selected
on validation NDCG@10 per epoch and evaluated on test by full ranking. Per step: the global batch's
training loss and the stale fraction (the share of looked-up rows an update changed between lookup
and use). A worst case (few hot items, a high learning rate, large k) shows where staleness hurts.

    rows of table `semi_async`:  part = final (one per run: test and validation metrics)
                                 part = curve (one per run and step: loss, stale fraction; and
                                               per epoch: validation NDCG@10)

C4's verdict (`acceptance`): on each dataset, the mean test NDCG@10 of every k <= 2 within one
seed-std of sync's, or within 1% relative; larger k reported as they come.
"""
from __future__ import annotations

import dataclasses
import json
import os

import altair as alt
import polars as pl

from grlib import plots, results
from grlib.config import Config, SemiAsyncAblation
from grlib.experiments import claims as registry

TABLE = "semi_async"
SYNC = 0


def quick(ab: SemiAsyncAblation) -> SemiAsyncAblation:
    """A grid for the smoke scale and the notebook's default (seconds)."""
    return dataclasses.replace(ab, staleness=[0, 2], seeds=[0], datasets=["scale"], max_steps=[12],
                               worst_staleness=[0, 4], worst_steps=12)


def runs(ab: SemiAsyncAblation) -> list[dict]:
    """Every run of the grid: dataset, step cap, k, seed, overrides (the dataset's, or the worst case's),
    and whether it is the worst case."""
    out = [{"dataset": d, "max_steps": cap, "k": k, "seed": s, "overrides": dict(ab.overrides.get(d) or {}),
            "case": "grid"}
           for d, cap in zip(ab.datasets, ab.max_steps) for k in ab.staleness for s in ab.seeds]
    worst = {"data.n_items": ab.worst_items, "train.lr": ab.worst_lr}
    out += [{"dataset": "scale", "max_steps": ab.worst_steps, "k": k, "seed": s, "overrides": worst, "case": "worst"}
            for k in ab.worst_staleness for s in ab.seeds[:1]]
    return out


def grid_rank(runtime, cfg: Config, ab: SemiAsyncAblation) -> list[dict]:
    """One rank of the whole grid (one start-up for every run); rank 0's rows are the result."""
    from grlib.data.catalog import load_dataset
    from grlib.fit import fit_and_evaluate

    if runtime.topology.rank != 0:
        os.environ["GRLIB_PROGRESS"] = "0"
    rows = []
    for run in runs(ab):
        run_cfg = cfg.replace({**run["overrides"], "train.seed": run["seed"], "train.max_steps": run["max_steps"],
                               "dist.world": runtime.topology.world, "dist.nodes": runtime.topology.nodes,
                               "dist.balance": ab.balance, "dist.items": ab.items, "dist.schedule": "semisync",
                               "dist.staleness": run["k"]})
        if runtime.topology.rank != 0:
            runtime.barrier()
        ds = load_dataset(run_cfg, run["dataset"])  # rank 0 prepares a dataset first, once
        if runtime.topology.rank == 0:
            runtime.barrier()
        fit = fit_and_evaluate(run_cfg, ds, None, runtime=runtime)
        key = {"dataset": ds.name, "case": run["case"], "k": run["k"], "seed": run["seed"],
               "lr": run_cfg.train.lr, "n_items": ds.data.n_items, "overrides": json.dumps(run["overrides"], sort_keys=True)}
        rows.append({"part": "final", **key, **{k: v for k, v in fit.row.items()
                                                 if k.startswith(("test_", "val_")) or k in ("steps", "best_epoch")},
                     "stale_fraction": _mean([c.get("stale_fraction") for c in fit.curve])})
        rows += [{"part": "curve", **key, **c} for c in fit.curve]
    return rows


def _mean(values: list) -> float:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else float("nan")


def measure(cfg: Config, ab: SemiAsyncAblation) -> list[dict]:
    from grlib.data.catalog import load_dataset
    from grlib.distributed.launch import launch

    for name in ab.datasets:  # prepared here once, before the ranks read them
        load_dataset(cfg, name)
    return launch(grid_rank, ab.world, args=(cfg, ab), timeout_s=3600)[0]


def summary(table: pl.DataFrame) -> pl.DataFrame:
    """Mean and std over seeds of each dataset x case x k's final metrics."""
    final = table.filter(pl.col("part") == "final")
    return (final.group_by("dataset", "case", "k", "lr", "n_items")
            .agg(pl.len().alias("seeds"), pl.col("test_ndcg@10").mean().alias("ndcg@10"),
                 pl.col("test_ndcg@10").std().alias("ndcg@10_std"), pl.col("test_hr@10").mean().alias("hr@10"),
                 pl.col("val_ndcg@10").mean().alias("val_ndcg@10"), pl.col("stale_fraction").mean())
            .sort("case", "dataset", "k"))


def acceptance(table: pl.DataFrame) -> pl.DataFrame:
    """C4 per dataset and k <= 2 (k > 2: reported, no verdict)."""
    target = registry.target("C4.convergence")
    out = []
    s = summary(table).filter(pl.col("case") == "grid")
    for ds in s["dataset"].unique(maintain_order=True):
        sub = s.filter(pl.col("dataset") == ds)
        sync = sub.filter(pl.col("k") == SYNC)
        if sync.height == 0:
            continue
        base, std = sync["ndcg@10"][0], sync["ndcg@10_std"][0]
        for r in sub.filter(pl.col("k") != SYNC).iter_rows(named=True):
            gap = r["ndcg@10"] - base
            rel = abs(gap) / base if base else float("nan")
            within = abs(gap) <= (std or 0.0) or rel <= 0.01
            out.append({"target": target.key, "dataset": ds, "k": r["k"], "ndcg@10": r["ndcg@10"], "sync": base,
                        "sync_std": std, "gap": gap, "relative": rel, "stale_fraction": r["stale_fraction"],
                        "met": within if r["k"] <= 2 else None})
    return pl.DataFrame(out, schema={"target": pl.String, "dataset": pl.String, "k": pl.Int64, "ndcg@10": pl.Float64,
                                     "sync": pl.Float64, "sync_std": pl.Float64, "gap": pl.Float64,
                                     "relative": pl.Float64, "stale_fraction": pl.Float64, "met": pl.Boolean})


def run(cfg: Config, ab: SemiAsyncAblation) -> dict:
    rows = measure(cfg, ab)
    table = results.append_rows(TABLE, rows, cfg)
    checks = acceptance(table)
    results.write_metrics(TABLE, {"scale": cfg.scale, "summary": summary(table).to_dicts(),
                                  "acceptance": checks.to_dicts()}, cfg.scale)
    figures = plots.save_chart(loss_chart(table), "semi_async_loss", cfg.scale)
    figures += plots.save_chart(quality_chart(table), "semi_async_quality", cfg.scale)
    return {"table": table, "summary": summary(table), "acceptance": checks, "figures": figures}


def loss_chart(table: pl.DataFrame) -> alt.VConcatChart:
    """Training loss per step, mean over seeds with a +-std band, per k; the stale fraction below."""
    curve = table.filter((pl.col("part") == "curve") & pl.col("loss").is_not_null())
    band = (curve.group_by("dataset", "case", "k", "step")
            .agg(pl.col("loss").mean().alias("mean"), pl.col("loss").std().fill_null(0.0).alias("std"),
                 pl.col("stale_fraction").mean().alias("stale"))
            .with_columns((pl.col("mean") - pl.col("std")).alias("lo"), (pl.col("mean") + pl.col("std")).alias("hi"))
            .with_columns((pl.col("dataset") + " · " + pl.col("case")).alias("panel"))
            .sort("panel", "k", "step"))
    base = alt.Chart(band).encode(x=alt.X("step:Q"), color=alt.Color("k:O", title="staleness k"))
    loss = (base.mark_area(opacity=0.2).encode(y="lo:Q", y2="hi:Q")
            + base.mark_line().encode(y=alt.Y("mean:Q", title="training loss (mean over seeds)")))
    stale = base.mark_line().encode(y=alt.Y("stale:Q", title="stale fraction", axis=alt.Axis(format="%")))
    return alt.vconcat(loss.properties(width=320, height=180).facet(column="panel:N"),
                       stale.properties(width=320, height=100).facet(column="panel:N")).properties(
        title="C4: semisync(k) training loss and stale rows (2 ranks, sharded items)")


def quality_chart(table: pl.DataFrame) -> alt.LayerChart:
    """Test NDCG@10 (mean +- std over seeds) vs k, per dataset and case."""
    s = summary(table).with_columns((pl.col("dataset") + " · " + pl.col("case")).alias("panel"),
                                    (pl.col("ndcg@10") - pl.col("ndcg@10_std").fill_null(0)).alias("lo"),
                                    (pl.col("ndcg@10") + pl.col("ndcg@10_std").fill_null(0)).alias("hi"))
    base = alt.Chart(s).encode(x=alt.X("k:O", title="staleness k"), color="panel:N")
    return (base.mark_errorbar().encode(y=alt.Y("lo:Q", title="test NDCG@10"), y2="hi:Q")
            + base.mark_point(filled=True).encode(y="ndcg@10:Q")).properties(
        title="C4: test NDCG@10 vs staleness (mean +- std over seeds)", width=360)
