"""Schedules around the one training step (grlib.train.step): what runs for later batches while a
step computes. The seed of the pipeline schedules.

    sync       SyncSchedule: each batch's negatives are drawn inside its step, on the critical path
    prefetch   PrefetchSchedule: a background worker prepares the next `depth` batches' negatives
               (NegativePath.prepare attaches each sample to its batch) while step i computes

    worker thread:  batch_{i+1} = next(batches);  prepare(batch_{i+1})  ──▶ queue (bounded)
    training loop:  batch_i = queue.get()  ──▶ data / forward / loss / backward / optimizer

    schedule = build_schedule(TrainStep(model, path, opt), cfg.negatives)
    with contextlib.closing(schedule.run(batches)) as steps:
        for result in steps: ...                # one StepResult per batch

The queue holds at most `depth` prepared items, so the worker runs at most `depth` steps ahead and
host memory stays bounded. An exception in the worker (in `prepare` or in the batch iterator) is
handed through the queue and raised in the training loop as PrefetchError (the original exception
chained as its cause). Closing the steps (or PrefetchWorker.close(), or leaving its `with` block)
stops the worker and joins its thread; nothing is left running. The worker prepares ids only, never
embedding values (see grlib.negatives.path for the staleness choice).
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Generic, TypeVar

from torch import nn

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
    """The prefetch worker failed; the cause holds the worker's exception."""


class _Failure:
    def __init__(self, exc: BaseException, index: int):
        self.exc, self.index = exc, index


class PrefetchWorker(Generic[B, S]):
    """Yields (item, fn(item)) for the items of `source`, computed `depth` items ahead in a thread."""

    def __init__(self, source: Iterable[B], fn: Callable[[B], S], depth: int = 2, name: str = "grlib-prefetch"):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._source, self._fn, self.name = source, fn, name
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _put(self, item: object) -> bool:
        """Blocks until there is room (no polling: a worker that wakes every few ms to retry takes
        the GIL and a core from the training threads). close() drains the queue, which unblocks it."""
        if self._stop.is_set():
            return False
        self._queue.put(item)
        return not self._stop.is_set()

    def _run(self) -> None:
        index = 0
        try:
            for item in self._source:
                if self._stop.is_set() or not self._put((item, self._fn(item))):
                    return
                index += 1
            self._put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, never swallowed
            self._put(_Failure(exc, index))

    def __iter__(self) -> Iterator[tuple[B, S]]:
        return self

    def __next__(self) -> tuple[B, S]:
        if self._finished:
            raise StopIteration
        while True:
            try:
                got = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
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
        return got

    def _drain(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout: float = 30.0) -> None:
        """Stops the worker and joins it (idempotent). Raises if it does not stop within `timeout`."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            deadline = time.monotonic() + timeout
            while self._thread.is_alive() and time.monotonic() < deadline:
                self._drain()  # unblock a worker waiting on a full queue (it puts at most once more)
                self._thread.join(_POLL_S)
            if self._thread.is_alive():
                raise PrefetchError(f"the {self.name} worker did not stop within {timeout} s")
        self._finished = True

    def __enter__(self) -> "PrefetchWorker[B, S]":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SyncSchedule:
    """One step per batch, nothing ahead: the step's loss draws the batch's negatives."""

    world, rank = 1, 0  # one process (grlib.distributed.schedules.Schedule: a rank of N)

    def __init__(self, step: TrainStep):
        self.step = step

    def run(self, batches: Iterable[JaggedBatch]) -> Generator[StepResult, None, None]:
        feed = iter(batches)
        while (result := self.step(feed)) is not None:
            yield result


class PrefetchSchedule(SyncSchedule):
    """One step per batch, the next `depth` batches' negatives prepared by a worker thread."""

    def __init__(self, step: TrainStep, depth: int):
        super().__init__(step)
        self.depth = depth

    def run(self, batches: Iterable[JaggedBatch]) -> Generator[StepResult, None, None]:
        with PrefetchWorker(batches, self.step.path.prepare, depth=self.depth) as worker:
            feed = (batch for batch, _ in worker)
            while (result := self.step(feed)) is not None:
                yield result


def build_schedule(step: TrainStep, negatives: NegativesConfig) -> SyncSchedule:
    """PrefetchSchedule when negatives.async_sampling (queue_depth ahead), else SyncSchedule."""
    return PrefetchSchedule(step, negatives.queue_depth) if negatives.async_sampling else SyncSchedule(step)


def one_process(model: nn.Module, n_items: int, item_counts, cfg: TrainConfig, negatives: NegativesConfig,
                seed: int | None = None) -> SyncSchedule:
    """The schedule of one process's training: the negative path (seeded with `seed`, default
    cfg.seed), the optimizers and the step around `model`, under negatives.async_sampling's schedule.
    (grlib.fit.assemble builds it, or a rank's of N.)"""
    path = build_negative_path(negatives, n_items, item_counts, seed=cfg.seed if seed is None else seed)
    return build_schedule(TrainStep(model, path, Optimizers(model, cfg)), negatives)
