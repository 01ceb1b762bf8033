"""The scaling stage's verdicts, views and charts (grlib.experiments.scaling.stage makes the rows).

    acceptance   C5.validation (each schedule's 2-rank prediction vs measurement, |error| <= the
                 registry's tolerance), C5.utilisation and C7.scaling (modelled at 1536 ranks, every
                 config, the truncated regime), C5.measured (2-rank
                 utilisation per schedule), C7.measured (1 -> 2 process efficiency per schedule).
                 The modelled TurboGR row (turbogr: grlib's pipelined(1) schedule) is met only when
                 the figure holds AND every schedule's validation holds, the pipelined one's included
                 (not met otherwise, the check saying which); the other configs' rows (grlib's semisync
                 and overlap schedules, the baseline) are figures beside it (met None)
    gantt        measured spans of a few steps per schedule: x = seconds, y = rank, colour = phase
    scaling_chart  modelled utilisation and linearity vs ranks, TurboGR vs baseline, the paper's 94% and 0.97
"""
from __future__ import annotations

import dataclasses

import altair as alt
import polars as pl

from grlib import schedules
from grlib.experiments import claims as registry

ACCEPT_RANKS, ACCEPT_REGIME = 1536, "truncated"
MAIN = ("turbogr",)  # the modelled config judged: TurboGR's, grlib's dist.schedule pipelined(1)
GANTT_PHASES = ("data", "forward", "loss", "backward", "comm", "optimizer")  # comm: the all-reduce
SCHEMA = {"target": pl.String, "check": pl.String, "value": pl.Float64, "met": pl.Boolean}


def schedule_name(r: dict) -> str:
    """The dist.schedule(k) a modelled row stands for: the registered schedule whose model cost is the
    row's program with its bucketed all-reduce and item trips on the stream (grlib.schedules)."""
    program = schedules.get(r["schedule"]).model
    cost = dataclasses.replace(program, overlap_allreduce=bool(r.get("bucketed_allreduce")),
                               sparse_stream=bool(r.get("sparse_stream")))
    name = schedules.modelled_as(cost, r["staleness"])
    k = r["staleness"] if r["staleness"] or schedules.get(name).stream else None
    return name if k is None else f"{name}({k})"


def _part(table: pl.DataFrame, part: str, processes: int | None = None) -> pl.DataFrame:
    """The rows of one part (of those, with `processes`); none where the table has no such rows."""
    if "part" not in table.columns:
        return pl.DataFrame()
    rows = table.filter(pl.col("part") == part)
    return rows.filter(pl.col("processes") == processes) if processes is not None and rows.height else rows


def _validation(table: pl.DataFrame) -> tuple[list[dict], bool, str]:
    t = registry.target("C5.validation")
    rows = [{"target": t.key, "check": f"{r['schedule']}: predicted {r['predicted_step_ms']:.0f} ms vs measured "
             f"{r['measured_step_ms']:.0f} ms per step on dedicated cores (2 gloo ranks; error {100 * r['error']:+.1f}%); "
             f"as measured on the shared machine {r['predicted_step_ms_raw']:.0f} vs {r['measured_step_ms_raw']:.0f} ms "
             f"({100 * r['error_raw']:+.1f}%; the ranks waited {r['rq_wait_ms']:.0f} ms per step for a core)",
             "value": r["abs_error"], "met": t.met(r["abs_error"])} for r in _part(table, "sim-validation").iter_rows(named=True)]
    valid = bool(rows) and all(r["met"] for r in rows)
    worst = max((r["value"] for r in rows), default=float("nan"))
    note = (f"counts: every schedule's 2-rank prediction within {t.bounds[0].limit} (worst {100 * worst:.1f}%)" if valid
            else "does not count: no validation rows" if not rows
            else f"does not count: a schedule's 2-rank prediction is off by {100 * worst:.1f}% (> {t.bounds[0].limit})")
    return rows, valid, note


def acceptance(table: pl.DataFrame) -> pl.DataFrame:
    """C5's and C7's checks on one run's rows: target, check, value, met (None: a figure, or not counted)."""
    out, valid, note = _validation(table)
    sim = _part(table, "simulated")
    if sim.height:
        regime = ACCEPT_REGIME if ACCEPT_REGIME in sim["regime"].to_list() else sim["regime"][0]
        P = ACCEPT_RANKS if ACCEPT_RANKS in sim["ranks"].to_list() else int(sim["ranks"].max())
        for key, column in (("C5.utilisation", "utilisation"), ("C7.scaling", "linearity")):
            t = registry.target(key)
            for r in sim.filter((pl.col("ranks") == P) & (pl.col("regime") == regime)).iter_rows(named=True):
                met = (valid and t.bounds[0].holds(r[column])) if r["config"] in MAIN else None
                out.append({"target": t.key, "value": r[column], "met": met, "check":
                            f"{r['config']} at {P} ranks, modelled ({note}): {r['regime']} KuaiRand-27K lengths at "
                            f"max_len {r['max_len']}, {r['users_per_rank']} users per rank, {r['device']} "
                            f"{r['peak_tflops']:.0f} TFLOP/s x measured efficiency {r['efficiency']:.3f}, {r['preset']} "
                            f"(NVLink {r['intra_gb_s']:.0f} GB/s, NIC {r['inter_gb_s']:.0f} GB/s), schedule "
                            f"{schedule_name(r)}, {r['items']} items, "
                            f"{r['balance']}; exposed comm {r['exposed_comm_ms']:.1f} of {r['step_ms']:.0f} ms"})
    t = registry.target("C5.measured")
    for r in _part(table, "measured-schedule").iter_rows(named=True):
        out.append({"target": t.key, "value": r["utilisation"], "met": t.met(r["utilisation"]),
                    "check": f"{r['schedule']}: 2 gloo ranks, compute / wall (rank 0 {100 * r['utilisation_rank0']:.1f}%, "
                             f"rank 1 {100 * r['utilisation_rank1']:.1f}%), {r['step_ms']:.0f} ms per step; on dedicated "
                             f"cores {100 * r['utilisation_dedicated']:.1f}% ({r['step_ms_dedicated']:.0f} ms)"})
    t = registry.target("C7.measured")
    for r in _part(table, "measured-scaling", 2).iter_rows(named=True):
        out.append({"target": t.key, "value": r["efficiency"], "met": None if r["schedule"].startswith("solo")
                    else t.met(r["efficiency"]), "check": f"{r['schedule']}: tokens/s per rank at 2 processes / at 1 "
                    f"({r['tokens_per_s_per_rank']:.0f} tokens/s per rank); on dedicated cores "
                    f"{r['efficiency_dedicated']:.3f}"})
    return pl.DataFrame(out, schema=SCHEMA)


def headline(table: pl.DataFrame) -> dict:
    """The figures of the metrics JSON."""
    sim = _part(table, "simulated")
    return {
        "validation_error": {r["schedule"]: r["error"] for r in _part(table, "sim-validation").iter_rows(named=True)},
        "measured_utilisation": {r["schedule"]: r["utilisation"] for r in
                                 _part(table, "measured-schedule").iter_rows(named=True)},
        "efficiency_1_to_2": {r["schedule"]: r["efficiency"] for r in
                              _part(table, "measured-scaling", 2).iter_rows(named=True)},
        "modelled": [{k: r[k] for k in ("config", "regime", "ranks", "utilisation", "linearity")}
                     for r in sim.iter_rows(named=True)],
        "mfu_paper_layer": {r["impl"]: r["mfu"] for r in _part(table, "mfu-paper").iter_rows(named=True)
                            if r["obtained"] == "measured"},
    }


def gantt(table: pl.DataFrame, steps: int) -> alt.FacetChart:
    """The measured phases of the first `steps` kept steps of each schedule, from its round whose
    steps took the least wall in all (the quietest)."""
    spans = _part(table, "spans")
    if spans.height:
        spans = spans.filter(pl.col("step") < steps)
        best = (spans.group_by("schedule", "round").agg(pl.col("wall_s").sum()).sort("wall_s", "round")
                .group_by("schedule").first().select("schedule", "round"))
        spans = spans.join(best, on=["schedule", "round"])
    bars = []
    for r in spans.iter_rows(named=True):
        at = r["t_s"]
        for phase in GANTT_PHASES:
            bars.append({"schedule": r["schedule"], "rank": f"rank {r['rank']}", "step": r["step"], "phase": phase,
                         "start": at, "end": at + r[f"{phase}_s"], "ms": 1e3 * r[f"{phase}_s"]})
            at += r[f"{phase}_s"]
        bars.append({"schedule": r["schedule"], "rank": f"rank {r['rank']}", "step": r["step"], "phase": "idle",
                     "start": at, "end": r["t_s"] + r["wall_s"], "ms": 1e3 * r["idle_s"]})
    data = pl.DataFrame(bars) if bars else pl.DataFrame(schema={"schedule": pl.String, "rank": pl.String,
                                                                "step": pl.Int64, "phase": pl.String, "start": pl.Float64,
                                                                "end": pl.Float64, "ms": pl.Float64})
    return (alt.Chart(data).mark_bar().encode(
        x=alt.X("start:Q", title="seconds from the first step's start"), x2="end:Q", y=alt.Y("rank:N", title=None),
        color=alt.Color("phase:N", sort=[*GANTT_PHASES, "idle"]),
        tooltip=["schedule", "rank", "step", "phase", alt.Tooltip("ms:Q", format=".1f")])
        .properties(width=560, height=50)
        .facet(row=alt.Row("schedule:N", title=None))
        .properties(title="C5: 2 gloo ranks, measured phases per step (comm = gradient all-reduce; the item "
                          "all-to-alls run inside forward, loss and backward)"))


def scaling_chart(table: pl.DataFrame) -> alt.HConcatChart:
    """Modelled utilisation and linearity vs ranks per config and regime; the paper's figures as rules."""
    sim = _part(table, "simulated")
    charts = []
    for column, key in (("utilisation", "C5.utilisation"), ("linearity", "C7.scaling")):
        paper = registry.target(key).paper.number
        data = (sim.select("ranks", "config", "regime", pl.col(column).alias("value")) if sim.height
                else pl.DataFrame(schema={"ranks": pl.Int64, "config": pl.String, "regime": pl.String, "value": pl.Float64}))
        line = alt.Chart(data).mark_line(point=True).encode(
            x=alt.X("ranks:Q", scale=alt.Scale(type="log", nice=False), title="ranks"),
            y=alt.Y("value:Q", title=column, scale=alt.Scale(domain=[0, 1])),
            color="config:N", strokeDash="regime:N", tooltip=["config", "regime", "ranks", alt.Tooltip("value:Q", format=".3f")])
        marks = pl.DataFrame({"value": [paper], "label": [f"paper {paper:g}"], "ranks": [8]})
        rule = alt.Chart(marks).mark_rule(color="gray", strokeDash=[4, 4]).encode(y="value:Q", tooltip=["label"])
        text = alt.Chart(marks).mark_text(align="left", dy=-6, color="gray").encode(x="ranks:Q", y="value:Q", text="label")
        charts.append(alt.layer(line, rule, text).properties(width=300, height=220,
                                                              title=f"{column} (modelled, gpu-8 preset)"))
    return alt.hconcat(*charts).properties(title="C5 / C7: TurboGR vs baseline at 8 .. 1536 ranks (grlib.sim.pipeline)")


VIEWS = {
    "measured-schedule": ["schedule", "staleness", "steps", "rounds", "step_ms", "step_ms_all", "step_ms_dedicated",
                          "utilisation", "utilisation_rank0", "utilisation_rank1", "utilisation_all",
                          "utilisation_dedicated", "rq_wait_ms", "cpu_ms", "data_ms", "forward_ms", "loss_ms", "backward_ms",
                          "allreduce_ms", "lookup_comm_ms", "optimizer_ms", "idle_ms", "tokens_per_s_per_rank"],
    "spans": ["schedule", "round", "rank", "step", "wall_s", "data_s", "forward_s", "loss_s", "backward_s", "comm_s",
              "lookup_comm_s", "optimizer_s", "idle_s", "compute_s", "utilisation", "rq_wait_s", "dedicated_wall_s"],
    "sim-validation": ["schedule", "measured_step_ms", "predicted_step_ms", "error", "measured_step_ms_raw",
                       "predicted_step_ms_raw", "error_raw", "rq_wait_ms", "cpu_ms", "solo_cpu_ms", "measured_utilisation",
                       "predicted_utilisation", "predicted_exposed_comm_ms", "alpha_us", "beta_ns_per_kb", "alpha_us_raw",
                       "beta_ns_per_kb_raw", "c0", "kappa", "per_token", "r2", "rows_input_per_peer", "rows_loss_per_peer"],
    "simulated": ["regime", "config", "ranks", "step_ms", "compute_ms", "exposed_comm_ms", "plan_ms", "imbalance",
                  "utilisation", "linearity", "efficiency", "node_dedup", "rank_dedup", "buckets"],
    "measured-scaling": ["processes", "schedule", "steps", "rounds", "step_ms", "step_ms_all", "step_ms_dedicated",
                         "tokens_per_s_per_rank", "tokens_per_s_all", "tokens_per_s_dedicated", "efficiency",
                         "efficiency_all", "efficiency_dedicated"],
    "mfu-paper": ["impl", "obtained", "regime", "max_len", "sequences", "layer_ms", "layer_wall_ms", "mfu", "mfu_wall",
                  "efficiency", "peak_gflops", "step_tflop", "padded_step_tflop", "useful_over_padded"],
}


def view(table: pl.DataFrame, part: str) -> pl.DataFrame:
    """The rows of one part with its own columns."""
    if part not in VIEWS:
        raise ValueError(f"part must be one of {tuple(VIEWS)}, got {part!r}")
    sub = _part(table, part)
    return sub.select([c for c in VIEWS[part] if c in sub.columns])
