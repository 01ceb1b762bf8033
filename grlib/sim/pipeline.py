"""Discrete-event model of data-parallel training steps under grlib.distributed.schedules' schedules.

Each rank runs its steps on lanes; an op on a lane starts when the lane is free and what it needs
is done, and a collective starts on every rank at once, when the last rank is ready (the others
wait: that is where imbalance shows):

    main     compute (forward, loss, backward, optimizer) and every collective the step blocks on
    worker   the schedule's host thread (prefetch, semisync): planning step j and building its
             routes (split sizes + the ids' trip of the input and the loss lookup), allowed once
             the main lane has taken batch j - (k + 1) (grlib.train.prefetch.PrefetchWorker); the
             main lane takes batch i + k at the start of step i
    stream   a device's communication stream (Machine.streams): semisync's input rows' trip of
             batch i+k issued at the start of step i, the bucketed gradient all-reduce
             (Setup.overlap_allreduce) beside backward, and with Setup.sparse_stream (grlib's
             pipelined schedule) every rows' and gradients' trip of the item table. Without
             streams (gloo: host-driven blocking collectives) semisync's rows run on the main lane,
             where grlib's semisync runs them.

One step on the main lane, per schedule (trips: an all-to-all of grlib.sim.alltoall, flat or
two-stage; meta: the split sizes' exchange before an ids' trip):

    sync      plan | fingerprint | meta+ids(in) | rows(in) | forward | meta+ids(loss) | rows(loss)
              | loss | backward | grads(loss) | grads(in) | all-reduce | optimizer | clip-norm sum
    prefetch  the same without plan and meta+ids (on the worker, a step ahead)
    semisync  prefetch, and rows(in) of batch i+k at the start of step i (before the fingerprint);
              after the step, grlib's stale-row bookkeeping (an all-reduce of StepLoad.stale_bytes)
    sparse_stream  (on prefetch or semisync; grlib's pipelined(k)) the stream lane, at the start of step
              i: rows(in) of batches i..i+k not fetched yet, then rows(loss) of batch i; the step waits
              for rows(in) of batch i before its fingerprint, the loss for rows(loss); grads(loss) from backward's start,
              grads(in) after backward; the optimizer waits for them and for the all-reduce. One FIFO
              lane carries them and the all-reduce's buckets (no two collectives at once)

All-reduce of B gradient bytes over P = N nodes x L ranks: ring, 2(P-1) steps, 2(P-1)/P B beta at the
slowest link the ring crosses; of its 2(P-1) alphas, the 2(N-1) steps that cross nodes pay the
inter-node alpha and the others the intra-node one (NCCL's ring latency model, src/graph/tuning.cc).
Tiny collectives (fingerprint, clip norm): a tree, 2 ceil(log2 P) alpha; the hierarchical meta is a
ring all-gather of the P x P split matrix.
Utilisation of a rank = its compute seconds / wall seconds over the steady steps (after `warm`).

    out = simulate(Setup("semisync", 1, "hierarchical"), machine, loads)   # loads: [StepLoad] (grlib.sim.scaleout)

A Setup names a registered schedule (grlib.schedules) and is priced by its ModelCost: plan_ahead
(the worker lane), rows_ahead (semisync's rows of batch i+k), overlap_allreduce and sparse_stream
(set on the Setup too, or implied by the cost). A schedule that declares no ModelCost is refused.
    out.step_s, out.utilisation, out.spans
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from grlib import schedules
from grlib.schedules import ModelCost
from grlib.sim.alltoall import Cluster, flat_time, two_stage_time

PHASES = ("forward", "loss", "backward", "optimizer")  # compute phases of StepLoad.compute's rows
ID_BYTES, META_BYTES = 8, 8  # an int64 id; one int64 split size


@dataclass(frozen=True)
class Machine:
    """The ranks' links (devices_per_node, intra and inter Link) and whether comm has its own stream."""

    cluster: Cluster
    streams: bool  # a device's communication stream beside compute (False: gloo, collectives block the host)


@dataclass(frozen=True)
class Setup:
    """What is modelled: the schedule, the item exchange and what overlaps."""

    schedule: str = "sync"  # a registered schedule with a model cost (grlib.schedules.priced())
    staleness: int = 0  # k of a schedule whose model cost looks rows up ahead
    items: str = "flat"  # flat | hierarchical
    node_dedup: float = 1.0  # hierarchical: inter-node bytes factor of per-node de-duplication
    overlap_allreduce: bool = False  # bucketed all-reduce beside backward (needs Machine.streams)
    buckets: int = 1  # all-reduce buckets (the last one runs after backward)
    sparse_stream: bool = False  # the item table's trips on the stream (needs Machine.streams; not with sync)

    def __post_init__(self) -> None:
        cost = model_cost(self.schedule)
        object.__setattr__(self, "overlap_allreduce", self.overlap_allreduce or cost.overlap_allreduce)
        object.__setattr__(self, "sparse_stream", self.sparse_stream or cost.sparse_stream)
        stale = tuple(s.name for s in schedules.specs() if s.model is not None and s.model.rows_ahead)
        if self.staleness < 0 or (self.staleness and not cost.rows_ahead):
            raise ValueError(f"staleness must be >= 0, and > 0 only with {stale}; got {self.staleness} with {self.schedule!r}")
        if self.items not in ("flat", "hierarchical"):
            raise ValueError(f"items must be 'flat' or 'hierarchical', got {self.items!r}")
        if not 0 < self.node_dedup <= 1 or (self.node_dedup < 1 and self.items != "hierarchical"):
            raise ValueError(f"node_dedup must be in (0, 1], below 1 only with 'hierarchical'; got {self.node_dedup}")
        if self.buckets < 1:
            raise ValueError(f"buckets must be >= 1, got {self.buckets}")
        if self.sparse_stream and not cost.plan_ahead:
            ahead = tuple(s.name for s in schedules.specs() if s.model is not None and s.model.plan_ahead)
            raise ValueError(f"sparse_stream needs the routes built ahead: a schedule of {ahead}, not {self.schedule!r}")

    @property
    def cost(self) -> ModelCost:
        """The priced lanes: the schedule's model cost with this Setup's overlap and stream."""
        c = model_cost(self.schedule)
        return dataclasses.replace(c, overlap_allreduce=self.overlap_allreduce, sparse_stream=self.sparse_stream)

    @property
    def program(self) -> str:
        """The registered schedule whose cost is this Setup's main lane alone (no buckets, no stream)."""
        c = model_cost(self.schedule)
        return schedules.modelled_as(ModelCost(c.plan_ahead, c.rows_ahead and self.staleness > 0))


def model_cost(schedule: str) -> ModelCost:
    """The ModelCost a registered schedule declares; an unknown or unpriced one fails in one line."""
    spec = schedules.get(schedule)
    if spec.model is None:
        raise ValueError(f"the pipeline model cannot price schedule {schedule!r}: it declares no model cost "
                         f"(grlib.schedules.Spec.model); priced: {schedules.priced()}")
    return spec.model


@dataclass(frozen=True)
class StepLoad:
    """One global batch's work per rank."""

    compute: np.ndarray  # [4, P] seconds of PHASES per rank
    rows_input: np.ndarray  # [P] rows each rank asks every other rank for (input lookup, per peer)
    rows_loss: np.ndarray  # [P] the same for the loss lookup (targets and negatives)
    row_bytes: int  # bytes of one row (d x value bytes)
    grad_bytes: float  # the dense gradients all-reduced
    plan_s: float = 0.0  # host planning (assignment, negatives, local share)
    tokens: np.ndarray | None = None  # [P] tokens per rank (throughput)
    stale_bytes: float = 0.0  # semisync: the [V] float32 mask of updated rows grlib all-reduces per step (0: none)

    @property
    def ranks(self) -> int:
        return self.compute.shape[1]


@dataclass
class SimResult:
    step_s: np.ndarray  # [steps - warm] wall seconds per steady step (mean over ranks)
    busy_s: np.ndarray  # [P] compute seconds per steady step
    utilisation: np.ndarray  # [P]
    exposed_comm_s: float  # mean per step of main-lane time inside collectives (waits included)
    spans: list[dict] = field(default_factory=list)  # rank, step, lane, phase, start, end (kept ranks)


def trip_s(m: Machine, setup: Setup, bytes_per_peer: np.ndarray) -> float:
    """One all-to-all trip: the slowest rank's time (every rank waits for its rows)."""
    P = bytes_per_peer.size
    if P == 1:
        return 0.0
    b = float(np.max(bytes_per_peer))
    if setup.items == "flat":
        return flat_time(m.cluster, P, b)
    return two_stage_time(m.cluster, P, b, setup.node_dedup)


def _link(m: Machine, P: int):
    return m.cluster.intra if P <= m.cluster.devices_per_node else m.cluster.inter


def ring_s(m: Machine, P: int, passes: int, bytes_per_step: float) -> float:
    """`passes` x (P - 1) ring steps of bytes_per_step each: every step pays the intra-node alpha but
    the passes x (N - 1) steps that cross nodes, which pay the inter-node one (NCCL's ring latency model,
    src/graph/tuning.cc: nInterSteps); the bytes go at the slowest link the ring uses."""
    if P == 1:
        return 0.0
    L = m.cluster.devices_per_node
    nodes = P // L if P > L else 1
    steps, inter = passes * (P - 1), passes * (nodes - 1)
    link = _link(m, P)
    return ((steps - inter) * m.cluster.intra.alpha_s + inter * m.cluster.inter.alpha_s
            + steps * bytes_per_step * link.beta_s_per_byte)


def allreduce_s(m: Machine, P: int, nbytes: float) -> float:
    """Ring all-reduce: 2(P-1) steps of B/P bytes (2(P-1)/P B beta)."""
    return ring_s(m, P, 2, nbytes / P)


def tiny_s(m: Machine, P: int) -> float:
    """A collective of a few bytes (tree): 2 ceil(log2 P) alpha."""
    return 0.0 if P == 1 else 2 * math.ceil(math.log2(P)) * _link(m, P).alpha_s


def meta_s(m: Machine, setup: Setup, P: int) -> float:
    """The split sizes before an ids' trip: flat, an all-to-all of one int64 per peer; hierarchical,
    a ring all-gather of the P x P matrix (P - 1 messages of P int64), with node de-duplication one
    more size exchange between nodes (N - 1 inter-node messages)."""
    if P == 1:
        return 0.0
    if setup.items == "flat":
        return flat_time(m.cluster, P, META_BYTES)
    nodes = max(1, P // m.cluster.devices_per_node)  # node de-duplication: one more exchange of sizes
    merge = (nodes - 1) * m.cluster.inter.alpha_s if setup.node_dedup < 1 else 0.0
    return ring_s(m, P, 1, P * META_BYTES) + merge


class _Lanes:
    """Per-rank lane clocks, the busy compute seconds and the spans of the kept ranks."""

    def __init__(self, P: int, keep: int):
        self.free = {lane: np.zeros(P) for lane in ("main", "worker", "stream")}
        self.busy = np.zeros(P)
        self.comm = np.zeros(P)
        self.keep, self.spans, self.step = min(keep, P), [], 0

    def run(self, lane: str, phase: str, seconds, after=0.0, collective: bool = False, kind: str = "comm"):
        """kind: compute (busy), comm (on the main lane: exposed, with the wait before it) or host."""
        start = np.maximum(self.free[lane], after)
        if collective:
            start = np.full_like(start, start.max())
        end = start + seconds
        if kind == "compute":
            self.busy += seconds
        elif kind == "comm" and lane == "main":
            self.comm += end - self.free[lane]  # the wait for the slowest rank counts as comm
        for r in range(self.keep):
            self.spans.append({"rank": r, "step": self.step, "lane": lane, "phase": phase,
                               "start": float(start[r]), "end": float(end[r])})
        self.free[lane] = end
        return end


def simulate(setup: Setup, machine: Machine, loads: Sequence[StepLoad], warm: int = 1,
             keep_ranks: int = 4) -> SimResult:
    """The steps of `loads` in order under `setup`; figures over the steps after the first `warm`."""
    if len(loads) <= warm:
        raise ValueError(f"simulate needs more than warm={warm} steps, got {len(loads)}")
    P = loads[0].ranks
    if any(ld.ranks != P for ld in loads):
        raise ValueError("every StepLoad must have the same number of ranks")
    k, sync = setup.staleness, not setup.cost.plan_ahead
    streams = machine.streams
    comm_lane = "stream" if streams else "main"
    if (setup.overlap_allreduce or setup.sparse_stream) and not streams:
        raise ValueError("overlap_allreduce and sparse_stream need a machine with communication streams (Machine.streams)")
    ahead = k > 0 or setup.sparse_stream  # rows(in) at the start of the step, for batches i..i+k
    lanes = _Lanes(P, keep_ranks)
    ready = [None] * len(loads)  # worker: routes built
    rows_in = [None] * len(loads)  # semisync: input rows looked up
    started, ends = [], []
    meta = meta_s(machine, setup, P)

    def ids(ld: StepLoad, which: str) -> float:
        return meta + trip_s(machine, setup, getattr(ld, f"rows_{which}") * ID_BYTES)

    def rows(ld: StepLoad, which: str) -> float:
        return trip_s(machine, setup, getattr(ld, f"rows_{which}") * ld.row_bytes)

    def prepare(j: int) -> None:  # the worker's plan and routes of step j
        if j >= len(loads) or ready[j] is not None:
            return
        taken = j - (k + 1)  # batch j may start once the main lane took this one (at step taken - k)
        allowed = started[taken - k] if taken - k >= 0 else 0.0
        lanes.run("worker", "plan", loads[j].plan_s, after=allowed, kind="host")
        lanes.run("worker", "ids trip", ids(loads[j], "input"), collective=True)
        ready[j] = lanes.run("worker", "ids trip", ids(loads[j], "loss"), collective=True)

    for i, ld in enumerate(loads):
        lanes.step = i
        f, lo, b, o = ld.compute
        if not sync:
            for j in range(i, i + k + 1):
                prepare(j)
        start = np.maximum(lanes.free["main"], 0.0 if sync else ready[min(i + k, len(loads) - 1)])
        started.append(start)
        lanes.free["main"] = start
        if sync:
            lanes.run("main", "plan", ld.plan_s, kind="host")
        if ahead:  # rows of batches i..i+k not yet looked up, at the start of step i
            for j in range(i, min(i + k + 1, len(loads))):
                if rows_in[j] is None:
                    rows_in[j] = lanes.run(comm_lane, "rows trip", rows(loads[j], "input"),
                                           after=lanes.free["main"], collective=True)
        if setup.sparse_stream:
            rows_loss = lanes.run("stream", "rows trip", rows(ld, "loss"), after=lanes.free["main"], collective=True)
        if ahead:  # the schedule waits for batch i's rows before the step begins (its fingerprint)
            lanes.run("main", "rows wait", 0.0, after=rows_in[i])
        lanes.run("main", "fingerprint", tiny_s(machine, P), collective=True)
        if sync:
            lanes.run("main", "ids trip", ids(ld, "input"), collective=True)
        if not ahead:
            lanes.run("main", "rows trip", rows(ld, "input"), collective=True)
        lanes.run("main", "forward", f, kind="compute")
        if sync:
            lanes.run("main", "ids trip", ids(ld, "loss"), collective=True)
        if setup.sparse_stream:
            lanes.run("main", "rows wait", 0.0, after=rows_loss)
        else:
            lanes.run("main", "rows trip", rows(ld, "loss"), collective=True)
        lanes.run("main", "loss", lo, kind="compute")
        bwd_start = lanes.free["main"].copy()
        if setup.sparse_stream:  # the loss rows' gradients as backward begins
            sent = [lanes.run("stream", "grads trip", rows(ld, "loss"), after=bwd_start, collective=True)]
        lanes.run("main", "backward", b, kind="compute")
        if not setup.sparse_stream:
            for which in ("loss", "input"):
                lanes.run("main", "grads trip", rows(ld, which), collective=True)
        ar = allreduce_s(machine, P, ld.grad_bytes)
        if setup.overlap_allreduce:  # buckets from backward's first 1/n on; the last after backward
            first = lanes.run("stream", "all-reduce", ar * (1 - 1 / setup.buckets),
                              after=bwd_start + b / setup.buckets, collective=True)
            if setup.sparse_stream:  # the input rows' gradients when backward reaches the embeddings
                sent.append(lanes.run("stream", "grads trip", rows(ld, "input"),
                                      after=np.maximum(first, lanes.free["main"]), collective=True))
            done = lanes.run("stream", "all-reduce", ar / setup.buckets,
                             after=np.maximum(lanes.free["stream"], lanes.free["main"]), collective=True)
            lanes.run("main", "all-reduce wait", 0.0, after=done)
        else:
            lanes.run("main", "all-reduce", ar, collective=True)
            if setup.sparse_stream:
                sent.append(lanes.run("stream", "grads trip", rows(ld, "input"), after=lanes.free["main"],
                                      collective=True))
        if setup.sparse_stream:
            lanes.run("main", "grads wait", 0.0, after=np.maximum.reduce(sent))
        lanes.run("main", "optimizer", o, kind="compute")
        end = lanes.run("main", "clip-norm sum", tiny_s(machine, P), collective=True)
        if k and ld.stale_bytes:
            end = lanes.run("main", "stale rows", allreduce_s(machine, P, ld.stale_bytes), collective=True)
        ends.append(end)
        if i == warm - 1:
            busy0, comm0 = lanes.busy.copy(), lanes.comm.copy()
    n = len(loads) - warm
    t0 = ends[warm - 1] if warm else np.zeros(P)
    wall = ends[-1] - t0  # [P]
    step = np.diff(np.stack([t0, *ends[warm:]]).mean(1))
    busy = lanes.busy - (busy0 if warm else 0.0)
    comm = lanes.comm - (comm0 if warm else 0.0)
    return SimResult(step, busy / n, busy / wall, float(comm.mean() / n), lanes.spans)
