"""A rank's communication stream for the row-sharded item table (the `pipelined` schedule).

One thread per rank runs the table's trips in the order they are queued, on process groups of its
own (a side channel, grlib.distributed.topology.side_channel), as a device's communication stream
runs its collectives beside the compute stream. Every rank queues the same trips in the same order,
so the collectives pair up:

    start of step i     rows(input, batch i+k) [if not fetched yet], rows(loss, batch i)
    backward of step i  grads(loss, batch i) as soon as backward produces them (its first op),
                        grads(input, batch i) when backward reaches the embeddings (its last op)
    before the update   the main thread waits for both (the owners' gradients complete)

    stream = CommStream(side_channel(runtime))
    lookup = StreamLookup(stream, table, ids, route)   # the rows' trip queued now
    rows = lookup.rows()        # [N, d] leaf: waits for the trip; its gradient goes back on the stream
    grads = StreamGrads([loss_lookup, input_lookup])   # the order their gradients' trips go out
    ... backward ...
    grads.finish()              # the trips not yet sent (no gradient: zeros), then wait for all

The trips are the table's own (Route.reply and its backward, grlib.distributed.alltoall); the thread
builds their autograd graph and runs its backward, so the owner's shard accumulates the same row
gradients in the same order (loss, then input) as when the main thread's backward runs them.
The rows a trip reads are those of the table when the trip runs: a trip queued at the start of step
i runs after step i-1's update (the main thread queued it then) and before step i's (the update
waits for finish()).
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch
from torch import Tensor


class CommStream:
    """One thread running queued calls in order (FIFO); `waited` sums the seconds the main thread
    spent waiting for the rows of a lookup (the exposed part of the rows' trips)."""

    def __init__(self, runtime: Any):
        self.runtime = runtime  # its groups carry the trips (a side channel's)
        self._pool: ThreadPoolExecutor | None = None  # started by the first submit after close()
        self.waited = 0.0

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grlib-comm-stream")
        return self._pool.submit(fn, *args)

    def result(self, future: Future) -> Any:
        """future's result; the seconds waited count in `waited`."""
        start = time.perf_counter()
        out = future.result()
        self.waited += time.perf_counter() - start
        return out

    def close(self) -> None:
        """Finishes what is queued and stops the thread (a later submit starts another)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _fetch(table, route) -> Tensor:
    """On the stream: the owner's rows for route.ids, sent back along the route ([N, d], a graph to table.weight)."""
    with torch.enable_grad():
        served = table.weight.index_select(0, route.ids - table.start)  # [M, d]
        return route.reply(served)


def _send_back(out: Tensor, grad: Tensor) -> None:
    """On the stream: the rows' gradient back to their owners (the reply's backward; the shard's grad accumulates)."""
    torch.autograd.backward(out, grad)


class StreamLookup:
    """The rows of one lookup fetched on the stream (a collective: every rank makes the same ones)."""

    def __init__(self, stream: CommStream, table, ids: Tensor, route):
        self.stream, self.ids = stream, ids.reshape(-1)  # [N]
        self.future = stream.submit(_fetch, table, route)
        self.out: Tensor | None = None  # the trip's output (graph to the shard), once waited for
        self.leaf: Tensor | None = None  # what the model reads
        self.on_grad: Callable[[Tensor], None] | None = None  # StreamGrads' callback

    def rows(self) -> Tensor:
        """[N, d] a leaf that requires grad: waits for the trip; backward hands its gradient to on_grad."""
        if self.leaf is None:
            self.out = self.stream.result(self.future)
            self.leaf = self.out.detach().requires_grad_()
            self.leaf.register_hook(self._hook)
        return self.leaf

    def _hook(self, grad: Tensor) -> None:
        if self.on_grad is not None:
            self.on_grad(grad)

    def send_back(self, grad: Tensor | None) -> Future:
        """Queues the gradient's trip (zeros where the model read no row or backward gave none)."""
        if self.out is None:  # never read (rows() not called): the trip still pairs with the peers'
            self.out = self.future.result()
        g = torch.zeros_like(self.out) if grad is None else grad
        return self.stream.submit(_send_back, self.out, g)


class StreamGrads:
    """The gradients of one step's lookups, sent back on the stream in a fixed order (the same on every
    rank, whichever hook fires first): lookup j goes once 0..j-1 went and backward gave its gradient."""

    def __init__(self, lookups: list[StreamLookup]):
        self.lookups = lookups
        self.grads: list[Tensor | None] = [None] * len(lookups)
        self.ready = [False] * len(lookups)
        self.sent: list[Future] = []
        for j, lookup in enumerate(lookups):
            lookup.on_grad = self._ready(j)

    def _ready(self, j: int) -> Callable[[Tensor], None]:
        def ready(grad: Tensor) -> None:
            self.grads[j], self.ready[j] = grad, True
            self._send_ready()
        return ready

    def _send_ready(self) -> None:
        while len(self.sent) < len(self.lookups) and self.ready[len(self.sent)]:
            j = len(self.sent)
            self.sent.append(self.lookups[j].send_back(self.grads[j]))

    def finish(self) -> dict[str, float]:
        """After backward: the rest sent (zeros where no gradient came), then every trip waited for.
        -> sent_in_backward (trips queued from backward's hooks), wait_s (seconds waited here)."""
        in_backward = len(self.sent)
        for j in range(len(self.lookups)):
            self.ready[j] = True
            self.lookups[j].on_grad = None
        self._send_ready()
        start = time.perf_counter()
        for future in self.sent:
            future.result()
        return {"stream_grads_in_backward": float(in_backward), "stream_wait_s": time.perf_counter() - start}
