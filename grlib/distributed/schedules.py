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

    worker:  plan(batch i+1) [+ Route.build of its ids on the side channel]   (at most `ahead` beyond use)
    main:    [rows of batch i+k looked up] -> forward / loss / backward -> all-reduce -> optimizer

The worker runs in lockstep across ranks (LockstepWorker): it starts batch j only once the main
thread has taken batch j - ahead, and when closed it finishes exactly the batches it was allowed,
so every rank's worker joins the same collectives and none waits for a peer that stopped.
Each step's result carries `stale_fraction` (semisync: the share of its looked-up rows that an
update changed between lookup and use), `t_start` (for per-rank timelines) and the seconds spent
inside item all-to-alls (`lookup_comm_s`).
"""
from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from grlib.distributed.data_parallel import DataParallelStep, Planner, RankPlan
from grlib.distributed.sharded_embedding import ShardedRows
from grlib.jagged import JaggedBatch
from grlib.model.embeddings import ITEM_ROWS
from grlib.negatives.path import ATTACHMENT, LocalIds
from grlib.train.step import StepResult

SCHEDULES = ("sync", "prefetch", "semisync")
_POLL_S = 0.05
_DONE = object()


class LockstepWorker:
    """Yields fn(item) for the items of `source`, computed in a thread at most `ahead` items beyond
    those taken. close() lets it finish the items it was allowed to start, then joins it."""

    def __init__(self, source: Iterable, fn: Callable, ahead: int, name: str = "grlib-schedule"):
        if ahead < 1:
            raise ValueError(f"ahead must be >= 1, got {ahead}")
        self._source, self._fn, self.name = iter(source), fn, name
        self._allowed, self._closing, self._finished = ahead, False, False
        self._cond = threading.Condition()
        self._out: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        started = 0
        try:
            for item in self._source:
                with self._cond:
                    while started >= self._allowed and not self._closing:
                        self._cond.wait()
                    if started >= self._allowed:
                        return
                started += 1
                self._out.put(self._fn(item))
            self._out.put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - raised in the consumer
            self._out.put(exc)

    def __iter__(self) -> Iterator:
        return self

    def __next__(self):
        if self._finished:
            raise StopIteration
        while True:
            try:
                got = self._out.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._out.empty():
                    raise RuntimeError(f"the {self.name} worker stopped without a result") from None
        if got is _DONE:
            self._finished = True
            raise StopIteration
        if isinstance(got, BaseException):
            self._finished = True
            raise RuntimeError(f"the {self.name} worker failed: {type(got).__name__}: {got}") from got
        with self._cond:
            self._allowed += 1
            self._cond.notify()
        return got

    def close(self, timeout: float = 600.0) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"the {self.name} worker did not stop within {timeout} s")


class Schedule:
    """One rank's steps under `kind` (SCHEDULES) with staleness k (semisync only)."""

    def __init__(self, step: DataParallelStep, planner: Planner, kind: str = "prefetch", staleness: int = 0,
                 side: Any = None):
        if kind not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {kind!r}")
        if staleness < 0 or (staleness and kind != "semisync"):
            raise ValueError(f"staleness must be >= 0 and only with schedule 'semisync', got {staleness} with {kind!r}")
        self.step, self.planner, self.kind, self.k = step, planner, kind, staleness
        self.world, self.rank = planner.world, planner.rank
        self.model: nn.Module = step.model
        self.tables = [m for m in self.model.modules() if isinstance(m, ShardedRows)]
        self.side = side  # a side channel (grlib.distributed.topology.side_channel) for routes built ahead
        self.step_index = 0
        self._touched: collections.deque = collections.deque(maxlen=max(1, staleness))  # [V] bool per update

    # --- ahead of the step ------------------------------------------------------------------
    def _plan(self, batch: JaggedBatch) -> RankPlan:
        """Planner + (sharded items, prefetch) the routes of the plan's two lookups, on the side channel."""
        plan = self.planner(batch)
        if self.tables and self.kind != "sync":
            table = self.tables[0]
            loss_ids = LocalIds.of(plan.local.attachments[ATTACHMENT].sample, table.n_rows).distinct
            plan.routes = {"input": (plan.local.item_ids, table.route(plan.local.item_ids, self.side)),
                           "loss": (loss_ids, table.route(loss_ids, self.side))}
        return plan

    def run(self, batches: Iterable[JaggedBatch]) -> Generator[StepResult, None, None]:
        if self.kind == "sync":
            yield from self._steps(self._plan(b) for b in batches)
            return
        worker = LockstepWorker(batches, self._plan, ahead=self.k + 1)
        try:
            yield from self._steps(worker)
        finally:
            worker.close()

    def _steps(self, plans: Iterator[RankPlan]) -> Generator[StepResult, None, None]:
        window: collections.deque[RankPlan] = collections.deque()
        while True:
            start, comm = time.perf_counter(), self._comm_seconds()
            while len(window) <= self.k and (plan := next(plans, None)) is not None:
                window.append(plan)
            if not window:
                return
            if self.k:
                for plan in window:  # rows of batch i+k now (at the start: of batches i..i+k)
                    if ITEM_ROWS not in plan.local.attachments:
                        self._prepare(plan, "input")
                        plan.local.attachments[ITEM_ROWS] = self.model.embed.items(plan.local.item_ids)
                        plan.looked_up_at = self.step_index
            ahead_s, ahead_comm = time.perf_counter() - start, self._comm_seconds() - comm
            plan = window.popleft()
            if not self.k:
                self._prepare(plan, "input")
            self._prepare(plan, "loss")
            stale = self._stale_fraction(plan)
            comm = self._comm_seconds()
            out = self.step(iter([plan]))
            out.seconds["data"] += ahead_s  # planning inline (sync) or waiting for the worker, rows ahead
            out.extra["t_start"] -= ahead_s
            out.extra.update(stale_fraction=stale, lookup_comm_s=self._comm_seconds() - comm,
                             ahead_comm_s=ahead_comm)
            if self.k:
                self._touched.append(self._updated_rows())
            self.step_index += 1
            yield out

    def _prepare(self, plan: RankPlan, which: str) -> None:
        """Queue the route built ahead for the plan's `which` lookup (input rows or loss rows)."""
        routes = getattr(plan, "routes", None)
        if routes:
            ids, route = routes.pop(which)
            self.tables[0].prepare(ids, route.rebind(self.side, self.tables[0].runtime))

    def _comm_seconds(self) -> float:
        return sum(t.counters.seconds_on_this_thread() for t in self.tables)  # not the worker's route builds

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

