"""Asynchronous offload: a background worker prepares step i+1 while step i computes.

    worker thread:  batch_{i+1} = next(batches);  sample_{i+1} = fn(batch_{i+1})  ──▶ queue (bounded)
    training loop:  batch_i, sample_i = queue.get()  ──▶ forward / loss / backward / optimizer

The queue holds at most `depth` prepared items, so the worker runs at most `depth` steps ahead and
host memory stays bounded. An exception in the worker (in `fn` or in the batch iterator) is handed
through the queue and raised in the training loop as NegativeSamplerError (the original exception
chained as its cause). `close()` (or leaving the `with` block, or dropping the iterator) stops the
worker and joins its thread; nothing is left running.

What the worker does is up to `fn`: in grlib.negatives it selects the valid tokens and draws the
negative ids, never the embedding values (see path.py for the staleness choice).
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

B = TypeVar("B")
S = TypeVar("S")

_DONE = object()
_POLL_S = 0.05


class NegativeSamplerError(RuntimeError):
    """The background sampler failed; the cause holds the worker's exception."""


class _Failure:
    def __init__(self, exc: BaseException, index: int):
        self.exc, self.index = exc, index


class PrefetchWorker(Generic[B, S]):
    """Yields (item, fn(item)) for the items of `source`, computed `depth` items ahead in a thread."""

    def __init__(self, source: Iterable[B], fn: Callable[[B], S], depth: int = 2, name: str = "grlib-negatives"):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._source, self._fn = source, fn
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
                    raise NegativeSamplerError("the negative sampler worker stopped without a result") from None
        if got is _DONE:
            self._finished = True
            raise StopIteration
        if isinstance(got, _Failure):
            self._finished = True
            self.close()
            raise NegativeSamplerError(
                f"the negative sampler worker failed on batch {got.index}: {type(got.exc).__name__}: {got.exc}"
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
                raise NegativeSamplerError(f"the negative sampler worker did not stop within {timeout} s")
        self._finished = True

    def __enter__(self) -> "PrefetchWorker[B, S]":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
