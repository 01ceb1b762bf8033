"""Schedules around the one training step (grlib.train.step): what runs for later batches while a
step computes, and PrefetchWorker, the one worker thread of every schedule that runs ahead (one
process's here, a rank of N's in grlib.distributed.schedules).

    sync       SyncSchedule: each batch's negatives are drawn inside its step, on the critical path
    prefetch   PrefetchSchedule: a background worker prepares the next `depth` batches' negatives
               (NegativePath.prepare attaches each sample to its batch) while step i computes

Both are the one-process classes of the registered schedules (grlib.schedules) of those names;
negatives.async_sampling picks one (grlib.schedules.ONE_PROCESS).

    worker thread:  wait until item j - depth was taken;  item_j = next(source);  fn(item_j)  ──▶ queue
    training loop:  (item_i, fn(item_i)) = next(worker)  ──▶ data / forward / loss / backward / optimizer

    schedule = build_schedule(TrainStep(model, path, opt), cfg.negatives)
    with contextlib.closing(schedule.run(batches)) as steps:
        for result in steps: ...                # one StepResult per batch

The worker runs in lockstep with its consumer: it starts item j only once item j - depth has been
taken, so at most `depth` items are started beyond those taken (host memory stays bounded), and
close() lets it finish exactly the items it was allowed to start, then joins it. Under N ranks that
makes every rank's worker join the same collectives (a worker's fn may run some), so none waits for
a peer that stopped. An exception in the worker (in `fn` or in the source) is handed to the consumer
and raised there as PrefetchError (the original exception chained as its cause). Closing the steps
(or PrefetchWorker.close(), or leaving its `with` block) stops the worker and joins its thread;
nothing is left running. The one-process worker prepares ids only, never embedding values (see
grlib.negatives.path for the staleness choice).
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Generic, TypeVar

from torch import nn

from grlib import schedules
from grlib.config import NegativesConfig, TrainConfig
from grlib.jagged import JaggedBatch
from grlib.negatives import build_negative_path
from grlib.train.optim import Optimizers
from grlib.train.step import StepResult, TrainStep

B = TypeVar("B")
S = TypeVar("S")

_DONE = object()
_POLL_S = 0.05


class PrefetchError(RuntimeError):
    """The worker failed, or stopped without a result; the cause holds the worker's exception."""


class _Failure:
    def __init__(self, exc: BaseException, index: int):
        self.exc, self.index = exc, index


class PrefetchWorker(Generic[B, S]):
    """Yields (item, fn(item)) for the items of `source`, computed in a thread at most `depth` items
    beyond those taken. close() lets it finish the items it was allowed to start, then joins it."""

    def __init__(self, source: Iterable[B], fn: Callable[[B], S], depth: int = 2, name: str = "grlib-prefetch"):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._source, self._fn, self.name = iter(source), fn, name
        self._allowed, self._closing, self._finished = depth, False, False
        self._cond = threading.Condition()  # the worker waits on it (no polling: a worker that wakes
        self._out: queue.Queue = queue.Queue()  # every few ms takes the GIL and a core from training)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        index = 0
        try:
            while True:
                with self._cond:
                    while index >= self._allowed and not self._closing:
                        self._cond.wait()
                    if index >= self._allowed:
                        return  # closing: every item it was allowed is done
                item = next(self._source, _DONE)
                if item is _DONE:
                    break
                self._out.put((item, self._fn(item)))
                index += 1
            self._out.put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, never swallowed
            self._out.put(_Failure(exc, index))

    def __iter__(self) -> Iterator[tuple[B, S]]:
        return self

    def __next__(self) -> tuple[B, S]:
        if self._finished:
            raise StopIteration
        while True:
            try:
                got = self._out.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._out.empty():
                    self._finished = True
                    raise PrefetchError(f"the {self.name} worker stopped without a result") from None
        if got is _DONE:
            self._finished = True
            raise StopIteration
        if isinstance(got, _Failure):
            self._finished = True
            self.close()
            raise PrefetchError(
                f"the {self.name} worker failed on batch {got.index}: {type(got.exc).__name__}: {got.exc}"
            ) from got.exc
        with self._cond:
            self._allowed += 1
            self._cond.notify()
        return got

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout: float = 600.0) -> None:
        """Lets the worker finish what it was allowed, joins it (idempotent). Raises PrefetchError
        if it does not stop within `timeout`."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise PrefetchError(f"the {self.name} worker did not stop within {timeout} s")
        self._finished = True

    def __enter__(self) -> "PrefetchWorker[B, S]":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SyncSchedule:
    """One step per batch, nothing ahead: the step's loss draws the batch's negatives. The base of
    the schedule family (each names its entry in grlib.schedules): PrefetchSchedule here, a rank's
    grlib.distributed.schedules.RankSchedule. A one-process class names its schedule with
    `process=NAME` (a Spec with one_process=True)."""

    world, rank = 1, 0  # one process (grlib.distributed.schedules.RankSchedule: a rank of N)
    one_process_classes: dict[str, type] = {}  # schedule name -> its one-process class

    def __init_subclass__(cls, process: str | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if process is not None:  # its Spec is checked when a run asks for it (build_schedule)
            SyncSchedule.one_process_classes[process] = cls

    def __init__(self, step: TrainStep):
        self.step = step

    @classmethod
    def of(cls, step: TrainStep, negatives: NegativesConfig) -> "SyncSchedule":
        """The one-process schedule around `step` under `negatives` (its queue depth)."""
        return cls(step)

    def run(self, batches: Iterable[JaggedBatch]) -> Generator[StepResult, None, None]:
        feed = iter(batches)
        while (result := self.step(feed)) is not None:
            yield result


SyncSchedule.one_process_classes[schedules.SYNC] = SyncSchedule


class PrefetchSchedule(SyncSchedule, process=schedules.PREFETCH):
    """One step per batch, the next `depth` batches' negatives prepared by a worker thread."""

    def __init__(self, step: TrainStep, depth: int):
        super().__init__(step)
        self.depth = depth

    @classmethod
    def of(cls, step: TrainStep, negatives: NegativesConfig) -> "PrefetchSchedule":
        return cls(step, negatives.queue_depth)

    def run(self, batches: Iterable[JaggedBatch]) -> Generator[StepResult, None, None]:
        with PrefetchWorker(batches, self.step.path.prepare, depth=self.depth) as worker:
            feed = (batch for batch, _ in worker)
            while (result := self.step(feed)) is not None:
                yield result


def build_schedule(step: TrainStep, negatives: NegativesConfig) -> SyncSchedule:
    """The registered one-process schedule (grlib.schedules) of negatives.async_sampling: prefetch's
    PrefetchSchedule (queue_depth ahead), else sync's SyncSchedule."""
    spec = schedules.get(schedules.ONE_PROCESS[negatives.async_sampling])
    return spec.class_in(SyncSchedule.one_process_classes, "one-process SyncSchedule").of(step, negatives)


def one_process(model: nn.Module, n_items: int, item_counts, cfg: TrainConfig, negatives: NegativesConfig,
                seed: int | None = None) -> SyncSchedule:
    """The schedule of one process's training: the negative path (seeded with `seed`, default
    cfg.seed), the optimizers and the step around `model`, under negatives.async_sampling's schedule.
    (grlib.fit.assemble builds it, or a rank's of N.)"""
    path = build_negative_path(negatives, n_items, item_counts, seed=cfg.seed if seed is None else seed)
    return build_schedule(TrainStep(model, path, Optimizers(model, cfg)), negatives)
