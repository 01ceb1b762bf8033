"""Stage `report` (notebooks/99_report): every claim of the registry (grlib.experiments.claims) at
every scale present in the result tables, and model quality.

`run(scale)` writes results/summary/<scale>.md and results/figures/<scale>/ (never another
scale's); `render_all()` gives the claims of every scale as markdown and writes nothing.
Each claim row reads the newest run of its stage's table at the scale (the train table: the newest
row per dataset, model and seed; bench_train: the newest row per model shape). A target with no
row reads "not measured yet", with the reason; none is left out.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import altair as alt
import polars as pl

from grlib import io, paths, plots, results
from grlib.config import load_config, scale_names
from grlib.experiments import claims as registry
from grlib.experiments.claims import Figure, Target


def train_summary(scale: str | None = None) -> pl.DataFrame:
    """Mean and std over seeds of the latest run of each (scale, model), and the peer library's figure of
    the same model on the same dataset where there is one (`peer_ndcg@10`, train_stage.PEERS)."""
    from grlib.experiments.train_stage import peer_table

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
            .join(peer_table().select("dataset", "model", pl.col("test_ndcg@10").alias("peer_ndcg@10")),
                  on=["dataset", "model"], how="left")
            .sort("scale", "dataset", "ndcg@10", descending=[False, False, True]))


def quality_chart(summary: pl.DataFrame) -> alt.FacetChart:
    """train_summary's chart: the train stage's (one panel per dataset on its own axis, seed-std
    whiskers, the peers' figures as dashed lines)."""
    from grlib.experiments.train_stage import quality_chart as chart

    return chart(summary)


def _latest_run(name: str, scale: str | None) -> pl.DataFrame:
    """Every row of the newest run (run_id) of table `name` at `scale` (the newest scale if None)."""
    table = results.read_table(name, scale)
    if table.height == 0:
        return table
    newest = table.with_row_index("_i").sort("timestamp", "_i").row(-1, named=True)["run_id"]  # ties: table order
    return table.filter(pl.col("run_id") == newest)


# ---------------------------------------------------------------------------------------------
# claim rows


@dataclass(frozen=True)
class Found:
    """One result a table gives for a target: the check (with its context), ours, how, the verdict."""
    target: str          # registry key
    check: str
    ours: str
    how: str             # the run it comes from and its parameters
    met: bool | None     # None: no verdict (the target has no threshold, or this row does not judge)
    verdict: str | None = None  # the verdict's words where not VERDICTS[met] (C7.mfu: "fp32: context" ...)
    kind: str | None = None     # how it is obtained where not the target's method (C7.mfu: "not measured in bf16")


VERDICTS = {True: "met", False: "not met", None: "(no threshold)"}
COLUMNS = {"scale": pl.String, "claim": pl.String, "target": pl.String, "check": pl.String, "paper": pl.String,
           "threshold": pl.String, "ours": pl.String, "obtained": pl.String, "verdict": pl.String,
           "met": pl.Boolean}


def _run_note(table: pl.DataFrame, name: str) -> str:
    first = table.row(0, named=True)
    return f"{name} run {first['run_id']} ({first['timestamp'][:10]})"


def _kernels(scale: str) -> list[Found]:
    run = _latest_run("kernels", scale)
    if run.height == 0:
        return []
    from grlib.experiments import kernels_stage

    note = _run_note(run, "kernels")
    return [Found(r["target"], r["check"], Figure.of(r["value"], registry.target(r["target"]).unit).short(),
                  note, r["met"]) for r in kernels_stage.acceptance(run).iter_rows(named=True)]


def _negatives(scale: str) -> list[Found]:
    run = _latest_run("negatives", scale)
    if run.height == 0:
        return []
    from grlib.config import load_ablation
    from grlib.experiments import negatives_stage

    note = _run_note(run, "negatives")
    return [Found(c["target"], f"{c['dataset']} · {c['check']}", c["figure"], f"{note}, row {c['row']}", c["met"])
            for c in negatives_stage.acceptance(run.to_dicts(), load_ablation("negatives"))]


def _quality(scale: str) -> list[Found]:
    train = train_summary(scale)
    quality = registry.target("W1.quality")
    found = []
    for ds in train["dataset"].unique(maintain_order=True) if train.height else []:
        sub = train.filter(pl.col("dataset") == ds)
        pop = sub.filter(pl.col("model") == "popularity")["ndcg@10"]
        for r in sub.filter(pl.col("model") != "popularity").iter_rows(named=True):
            if pop.len() and pop[0] > 0:
                ratio = r["ndcg@10"] / pop[0]
                found.append(Found(quality.key, f"{ds} · {r['model']} {quality.threshold}",
                                   f"{ratio:.2f}x ({r['ndcg@10']:.4f}, {r['seeds']} seeds)",
                                   f"train table, popularity NDCG@10 {pop[0]:.4f}", quality.met(ratio)))
    return found + _vs_peer(train)


def _vs_peer(train: pl.DataFrame) -> list[Found]:
    """W1.peer: HSTU's NDCG@10 on each dataset with a peer SASRec figure (train_stage.PEERS)."""
    from grlib.experiments.train_stage import PEER_TARGET_MODEL, peer

    t = registry.target("W1.peer")
    found = []
    for r in train.filter(pl.col("model") == "hstu").iter_rows(named=True) if train.height else []:
        p = peer(r["dataset"], PEER_TARGET_MODEL)
        if p is not None:
            ratio = r["ndcg@10"] / p.ndcg10
            found.append(Found(t.key, f"{r['dataset']} · {t.threshold}",
                               f"{ratio:.2f}x ({r['ndcg@10']:.4f} ± {r['ndcg@10_std'] or 0:.4f}, {r['seeds']} seeds)",
                               f"train table vs {p.library} {p.model} NDCG@10 {p.ndcg10:.4f} (train_stage.PEERS)",
                               t.met(ratio)))
    return found


SHAPE = ["d_model", "n_layers", "n_heads", "batch", "max_len"]


def _preset(scale: str) -> tuple | None:
    """The model shape of the scale's preset in params.yaml (None for a scale it does not name)."""
    if scale not in scale_names():
        return None
    cfg = load_config(scale)
    return (cfg.model.d_model, cfg.model.n_layers, cfg.model.n_heads, cfg.train.batch_size, cfg.data.max_len)


PAPER_ON_CPU = "paper-cpu"  # the paper preset's model on one CPU (params.yaml): its rows stand beside every scale's


def _mfu(scale: str) -> list[Found]:
    """C7's MFU from `bench train`: the newest row of the automatically chosen attention per model
    shape, precision and CPU, the scale's own, then those of the paper preset on one CPU (scale paper-cpu)."""
    found = _mfu_rows(scale, "")
    if scale != PAPER_ON_CPU:
        found += _mfu_rows(PAPER_ON_CPU, f"; scale {PAPER_ON_CPU}, the paper preset on one CPU")
    return found


# The paper's 54.71% is a half-precision figure (NPU matrix units): on a CPU with bf16 units the verdict
# reads its bf16 rows (against the bf16 nominal peak) and its fp32 rows are context; a CPU without bf16
# units can only run fp32, whose rows then judge; a CPU whose bf16 units no row records judges nothing.
BF16_CONTEXT = "fp32: context"  # verdicts of the rows that do not judge
UNITS_UNKNOWN = "fp32: bf16 units not recorded"
NOT_IN_BF16 = "not measured in bf16"
MFU_NOTE = ("C7.mfu: every MFU figure names its precision. The paper's 54.71% is a half-precision figure, so on a "
            "CPU with bf16 units (amx_bf16, avx512_bf16) its bf16 rows judge, against the bf16 nominal peak with "
            f"the bf16 GEMM peak measured in the run beside it, and its fp32 rows read \"{BF16_CONTEXT}\"; such a "
            f"CPU without a bf16 row reads \"{NOT_IN_BF16}\"; only a CPU without bf16 units is judged in fp32.")
_HOW_CPU = r"CPU '([^']*)' family"  # nominal_peak_how names the CPU (rows since the nominal peak, 2026-12-01)
_FAMILY = r"(family 0x[0-9a-f]+ model 0x[0-9a-f]+)"  # in cpu_id and in nominal_peak_how


def _with_cpu(table: pl.DataFrame) -> pl.DataFrame:
    """Columns `cpu` (the CPU's name and family / model, or the device a device check's row ran on,
    not its host CPU; null: not recorded) and `bf16_units` (its
    bf16 flags, "none", or null: not recorded) of every bench_train row: the recorded cpu_model,
    cpu_id and cpu_bf16_units, else what the row's nominal_peak_how says (rows from before those
    columns: its CPU, and its bf16 FLOP per cycle's source, which names the bf16 flag; "no bf16
    instructions" counts only on the avx512 path, the others' nominal peak leaving the flags out),
    then, per CPU, what another of its rows records; a bf16 row's CPU has bf16 units (bench train
    refuses bf16 elsewhere)."""
    col = lambda c: pl.col(c) if c in table.columns else pl.lit(None, pl.String)  # noqa: E731
    how = col("nominal_peak_how")
    name = pl.coalesce(col("cpu_model"), how.str.extract(_HOW_CPU, 1))
    family = pl.coalesce(col("cpu_id").str.extract(_FAMILY, 1), how.str.extract(_FAMILY, 1))
    from_how = (pl.when(how.str.contains("bf16: amx_bf16:", literal=True)).then(pl.lit("amx_bf16"))
                .when(how.str.contains("bf16: avx512_bf16:", literal=True)).then(pl.lit("avx512_bf16"))
                .when(how.str.contains("no bf16 instructions", literal=True) & (pl.col("isa") == "avx512"))
                .then(pl.lit("none")))
    table = table.with_columns(
        pl.when(col("device").is_not_null()).then(col("device"))  # a device check's row (import-rows): its GPU
        .when(name.is_null() & family.is_null()).then(pl.lit(None, pl.String))
        .otherwise(pl.concat_str(name.fill_null("CPU"), pl.lit(" ("), family.fill_null("family not recorded"),
                                 pl.lit(")"))).alias("cpu"),
        pl.coalesce(col("cpu_bf16_units"), from_how,
                    pl.when(pl.col("precision") == "bf16").then(pl.lit("bf16 units"))).alias("bf16_units"))
    known = (pl.col("bf16_units").filter(pl.col("bf16_units") != "bf16 units").drop_nulls().first()
             .over("cpu"))  # a flag another row of the CPU names, before the bare "a bf16 row ran"
    fill = pl.coalesce(known, pl.col("bf16_units").drop_nulls().first().over("cpu"))
    return table.with_columns(pl.when(pl.col("cpu").is_null()).then(pl.col("bf16_units")).otherwise(fill)
                              .alias("bf16_units"))


def _mfu_rows(scale: str, label: str) -> list[Found]:
    table = results.read_table("bench_train", scale)
    if table.height == 0:
        return []
    mfu, preset = registry.target("C7.mfu"), _preset(scale)
    # rows from before a column: fp32 (before bf16 mode), no recomputation, avx512 (before the per-ISA
    # paths every run was on an AVX-512 machine: Zen 5, Xeon)
    table = table.with_columns(*((pl.col(c).fill_null(v) if c in table.columns else pl.lit(v)).alias(c)
                                 for c, v in (("precision", "fp32"), ("recompute_layers", False), ("isa", "avx512"))))
    table = _with_cpu(table)
    key = [*SHAPE, "precision", "recompute_layers", "isa"]
    rows = results.latest(table.filter(pl.col("auto")), [*key, "cpu"])
    # a row that records no CPU stands only where no row of a known CPU has its key (older runs, superseded)
    rows = pl.concat([rows.filter(pl.col("cpu").is_not_null()),
                      rows.filter(pl.col("cpu").is_null()).join(rows.filter(pl.col("cpu").is_not_null()),
                                                                 on=key, how="anti", nulls_equal=True)]).to_dicts()
    newest = {}  # each CPU's newest row: the CPUs in that order, the newest first; rows recording none last
    for r in rows:
        newest[r["cpu"]] = max(newest.get(r["cpu"], ""), r["timestamp"])
    order = sorted(sorted(c for c in newest if c is not None), key=newest.get, reverse=True) + \
        ([None] if None in newest else [])  # ties (timestamps in seconds): by name
    found = []
    for cpu in order:
        mine = [r for r in rows if r["cpu"] == cpu]
        mine.sort(key=lambda r: (tuple(r[k] for k in SHAPE) != preset, *(r[k] for k in SHAPE),
                                 r["precision"] != "bf16", r["recompute_layers"], r["isa"]))
        units = mine[0]["bf16_units"]
        has_bf16 = units not in (None, "none")
        in_bf16 = any(r["precision"] == "bf16" for r in mine)
        if has_bf16 and not in_bf16:
            found.append(Found(mfu.key, f"bf16 · {_cpu_text(cpu, units)}{label}: {mfu.threshold}", "—",
                               f"no `bench train --precision bf16` row of this CPU at scale {scale}, which has bf16 "
                               f"units ({units}): the paper's 54.71% is a half-precision figure, so this CPU's "
                               f"fp32 rows are context, not the verdict", None, verdict=NOT_IN_BF16, kind=NOT_IN_BF16))
        found += [_mfu_found(table, r, mfu, preset, label, units, in_bf16) for r in mine]
    return found


def _cpu_text(cpu: str | None, units: str | None) -> str:
    return (f"{cpu or 'CPU not recorded'}, bf16 units: "
            f"{'not recorded' if units is None else 'a bf16 row ran' if units == 'bf16 units' else units}")


def _mfu_found(table: pl.DataFrame, r: dict, mfu: Target, preset: tuple | None, label: str, units: str | None,
               in_bf16: bool) -> Found:
    """One C7.mfu row: judged when it is the CPU's precision of the verdict (module note above _with_cpu)."""
    shape = tuple(r[k] for k in SHAPE)
    ref = table.filter((pl.col("run_id") == r["run_id"]) & (pl.col("attention_impl") == "reference")
                       & (pl.col("isa") == r["isa"])
                       & ~(pl.col("compiled").fill_null(False) if "compiled" in table.columns else pl.lit(False)))
    # the paper's figure divides by a nominal peak (NVIDIA's convention): the verdict reads mfu_nominal,
    # and the MFU against the GEMM peak measured in the same run stands beside it
    nominal = r.get("mfu_nominal")
    value = nominal if nominal is not None else r["mfu"]
    cpu = r["cpu"] or "CPU not recorded"  # recorded, or read from the nominal peak's description (_with_cpu)
    limit = r.get("gemm_limit")
    how = (f"bench_train run {r['run_id']} ({r['timestamp'][:10]}, {cpu}, grlib._C path {r['isa']}"
           f"{'' if not limit or limit == 'none' else ', GEMMs limited: ' + limit}): "
           f"{r['attention_impl']} attention, {r['step_ms']:.1f} ms/step; ")
    if nominal is not None:
        how += (f"of the nominal {r['precision']} peak {r['nominal_peak_flops'] / 1e9:.0f} GFLOP/s; "
                f"{Figure.of(r['mfu'], mfu.unit).short()} of the {r['precision']} GEMM peak measured in the run "
                f"({r['peak_flops'] / 1e9:.0f} GFLOP/s)")
    else:
        how += (f"of the {r['precision']} GEMM peak measured in the run ({r['peak_flops'] / 1e9:.0f} GFLOP/s; "
                f"the row records no nominal peak)")
    if ref.height:  # the reference row of the same recomputation where the run has one
        same = ref.filter(pl.col("recompute_layers") == r["recompute_layers"])
        ref = same if same.height else ref
        ref_value = ref["mfu_nominal"][0] if nominal is not None else ref["mfu"][0]
        how += (f"; padded reference {Figure.of(ref_value, mfu.unit).short()}"
                f"{' (layers recomputed)' if ref['recompute_layers'][0] and not r['recompute_layers'] else ''}")
    if r.get("mfu_gemm_bound") is not None:  # rows since bench train's GEMM-only bound
        how += (f"; GEMMs alone {r['gemm_bound_ms']:.0f} ms of the step: "
                f"{Figure.of(r['mfu_gemm_bound'], mfu.unit).short()} of the measured peak if nothing else took time")
    if r.get("peak_rss_mb") is not None:  # rows since bench train's peak RSS column
        how += f"; peak RSS {r['peak_rss_mb'] / 1024:.1f} GB"
    verdict = None
    if r["precision"] == "fp32" and units is None:
        verdict = UNITS_UNKNOWN
        how += "; no verdict: the row does not record whether its CPU has bf16 units (the paper's precision)"
    elif r["precision"] == "fp32" and units != "none":
        verdict = BF16_CONTEXT
        judge = "its bf16 rows judge" if in_bf16 else "its bf16 row would judge (none yet)"
        how += f"; context: this CPU has bf16 units, so {judge} (the paper's 54.71% is a half-precision figure)"
    elif r["precision"] == "fp32":
        how += "; judged in fp32: this CPU has no bf16 units (no avx512_bf16 or amx_bf16)"
    check = (f"{r['precision']} · HSTU {r['n_layers']}x{r['n_heads']} d={r['d_model']} ({r['params'] / 1e6:.1f}M "
             f"parameters), batch {r['batch']} x max_len {r['max_len']}"
             f"{' (preset)' if shape == preset else ''}"
             f"{', layers recomputed in backward' if r.get('recompute_layers') else ''}"
             f"{'' if r['isa'] == 'avx512' else ', the ' + r['isa'] + ' path'} · {_cpu_text(r['cpu'], units)}{label}: "
             f"{mfu.threshold}")
    return Found(mfu.key, check, f"{Figure.of(value, mfu.unit).short()} ({r['precision']})", how,
                 None if verdict else mfu.met(value), verdict=verdict)


def _bf16(scale: str) -> list[Found]:
    """C7.bf16: the newest train_precision run against the fp32 HSTU rows of the same train run; "not
    measured on this CPU" when the newest train stage skipped bf16 (train_stage.precision_missing)."""
    t = registry.target("C7.bf16")
    metrics = results.metrics_path("train", scale) if scale else None
    if metrics is not None and metrics.exists():
        import json

        why = json.loads(metrics.read_text()).get("precisions_skipped", {}).get("bf16")
        if why:
            return [Found(t.key, f"bf16: {t.threshold}", "not measured on this CPU", f"train stage skipped bf16: {why}",
                          None)]
    run = _latest_run("train_precision", scale)
    if run.height == 0:
        return []
    from grlib.experiments.train_stage import precision_summary

    train = results.read_table("train", scale)
    fp32 = train.filter(pl.col("run_id") == run["run_id"][0]) if train.height else train
    t, note = registry.target("C7.bf16"), _run_note(run, "train_precision")
    return [Found(t.key, f"{r['dataset']} · {r['precision']}: {t.threshold}", f"{r['in_fp32_stds']:.2f}",
                  f"{note}: NDCG@10 {r['test_ndcg@10']:.4f} ± {r['test_ndcg@10_std']:.4f} vs fp32 "
                  f"{r['fp32_ndcg@10']:.4f} ± {r['fp32_ndcg@10_std']:.4f} ({r['change']:+.1%}; {r['seeds']} and "
                  f"{r['fp32_seeds']} seeds), tokens/s {r['tokens_per_s_vs_fp32']:.2f}x fp32's",
                  t.met(r["in_fp32_stds"]))
            for r in precision_summary(fp32, run).iter_rows(named=True)]


def _balance(scale: str) -> list[Found]:
    run = _latest_run("balance", scale)
    if run.height == 0:
        return []
    from grlib.experiments import balance_stage

    fit = run.filter(pl.col("part") == "calibrate").row(0, named=True) if "part" in run.columns else None
    params = (f"; cost {fit['c0']:.3g} + {fit['a']:.3g}*s + {fit['b']:.3g}*s^2 s (R^2 {fit['r2']:.4f})"
              if fit else "")
    note = _run_note(run, "balance") + params
    return [Found(r["target"], r["check"], Figure.of(r["value"], registry.target(r["target"]).unit).short(),
                  note, r["met"]) for r in balance_stage.acceptance(run).iter_rows(named=True)]


def _sparse(scale: str) -> list[Found]:
    run = _latest_run("sparse", scale)
    if run.height == 0:
        return []
    from grlib.experiments import sparse_stage

    note = _run_note(run, "sparse")
    model = run.filter(pl.col("part") == "model") if "part" in run.columns else run.clear()
    if model.height:
        r = model.row(0, named=True)
        note += (f"; paper shape {r['tokens_per_rank']:,.0f} tokens x d {r['d_model']} fp32 per rank "
                 f"({r['users_per_rank']} users, max_len {r['max_len']})")
    return [Found(r["target"], r["check"], Figure.of(r["value"], registry.target(r["target"]).unit).short(),
                  note, r["met"]) for r in sparse_stage.acceptance(run).iter_rows(named=True)]


def _semi_async(scale: str) -> list[Found]:
    run = _latest_run("semi_async", scale)
    if run.height == 0:
        return []
    from grlib.experiments import semi_async_stage

    note = _run_note(run, "semi_async")
    std = lambda v: "no std: one seed" if v is None else f"{v:.4f}"  # noqa: E731
    return [Found(r["target"], f"{r['dataset']} · semisync({r['k']}) vs sync: within one seed-std "
                               f"({std(r['sync_std'])}) or 1% relative",
                  f"{r['ndcg@10']:.4f} vs {r['sync']:.4f} ({100 * r['relative']:.1f}%; "
                  f"stale rows {100 * r['stale_fraction']:.1f}%)", note, r["met"])
            for r in semi_async_stage.acceptance(run).iter_rows(named=True)]


def _scaling(scale: str) -> list[Found]:
    run = _latest_run("scaling", scale)
    if run.height == 0:
        return []
    from grlib.experiments.scaling import stage as scaling_stage

    note = _run_note(run, "scaling")
    return [Found(r["target"], r["check"], Figure.of(r["value"], registry.target(r["target"]).unit).short(),
                  note, r["met"]) for r in scaling_stage.acceptance(run).iter_rows(named=True)]


READERS: dict[str, Callable[[str], list[Found]]] = {
    "balance": _balance, "semi_async": _semi_async, "kernels": _kernels, "negatives": _negatives, "sparse": _sparse, "train": _quality,
    "scaling": _scaling, "train_precision": _bf16,
    "bench_train": _mfu}


def _claim_rows(scale: str, t: Target, found: list[Found]) -> list[dict]:
    claim = registry.CLAIMS[t.claim]
    base = {"scale": scale, "claim": f"{t.claim} {claim.title}", "target": t.key, "paper": t.paper_text,
            "threshold": t.threshold}
    if t.method.kind == "not measured yet" or not found:
        reason = (t.method.how if t.method.kind == "not measured yet" else
                  f"the newest {t.table} run at {scale} has no row for it" if results.parts(t.table, scale) else
                  f"no {t.table} rows at {scale}")
        check = f"{t.what}: {t.threshold}" if t.bounds else t.what
        return [{**base, "check": check, "ours": "—", "obtained": f"not measured yet: {reason}",
                 "verdict": "not measured yet", "met": None}]
    return [{**base, "check": f.check, "ours": f.ours, "obtained": f"{f.kind or t.method.kind}: {f.how}",
             "verdict": f.verdict or VERDICTS[f.met], "met": f.met} for f in found]


def claims(scale: str) -> pl.DataFrame:
    """Every target of every claim at `scale`, in registry order: one row per result of its check
    (paper figure, threshold, ours, how obtained, verdict), or one "not measured yet" row."""
    measured = {t.table for t in registry.TARGETS.values() if t.method.kind != "not measured yet"}
    unread = measured - set(READERS)
    if unread:
        raise ValueError(f"report: no reader for the claim tables {sorted(unread)}; readers: {sorted(READERS)}")
    found: dict[str, list[Found]] = {key: [] for key in registry.TARGETS}
    for name in sorted(measured):
        for f in READERS[name](scale):
            found[registry.target(f.target).key].append(f)
    rows = [row for t in registry.TARGETS.values() for row in _claim_rows(scale, t, found[t.key])]
    return pl.DataFrame(rows, schema=COLUMNS)


def scales() -> list[str]:
    """Every scale with rows in any result table: params.yaml's scales in their order, then others."""
    found = {p.parent.name.removeprefix("scale=") for name in _table_names() for p in results.parts(name)}
    order = [s for s in scale_names() if s in found]
    return order + sorted(found - set(order))


def _table_names() -> list[str]:
    base = results.tables_dir()
    return sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")) if base.is_dir() else []


def claims_all() -> pl.DataFrame:
    """`claims` of every scale in the tables, grouped by target (each target's scales side by side)."""
    frames = [claims(s) for s in scales()]
    if not frames:
        return pl.DataFrame(schema=COLUMNS)
    order = {key: i for i, key in enumerate(registry.TARGETS)}
    table = pl.concat(frames).with_row_index("_i")
    return (table.with_columns(pl.col("target").replace_strict(order, return_dtype=pl.Int64).alias("_t"))
            .sort("_t", "_i").drop("_t", "_i"))


SHOWN = {"claim": "claim", "check": "check", "paper": "paper", "ours": "ours", "obtained": "how obtained",
         "verdict": "verdict"}


def claims_markdown(table: pl.DataFrame, with_scale: bool) -> str:
    cols = (["scale"] if with_scale else []) + list(SHOWN)
    return to_markdown(table.select(cols).rename({k: v for k, v in SHOWN.items() if k != v}))


def render_all() -> str:
    """The claims of every scale in the tables as one markdown table (writes nothing)."""
    return f"## Claims, every scale in the tables ({', '.join(scales()) or 'none'})\n\n" + \
        claims_markdown(claims_all(), with_scale=True)


def summary_path(scale: str) -> Path:
    return paths.results_dir() / "summary" / f"{results.check_scale(scale)}.md"


def run(scale: str) -> dict:
    """Claims, model-quality summary and quality figure of `scale`, written under that scale only."""
    md = summary_path(scale)
    summary = train_summary(scale)
    checks = claims(scale)
    figures = plots.save_chart(quality_chart(summary), "train_quality", scale) if summary.height else []
    text = (f"# Summary ({scale})\n\n## Claims: the paper's figures and ours (newest run of each stage)\n\n"
            f"{claims_markdown(checks, with_scale=False)}\n\n{MFU_NOTE}\n\n"
            f"## Model quality (test, full ranking, mean over seeds)\n\n{to_markdown(summary)}\n")
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
