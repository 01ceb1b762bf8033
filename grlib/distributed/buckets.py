"""The dense gradients all-reduced in buckets while backward still runs (the `overlap` schedule).

    buckets  the dense parameters in reverse registration order (about the order backward produces
             their gradients), cut into runs of at most bucket_bytes (torch DDP's bucket_cap_mb, 25 MiB)
    backward: each parameter's post-accumulate-grad hook marks it ready; when every parameter of
             bucket b is ready and buckets 0..b-1 are launched, bucket b's flat copy goes out with
             dist.all_reduce(async_op=True) (gloo's own threads move it while backward goes on)
    reduce:  (after backward) the buckets not yet launched go out, in bucket order, zeros for the
             parameters this rank gave no gradient; one small all-reduce of the got-a-gradient flags
             and the loss; wait on every bucket; p.grad <- the summed slice, None where no rank gave one

Every rank launches the buckets in the same order (bucket b only after b-1), so the collectives
pair up across ranks even when a rank's hooks fire in another order or a parameter got no gradient
on some rank (its bucket, and those after it, then wait for reduce). The sums are SUM over ranks of
gradients of loss * P_local / P_global (the weighting is applied to the loss before backward, by
grlib.train.step.TrainStep), so the result is GradientSync's up to float summation order.

Why hooks of our own and not torch's DistributedDataParallel: DDP averages (divides by the world
size) where grlib's loss weighting needs a plain SUM of the per-rank weighted gradients (a comm hook
could undo that), but DDP also writes a zero gradient into every parameter that no rank used
(find_unused_parameters) where grlib keeps None, as one process does (so AdamW skips it, and
weight decay does not move it); and it wraps the model's forward, which grlib.train.step runs
itself. The hooks are a few dozen lines and keep both rules; the row-sharded item tables stay out
of the buckets (their owners hold their whole gradient; grlib.distributed.sharded_embedding).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import Tensor, nn

BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb (25 MiB)


def bucket_layout(params: list[nn.Parameter], bucket_bytes: int) -> list[list[int]]:
    """Indices of `params` per bucket: reverse order, one dtype per bucket, at most bucket_bytes each
    (a parameter larger than that is a bucket of its own)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    buckets: list[list[int]] = []
    size, dtype = 0, None
    for i in reversed(range(len(params))):
        p = params[i]
        nbytes = p.numel() * p.element_size()
        if not buckets or p.dtype != dtype or size + nbytes > bucket_bytes:
            buckets.append([])
            size, dtype = 0, p.dtype
        buckets[-1].append(i)
        size += nbytes
    return buckets


class BucketedSync:
    """SUM all-reduce of `params`' gradients in buckets launched from backward's hooks, plus the loss
    and which parameters got a gradient (a parameter no rank gave one keeps None).

        sync = BucketedSync(params, bucket_bytes, group)
        sync.arm()                  # before backward: this step's hooks count
        loss.backward()             # buckets go out as their parameters' gradients are produced
        global_loss, figures = sync(loss)   # the rest out, flags + loss, wait, gradients in place
    """

    def __init__(self, params: list[nn.Parameter], bucket_bytes: int = BUCKET_BYTES, group=None):
        if not params:
            raise ValueError("BucketedSync needs at least one parameter")
        self.params, self.group = params, group
        self.buckets = bucket_layout(params, bucket_bytes)
        self.bucket_of = {i: b for b, idx in enumerate(self.buckets) for i in idx}
        self.hooks = [p.register_post_accumulate_grad_hook(self._hook(i)) for i, p in enumerate(params)]
        self.armed = False
        self._reset()

    def _reset(self) -> None:
        self.missing = [len(idx) for idx in self.buckets]  # parameters of each bucket not ready yet
        self.next = 0  # the next bucket to launch (launched strictly in bucket order)
        self.flats: list[Tensor] = []
        self.works: list = []
        self.launched_at: list[float] = []

    def arm(self) -> None:
        """Start counting this step's gradients (hooks outside an armed step do nothing)."""
        if self.works and self.next < len(self.buckets):
            raise RuntimeError("BucketedSync.arm: the previous step's buckets were not reduced")
        self._reset()
        self.armed = True

    def _hook(self, i: int):
        def ready(_: Tensor) -> None:
            if self.armed:
                b = self.bucket_of[i]
                self.missing[b] -= 1
                self._launch_ready()
        return ready

    def _launch_ready(self) -> None:
        while self.next < len(self.buckets) and self.missing[self.next] == 0:
            self._launch(self.next)

    def _launch(self, b: int) -> None:
        grads = [self.params[i].grad for i in self.buckets[b]]
        flat = torch.cat([(g if g is not None else torch.zeros_like(self.params[i])).reshape(-1)
                          for i, g in zip(self.buckets[b], grads)])  # [sum of numel]
        self.flats.append(flat)
        self.works.append(dist.all_reduce(flat, group=self.group, async_op=True))
        self.launched_at.append(time.perf_counter())
        self.next += 1

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []

    def __call__(self, loss: Tensor) -> tuple[float, dict[str, float]]:
        """After backward -> (global loss, figures): allreduce_s (seconds here, from the end of backward
        to the gradients in place: the exposed communication), buckets, buckets_in_backward (launched
        before backward ended), buckets_done_in_backward (already summed when it ended)."""
        if not self.armed:
            raise RuntimeError("BucketedSync: arm() before backward")
        end = time.perf_counter()
        in_backward = self.next
        done = sum(w.is_completed() for w in self.works)
        self.armed = False
        while self.next < len(self.buckets):
            self._launch(self.next)
        flags = torch.tensor([p.grad is not None for p in self.params] + [0.0], dtype=torch.float32)  # [n + 1]
        flags[-1] = float(loss.detach())
        dist.all_reduce(flags, group=self.group)
        for work in self.works:
            work.wait()
        for idx, flat in zip(self.buckets, self.flats):
            at = 0
            for i in idx:
                p = self.params[i]
                p.grad = flat[at:at + p.numel()].view_as(p) if flags[i] > 0 else None
                at += p.numel()
        return float(flags[-1]), {"allreduce_s": time.perf_counter() - end, "buckets": float(len(self.buckets)),
                                  "buckets_in_backward": float(in_backward),
                                  "buckets_done_in_backward": float(done),
                                  "first_launch_lead_s": end - self.launched_at[0] if in_backward else 0.0}
