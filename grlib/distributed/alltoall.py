"""All-to-all exchanges, flat or hierarchical, and the request/response Route a sharded table rides on.

    y, recv = all_to_all(x, splits, rt, mode="hierarchical")    # x [N, *F] grouped by destination rank
    route = Route.build(ids, owner, rt, mode="hierarchical", dedup="node")
    rows = table[route.ids - lo]          # [M, F] the owner's answers for the ids it serves
    emb = route.reply(rows)               # [N, F] aligned with ids; backward sends gradients to the owners

flat: one all_to_all_single over the world group. hierarchical (two stages, ranks laid out as
grlib.distributed.topology numbers them, rank = node * L + local): stage 1 over the node's intra_group
moves every row to the node-mate whose local index is the destination's; stage 2 over cross_group
(one rank per node, same local index) forwards it to the destination's node. Both deliver the same
rows in the same order (by source rank, then send order), bitwise: the receivers reorder with an
all-gathered P x P matrix of split sizes. Inter-node bytes are equal; hierarchical sends N - 1
inter-node messages per rank instead of P - L.

A trip is a list of steps, Select (rows reordered / de-duplicated by index) and Hop (one
all_to_all_single over one group). The ids go forward through the steps; reply() sends the rows
back through them in reverse (a Select expands, a Hop is reversed) and its backward retraces the
forward path, summing the gradients of de-duplicated requests with index_add. dedup "rank": each
rank asks for every distinct (owner, id) once; "node" (hierarchical only): the stage-1 receiver
also merges its node-mates' requests for the same id from the same destination before stage 2.

LinkCounters count what this rank sends per link class (intra: same node, inter: another node,
self-sends left out): payload bytes, messages (peer pairs of each hop, empty ones included) and
the split-size metadata separately as meta_bytes. calls counts trips (an all_to_all, a build, a
reply, a reply's backward). Only c10d calls are used (all_to_all_single with uneven splits,
all_gather_single, subgroups), so gloo, nccl and hccl run the same code.
"""
from __future__ import annotations

import dataclasses
import threading
import time

from dataclasses import asdict, dataclass, fields
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from grlib.distributed.topology import Runtime

MODES = ("flat", "hierarchical")
DEDUP = ("none", "rank", "node")


@dataclass
class LinkCounters:
    """Accumulated over calls on this rank: what this rank SENDS."""
    intra_bytes: int = 0
    inter_bytes: int = 0
    intra_messages: int = 0
    inter_messages: int = 0
    meta_bytes: int = 0
    calls: int = 0
    seconds: float = 0.0  # wall time inside this rank's all_to_all_single calls (waiting + transfer)

    def __post_init__(self) -> None:
        self._by_thread: dict[int, float] = {}  # `seconds` split by calling thread (not a field: not in rows)

    def add_seconds(self, s: float) -> None:
        self.seconds += s
        key = threading.get_ident()
        self._by_thread[key] = self._by_thread.get(key, 0.0) + s

    def seconds_on_this_thread(self) -> float:
        """The part of `seconds` spent in calls made by the calling thread (a prefetch worker's
        all-to-alls overlap the step on another thread and are not the step's waiting)."""
        return self._by_thread.get(threading.get_ident(), 0.0)

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)
        self._by_thread = {}

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _Select:
    """Forward y = x[fwd]; reverse x' = y[back] (x[j] == y[back[j]]); perm: fwd is a permutation."""
    fwd: Tensor  # [len(y)] int64
    back: Tensor  # [len(x)] int64
    perm: bool


@dataclass(frozen=True)
class _Hop:
    """One all_to_all_single over `group`: send[i] rows to member i, recv[i] rows from member i."""
    group: Any
    send: tuple[int, ...]
    recv: tuple[int, ...]
    intra: np.ndarray  # [G] bool: member i is on my node (and is not me)
    inter: np.ndarray  # [G] bool: member i is on another node

    def reversed(self) -> _Hop:
        return _Hop(self.group, self.recv, self.send, self.intra, self.inter)


def _hop(runtime: Runtime, kind: str, send: Sequence[int], recv: Sequence[int]) -> _Hop:
    topo = runtime.topology
    members = {"world": range(topo.world), "intra": topo.node_ranks(topo.node),
               "cross": topo.peers_with_local_rank(topo.local_rank)}[kind]
    nodes = np.asarray(members) // topo.local_world  # [G]
    mine = np.asarray(members) == topo.rank
    group = {"world": runtime.world_group, "intra": runtime.intra_group, "cross": runtime.cross_group}[kind]
    return _Hop(group, tuple(int(s) for s in send), tuple(int(r) for r in recv),
                (nodes == topo.node) & ~mine, nodes != topo.node)


def _run_hop(x: Tensor, hop: _Hop, counters: LinkCounters | None) -> Tensor:
    if counters is not None:
        row = x.element_size() * int(np.prod(x.shape[1:], dtype=np.int64))
        send = np.asarray(hop.send, dtype=np.int64)
        counters.intra_bytes += int(send[hop.intra].sum()) * row
        counters.inter_bytes += int(send[hop.inter].sum()) * row
        counters.intra_messages += int(hop.intra.sum())
        counters.inter_messages += int(hop.inter.sum())
    if len(hop.send) == 1:  # a group of one: nothing leaves this rank
        return x
    out = x.new_empty((sum(hop.recv), *x.shape[1:]))
    start = time.perf_counter()
    dist.all_to_all_single(out, x.contiguous(), list(hop.recv), list(hop.send), group=hop.group)
    if counters is not None:
        counters.add_seconds(time.perf_counter() - start)
    return out


def _forward(x: Tensor, steps: list, counters: LinkCounters | None) -> Tensor:
    for step in steps:
        x = x.index_select(0, step.fwd) if isinstance(step, _Select) else _run_hop(x, step, counters)
    return x


def _reverse(y: Tensor, steps: list, counters: LinkCounters | None) -> Tensor:
    for step in reversed(steps):
        y = y.index_select(0, step.back) if isinstance(step, _Select) else _run_hop(y, step.reversed(), counters)
    return y


def _adjoint(g: Tensor, steps: list, counters: LinkCounters | None) -> Tensor:
    """The transpose of _reverse: a permuting Select gathers, a de-duplicating one sums (index_add)."""
    for step in steps:
        if isinstance(step, _Hop):
            g = _run_hop(g, step, counters)
        elif step.perm:
            g = g.index_select(0, step.fwd)
        else:
            g = g.new_zeros((step.fwd.numel(), *g.shape[1:])).index_add_(0, step.back, g)
    return g


def _count_call(counters: LinkCounters | None, meta_bytes: int = 0) -> None:
    if counters is not None:
        counters.calls += 1
        counters.meta_bytes += meta_bytes


class _Trip(torch.autograd.Function):
    """outbound: x along the steps (backward: the reverse trip, for steps that only permute);
    else rows back along them (backward: the adjoint, duplicate gradients summed)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, steps: list, counters: LinkCounters | None, outbound: bool) -> Tensor:
        ctx.steps, ctx.counters, ctx.outbound = steps, counters, outbound
        y = (_forward if outbound else _reverse)(x, steps, counters)
        return y.clone() if y is x else y  # one rank, nothing moved: still a new tensor

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        _count_call(ctx.counters)
        return (_reverse if ctx.outbound else _adjoint)(grad, ctx.steps, ctx.counters), None, None, None


# --- plans --------------------------------------------------------------------------------------

def _permutation(fwd: Tensor) -> _Select:
    back = torch.empty_like(fwd)
    back[fwd] = torch.arange(fwd.numel(), device=fwd.device)
    return _Select(fwd, back, True)


def _fuse(a: _Select, b: _Select) -> _Select:
    """x[a.fwd][b.fwd] as one Select."""
    return _Select(a.fwd[b.fwd], b.back[a.back], a.perm and b.perm)


def _segment_order(sizes: np.ndarray, order: np.ndarray, device: torch.device) -> _Select:
    """The permutation that lays segments of `sizes` [K] out in `order` [K] (a rows' reorder)."""
    sizes = sizes.astype(np.int64)
    starts = np.cumsum(sizes) - sizes
    moved = sizes[order]
    new_starts = np.cumsum(moved) - moved
    total = int(sizes.sum())
    fwd = np.repeat(starts[order] - new_starts, moved) + np.arange(total, dtype=np.int64)
    return _permutation(torch.from_numpy(fwd).to(device))


def _unique_pairs(key: Tensor, ids: Tensor) -> _Select:
    """De-duplicate (key, id) pairs: fwd picks one of each, sorted by key then id; back expands."""
    order = torch.argsort(ids, stable=True)
    order = order[torch.argsort(key[order], stable=True)]
    k, i = key[order], ids[order]
    first = torch.ones_like(k, dtype=torch.bool)
    first[1:] = (k[1:] != k[:-1]) | (i[1:] != i[:-1])
    back = torch.empty_like(order)
    back[order] = torch.cumsum(first, 0) - 1
    return _Select(order[first], back, False)


def _hierarchical_steps(S: np.ndarray, runtime: Runtime, device: torch.device) -> tuple[_Select, _Hop, np.ndarray]:
    """Stage 1 for a P x P split matrix S[src, dst]: the reorder of this rank's rows (grouped by
    destination) into [local index l'][node n'], the intra hop, and what it receives [L (src local), N]."""
    topo = runtime.topology
    N, L, n, l = topo.nodes, topo.local_world, topo.node, topo.local_rank
    mine = S[topo.rank]  # [P]
    order1 = np.arange(N * L).reshape(N, L).T.ravel()  # destinations by local index, then node
    received = S[n * L:(n + 1) * L][:, l::L]  # [L, N]: from node-mate l, for node n' (local index l)
    hop = _hop(runtime, "intra", mine.reshape(N, L).sum(0), received.sum(1))
    return _segment_order(mine, order1, device), hop, received


def _split_matrix(send: Tensor, runtime: Runtime) -> np.ndarray:
    """S[src, dst]: every rank's split sizes [P] all-gathered into a P x P matrix (on the host)."""
    P = runtime.topology.world
    matrix = send
    if P > 1:
        matrix = send.new_empty(P * P)
        dist.all_gather_single(matrix, send, group=runtime.world_group)
    return matrix.cpu().numpy().reshape(P, P)


def _all_to_all_steps(splits: Sequence[int], runtime: Runtime, mode: str, device: torch.device,
                      counters: LinkCounters | None) -> tuple[list, list[int]]:
    """Steps moving rows grouped by destination to their destinations, in flat's receive order, and
    the rows received from each rank [P]."""
    topo = runtime.topology
    P = topo.world
    send = torch.tensor(list(splits), dtype=torch.int64, device=device)  # [P]
    if mode == "flat":
        recv = send.clone()
        if P > 1:
            dist.all_to_all_single(recv, send, group=runtime.world_group)
        _count_call(counters, 8 * (P - 1))
        recv_splits = recv.tolist()
        return [_hop(runtime, "world", splits, recv_splits)], recv_splits
    S = _split_matrix(send, runtime)
    _count_call(counters, 8 * P * (P - 1))
    first, hop1, received = _hierarchical_steps(S, runtime, device)
    N, L = topo.nodes, topo.local_world
    order2 = np.arange(L * N).reshape(L, N).T.ravel()  # [l][n'] -> [n'][l]
    second = _segment_order(received.ravel(), order2, device)
    from_nodes = S[:, topo.rank].reshape(N, L).sum(1)  # [N]
    hop2 = _hop(runtime, "cross", received.sum(0), from_nodes)
    return [first, hop1, second, hop2], S[:, topo.rank].tolist()


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: expected one of {MODES}")


def all_to_all(x: Tensor, splits: Sequence[int], runtime: Runtime, mode: str = "flat",
               counters: LinkCounters | None = None) -> tuple[Tensor, list[int]]:
    """x [N, *F] grouped by destination (splits[r] rows to rank r) -> (rows received [M, *F] ordered
    by source rank, then send order; recv splits [P]). Collective; differentiable in x."""
    _check_mode(mode)
    P = runtime.topology.world
    splits = [int(s) for s in splits]
    if x.dim() < 1:
        raise ValueError(f"x must have a leading row dimension, got shape {tuple(x.shape)}")
    if len(splits) != P or min(splits, default=0) < 0 or sum(splits) != x.shape[0]:
        raise ValueError(f"splits={splits}: expected {P} counts >= 0 (one per rank) summing to x.shape[0]="
                         f"{x.shape[0]}")
    steps, recv = _all_to_all_steps(splits, runtime, mode, x.device, counters)
    return _Trip.apply(x, steps, counters, True), recv


class Route:
    """One request/response exchange: each rank asks owners for items (e.g. embedding rows by id)."""

    def __init__(self, ids: Tensor, steps: list, counters: LinkCounters | None) -> None:
        self.ids = ids  # [M] int64: the ids this rank serves, by source (rank or node), then send order
        self._steps = steps
        self._counters = counters

    @classmethod
    def build(cls, ids: Tensor, owner: Tensor, runtime: Runtime, mode: str = "flat", dedup: str = "none",
              counters: LinkCounters | None = None) -> Route:
        """Collective. ids [N] int64, owner [N] int64: the rank that serves each id."""
        _check_mode(mode)
        if dedup not in DEDUP:
            raise ValueError(f"dedup={dedup!r}: expected one of {DEDUP}")
        if dedup == "node" and mode != "hierarchical":
            raise ValueError("dedup='node' de-duplicates between the two stages of mode='hierarchical'; "
                             f"with mode={mode!r} use dedup 'none' or 'rank'")
        P = runtime.topology.world
        if ids.dim() != 1 or ids.dtype != torch.int64:
            raise ValueError(f"ids must be one-dimensional int64, got {ids.dtype} of shape {tuple(ids.shape)}")
        if owner.shape != ids.shape or owner.dtype != torch.int64:
            raise ValueError(f"owner must be int64 shaped like ids {tuple(ids.shape)}, got {owner.dtype} "
                             f"of shape {tuple(owner.shape)}")
        if ids.numel() and (int(owner.min()) < 0 or int(owner.max()) >= P):
            raise ValueError(f"owner holds ranks outside [0, {P}): {int(owner.min())}..{int(owner.max())}")
        first = _permutation(torch.argsort(owner, stable=True)) if dedup == "none" else _unique_pairs(owner, ids)
        splits = torch.bincount(owner[first.fwd], minlength=P).tolist()
        if dedup != "node":
            steps, _ = _all_to_all_steps(splits, runtime, mode, ids.device, counters)
            steps = [_fuse(first, steps[0]), *steps[1:]] if isinstance(steps[0], _Select) else [first, *steps]
            served = _forward(ids, steps, counters)
            return cls(served, steps, counters)
        return cls._build_node(ids, first, splits, runtime, counters)

    @classmethod
    def _build_node(cls, ids: Tensor, first: _Select, splits: list[int], runtime: Runtime,
                    counters: LinkCounters | None) -> Route:
        topo = runtime.topology
        P, N = topo.world, topo.nodes
        S = _split_matrix(torch.tensor(splits, dtype=torch.int64, device=ids.device), runtime)
        order1, hop1, received = _hierarchical_steps(S, runtime, ids.device)
        steps: list = [_fuse(first, order1), hop1]
        staged = _forward(ids, steps, counters)  # [sum(received)] in layout [l][n']
        node_of = torch.arange(N, device=ids.device).repeat(topo.local_world)  # [L * N] the n' of each segment
        dest_node = torch.repeat_interleave(node_of, torch.from_numpy(received.ravel()).to(ids.device))
        merge = _unique_pairs(dest_node, staged)  # sorted by destination node, then id
        send2 = torch.bincount(dest_node[merge.fwd], minlength=N)  # [N]
        recv2 = send2.clone()
        if N > 1:
            dist.all_to_all_single(recv2, send2, group=runtime.cross_group)
        _count_call(counters, 8 * P * (P - 1) + 8 * (N - 1))
        hop2 = _hop(runtime, "cross", send2.tolist(), recv2.tolist())
        served = _run_hop(staged.index_select(0, merge.fwd), hop2, counters)
        return cls(served, [*steps, merge, hop2], counters)

    def rebind(self, source: Runtime, target: Runtime) -> Route:
        """This route with its exchanges moved from `source`'s groups to `target`'s (same members):
        a route built ahead on a side channel (grlib.distributed.topology.side_channel) replies on the main groups."""
        swap = {id(source.world_group): target.world_group, id(source.intra_group): target.intra_group,
                id(source.cross_group): target.cross_group}
        steps = [dataclasses.replace(s, group=swap[id(s.group)]) if isinstance(s, _Hop) else s for s in self._steps]
        return Route(self.ids, steps, self._counters)

    def reply(self, rows: Tensor) -> Tensor:
        """rows [M, *F] (the answers for self.ids) -> [N, *F] aligned with the ids given to build.
        Differentiable: the backward sends gradients [N, *F] to the owners, duplicates summed."""
        if rows.dim() < 1 or rows.shape[0] != self.ids.numel():
            raise ValueError(f"rows must have {self.ids.numel()} rows (one per served id), got shape "
                             f"{tuple(rows.shape)}")
        _count_call(self._counters)
        return _Trip.apply(rows, self._steps, self._counters, False)
