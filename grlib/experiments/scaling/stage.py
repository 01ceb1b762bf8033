"""Stage `scaling` (notebooks/07_scaling, `bench pipeline`): claims C5 (a fine-grained pipeline keeps
94% of the devices busy) and C7's scaling (near-linear, 0.97; baselines below 0.6).

Six parts, each a `part` of table `scaling`, with `obtained` measured | modelled | computed. One
launch of 2 gloo ranks (one thread each) measures everything but the MFU, in `rounds` rounds on the
same global batches; the measured figures are those of the typical steps (each batch's median round:
the cores are shared with other jobs, whose bursts stretch some runs), every step's beside them (_all),
and the dedicated-core ones (less the time the ranks waited for a core; grlib.experiments.scaling.frames):

    measured-schedule  measured: the ranks train the scale's model on ragged batches (the scale's data
                       at pair_max_len, sharded items, balance kk) under each schedule (sync, prefetch,
                       semisync(k), overlap, pipelined(k)): step time, per-rank utilisation = compute /
                       wall, per-phase means
    spans              measured: per rank and step, data / forward / loss / backward / comm (all-reduce +
                       item all-to-alls) / optimizer / idle (grlib.experiments.scaling.frames.spans)
    sim-validation     modelled vs measured: grlib.sim.pipeline predicts each schedule's 2-rank step from
                       the compute model fitted to solo steps, gloo's alpha-beta fitted here and each
                       step's exact work, on dedicated cores (the verdict) and as measured on the
                       shared machine (grlib.experiments.scaling.validation)
    simulated          modelled: 8 .. 1536 ranks of the gpu-8 preset, TurboGR vs the baseline
                       (grlib.experiments.scaling.cluster.CONFIGS), utilisation and weak-scaling linearity
    measured-scaling   measured: tokens/s per rank of 1 process (rank 0 alone, rank 1 waiting) and of 2
                       (each schedule; and both solo at once, no communication), same per-rank batch;
                       efficiency = 2 / 1
    mfu-paper          measured: one paper-preset layer's MFU, fused kernel vs padded reference; computed:
                       the preset's FLOPs per rank step (grlib.experiments.scaling.cluster.mfu_paper)

The modelled figures count only when every schedule's 2-rank prediction is within the registry's
tolerance (C5.validation); acceptance (grlib.experiments.scaling.charts) says so in each verdict.
"""
from __future__ import annotations

import dataclasses
import statistics

import numpy as np
import polars as pl

from grlib import plots, results, schedules
from grlib.config import Config, ScalingAblation
from grlib.distributed.cost import QuadraticCost, calibrate_layer, fit_quadratic
from grlib.distributed.launch import launch
from grlib.experiments.scaling import charts, cluster, frames, measured
from grlib.experiments.scaling.validation import validation

TABLE = "scaling"
PARTS = ("measured-schedule", "spans", "sim-validation", "simulated", "measured-scaling", "mfu-paper")
acceptance, view = charts.acceptance, charts.view


def quick(ab: ScalingAblation) -> ScalingAblation:
    """The smoke grid (the notebook's default): one round of a few steps, a short MFU batch."""
    return dataclasses.replace(ab, pair_batch_size=16, pair_max_len=128, pair_steps=2, warm_steps=1, rounds=1,
                               solo_steps=2, gloo_sizes=[1024, 1048576], gloo_repeats=2, calibration_points=3,
                               calibration_repeats=1, ranks=[8, 1536], sim_steps=2, regimes=["truncated"],
                               mfu_sequences=1, mfu_max_len=128, mfu_repeats=1)


def pair_spec(ab: ScalingAblation) -> measured.PairSpec:
    return measured.PairSpec(ab.pair_batch_size, ab.pair_max_len, ab.pair_steps, ab.warm_steps, ab.rounds,
                             tuple((s, ab.staleness if schedules.get(s).stale else 0) for s in ab.schedules),
                             ab.pair_balance, ab.pair_items, ab.solo_steps, tuple(ab.gloo_sizes), ab.gloo_repeats)


def calibrate(cfg: Config, ab: ScalingAblation) -> QuadraticCost:
    """One HSTU layer of the scale's model, measured at lengths 16 .. pair_max_len, fitted quadratic."""
    lengths = sorted({int(round(x)) for x in np.geomspace(16, ab.pair_max_len, ab.calibration_points)})
    points = calibrate_layer(cfg.model, lengths, repeats=ab.calibration_repeats)
    return fit_quadratic([p["length"] for p in points], [p["seconds_per_sequence"] for p in points])


def launches(cfg: Config, ab: ScalingAblation) -> list[dict]:
    """The 2-rank launch: link timings, then rounds of solo (1 process, 2 processes) and schedules."""
    return launch(measured.pair_rank, 2, args=(cfg, pair_spec(ab)), timeout_s=1800)


def schedule_spans(two: list[dict], ab: ScalingAblation) -> list[dict]:
    """Span rows of every run (schedule, round) of the 2-rank launch."""
    rows = []
    for run0, run1 in zip(two[0]["runs"], two[1]["runs"], strict=True):
        for s in frames.spans([run0["timeline"], run1["timeline"]], ab.warm_steps):
            rows.append({"part": "spans", "obtained": "measured", "schedule": run0["schedule"],
                         "staleness": run0["staleness"], "round": run0["round"], **s})
    return rows


def _per_schedule(spans: list[dict]) -> dict[str, pl.DataFrame]:
    df = pl.DataFrame(spans)
    return {s: df.filter(pl.col("schedule") == s) for s in dict.fromkeys(df["schedule"].to_list())}


def _utilisation(df: pl.DataFrame, compute: str = "compute_s", wall: str = "wall_s") -> list[float]:
    """Compute / wall of each rank over the rows of df (rank order)."""
    return [float(d[compute].sum() / d[wall].sum()) for _, d in df.sort("rank").group_by("rank", maintain_order=True)]


def schedule_rows(spans: list[dict]) -> list[dict]:
    """Per schedule, over the typical steps (each batch's median round): step time, utilisation per
    rank, mean seconds per phase; the same over every step beside them (_all)."""
    rows = []
    for schedule, df in _per_schedule(spans).items():
        q = frames.typical(df)
        util, util_all = _utilisation(q), _utilisation(df)
        dedicated = _utilisation(frames.typical(df, "dedicated_wall_s"), "dedicated_compute_s", "dedicated_wall_s")
        rows.append({"part": "measured-schedule", "obtained": "measured", "schedule": schedule,
                     "staleness": int(df["staleness"][0]), "ranks": 2, **frames.throughput(df),
                     "utilisation": float(np.mean(util)), "utilisation_rank0": util[0], "utilisation_rank1": util[1],
                     "utilisation_all": float(np.mean(util_all)), "utilisation_dedicated": float(np.mean(dedicated)),
                     **{f"{c.removesuffix('_s')}_ms": 1e3 * float(q[c].mean()) for c in
                        ("data_s", "forward_s", "loss_s", "backward_s", "allreduce_s", "lookup_comm_s", "comm_total_s",
                         "optimizer_s", "idle_s", "compute_s")},
                     "stale_fraction": float(df["stale_fraction"].mean())})
    return rows


def scaling_rows(two: list[dict], spans: list[dict]) -> list[dict]:
    """Tokens/s per rank: 1 process (rank 0 alone), 2 processes at once without communication, and
    2 ranks under each schedule; efficiency = over 1 process (typical steps; _all: every step)."""
    alone = frames.throughput(frames.solo_frame(two[0]["alone"], 0))
    both = frames.throughput(pl.concat([frames.solo_frame(r["solo"], r["rank"]) for r in two]))
    rows = [(1, "solo", alone), (2, "solo (no communication)", both),
            *((2, s, frames.throughput(df)) for s, df in _per_schedule(spans).items())]
    return [{"part": "measured-scaling", "obtained": "measured", "processes": p, "schedule": name,
             **{k: v for k, v in r.items() if k != "tokens_per_s"}, "tokens_per_s_per_rank": r["tokens_per_s"],
             "efficiency": r["tokens_per_s"] / alone["tokens_per_s"],
             "efficiency_all": r["tokens_per_s_all"] / alone["tokens_per_s_all"],
             "efficiency_dedicated": r["tokens_per_s_dedicated"] / alone["tokens_per_s_dedicated"]} for p, name, r in rows]


def measure(cfg: Config, ab: ScalingAblation) -> list[dict]:
    """Every part's rows (the launches first: the compute model needs their solo steps)."""
    from grlib.data.catalog import load_dataset

    load_dataset(cfg, "scale")  # prepared once, before the ranks read it
    layer = calibrate(cfg, ab)
    two = launches(cfg, ab)
    spans = schedule_spans(two, ab)
    rows = schedule_rows(spans) + spans + validation(cfg, ab, pair_spec(ab), two, spans, layer) + scaling_rows(two, spans)
    mfu = cluster.mfu_paper(ab)
    eff = {r["impl"]: r["efficiency"] for r in mfu if r["obtained"] == "measured"}
    return rows + cluster.simulate_cluster(ab, eff["fused"], eff["padded"]) + mfu


def run(cfg: Config, ab: ScalingAblation) -> dict:
    """Every part; rows appended to table `scaling`; the charts and the metrics JSON written."""
    rows = measure(cfg, ab)
    table = results.append_rows(TABLE, rows, cfg)
    checks = acceptance(table)
    results.write_metrics(TABLE, {"scale": cfg.scale, "acceptance": checks.to_dicts(),
                                  **charts.headline(table)}, cfg.scale)
    figures = (plots.save_chart(charts.gantt(table, ab.gantt_steps), "scaling_gantt", cfg.scale)
               + plots.save_chart(charts.scaling_chart(table), "scaling_utilisation", cfg.scale))
    return {"table": table, "acceptance": checks, "figures": figures}
