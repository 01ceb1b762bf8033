"""The pipeline model against the 2-rank measurement (the scaling stage's part `sim-validation`).

Each schedule's measured steps are predicted by grlib.sim.pipeline from inputs measured apart from
them: the step compute fitted to the solo steps (grlib.sim.scaleout.fit_step_compute on one HSTU
layer calibrated here), gloo's alpha-beta fitted to all-to-alls timed here, and each step's exact
work (the Planner run again on the same global batches: lengths per rank, item rows asked of the
other rank, planning seconds). The ranks meet at every collective, so a rank's jitter costs the
other its wait: each rank's compute of each step is drawn times (1 + e), e resampled from the solo
steps' deviations from their own median over rounds (the same work), JITTER_DRAWS seeded draws
averaged (predicted_step_ms_no_jitter: without). Two comparisons, each with its own inputs:

    dedicated    (the verdict) compute fitted to the solo steps' dedicated compute (at most their main
                 thread's on-CPU seconds), the back-to-back link fit; vs the measured steps' dedicated
                 walls (less the time the ranks waited for a core; grlib.experiments.scaling.frames):
                 the machine the model describes, cores of its own, as the devices it goes on to model
    as measured  compute fitted to the raw solo compute, the staggered link fit (a collective whose
                 peer is asleep inside it: the transfer plus a wake-up, on the loaded machine); vs the
                 raw walls, other jobs' share of the cores included

The overlap schedule is modelled as prefetch with its bucketed all-reduce on a stream of its own
(Setup.overlap_allreduce, the measured layout's bucket count): gloo runs an async all-reduce on its
own threads while the main thread goes on with backward. The pipelined schedule is semisync(k)
(prefetch at k = 0) with the same buckets and the item table's trips on that stream
(Setup.sparse_stream): grlib runs them on a thread of its own (grlib.distributed.stream).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl

from grlib.config import Config, ScalingAblation
from grlib.distributed.cost import QuadraticCost
from grlib.experiments.scaling import frames, measured
from grlib.sim.alltoall import Cluster, fit_link
from grlib.sim.pipeline import PHASES, Machine, Setup, StepLoad, simulate
from grlib.sim.scaleout import StepCompute, fit_step_compute

FP32 = 4
JITTER_DRAWS = 16
KINDS = {"dedicated": ("dedicated_compute_s", "a2a", ""), "as measured": ("compute_s", "a2a_staggered", "_raw")}


def links(two: list[dict]) -> dict[str, tuple[Machine, dict]]:
    """The 2-rank machine of each comparison, with its fit's parameters and errors."""
    sizes = [r["bytes_per_peer"] for r in two[0]["a2a"]]
    times = {"a2a": [r["seconds"] for r in two[0]["a2a"]], "a2a_staggered": two[0]["a2a_staggered"]}
    out = {}
    for kind, (_, key, suffix) in KINDS.items():
        link = fit_link(sizes, times[key])
        pred = [link.alpha_s + s * link.beta_s_per_byte for s in sizes]
        ring = [2 * link.alpha_s + s * link.beta_s_per_byte for s in sizes]  # a 2-rank ring all-reduce of s bytes
        out[kind] = (Machine(Cluster("gloo-2", 2, link, link, f"gloo all_to_all_single ({key}), fitted here"),
                             streams=False),
                     {f"alpha_us{suffix}": 1e6 * link.alpha_s, f"beta_ns_per_kb{suffix}": 1e12 * link.beta_s_per_byte,
                      f"a2a_fit_max_error{suffix}": float(max(abs(p / t - 1) for p, t in zip(pred, times[key]))),
                      f"allreduce_ring_median_error{suffix}": float(np.median(
                          [p / t - 1 for p, t in zip(ring, two[0]["allreduce"])]))})
    return out


def fit_compute(lengths: list[np.ndarray], two: list[dict], layer: QuadraticCost, n_layers: int,
                column: str) -> tuple[StepCompute, np.ndarray]:
    """The step compute fitted to both ranks' solo steps (each step's median round by `column`'s
    wall), and the phases' shares of it [4]."""
    xs, ys, phases = [], [], np.zeros(4)
    wall = "dedicated_wall_s" if column.startswith("dedicated") else "wall_s"
    for rank in two:
        df = frames.solo_frame(rank["solo"], rank["rank"])
        tokens = df.filter(pl.col("round") == 0).sort("step")["tokens"].to_list()
        if tokens != [int(s.sum()) for s in lengths]:
            raise RuntimeError(f"solo steps of rank {rank['rank']}: {tokens} tokens trained, "
                               f"{[int(s.sum()) for s in lengths]} in the batches drawn again (the data order differs)")
        typical = frames.typical(df, wall)
        xs += lengths
        ys += typical[column].to_list()
        phases += [float(typical[f"{p}_s"].sum()) for p in PHASES]
    return fit_step_compute(layer, n_layers, xs, ys), phases / phases.sum()


def jitter(two: list[dict], column: str) -> np.ndarray:
    """Relative deviations of each solo step's compute (`column`) from the median over rounds of the
    same rank and step: the spread of the same work's time (every round trains the same batches)."""
    eps = []
    for rank in two:
        df = frames.solo_frame(rank["solo"], rank["rank"])
        df = df.join(df.group_by("step").agg(pl.col(column).median().alias("_median")), on="step")
        eps += (df[column] / df["_median"] - 1).to_list()
    return np.asarray(eps)


def _jittered(loads: list[StepLoad], eps: np.ndarray, rng: np.random.Generator) -> list[StepLoad]:
    """Each rank's compute of each step times (1 + e), e drawn from the measured deviations."""
    return [dataclasses.replace(ld, compute=ld.compute * (1 + rng.choice(eps, ld.ranks))[None, :]) for ld in loads]


def model_setup(schedule: str, k: int, spec: measured.PairSpec, buckets: int) -> Setup:
    """The modelled setup of a measured schedule, priced by its model cost (grlib.schedules: overlap =
    prefetch + the bucketed all-reduce; pipelined(k) = semisync(k) + the buckets + the item trips on
    the stream); a bucketed one with the measured layout's `buckets`."""
    setup = Setup(schedule, k, spec.items)
    return dataclasses.replace(setup, buckets=buckets) if setup.overlap_allreduce else setup


def validation(cfg: Config, ab: ScalingAblation, spec: measured.PairSpec, two: list[dict], spans: list[dict],
               layer: QuadraticCost) -> list[dict]:
    """One row per schedule: measured and predicted step, error, utilisation, every input's parameters."""
    from grlib.data.catalog import load_dataset

    data = load_dataset(cfg, "scale").data
    plans = measured.plan_steps(cfg, data, spec, 2, ab.warm_steps + ab.pair_steps + 1)
    for rank in two:
        for run in rank["runs"]:
            if [r["tokens"] for r in run["timeline"]] != [int(p["tokens"][rank["rank"]]) for p in plans]:
                raise RuntimeError(f"{run['schedule']} on rank {rank['rank']}: the tokens trained per step differ "
                                   f"from the steps planned again")
    lengths = measured.solo_lengths(cfg, data, spec, 2, ab.warm_steps + ab.solo_steps)[ab.warm_steps:]
    grads = FP32 * (measured.dense_parameters(cfg, data.n_items, ab.pair_max_len) + 1)  # + the flags and the loss
    fixed = {"layer_c0": layer.c0, "layer_a": layer.a, "layer_b": layer.b, "grad_bytes": grads,
             "row_bytes": cfg.model.d_model * FP32, "stale_bytes": FP32 * data.n_items,
             "rows_input_per_peer": float(np.mean([p["rows_input"].mean() for p in plans])),
             "rows_loss_per_peer": float(np.mean([p["rows_loss"].mean() for p in plans])),
             "plan_ms": 1e3 * float(np.median([p["plan_s"] for p in plans]))}
    models, spreads = {}, {}
    for kind, (column, _, suffix) in KINDS.items():
        spreads[kind] = jitter(two, column)
        fixed[f"jitter_median_abs{suffix}"] = float(np.median(np.abs(spreads[kind])))
        compute, shares = fit_compute(lengths, two, layer, cfg.model.n_layers, column)
        models[kind] = [StepLoad(np.outer(shares, [compute(s) for s in p["lengths"]]), p["rows_input"],
                                 p["rows_loss"], cfg.model.d_model * FP32, grads, p["plan_s"], p["tokens"],
                                 FP32 * data.n_items) for p in plans]
        fixed.update({f"{k}{suffix}": v for k, v in compute.params().items()})
        fixed[f"compute_fit_median_abs_residual{suffix}"] = float(np.median(np.abs(compute.residuals)))
        fixed.update({f"share_{p}{suffix}": float(f) for p, f in zip(PHASES, shares)})
    solo_cpu = 1e3 * float(pl.concat([frames.solo_frame(r["solo"], r["rank"]) for r in two])["cpu_s"].median())
    machines = links(two)
    for _, params in machines.values():
        fixed.update(params)
    buckets = measured.dense_buckets(cfg, data.n_items, ab.pair_max_len, spec.bucket_bytes)
    fixed["overlap_buckets"] = buckets
    rows = []
    df_all = pl.DataFrame(spans)
    for schedule in dict.fromkeys(df_all["schedule"].to_list()):
        df = df_all.filter(pl.col("schedule") == schedule)
        k = int(df["staleness"][0])
        got = frames.throughput(df)
        row = {"part": "sim-validation", "obtained": "modelled", "schedule": schedule, "staleness": k, "ranks": 2,
               "steps": got["steps"], "rounds": got["rounds"], "rq_wait_ms": got["rq_wait_ms"],
               "cpu_ms": got["cpu_ms"], "solo_cpu_ms": solo_cpu}
        for kind, (_, _, suffix) in KINDS.items():
            setup, machine = model_setup(schedule, k, spec, buckets), machines[kind][0]
            machine = dataclasses.replace(machine, streams=setup.overlap_allreduce or setup.sparse_stream)
            out = simulate(setup, machine, models[kind], warm=ab.warm_steps)
            plain = 1e3 * float(np.median(out.step_s[:ab.pair_steps]))
            draws = [simulate(setup, machine, _jittered(models[kind], spreads[kind], np.random.default_rng([d, k])),
                              warm=ab.warm_steps) for d in range(JITTER_DRAWS)]
            pred = 1e3 * float(np.mean([np.median(o.step_s[:ab.pair_steps]) for o in draws]))
            meas = got["step_ms_dedicated" if kind == "dedicated" else "step_ms"]
            typical = frames.typical(df, "dedicated_wall_s" if kind == "dedicated" else "wall_s")
            compute = "dedicated_compute_s" if kind == "dedicated" else "compute_s"
            wall = "dedicated_wall_s" if kind == "dedicated" else "wall_s"
            row.update({f"measured_step_ms{suffix}": meas, f"predicted_step_ms{suffix}": pred,
                        f"predicted_step_ms_no_jitter{suffix}": plain,
                        f"error{suffix}": pred / meas - 1, f"abs_error{suffix}": abs(pred / meas - 1),
                        f"measured_utilisation{suffix}": float(typical[compute].sum() / typical[wall].sum()),
                        f"predicted_utilisation{suffix}": float(out.utilisation.mean()),
                        f"predicted_exposed_comm_ms{suffix}": 1e3 * out.exposed_comm_s,
                        f"predicted_compute_ms{suffix}": 1e3 * float(out.busy_s.mean())})
        rows.append({**row, **fixed})
    return rows
