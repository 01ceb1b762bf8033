"""One training step: data -> forward -> loss -> backward -> optimizer, for one batch.

    step = TrainStep(model, path, Optimizers(model, cfg.train))
    result = step(batches)      # pulls the next batch (timed as `data`); None when there is none
    result.loss, result.seconds["forward"], ...

The trainer (grlib.train.loop), `bench train` and the negatives ablation run this one step (built by
grlib.fit.assemble), so a benchmark times exactly what trains; a data-parallel rank's step
(grlib.distributed.data_parallel.DataParallelStep) is this one with its hooks. What runs for later batches
while a step computes (negatives prepared ahead) is a schedule's business (grlib.train.prefetch).
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

from torch import Tensor, nn

from grlib.jagged import JaggedBatch
from grlib.negatives.path import NegativePath
from grlib.train.optim import Optimizers

PHASES = ("data", "forward", "loss", "backward", "comm", "optimizer")  # comm: gradient all-reduce (0 on one process)


@dataclass
class StepResult:
    batch: JaggedBatch
    loss: float
    grad_norm: float  # before clipping
    lr: float  # the learning rate of the next step (the schedule has stepped)
    seconds: dict[str, float]  # per phase of PHASES
    extra: dict[str, float] = field(default_factory=dict)  # figures of a schedule (e.g. all-reduce wait)

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())


class TrainStep:
    """model (an encoder whose `embed` is the item table), its negative path and its optimizers.

    The phases run here and only here (the one `.backward()` of a training step); a rank of N
    (grlib.distributed.data_parallel.DataParallelStep) overrides the hooks around them: `begin` (the item
    pulled -> the batch to train, a forward context, the loss's weight), `reduce` (the gradients
    summed over ranks) and `figures` (the step's extra figures)."""

    def __init__(self, model: nn.Module, path: NegativePath, opt: Optimizers):
        self.model, self.path, self.opt = model, path, opt

    def begin(self, item) -> tuple[JaggedBatch, AbstractContextManager, float | None]:
        return item, nullcontext(), None

    def reduce(self, loss: Tensor) -> tuple[float, dict[str, float]] | None:
        """None on one process (no comm phase); a rank's (global loss, figures)."""
        return None

    def figures(self, item, t0: float) -> dict[str, float]:
        return {}

    def __call__(self, batches: Iterator) -> StepResult | None:
        t0 = time.perf_counter()
        item = next(batches, None)
        if item is None:
            return None
        batch, context, weight = self.begin(item)
        t1 = time.perf_counter()
        with context:
            user = self.model(batch)  # [T, d]
        t2 = time.perf_counter()
        loss = self.path.loss(user, self.model.embed, batch)
        if weight is not None:
            loss = loss * weight
        t3 = time.perf_counter()
        self.opt.zero_grad()
        loss.backward()
        t4 = time.perf_counter()
        reduced = self.reduce(loss)
        t5 = time.perf_counter()
        grad_norm = self.opt.step()
        t6 = time.perf_counter()
        value, extra = reduced if reduced is not None else (float(loss.detach()), {})
        return StepResult(batch, value, grad_norm, self.opt.lr,
                          {"data": t1 - t0, "forward": t2 - t1, "loss": t3 - t2, "backward": t4 - t3,
                           "comm": t5 - t4 if reduced is not None else 0.0, "optimizer": t6 - t5},
                          extra={**self.figures(item, t0), **extra})
