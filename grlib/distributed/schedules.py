"""Schedules of data-parallel steps (grlib.distributed.data_parallel): what runs ahead of step i.

    sync         step i plans its global batch (assignment, negatives, local share) inline, then
                 looks its rows up and trains: everything on the critical path
    prefetch     a worker thread plans step i+1 and, for a sharded item table, builds its id
                 all-to-alls (the ids' trip of both lookups, on a side channel of process groups)
                 while step i computes; the rows' trip runs in step i+1 under the current weights,
                 so the losses equal sync's bit for bit
    semisync(k)  prefetch, and the input item rows of batch i+k are looked up at the start of step i,
                 before the updates of batches i..i+k-1 land (bounded staleness k, TorchRec's
                 TrainPipelineSemiSync at k = 1); their gradients still reach the current table.
                 Dense parameters and the loss's rows (targets, negatives) stay synchronous.
                 semisync(0) is sync.
    overlap      prefetch, and the dense gradients all-reduced in buckets of dist.bucket_bytes as
                 backward produces them (grlib.distributed.buckets.BucketedSync, built by
                 grlib.fit.assemble): the comm phase is only what is left after backward; the same
                 sums as the flat all-reduce's
    pipelined(k) overlap's buckets, and a sharded table's trips on a communication stream
                 (grlib.distributed.stream): at the start of step i the input rows of batch i+k
                 (semisync's staleness; k = 0: batch i's, exact) and the loss rows of batch i (exact:
                 no update lands before the loss) go out beside forward; their gradients go back
                 beside backward, the loss rows' as soon as backward produces them; the update waits
                 for both. Without a sharded table it is semisync(k) with overlap's buckets.

    worker:  plan(batch i+1) [+ Route.build of its ids on the side channel]   (at most `ahead` beyond use)
    main:    [rows of batch i+k looked up] -> forward / loss / backward -> all-reduce -> optimizer
                                                            (overlap: buckets ─┘ from backward's hooks)
    stream:  (pipelined) rows(input i+k), rows(loss i) | ... | grads(loss i) ... grads(input i) ─┘ waited

The worker is one process's (grlib.train.prefetch.PrefetchWorker), in lockstep across ranks: it starts
batch j only once the main thread has taken batch j - (k + 1), and when closed it finishes exactly the
batches it was allowed, so every rank's worker joins the same collectives and none waits for a peer
that stopped.
Each step's result carries `stale_fraction` (semisync, pipelined: the share of its looked-up rows
that an update changed between lookup and use), `t_start` (for per-rank timelines) and the seconds
spent inside item all-to-alls (`lookup_comm_s`; pipelined: waiting for the stream's rows).

Each schedule is a subclass of RankSchedule naming its entry in the registry (grlib.schedules),
which holds its traits (stale, bucketed, side channel, stream):

    class Pipelined(RankSchedule, schedule=PIPELINED): ...
    schedule = rank_schedule(dist.schedule)(step, planner, staleness, side, stream)   # grlib.fit.assemble
"""
from __future__ import annotations

import collections
import os
import sys
import time
from collections.abc import Generator, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from grlib import schedules
from grlib.distributed.data_parallel import DataParallelStep, Planner, RankPlan
from grlib.distributed.sharded_embedding import ShardedRows
from grlib.distributed.stream import CommStream, StreamGrads, StreamLookup
from grlib.jagged import JaggedBatch
from grlib.model.embeddings import ITEM_ROWS
from grlib.negatives.path import ATTACHMENT, LocalIds
from grlib.train.prefetch import PrefetchWorker, SyncSchedule
from grlib.train.step import StepResult


class RankSchedule(SyncSchedule):
    """One rank's steps under the registered schedule `name` (grlib.schedules) with staleness k (stale
    schedules only): the N-rank members of the schedule family (grlib.train.prefetch.SyncSchedule:
    run(batches) -> one StepResult per batch). A subclass names its registered schedule
    (`schedule=NAME`) and reads its traits there."""

    classes: dict[str, type] = {}  # schedule name -> its rank class, as each is defined
    schedule_name: str = ""

    def __init_subclass__(cls, schedule: str | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.schedule_name = schedule or ""  # a subclass naming none runs no schedule (not its parent's)
        if schedule is not None:  # its Spec is checked when a run asks for it (rank_schedule)
            old = RankSchedule.classes.get(schedule)
            if old is not None and _origin(old) != _origin(cls):
                raise ValueError(f"schedule {schedule!r} has a rank class already ({old.__module__}.{old.__qualname__})")
            RankSchedule.classes[schedule] = cls  # the same class again: its file was imported again

    def __init__(self, step: DataParallelStep, planner: Planner, staleness: int = 0,
                 side: Any = None, stream: CommStream | None = None):
        if not self.schedule_name:
            raise ValueError(f"{type(self).__qualname__} names no schedule (class C(RankSchedule, schedule=NAME))")
        spec = schedules.get(self.schedule_name)
        self.name = spec.name
        if staleness < 0 or (staleness and not spec.stale):
            raise ValueError(f"staleness must be >= 0 and only with schedules {schedules.with_trait('stale')}, "
                             f"got {staleness} with {self.name!r}")
        if stream is not None and not spec.stream:
            raise ValueError(f"a communication stream is the {schedules.with_trait('stream')} schedules', not {self.name!r}'s")
        super().__init__(step)
        self.spec = spec
        self.planner, self.k = planner, staleness
        self.world, self.rank = planner.world, planner.rank
        self.model: nn.Module = step.model
        self.tables = [m for m in self.model.modules() if isinstance(m, ShardedRows)]
        self.side = side  # a side channel (grlib.distributed.topology.side_channel) for routes built ahead
        self.stream = stream  # pipelined with a sharded table: the table's trips (grlib.distributed.stream)
        if stream is not None and not self.tables:
            raise ValueError("the communication stream carries a sharded item table's trips; this model has none")
        self.step_index = 0
        self._touched: collections.deque = collections.deque(maxlen=max(1, staleness))  # [V] bool per update

    # --- ahead of the step ------------------------------------------------------------------
    def _plan(self, batch: JaggedBatch) -> RankPlan:
        """Planner + (sharded items, prefetch) the routes of the plan's two lookups, on the side channel."""
        plan = self.planner(batch)
        if self.tables and self.spec.side_channel:
            table = self.tables[0]
            loss_ids = LocalIds.of(plan.local.attachments[ATTACHMENT].sample, table.n_rows).distinct
            plan.routes = {"input": (plan.local.item_ids, table.route(plan.local.item_ids, self.side)),
                           "loss": (loss_ids, table.route(loss_ids, self.side))}
        return plan

    def run(self, batches: Iterable[JaggedBatch]) -> Generator[StepResult, None, None]:
        if not self.spec.side_channel:  # nothing built ahead: every step plans inline
            yield from self._steps(self._plan(b) for b in batches)
            return
        try:
            with PrefetchWorker(batches, self._plan, depth=self.k + 1, name="grlib-schedule") as worker:
                yield from self._steps(plan for _, plan in worker)
        finally:
            if self.stream is not None:
                self.stream.close()

    def _steps(self, plans: Iterator[RankPlan]) -> Generator[StepResult, None, None]:
        window: collections.deque[RankPlan] = collections.deque()
        while True:
            start, comm = time.perf_counter(), self._comm_seconds()
            while len(window) <= self.k and (plan := next(plans, None)) is not None:
                window.append(plan)
            if not window:
                return
            if self.stream is not None:
                plan = self._stream_ahead(window)
            else:
                if self.k:
                    for ahead in window:  # rows of batch i+k now (at the start: of batches i..i+k)
                        if ITEM_ROWS not in ahead.local.attachments:
                            self._prepare(ahead, "input")
                            ahead.local.attachments[ITEM_ROWS] = self.model.embed.items(ahead.local.item_ids)
                            ahead.looked_up_at = self.step_index
                plan = window.popleft()
                if not self.k:
                    self._prepare(plan, "input")
                self._prepare(plan, "loss")
            ahead_s, ahead_comm = time.perf_counter() - start, self._comm_seconds() - comm
            stale = self._stale_fraction(plan)
            comm = self._comm_seconds()
            out = self.step(iter([plan]))
            if self.stream is not None and self.tables[0]._ahead:
                raise RuntimeError("pipelined: the step did not read the loss rows fetched for it")
            out.seconds["data"] += ahead_s  # planning inline (sync) or waiting for the worker, rows ahead
            out.extra["t_start"] -= ahead_s
            out.extra.update(stale_fraction=stale, lookup_comm_s=self._comm_seconds() - comm,
                             ahead_comm_s=ahead_comm)
            if self.k:
                self._touched.append(self._updated_rows())
            self.step_index += 1
            yield out

    def _stream_ahead(self, window: collections.deque) -> RankPlan:
        """pipelined: the input rows of batches i..i+k not fetched yet and the loss rows of batch i queued on
        the stream; batch i's input rows waited for; its lookups' gradients armed -> batch i's plan."""
        for ahead in window:
            if not hasattr(ahead, "input_rows"):
                ahead.input_rows = self._fetch(ahead, "input")
                ahead.looked_up_at = self.step_index
        plan = window.popleft()
        loss = self._fetch(plan, "loss")
        self.tables[0].expect(loss)  # the loss's lookup reads these rows
        plan.local.attachments[ITEM_ROWS] = plan.input_rows.rows()
        self.step.stream_grads = StreamGrads([loss, plan.input_rows])  # every rank: loss, then input
        return plan

    def _fetch(self, plan: RankPlan, which: str) -> StreamLookup:
        ids, route = plan.routes.pop(which)
        return StreamLookup(self.stream, self.tables[0], ids, route.rebind(self.side, self.stream.runtime))

    def _prepare(self, plan: RankPlan, which: str) -> None:
        """Queue the route built ahead for the plan's `which` lookup (input rows or loss rows)."""
        routes = getattr(plan, "routes", None)
        if routes:
            ids, route = routes.pop(which)
            self.tables[0].prepare(ids, route.rebind(self.side, self.tables[0].runtime))

    def _comm_seconds(self) -> float:
        """Seconds this thread spent in item all-to-alls (not the worker's route builds, not the stream's
        trips) or waiting for the stream's rows."""
        waited = self.stream.waited if self.stream is not None else 0.0
        return waited + sum(t.counters.seconds_on_this_thread() for t in self.tables)

    # --- staleness ----------------------------------------------------------------------------
    def _updated_rows(self) -> torch.Tensor:
        """[V] bool: the item rows this step's update changed (every rank's, for a sharded table)."""
        table = self.model.embed.items
        grad = table.weight.grad
        rows = torch.zeros(table.weight.shape[0], dtype=torch.bool) if grad is None else grad.abs().sum(1) > 0
        if not isinstance(table, ShardedRows):
            return rows  # the all-reduced gradient: every rank's rows
        full = torch.zeros(table.n_rows, dtype=torch.float32)
        full[table.start:table.stop] = rows.float()
        import torch.distributed as dist

        dist.all_reduce(full, group=table.runtime.world_group)
        return full > 0

    def _stale_fraction(self, plan: RankPlan) -> float:
        looked = getattr(plan, "looked_up_at", self.step_index)
        ids = plan.local.item_ids
        between = list(self._touched)[len(self._touched) - (self.step_index - looked):] if looked < self.step_index else []
        if not between or ids.numel() == 0:
            return 0.0
        changed = torch.stack(between).any(0)  # [V]
        return float(changed[ids].float().mean())


def _origin(cls: type) -> tuple[str, str]:
    """(its source file, its name): one class however its file was imported (a plugin file may be a test module too)."""
    file = getattr(sys.modules.get(cls.__module__), "__file__", None)
    return (os.path.realpath(file) if file else cls.__module__, cls.__qualname__)


def rank_schedule(name: str) -> type[RankSchedule]:
    """The rank class of the registered schedule `name` (a plugin's once its file is loaded)."""
    return schedules.get(name).class_in(RankSchedule.classes, "RankSchedule")


# the built-in schedules: each names its entry in the registry (grlib.schedules), which holds its traits
class Sync(RankSchedule, schedule=schedules.SYNC):
    """Plans each step inline."""


class Prefetch(RankSchedule, schedule=schedules.PREFETCH):
    """Plans step i+1 (and its routes) on the worker during step i."""


class Semisync(RankSchedule, schedule=schedules.SEMISYNC):
    """Prefetch, and the input rows of batch i+k looked up at the start of step i."""


class Overlap(RankSchedule, schedule=schedules.OVERLAP):
    """Prefetch's plan; the step's dense gradients in buckets (grlib.fit.assemble)."""


class Pipelined(RankSchedule, schedule=schedules.PIPELINED):
    """Semisync's rows, overlap's buckets and a sharded table's trips on the stream."""
