"""Alpha-beta model of one all-to-all, flat vs two-stage (hierarchical), at scales this machine cannot run.

P = N nodes x L devices per node; every rank sends m bytes to every other rank. A message over a
link costs alpha + bytes * beta; intra-node links (NVLink, HCCS) and inter-node links (one NIC per
device) have their own Link. Per rank:

    flat       = (L-1)(a_i + m b_i) + (P-L)(a_e + m b_e)
    two-stage  = (L-1)(a_i + N m b_i) + (N-1)(a_e + L m f b_e)     stage 1 intra, then stage 2 inter

f <= 1 is the inter-node bytes factor of per-node de-duplication (grlib.distributed.alltoall dedup="node").
Both stages of the two-stage form add: stage 2 needs stage 1's rows. For flat this module takes the
serial form (a rank's messages are issued one after another, intra and inter alike) rather than
max(intra, inter) with the NIC and the intra links busy in parallel, because (1) a rank's sends are
driven by one progress engine (gloo's and HCCL's host threads, NCCL's proxy for the NIC), so the
per-message alpha is paid in turn; (2) on this machine (gloo over loopback, no separate links) a
4-rank (2 x 2) exchange measured 2-3x above even the serial form fitted on 2 ranks, never below it
(tests/test_alltoall_model.py prints that cross-check). The parallel form would drop
flat's intra term I (L-1 of P-1 messages, over links 8-9x faster than the NIC in the presets) when the
inter term E is larger, lowering the cut by (1 - cut) * I / E; table() reports I as flat_intra_s.

    rows = table(PRESETS["gpu-8"], [16, 64, 512, 1536], bytes_per_peer=2**20, dedup=0.4)
    cut_regime(PRESETS["npu-16"], 1536, 0.759)   # bytes per peer where two-stage cuts >= 75.9%

traffic() gives the messages and bytes one rank sends per link class - what grlib.distributed.alltoall's
LinkCounters count for uniform splits - and every time is messages * alpha + bytes * beta summed
over the classes. fit_link fits alpha and beta to measured (bytes, seconds); measure_gloo times
all_to_all_single on the ranks of a Runtime (a collective: every rank calls it).
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from grlib.distributed.topology import Runtime


@dataclass(frozen=True)
class Link:
    alpha_s: float  # seconds per message
    beta_s_per_byte: float  # seconds per byte (1 / bandwidth)

    def __post_init__(self) -> None:
        for name in ("alpha_s", "beta_s_per_byte"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"Link.{name}={value!r}: expected a finite number >= 0")


@dataclass(frozen=True)
class Cluster:
    name: str
    devices_per_node: int
    intra: Link
    inter: Link
    source: str  # where the figures come from

    def __post_init__(self) -> None:
        if not isinstance(self.devices_per_node, int) or self.devices_per_node < 1:
            raise ValueError(f"Cluster.devices_per_node={self.devices_per_node!r}: expected an integer >= 1")


# alpha: NCCL's own per-step latency constants for its Simple protocol (the one its send/recv uses at
# these sizes), src/graph/tuning.cc hwLat, Ring/Simple: NVLink 3.4 us, NET 14.0 us. HCCL publishes no
# per-message latency: npu-16 takes the same constants for its intra and inter links (a proxy).
_NCCL_ALPHA = "alpha: NCCL src/graph/tuning.cc hwLat Ring/Simple (NVLink 3.4 us, NET 14.0 us)"
PRESETS: dict[str, Cluster] = {
    "gpu-8": Cluster(
        "gpu-8", 8, Link(3.4e-6, 1 / 450e9), Link(14.0e-6, 1 / 50e9),
        "H100 SXM: NVLink 4 900 GB/s per GPU both directions = 450 GB/s per direction (NVIDIA H100 "
        "datasheet); DGX H100: one ConnectX-7 400 Gb/s = 50 GB/s NIC per GPU (NVIDIA DGX H100 user "
        f"guide); {_NCCL_ALPHA}"),
    "npu-16": Cluster(
        "npu-16", 16, Link(3.4e-6, 1 / 196e9), Link(14.0e-6, 1 / 25e9),
        "Atlas 800T A3 / CloudMatrix384 node: 8 Ascend 910C = 16 dies (Huawei MindCluster docs: 16 "
        "processors per node over HCCS); per 910C 392 GB/s unidirectional UB/HCCS and 400 Gb/s RoCE "
        "(Zuo et al., Serving LLMs on Huawei CloudMatrix384, arXiv 2506.12708), per die 196 GB/s and "
        f"200 Gb/s = 25 GB/s; {_NCCL_ALPHA}, used as a proxy"),
}


def _shape(cluster: Cluster, ranks: int) -> tuple[int, int]:
    L = cluster.devices_per_node
    if not isinstance(ranks, int) or ranks < L or ranks % L:
        raise ValueError(f"ranks={ranks!r}: expected a multiple of {cluster.name}'s devices_per_node={L} "
                         f"(whole nodes: {L}, {2 * L}, {3 * L}, ...)")
    return ranks // L, L


def _check(bytes_per_peer: float, dedup: float) -> None:
    if not (math.isfinite(bytes_per_peer) and bytes_per_peer >= 0):
        raise ValueError(f"bytes_per_peer={bytes_per_peer!r}: expected bytes >= 0")
    if not 0 <= dedup <= 1:
        raise ValueError(f"dedup={dedup!r}: expected the inter-node bytes factor in [0, 1]")


def traffic(devices_per_node: int, ranks: int, bytes_per_peer: float, mode: str,
            dedup: float = 1.0) -> dict[str, float]:
    """What one rank sends in one all-to-all with bytes_per_peer to every rank, per link class (self
    left out) - the figures grlib.distributed.alltoall's LinkCounters count for uniform splits.

    flat: L-1 intra messages of m, P-L inter messages of m. hierarchical: stage 1, L-1 intra messages
    of N m (the rows for the N ranks with that node-mate's local index); stage 2, N-1 inter messages
    of L m f (the rows of the L ranks of my node for one rank of that node)."""
    if mode not in ("flat", "hierarchical"):
        raise ValueError(f"mode={mode!r}: expected one of ('flat', 'hierarchical')")
    _check(bytes_per_peer, dedup)
    L = devices_per_node
    if not isinstance(ranks, int) or ranks < L or ranks % L:
        raise ValueError(f"ranks={ranks!r}: expected a multiple of devices_per_node={L} "
                         f"(whole nodes: {L}, {2 * L}, {3 * L}, ...)")
    N, m = ranks // L, bytes_per_peer
    if mode == "flat":
        return {"intra_messages": L - 1, "intra_bytes": (L - 1) * m,
                "inter_messages": ranks - L, "inter_bytes": (ranks - L) * m}
    return {"intra_messages": L - 1, "intra_bytes": (L - 1) * N * m,
            "inter_messages": N - 1, "inter_bytes": (N - 1) * L * m * dedup}


def _time(cluster: Cluster, t: dict[str, float]) -> float:
    i, e = cluster.intra, cluster.inter
    return (t["intra_messages"] * i.alpha_s + t["intra_bytes"] * i.beta_s_per_byte
            + t["inter_messages"] * e.alpha_s + t["inter_bytes"] * e.beta_s_per_byte)


def _terms(cluster: Cluster, ranks: int, dedup: float) -> tuple[float, float, float, float]:
    """(A_flat, B_flat, A_two, B_two): each time is A + m * B for m bytes per peer."""
    _shape(cluster, ranks)
    L = cluster.devices_per_node
    a_flat, a_two = (_time(cluster, traffic(L, ranks, 0.0, mode)) for mode in ("flat", "hierarchical"))
    b_flat = _time(cluster, traffic(L, ranks, 1.0, "flat")) - a_flat
    b_two = _time(cluster, traffic(L, ranks, 1.0, "hierarchical", dedup)) - a_two
    return a_flat, b_flat, a_two, b_two


def flat_time(cluster: Cluster, ranks: int, bytes_per_peer: float) -> float:
    """Seconds of one flat all-to-all per rank (serial messages)."""
    _shape(cluster, ranks)
    return _time(cluster, traffic(cluster.devices_per_node, ranks, bytes_per_peer, "flat"))


def two_stage_time(cluster: Cluster, ranks: int, bytes_per_peer: float, dedup: float = 1.0) -> float:
    """Seconds of the two-stage all-to-all per rank; dedup: inter-node bytes factor (<= 1)."""
    _shape(cluster, ranks)
    return _time(cluster, traffic(cluster.devices_per_node, ranks, bytes_per_peer, "hierarchical", dedup))


def table(cluster: Cluster, ranks_list: Sequence[int], bytes_per_peer: float, dedup: float) -> list[dict]:
    """One row per rank count: the times, cut = 1 - two/flat (plain and de-duplicated), every parameter."""
    rows = []
    for ranks in ranks_list:
        N, L = _shape(cluster, ranks)
        flat = flat_time(cluster, ranks, bytes_per_peer)
        two = two_stage_time(cluster, ranks, bytes_per_peer)
        two_dedup = two_stage_time(cluster, ranks, bytes_per_peer, dedup)
        rows.append({"cluster": cluster.name, "ranks": ranks, "nodes": N, "devices_per_node": L,
                     "bytes_per_peer": bytes_per_peer, "dedup": dedup,
                     "intra_alpha_s": cluster.intra.alpha_s, "intra_beta_s_per_byte": cluster.intra.beta_s_per_byte,
                     "inter_alpha_s": cluster.inter.alpha_s, "inter_beta_s_per_byte": cluster.inter.beta_s_per_byte,
                     "flat_s": flat, "flat_intra_s": (L - 1) * (cluster.intra.alpha_s
                                                               + bytes_per_peer * cluster.intra.beta_s_per_byte),
                     "two_stage_s": two, "two_stage_dedup_s": two_dedup,
                     "cut": 1 - two / flat if flat > 0 else 0.0,
                     "cut_dedup": 1 - two_dedup / flat if flat > 0 else 0.0, "source": cluster.source})
    return rows


def cut_regime(cluster: Cluster, ranks: int, target: float, dedup: float = 1.0) -> tuple[float, float] | None:
    """The bytes per peer [low, high] (high may be inf) where two-stage cuts the flat time by >= target,
    or None where no size does. The cut 1 - (A_t + m B_t)/(A_f + m B_f) is monotone in m, from
    1 - A_t/A_f (latency-bound) to 1 - B_t/B_f (bandwidth-bound), so the set is one interval."""
    _check(0.0, dedup)
    a_f, b_f, a_t, b_t = _terms(cluster, ranks, dedup)
    keep = 1 - target
    small_ok = a_t <= keep * a_f  # the cut at m -> 0 reaches target
    if small_ok and b_t <= keep * b_f:
        return (0.0, math.inf)
    if not small_ok and b_t >= keep * b_f:  # (at equality the cut only approaches target)
        return None
    edge = (keep * a_f - a_t) / (b_t - keep * b_f)  # where the cut equals target
    return (0.0, edge) if small_ok else (edge, math.inf)


def fit_link(sizes_bytes: Sequence[float], seconds: Sequence[float]) -> Link:
    """alpha + beta * m by least squares on relative residuals ((fit - t) / t: the sizes span decades,
    so absolute residuals would fit the largest only), alpha, beta >= 0 (the best boundary fit when
    the free fit has a negative one)."""
    m = np.asarray(sizes_bytes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if m.ndim != 1 or m.shape != t.shape or m.size < 2 or (t <= 0).any() or (m < 0).any():
        raise ValueError(f"sizes_bytes and seconds must be equal-length sequences of >= 2 points, bytes >= 0 "
                         f"and seconds > 0; got {m.size} sizes and {t.size} times")
    unit_t, unit_m = float(t.max()), float(m.max()) or 1.0  # fit in scaled units: well conditioned
    A = np.stack([np.ones_like(m), m / unit_m], axis=1) / (t / unit_t)[:, None]  # rows scaled by 1/t
    y = np.ones_like(t)
    candidates = []
    free, *_ = np.linalg.lstsq(A, y, rcond=None)
    if (free >= 0).all():
        candidates.append(free)
    for col in (0, 1):  # one parameter at zero
        a = A[:, col]
        p = np.zeros(2)
        p[col] = max(0.0, float(a @ y) / float(a @ a)) if (a @ a) > 0 else 0.0
        candidates.append(p)
    best = min(candidates, key=lambda p: float(np.sum((A @ p - y) ** 2)))
    return Link(float(best[0]) * unit_t, float(best[1]) * unit_t / unit_m)


def measure_gloo(runtime: Runtime, sizes_bytes: Sequence[int], repeats: int, warmup: int = 2) -> list[dict]:
    """Per size (bytes per peer): the median over `repeats` of one all_to_all_single over the world
    group, each timed on every rank after a barrier and taken as the max over ranks. The sizes are
    interleaved (every round times each size once), so a burst of load elsewhere on the machine
    lands on all sizes alike instead of on one. Collective: every rank calls it."""
    if runtime.backend != "gloo":
        raise ValueError(f"measure_gloo times host-synchronous gloo collectives; runtime.backend="
                         f"{runtime.backend!r} runs them asynchronously on a device stream")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats={repeats!r}, warmup={warmup!r}: expected repeats >= 1 and warmup >= 0")
    topo = runtime.topology
    P = topo.world
    if P < 2:
        raise ValueError("measure_gloo needs >= 2 ranks (an all-to-all of one rank moves nothing)")
    sizes = [int(s) for s in sizes_bytes]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"sizes_bytes={list(sizes_bytes)}: expected one or more bytes-per-peer sizes >= 1")
    xs = [torch.full((P * s,), topo.rank % 251, dtype=torch.uint8, device=runtime.device) for s in sizes]  # [P * m]
    outs = [torch.empty_like(x) for x in xs]
    spent = torch.zeros(len(sizes), repeats, dtype=torch.float64)
    for k in range(warmup + repeats):
        for j, (x, out) in enumerate(zip(xs, outs)):
            runtime.barrier()
            start = time.perf_counter()
            dist.all_to_all_single(out, x, group=runtime.world_group)
            if k >= warmup:
                spent[j, k - warmup] = time.perf_counter() - start
    dist.all_reduce(spent, op=dist.ReduceOp.MAX, group=runtime.world_group)
    return [{"ranks": P, "nodes": topo.nodes, "local_world": topo.local_world, "backend": runtime.backend,
             "bytes_per_peer": size, "repeats": repeats, "seconds": float(np.median(s)),
             "p10_s": float(np.quantile(s, 0.1)), "p90_s": float(np.quantile(s, 0.9))}
            for size, s in zip(sizes, spent.numpy())]
