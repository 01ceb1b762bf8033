"""The measured side of the scaling stage (grlib.experiments.scaling.stage): gloo processes training
the scale's model, their per-step spans, and the exact work of each step they trained.

    staggered_a2a   an all-to-all timed as training meets it: the peer already asleep inside it
    pair_rank       one of 2 ranks: gloo's all-to-all (back to back and staggered) and all-reduce timed,
                    then rounds of (rotated):
                    solo steps of rank 0 alone (1 process), solo steps of both at once (2 processes,
                    no communication: the compute the model is fitted to), each schedule; every run
                    restarts the data order (the same batches in every round) and drops `warm` steps
    plan_steps      the global batches those runs trained, planned again as every rank planned them
                    (grlib.distributed.data_parallel.Planner: the same assignment and negatives): per step
                    and rank, the lengths, the rows asked of the other ranks (input and loss lookups,
                    de-duplicated per rank), and the planning seconds

Every step's row also carries rq_wait_s and cpu_s: the seconds its main thread waited for a core
(other jobs' share of the shared cores; Linux schedstat) and ran on one (the thread's CPU clock;
grlib.experiments.scaling.frames).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from grlib import schedules
from grlib.config import Config, DistConfig

SCHEDSTAT = Path("/proc/thread-self/schedstat")


@dataclass(frozen=True)
class PairSpec:
    """What each rank of a launch runs."""

    batch_size: int  # global (each of P ranks trains batch_size / P sequences); solo steps: batch_size / P
    max_len: int
    steps: int  # kept steps per run
    warm: int  # dropped first steps per run
    rounds: int
    schedules: tuple[tuple[str, int], ...]  # (schedule, staleness)
    balance: str
    items: str
    solo_steps: int
    gloo_sizes: tuple[int, ...]
    gloo_repeats: int
    # the overlap and pipelined schedules' buckets: the laptop model's 2.8 MiB of dense gradients in 5 (torch DDP's
    # 25 MiB would make one bucket, all-reduced after backward: nothing to overlap)
    bucket_bytes: int = 2**19


def dist_config(spec: PairSpec, world: int, schedule: str, staleness: int) -> DistConfig:
    extra = {"bucket_bytes": spec.bucket_bytes} if schedules.get(schedule).bucketed else {}
    return DistConfig(world=world, balance=spec.balance, cost="flops", schedule=schedule, staleness=staleness,
                      items=spec.items, dedup="rank", **extra)


def cpu_and_wait() -> tuple[float, float]:
    """(seconds on a core, seconds waiting for one) of this thread since it started. On a core:
    CLOCK_THREAD_CPUTIME_ID (time.thread_time, which counts up to now; schedstat's own run field is
    updated only at scheduler ticks and switches, so a step of a few ms can read 0); waiting: Linux
    schedstat's runnable-but-not-running field (it grows when the thread gets a core back)."""
    try:
        wait = SCHEDSTAT.read_text().split()[1]
        return time.thread_time(), int(wait) / 1e9
    except FileNotFoundError:
        raise RuntimeError(f"the scaling stage reads {SCHEDSTAT} (Linux: the time a thread waited for a core) to "
                           f"tell other jobs' share of the cores from the steps' own time; this system has none") from None


def _train(cfg: Config, data, runtime, steps: int, batch_size: int, max_len: int):
    """The timeline of `steps` training steps (on `runtime`'s ranks: cfg.dist set to them, dist_config);
    each row also holds cpu_s and rq_wait_s, the seconds the main thread ran on a core and waited for
    one between the previous step's record and its own."""
    from grlib.model import build_model
    from grlib.perf import sequence_flops
    from grlib.fit import train

    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, data.n_items, max_len)
    run_cfg = cfg.replace({"train.max_steps": steps, "train.epochs": 10**6, "train.batch_size": batch_size,
                           "train.select_best": False})
    stats = [cpu_and_wait()]

    def flops(batch) -> float:  # called once per step, as its row is recorded
        stats.append(cpu_and_wait())
        return sequence_flops(batch.lengths().numpy(), cfg.model)

    timeline = train(model, data, run_cfg, max_len, runtime=runtime, flops_fn=flops).timeline
    for row, before, after in zip(timeline, stats[:-1], stats[1:], strict=True):
        row["cpu_s"], row["rq_wait_s"] = after[0] - before[0], after[1] - before[1]
    return timeline


def _allreduce_times(runtime, sizes: tuple[int, ...], repeats: int) -> list[float]:
    """Median seconds of one all_reduce of each size (bytes), the max over ranks, after a barrier."""
    spent = torch.zeros(len(sizes), repeats, dtype=torch.float64)
    for k in range(repeats + 1):
        for j, size in enumerate(sizes):
            x = torch.ones(max(1, size // 4))
            runtime.barrier()
            start = time.perf_counter()
            dist.all_reduce(x, group=runtime.world_group)
            if k:
                spent[j, k - 1] = time.perf_counter() - start
    dist.all_reduce(spent, op=dist.ReduceOp.MAX, group=runtime.world_group)
    return [float(np.median(s)) for s in spent.numpy()]


def staggered_a2a(runtime, sizes: tuple[int, ...], repeats: int, delay_s: float = 0.02) -> list[float]:
    """Median seconds of one all_to_all_single per size (bytes per peer) as training meets it: one rank
    (in turn) computes for delay_s first, and the time is the late rank's, from its call to the return:
    the transfer plus waking its peer, asleep inside the collective (gloo blocks the host)."""
    P, rank = runtime.topology.world, runtime.topology.rank
    spent = torch.zeros(len(sizes), repeats, dtype=torch.float64)
    a = torch.randn(128, 128)
    for k in range(repeats + 1):
        for j, size in enumerate(sizes):
            x, out = torch.zeros(P * size, dtype=torch.uint8), torch.empty(P * size, dtype=torch.uint8)
            runtime.barrier()
            late = k % P == rank
            if late:
                until = time.perf_counter() + delay_s
                while time.perf_counter() < until:
                    a @ a
            start = time.perf_counter()
            dist.all_to_all_single(out, x, group=runtime.world_group)
            if k and late:
                spent[j, k - 1] = time.perf_counter() - start
    dist.all_reduce(spent, op=dist.ReduceOp.MAX, group=runtime.world_group)  # each entry: its late rank's
    return [float(np.median(s)) for s in spent.numpy()]


def pair_rank(runtime, cfg: Config, spec: PairSpec) -> dict:
    """One rank of 2: the link timings, then `rounds` rounds of: solo steps on rank 0 alone (rank 1
    waits at a barrier: one process computing), solo steps on both at once (two processes, no
    communication), and every schedule; round r starts at the r-th of these (rotated), so that no
    variant always runs at the same point of a round while the machine's load drifts."""
    from grlib.data.catalog import load_dataset
    from grlib.sim.alltoall import measure_gloo

    topo = runtime.topology
    if topo.world != 2:
        raise ValueError(f"pair_rank runs on 2 ranks, got world={topo.world}")
    if topo.rank != 0:
        runtime.barrier()
    data = load_dataset(cfg, "scale").data
    if topo.rank == 0:
        runtime.barrier()
    out: dict = {"rank": topo.rank, "a2a": measure_gloo(runtime, spec.gloo_sizes, spec.gloo_repeats),
                 "allreduce": _allreduce_times(runtime, spec.gloo_sizes, spec.gloo_repeats),
                 "a2a_staggered": staggered_a2a(runtime, spec.gloo_sizes, spec.gloo_repeats),
                 "alone": [], "solo": [], "runs": []}
    per_rank, solo = spec.batch_size // topo.world, spec.warm + spec.solo_steps
    variants = ["alone", "solo", *spec.schedules]
    for rnd in range(spec.rounds):
        for variant in variants[rnd % len(variants):] + variants[:rnd % len(variants)]:  # each round rotated
            runtime.barrier()
            if variant == "alone":
                if topo.rank == 0:
                    out["alone"].append(_train(cfg, data, None, solo, per_rank, spec.max_len)[spec.warm:])
            elif variant == "solo":
                out["solo"].append(_train(cfg, data, None, solo, per_rank, spec.max_len)[spec.warm:])
            else:
                schedule, k = variant
                run_cfg = dataclasses.replace(cfg, dist=dist_config(spec, topo.world, schedule, k))
                timeline = _train(run_cfg, data, runtime, spec.warm + spec.steps + 1, spec.batch_size, spec.max_len)
                out["runs"].append({"schedule": schedule, "staleness": k, "round": rnd, "timeline": timeline})
    return out


def plan_steps(cfg: Config, data, spec: PairSpec, world: int, n_steps: int) -> list[dict]:
    """The first n_steps global batches of a run, planned as each rank planned them: per step,
    lengths [P] arrays, tokens [P], rows_input / rows_loss [P] (distinct ids owned by another rank,
    per peer) and plan_s (host seconds of one rank's planning, the slowest)."""
    from grlib.distributed.data_parallel import Planner, cost_function
    from grlib.distributed.sharded_embedding import row_blocks
    from grlib.negatives import build_negative_path
    from grlib.negatives.path import ATTACHMENT, LocalIds

    dc = dist_config(spec, world, "sync", 0)
    bounds = np.array([b[0] for b in row_blocks(data.n_items, world)])  # [P] first row of each shard
    planners = [Planner(build_negative_path(cfg.negatives, data.n_items, data.train_item_counts(), seed=cfg.train.seed),
                        r, world, dc.balance, equal_counts=dc.equal_counts, cost=cost_function(dc, cfg.model),
                        seed=cfg.train.seed) for r in range(world)]
    rng = np.random.default_rng(cfg.train.seed)
    steps = []
    for _, batch in zip(range(n_steps), data.train_batches(spec.batch_size, spec.max_len, rng)):
        row = {"lengths": [], "tokens": np.zeros(world), "rows_input": np.zeros(world), "rows_loss": np.zeros(world),
               "plan_s": 0.0}
        for r, planner in enumerate(planners):
            start = time.perf_counter()
            plan = planner(batch.select(np.arange(batch.batch_size)))  # a copy: each planner attaches its sample
            row["plan_s"] = max(row["plan_s"], time.perf_counter() - start)
            local = plan.local
            row["lengths"].append(local.lengths().numpy())
            row["tokens"][r] = local.num_tokens
            for which, ids in (("input", local.item_ids.numpy()),
                               ("loss", LocalIds.of(local.attachments[ATTACHMENT].sample, data.n_items).distinct.numpy())):
                owner = np.searchsorted(bounds, np.unique(ids), side="right") - 1
                row[f"rows_{which}"][r] = np.sum(owner != r) / max(world - 1, 1)
        steps.append(row)
    return steps


def solo_lengths(cfg: Config, data, spec: PairSpec, world: int, n_steps: int) -> list[np.ndarray]:
    """The lengths of each of the first n_steps batches of the solo runs (batch_size / world)."""
    rng = np.random.default_rng(cfg.train.seed)
    batches = data.train_batches(spec.batch_size // world, spec.max_len, rng)
    return [b.lengths().numpy() for _, b in zip(range(n_steps), batches)]


def dense_buckets(cfg: Config, n_items: int, max_len: int, bucket_bytes: int) -> int:
    """Buckets the overlap schedule all-reduces with a sharded item table (grlib.distributed.buckets)."""
    from grlib.distributed.buckets import bucket_layout
    from grlib.model import build_model

    model = build_model(cfg.model, n_items, max_len)
    dense = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("embed.items.")]
    return len(bucket_layout(dense, bucket_bytes))


def dense_parameters(cfg: Config, n_items: int, max_len: int) -> int:
    """Values of the flat buffer GradientSync all-reduces with a sharded item table: every parameter
    but the item rows, plus one flag per parameter (grlib.distributed.data_parallel.GradientSync)."""
    from grlib.model import build_model

    model = build_model(cfg.model, n_items, max_len)
    dense = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("embed.items.")]
    return sum(p.numel() for p in dense) + len(dense)


