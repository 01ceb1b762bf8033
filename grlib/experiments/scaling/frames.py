"""Rows and estimators of the steps the scaling stage measured (grlib.experiments.scaling.measured).

    spans        per rank and step of one 2-rank run: data, forward, loss, backward, comm (all-reduce +
                 the item all-to-alls inside forward / loss / backward), optimizer, idle (wall between
                 step starts not covered), compute (forward + loss + backward + optimizer - item
                 all-to-alls), utilisation = compute / wall
    solo_frame   the same for one process's solo steps (no communication)
    typical      per step, its median round (every round trains the same global batches)
    throughput   tokens/s per rank and step time of the typical steps and of all steps

The cores are shared with other jobs. Beside every figure, its dedicated-core counterpart takes out
the time the ranks' main threads waited for a core (rq_wait_s, Linux schedstat): a step's dedicated
wall is its wall less the larger of the ranks' waits (a wait on either rank stalls both at the next
collective; less than their sum, so the estimate stays at or above the dedicated time); a rank's
dedicated compute is its compute, at most its main thread's on-CPU seconds (cpu_s: one intra-op
thread per process, the compute runs on the main thread).
"""
from __future__ import annotations

import numpy as np
import polars as pl

PHASES = ("data", "forward", "loss", "backward", "comm", "optimizer")


def spans(timelines: list[list[dict]], warm: int) -> list[dict]:
    """One row per rank and kept step of one run (timelines: per rank, in rank order); t_s from the
    earliest rank's first kept step; the run's last step only ends the wall of the one before it."""
    rows = []
    t0 = min(timeline[warm]["t_start"] for timeline in timelines)  # perf_counter: one clock on one machine
    for rank, timeline in enumerate(timelines):
        for i in range(warm, len(timeline) - 1):
            r = timeline[i]
            wall = timeline[i + 1]["t_start"] - r["t_start"]
            waited = max(t[i]["rq_wait_s"] for t in timelines)  # row i's wait: from record i-1 (~ t_start i) to record i
            busy = sum(r[f"{p}_s"] for p in PHASES)
            lookup = r.get("lookup_comm_s", 0.0)
            compute = r["forward_s"] + r["loss_s"] + r["backward_s"] + r["optimizer_s"] - lookup
            rows.append({"rank": rank, "step": i - warm, "t_s": r["t_start"] - t0, "wall_s": wall,
                         **{f"{p}_s": r[f"{p}_s"] for p in PHASES}, "allreduce_s": r["allreduce_s"],
                         "lookup_comm_s": lookup, "comm_total_s": r["comm_s"] + lookup,
                         "idle_s": wall - busy, "compute_s": compute, "utilisation": compute / wall,
                         "tokens": r["tokens"], "plan_s": r["plan_s"], "stale_fraction": r.get("stale_fraction", 0.0),
                         "rq_wait_s": r["rq_wait_s"], "cpu_s": r["cpu_s"], "dedicated_wall_s": wall - waited,
                         "dedicated_compute_s": min(compute, r["cpu_s"]),
                         "utilisation_dedicated": min(compute, r["cpu_s"]) / (wall - waited)})
    return rows


def typical(df: pl.DataFrame, wall: str = "wall_s") -> pl.DataFrame:
    """Per step, the rows of its median round by wall (mean over ranks; the lower median of an even
    count). Every round trains the same global batches; the cores are shared with other jobs, whose
    bursts stretch some runs: the median run of a batch is robust to them, and treats one process and
    two coupled ranks alike (the fastest run would not: two ranks are fast only while both are
    scheduled at once, an independent process whenever it is). df: rows with round, step, rank, `wall`."""
    walls = df.group_by("round", "step").agg(pl.col(wall).mean().alias("_wall")).sort("step", "_wall", "round")
    mid = walls.group_by("step", maintain_order=True).agg(pl.col("round").get((pl.len() - 1) // 2))
    return df.join(mid, on=["step", "round"]).sort("step", "rank")


def solo_frame(rounds: list[list[dict]], rank: int = 0) -> pl.DataFrame:
    """Solo steps of one rank per round as rows: round, step, rank, wall_s (the sum of phases: the
    step's wall on one process), compute_s (forward + loss + backward + optimizer), the phases, tokens,
    rq_wait_s and the dedicated wall and compute (less the wait)."""
    rows = []
    for rnd, timeline in enumerate(rounds):
        for i, r in enumerate(timeline):
            wall, compute = sum(r[f"{p}_s"] for p in PHASES), sum(r[f"{p}_s"] for p in PHASES[1:])
            rows.append({"round": rnd, "step": i, "rank": rank, "wall_s": wall, "compute_s": compute,
                         "tokens": r["tokens"], **{f"{p}_s": r[f"{p}_s"] for p in PHASES},
                         "rq_wait_s": r["rq_wait_s"], "cpu_s": r["cpu_s"],
                         "dedicated_wall_s": max(wall - r["rq_wait_s"], 0.0),
                         "dedicated_compute_s": min(compute, r["cpu_s"])})
    return pl.DataFrame(rows)


def throughput(df: pl.DataFrame) -> dict:
    """Tokens per second per rank (every rank's tokens over its own wall) and the median step, of the
    typical steps and of all; _dedicated: the same on the dedicated walls."""
    def per_rank(d: pl.DataFrame, wall: str) -> float:
        return float(np.mean([g["tokens"].sum() / g[wall].sum() for _, g in d.group_by("rank")]))

    def step_ms(d: pl.DataFrame, wall: str) -> float:
        return 1e3 * float(d.group_by("round", "step").agg(pl.col(wall).mean())[wall].median())
    q, qd = typical(df), typical(df, "dedicated_wall_s")
    return {"steps": int(q["step"].n_unique()), "rounds": int(df["round"].n_unique()),
            "tokens_per_s": per_rank(q, "wall_s"), "tokens_per_s_all": per_rank(df, "wall_s"),
            "tokens_per_s_dedicated": per_rank(qd, "dedicated_wall_s"), "step_ms": step_ms(q, "wall_s"),
            "step_ms_all": step_ms(df, "wall_s"), "step_ms_dedicated": step_ms(qd, "dedicated_wall_s"),
            "rq_wait_ms": 1e3 * float(df["rq_wait_s"].mean()), "cpu_ms": 1e3 * float(df["cpu_s"].median())}
