"""Stage `balance` (notebooks/03_load_balancing, `bench balance`): claim C2, dynamic load balancing
of jagged batches across data-parallel ranks (paper: imbalance 47% -> 2.4%).

Imbalance of one global batch = (max - min) / max of the per-rank cost (NVIDIA recsys-examples'
definition); max / mean is the step time over the ideal (1 - mean / max is throughput lost to waiting).
Four parts, each a `part` of table `balance`, in one run:

    calibrate    measured: one HSTU layer of the scale's model, forward + backward on one thread, at
                 lengths 16 .. calibration_max; fitted c0 + a*s + b*s^2 (R^2, relative residuals)
    simulated    modelled: every ranks x users x max_len cell on KuaiRand-27K lengths (its lognormal fit
                 at length factor 1.0); the balancers assign on the fitted costs; imbalance of the model
                 costs and of model * (1 + r), r resampled from the calibration's measured residuals
    time-sliced  measured: sliced_ranks emulated ranks' shares of each global batch timed one after
                 another on one thread; imbalance of the measured times, random vs each balancer
    2-process    measured: two gloo ranks train the scale's model on ragged batches, balance none vs
                 pair_method; per-rank seconds inside the gradient all-reduce, step time

C2's verdicts (grlib.experiments.claims, via `acceptance`): the simulated 64 x 32, max_len 16384
cell before (paper 47%) and after (paper 2.4%), and the time-sliced after / before <= 1/3.
"""
from __future__ import annotations

import dataclasses
import statistics

import altair as alt
import numpy as np
import polars as pl
import torch

from grlib import plots, results
from grlib.config import BalanceAblation, Config, choices
from grlib.data.synthetic import user_lengths
from grlib.distributed.balance import assign, imbalance, max_over_mean
from grlib.distributed.cost import QuadraticCost, calibrate_layer, fit_quadratic, time_pass
from grlib.experiments import claims as registry
from grlib.experiments.measure import kuairand_lengths
from grlib.model.hstu import HSTULayer
from grlib.sim.balance import grid

TABLE = "balance"
PARTS = choices.BALANCE_PARTS
CELL = {"ranks": 64, "users_per_rank": 32, "max_len": 16384}  # the acceptance cell (paper's figure)
PAPER_BEFORE, PAPER_AFTER = registry.target("C2.before").paper, registry.target("C2.after").paper


def quick(ab: BalanceAblation) -> BalanceAblation:
    """A grid for the smoke scale and the notebook's default: seconds, every part still run."""
    return dataclasses.replace(ab, ranks=[8, 64], users_per_rank=[4, 32], max_lens=[16384], sim_steps=5,
                               calibration_points=6, calibration_max=512, calibration_repeats=3, sliced_ranks=4,
                               sliced_users=4, sliced_max_len=256, sliced_steps=2, sliced_repeats=1, pair_steps=4,
                               pair_batch_size=16, pair_max_len=128)


def calibration_lengths(ab: BalanceAblation) -> list[int]:
    return sorted({int(round(x)) for x in np.geomspace(16, ab.calibration_max, ab.calibration_points)})


def calibrate(cfg: Config, ab: BalanceAblation) -> tuple[list[dict], QuadraticCost]:
    """Measured seconds per sequence of one HSTU layer per length, and the fitted quadratic."""
    points = calibrate_layer(cfg.model, calibration_lengths(ab), repeats=ab.calibration_repeats)
    fit = fit_quadratic([p["length"] for p in points], [p["seconds_per_sequence"] for p in points])
    rows = [{"part": "calibrate", "obtained": "measured", "length": p["length"],
             "seconds_per_sequence": p["seconds_per_sequence"], "residual": r, **_fit_fields(fit)}
            for p, r in zip(points, fit.residuals)]
    return rows, fit


def _fit_fields(fit: QuadraticCost) -> dict:
    return {"c0": fit.c0, "a": fit.a, "b": fit.b, "r2": fit.r2}


def simulate(ab: BalanceAblation, cost: QuadraticCost, seed: int = 0) -> list[dict]:
    """Every cell of the grid on the twin's KuaiRand-27K lengths; model and noisy figures per method."""
    pool = user_lengths(ab.pool_users, 1.0, np.random.default_rng(seed))  # [pool_users] events per user
    rows = grid(pool, cost, ranks=tuple(ab.ranks), users=tuple(ab.users_per_rank), max_lens=tuple(ab.max_lens),
                steps=ab.sim_steps, methods=tuple(ab.methods), equal_counts=ab.equal_counts,
                noise=np.asarray(cost.residuals), seed=seed)
    return [{"part": "simulated", "obtained": "modelled", **r, **_fit_fields(cost)} for r in rows]


def time_sliced(cfg: Config, ab: BalanceAblation, cost: QuadraticCost, seed: int = 0) -> list[dict]:
    """Measured: each emulated rank's share of a global batch timed alone (one thread, on-CPU time);
    every method on the same global batches, interleaved per batch so drift hits all alike."""
    P, U = ab.sliced_ranks, ab.sliced_users
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        layer = HSTULayer(cfg.model.d_model, cfg.model.n_heads, cfg.model.dropout, cfg.model.attention_impl).train()
        times: dict[str, list[np.ndarray]] = {m: [] for m in ab.methods}
        modelled: dict[str, list[float]] = {m: [] for m in ab.methods}
        time_pass(layer, [ab.sliced_max_len // 2] * U)  # warm-up
        for step in range(ab.sliced_steps):
            lengths = kuairand_lengths(P * U, ab.sliced_max_len, "scaled", seed=seed + step)  # [P*U]
            costs = cost(lengths)
            for m in ab.methods:
                owner = assign(costs, P, m, equal_counts=ab.equal_counts, seed=seed + step)
                share = [time_pass(layer, lengths[owner.rows(r)], ab.sliced_repeats)[0] for r in range(P)]
                times[m].append(np.array(share))
                modelled[m].append(imbalance(owner.loads(costs)))
    finally:
        torch.set_num_threads(threads)
    rows = []
    for m in ab.methods:
        measured = [imbalance(t) for t in times[m]]
        rows.append({"part": "time-sliced", "obtained": "measured", "method": m, "ranks": P, "users_per_rank": U,
                     "max_len": ab.sliced_max_len, "steps": ab.sliced_steps,
                     "imbalance_measured": statistics.median(measured),
                     "max_over_mean_measured": statistics.median([max_over_mean(t) for t in times[m]]),
                     "imbalance_model": statistics.median(modelled[m]),
                     "rank_ms_mean": 1e3 * float(np.mean([t.mean() for t in times[m]])), **_fit_fields(cost)})
    return rows


def pair_rank(runtime, cfg: Config, steps: int, batch_size: int, max_len: int) -> dict:
    """One of the two measured ranks (cfg.dist their settings): `steps` training steps on the scale's
    data at `max_len`; this rank's per-step seconds (the first two, warm-up, dropped)."""
    from grlib.data.catalog import load_dataset
    from grlib.model import build_model
    from grlib.fit import train
    from grlib.train import PHASES

    if runtime.topology.rank != 0:
        runtime.barrier()
    ds = load_dataset(cfg, "scale")
    if runtime.topology.rank == 0:
        runtime.barrier()
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, ds.data.n_items, max_len)
    run_cfg = cfg.replace({"train.max_steps": steps + 2, "train.epochs": 10**6, "train.batch_size": batch_size,
                           "train.select_best": False})
    fit = train(model, ds.data, run_cfg, max_len, runtime=runtime)
    kept = fit.timeline[2:]
    return {"rank": runtime.topology.rank, "allreduce_s": [r["allreduce_s"] for r in kept],
            "step_s": [sum(r[f"{p}_s"] for p in PHASES) for r in kept],
            "imbalance_model": [r["imbalance_model"] for r in kept], "losses": fit.losses[2:]}


def two_process(cfg: Config, ab: BalanceAblation, cost: QuadraticCost) -> list[dict]:
    """Measured: 2 gloo ranks, balance none then pair_method (the fitted costs), same batches."""
    from grlib.data.catalog import load_dataset
    from grlib.distributed.launch import launch

    load_dataset(cfg, "scale")  # prepared once, before the ranks read it
    rows = []
    for method in ("none", ab.pair_method):
        pair_cfg = cfg.replace({"dist.world": 2, "dist.balance": method, "dist.equal_counts": ab.equal_counts,
                                "dist.cost": "quadratic", "dist.quadratic": [cost.c0, cost.a, cost.b]})
        ranks = launch(pair_rank, 2, args=(pair_cfg, ab.pair_steps, ab.pair_batch_size, ab.pair_max_len),
                       timeout_s=1800)
        step = np.array([r["step_s"] for r in ranks])  # [2, steps]
        wait = np.array([r["allreduce_s"] for r in ranks])  # [2, steps]
        compute = step - wait  # [2, steps]: each rank's own work
        rows.append({"part": "2-process", "obtained": "measured", "method": method, "ranks": 2,
                     "max_len": ab.pair_max_len, "users_per_rank": ab.pair_batch_size // 2, "steps": step.shape[1],
                     "step_ms": 1e3 * float(np.median(step.max(0))),
                     "allreduce_fraction": float(wait.sum() / step.sum()),
                     "allreduce_fraction_rank0": float(wait[0].sum() / step[0].sum()),
                     "allreduce_fraction_rank1": float(wait[1].sum() / step[1].sum()),
                     "imbalance_measured": float(np.median([imbalance(c) for c in compute.T])),
                     "imbalance_model": float(np.median(ranks[0]["imbalance_model"])),
                     "final_loss": ranks[0]["losses"][-1], **_fit_fields(cost)})
    base = rows[0]["step_ms"]
    for r in rows:
        r["step_ratio"] = r["step_ms"] / base
    return rows


def measure(cfg: Config, ab: BalanceAblation, parts: tuple[str, ...] = PARTS) -> tuple[list[dict], QuadraticCost]:
    """The rows of `parts` (calibration always runs: the others use its fit) and the fitted cost."""
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; valid: {PARTS}")
    rows, cost = calibrate(cfg, ab)
    if "simulated" in parts:
        rows += simulate(ab, cost)
    if "time-sliced" in parts:
        rows += time_sliced(cfg, ab, cost)
    if "2-process" in parts:
        rows += two_process(cfg, ab, cost)
    return rows, cost


def run(cfg: Config, ab: BalanceAblation) -> dict:
    """Every part; rows appended to table `balance`; the chart and the metrics JSON written."""
    rows, cost = measure(cfg, ab)
    table = results.append_rows(TABLE, rows, cfg)
    checks = acceptance(table)
    results.write_metrics(TABLE, {"scale": cfg.scale, "fit": _fit_fields(cost),
                                  "acceptance": checks.to_dicts()}, cfg.scale)
    figures = plots.save_chart(chart(table), "balance_imbalance", cfg.scale)
    return {"table": table, "cost": cost, "acceptance": checks, "figures": figures}


def _cell(table: pl.DataFrame, method: str, **cell) -> dict | None:
    sub = table.filter((pl.col("part") == "simulated") & (pl.col("method") == method))
    for k, v in cell.items():
        sub = sub.filter(pl.col(k) == v)
    return sub.row(0, named=True) if sub.height else None


def acceptance(table: pl.DataFrame) -> pl.DataFrame:
    """C2's checks on one run's rows: target, check, value (a fraction), met."""
    out = []
    before = _cell(table, "random", **CELL)
    cell = f"{CELL['ranks']} ranks x {CELL['users_per_rank']} users, max_len {CELL['max_len']}"
    if before is not None:
        out.append({"target": "C2.before", "check": f"{cell}: random split (model costs, median of steps)",
                    "value": before["imbalance_model_median"], "met": None})
        afters = [r for m in ("kk", "lpt", "snake") if (r := _cell(table, m, **CELL)) is not None]
        if afters:
            best = min(afters, key=lambda r: r["imbalance_model_median"])
            bound = registry.target("C2.after")
            out.append({"target": bound.key, "check": f"{cell}: {best['method']} on model costs "
                        f"(under measured cost noise: {100 * best['imbalance_noisy_median']:.2f}%)",
                        "value": best["imbalance_model_median"], "met": bound.met(best["imbalance_model_median"])})
    sliced = table.filter(pl.col("part") == "time-sliced")
    if sliced.height:
        base = sliced.filter(pl.col("method") == "random")["imbalance_measured"][0]
        best = sliced.filter(pl.col("method") != "random").sort("imbalance_measured").row(0, named=True)
        ratio = best["imbalance_measured"] / base if base else float("nan")
        t = registry.target("C2.measured")
        out.append({"target": t.key, "check": f"{best['ranks']} emulated ranks: {best['method']} "
                    f"{100 * best['imbalance_measured']:.1f}% vs random {100 * base:.1f}% (measured times)",
                    "value": ratio, "met": t.met(ratio)})
    return pl.DataFrame(out, schema={"target": pl.String, "check": pl.String, "value": pl.Float64,
                                     "met": pl.Boolean})


def chart(table: pl.DataFrame) -> alt.FacetChart:
    """Imbalance vs ranks (simulated, median of steps), before (random) and after each balancer,
    model and noisy costs, per users per rank and max_len; the paper's 47% and 2.4% as gray lines."""
    sim = table.filter(pl.col("part") == "simulated")
    keys = ["ranks", "users_per_rank", "max_len"]
    long = pl.concat([sim.select(*keys, "method", pl.col(f"imbalance_{k}_median").alias("imbalance"),
                                 pl.lit(k).alias("costs")) for k in ("model", "noisy")])
    cells = sim.select(keys).unique()
    paper = pl.concat([cells.with_columns(pl.lit(f"paper {w} ({fig})").alias("method"),
                                          pl.lit(fig.number).alias("imbalance"), pl.lit("paper").alias("costs"))
                       for w, fig in (("before", PAPER_BEFORE), ("after", PAPER_AFTER))])
    data = pl.concat([long, paper.select(long.columns)])
    return (alt.Chart(data).mark_line(point=True).encode(
        x=alt.X("ranks:Q", scale=alt.Scale(type="log"), title="ranks"),
        y=alt.Y("imbalance:Q", axis=alt.Axis(format="%"), title="imbalance (max - min) / max"),
        color=alt.Color("method:N"), strokeDash=alt.StrokeDash("costs:N", title="costs"),
        tooltip=[*keys, "method", "costs", alt.Tooltip("imbalance:Q", format=".2%")])
        .properties(width=220, height=160)
        .facet(column=alt.Column("users_per_rank:O", title="users per rank"), row=alt.Row("max_len:O"))
        .properties(title="C2: load imbalance vs ranks, simulated on KuaiRand-27K lengths (calibrated cost; "
                          "noisy: under the measured cost residuals)"))


VIEWS = {
    "calibrate": ["length", "seconds_per_sequence", "residual", "c0", "a", "b", "r2"],
    "simulated": ["ranks", "users_per_rank", "max_len", "method", "steps", "imbalance_model_median",
                  "imbalance_model_p90", "max_over_mean_model_median", "imbalance_noisy_median"],
    "time-sliced": ["ranks", "users_per_rank", "max_len", "method", "steps", "imbalance_measured",
                    "imbalance_model", "max_over_mean_measured", "rank_ms_mean"],
    "2-process": ["method", "ranks", "max_len", "steps", "step_ms", "step_ratio", "allreduce_fraction",
                  "allreduce_fraction_rank0", "allreduce_fraction_rank1", "imbalance_measured", "imbalance_model"],
}


def view(table: pl.DataFrame, part: str) -> pl.DataFrame:
    """The rows of one part with its own columns (the table holds every part's columns)."""
    if part not in VIEWS:
        raise ValueError(f"part must be one of {tuple(VIEWS)}, got {part!r}")
    return table.filter(pl.col("part") == part).select(VIEWS[part])
