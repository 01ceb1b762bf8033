"""The paper-preset side of the scaling stage (grlib.experiments.scaling.stage): one layer's MFU
measured here, and the pipeline model at 8 .. 1536 ranks.

    mfu_paper   measured: one HSTU layer of the paper preset (d_model, heads) forward + backward on
                mfu_threads threads over a few sequences of KuaiRand-27K-like lengths (mfu_regime at the
                preset's max_len), the compiled kernel ("cpu") and the padded reference; MFU = useful
                FLOPs / time / the fp32 GEMM peak measured around it (grlib.perf); `efficiency` (the
                kernel's MFU) and `efficiency_padded` (padded FLOPs / time / peak) scale compute to the
                device below. Beside them: the preset's FLOPs per rank step on both length regimes.
    simulated   modelled: grlib.sim.pipeline on grlib.sim.scaleout loads, every config x regime x ranks;
                weak-scaling linearity = tokens/s per rank at P over the same config at 1 rank.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time

import numpy as np
import torch

from grlib import perf, schedules
from grlib.config import ModelConfig, load_config
from grlib.distributed.balance import assign
from grlib.distributed.cost import FlopsCost, layer_batch
from grlib.experiments.measure import kuairand_lengths
from grlib.model.hstu import HSTULayer
from grlib.schedules import ModelCost
from grlib.sim.alltoall import PRESETS
from grlib.sim.pipeline import Machine, Setup, simulate
from grlib.sim.scaleout import DEVICES, Workload, cluster_loads, padded_flops

KUAIRAND_USERS = 27_285
DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb
# config -> (fused kernel, balancer, items, node de-duplication, what the schedule overlaps, staleness);
# the dist.schedule grlib runs is the registered one of that model cost (grlib.schedules): turbogr =
# pipelined(1) (TurboGR's semi-synchronous pipeline: item rows ahead and every trip beside compute),
# turbogr-semisync = semisync(1), turbogr-overlap = overlap (prefetch with the bucketed all-reduce);
# baseline = sync. A row names the model's main-lane program (Setup.program), the bucketed all-reduce
# and the item trips on the stream.
CONFIGS = {
    "turbogr": (True, "kk", "hierarchical", True, ModelCost(True, True, overlap_allreduce=True, sparse_stream=True), 1),
    "turbogr-semisync": (True, "kk", "hierarchical", True, ModelCost(True, rows_ahead=True), 1),
    "turbogr-overlap": (True, "kk", "hierarchical", True, ModelCost(True, overlap_allreduce=True), 0),
    "baseline": (False, "random", "flat", False, ModelCost(False), 0),
}


def paper_model() -> ModelConfig:
    return load_config("paper").model


def _time(layer: HSTULayer, lengths: np.ndarray, repeats: int) -> tuple[float, float]:
    """(on-CPU, wall) median seconds of forward + backward; on-CPU = min(wall, CPU time / threads)."""
    batch, d, threads = layer_batch(lengths), layer.out.in_features, torch.get_num_threads()
    on_cpu, walls = [], []
    for k in range(repeats + 1):
        x = torch.randn(batch.num_tokens, d, requires_grad=True)  # [T, d]
        wall, cpu = time.perf_counter(), time.process_time()
        layer(x, batch).backward(torch.ones_like(x))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if k:  # the first is a warm-up
            on_cpu.append(min(wall, cpu / threads))
            walls.append(wall)
        layer.zero_grad(set_to_none=True)
    return statistics.median(on_cpu), statistics.median(walls)


def mfu_paper(ab, seed: int = 0) -> list[dict]:
    """Measured MFU of one paper-preset layer, fused vs padded, and the preset's FLOPs per step."""
    paper = load_config("paper")
    m, max_len = paper.model, min(ab.mfu_max_len, paper.data.max_len)
    one = dataclasses.replace(m, n_layers=1)
    lengths = kuairand_lengths(ab.mfu_sequences, max_len, ab.mfu_regime, seed=seed)  # [B]
    threads = torch.get_num_threads()
    torch.set_num_threads(ab.mfu_threads)
    try:
        torch.manual_seed(seed)
        times = {}
        with perf.measured_peak() as peak:
            for impl in ("cpu", "reference"):
                times[impl] = _time(HSTULayer(m.d_model, m.n_heads, m.dropout, impl).train(), lengths, ab.mfu_repeats)
    finally:
        torch.set_num_threads(threads)
    useful, padded = perf.sequence_flops(lengths, one), padded_flops(lengths, one)
    common = {"part": "mfu-paper", "d_model": m.d_model, "n_heads": m.n_heads, "n_layers": m.n_layers,
              "max_len": max_len, "regime": ab.mfu_regime, "sequences": int(lengths.size),
              "lengths": ",".join(map(str, lengths)), "threads": ab.mfu_threads, "peak_gflops": peak.flops / 1e9,
              "layer_useful_gflop": useful / 1e9, "layer_padded_gflop": padded / 1e9}
    rows = []
    for impl, label in (("cpu", "fused"), ("reference", "padded")):
        on_cpu, wall = times[impl]
        rows.append({**common, "obtained": "measured", "impl": label, "layer_ms": 1e3 * on_cpu,
                     "layer_wall_ms": 1e3 * wall, "mfu": useful / on_cpu / peak.flops,
                     "mfu_wall": useful / wall / peak.flops,
                     "efficiency": (padded if impl == "reference" else useful) / on_cpu / peak.flops})
    users = ab.users_per_rank
    for regime in ab.regimes:  # the preset's whole step per rank (computed)
        pool = kuairand_lengths(KUAIRAND_USERS, paper.data.max_len, regime, seed=seed)
        batches = [pool[i:i + users] for i in range(0, pool.size - users + 1, users)][:64]
        flops = [perf.sequence_flops(b, m) for b in batches]
        pad = [padded_flops(b, m) for b in batches]
        rows.append({"part": "mfu-paper", "obtained": "computed", "impl": "preset-step", "regime": regime,
                     "d_model": m.d_model, "n_heads": m.n_heads, "n_layers": m.n_layers,
                     "max_len": paper.data.max_len, "sequences": users,
                     "step_tflop": float(np.mean(flops)) / 1e12, "padded_step_tflop": float(np.mean(pad)) / 1e12,
                     "useful_over_padded": float(np.sum(flops) / np.sum(pad))})
    return rows


def dedup_factors(tokens_per_rank: float, devices_per_node: int) -> tuple[float, float]:
    """(distinct ids / ids of one rank, inter-node bytes factor of node de-duplication) for iid draws
    of the twin's Zipf law over KuaiRand-27K's videos (grlib.experiments.sparse_stage.zipf_distinct)."""
    from grlib.experiments.sparse_stage import KUAIRAND, zipf_distinct

    rank, node = zipf_distinct(KUAIRAND.items, [tokens_per_rank, devices_per_node * tokens_per_rank])
    return rank, node / rank


def plan_seconds(pool: np.ndarray, ranks: int, users: int, method: str, model: ModelConfig, repeats: int = 3) -> float:
    """Host seconds of one assignment of ranks x users sequences (median of `repeats`)."""
    lengths = pool[np.random.default_rng(0).integers(0, pool.size, ranks * users)]
    costs, times = FlopsCost(model)(lengths), []
    for seed in range(repeats):
        start = time.perf_counter()
        assign(costs, ranks, method, equal_counts=True, seed=seed)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def simulate_cluster(ab, efficiency: float, efficiency_padded: float, seed: int = 0) -> list[dict]:
    """Every config x regime x ranks on the ab.preset cluster and ab.device compute."""
    m, paper = paper_model(), load_config("paper")
    cluster, device = PRESETS[ab.preset], DEVICES[ab.device]
    machine = Machine(cluster, streams=True)
    dense = sum(p.numel() for n, p in _dense_params(m))
    rows = []
    for regime in ab.regimes:
        pool = kuairand_lengths(KUAIRAND_USERS, paper.data.max_len, regime, seed=seed)
        rank_dedup, node_dedup = dedup_factors(ab.users_per_rank * float(pool.mean()), cluster.devices_per_node)
        for name, (fused, balance, items, node, cost, k) in CONFIGS.items():
            schedule = schedules.modelled_as(cost)
            wl = Workload(m, ab.users_per_rank, paper.data.max_len, paper.negatives.n_negatives, ab.value_bytes,
                          dense, rank_dedup)
            eff = efficiency if fused else efficiency_padded
            setup = Setup(schedule, k, items, node_dedup if node else 1.0)
            if setup.overlap_allreduce:
                setup = dataclasses.replace(setup, buckets=max(1, math.ceil(dense * ab.value_bytes / DDP_BUCKET_BYTES)))
            buckets = setup.buckets
            one = _run(setup, machine, pool, 1, wl, device, eff, balance, not fused, ab, m, seed, max(ab.sim_steps, 32))
            for P in ab.ranks:
                out = _run(setup, machine, pool, P, wl, device, eff, balance, not fused, ab, m, seed, ab.sim_steps)
                rows.append({"part": "simulated", "obtained": "modelled", "config": name, "regime": regime,
                             "ranks": P, **out, "linearity": out["tokens_per_s_per_rank"] / one["tokens_per_s_per_rank"],
                             "single_rank_step_ms": one["step_ms"], "fused": fused, "balance": balance,
                             "items": items, "schedule": setup.program, "staleness": k,
                             "bucketed_allreduce": setup.overlap_allreduce, "sparse_stream": setup.sparse_stream,
                             "buckets": buckets, "node_dedup": setup.node_dedup, "rank_dedup": rank_dedup,
                             "efficiency": eff, "device": device.name, "peak_tflops": device.peak_flops / 1e12,
                             "memory_tb_s": device.memory_bytes_per_s / 1e12, "preset": cluster.name,
                             "devices_per_node": cluster.devices_per_node,
                             "intra_alpha_us": 1e6 * cluster.intra.alpha_s,
                             "intra_gb_s": 1e-9 / cluster.intra.beta_s_per_byte,
                             "inter_alpha_us": 1e6 * cluster.inter.alpha_s,
                             "inter_gb_s": 1e-9 / cluster.inter.beta_s_per_byte, "users_per_rank": ab.users_per_rank,
                             "max_len": paper.data.max_len, "d_model": m.d_model, "n_layers": m.n_layers,
                             "negatives": wl.negatives, "value_bytes": ab.value_bytes, "dense_params": dense,
                             "source": f"{device.source}; {cluster.source}"})
    return rows


def _run(setup, machine, pool, P, wl, device, eff, balance, padded, ab, m, seed, steps) -> dict:
    plan = plan_seconds(pool, P, wl.users_per_rank, balance, m)
    loads = cluster_loads(pool, P, wl, device, eff, method=balance, padded=padded, steps=steps + 1, seed=seed,
                          plan_s=plan)
    out = simulate(setup, machine, loads, warm=1)
    tokens = float(np.mean([ld.tokens.mean() for ld in loads[1:]]))
    compute = np.array([ld.compute.sum(0) for ld in loads[1:]])  # [steps, P]
    step = float(out.step_s.mean())
    return {"steps": steps, "step_ms": 1e3 * step, "compute_ms": 1e3 * float(out.busy_s.mean()),
            "exposed_comm_ms": 1e3 * out.exposed_comm_s, "plan_ms": 1e3 * plan,
            "utilisation": float(out.utilisation.mean()), "utilisation_min": float(out.utilisation.min()),
            "imbalance": float(np.mean((compute.max(1) - compute.min(1)) / compute.max(1))),
            "tokens_per_rank": tokens, "tokens_per_s_per_rank": tokens / step}


def _dense_params(m: ModelConfig):
    """The HSTU layers' parameters of `m` (the dense part the gradient all-reduce moves)."""
    layer = HSTULayer(m.d_model, m.n_heads, 0.0, "reference")
    return [(n, p) for _ in range(m.n_layers) for n, p in layer.named_parameters()]
