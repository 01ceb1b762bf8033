"""One training step: data -> forward -> loss -> backward -> optimizer, for one batch.

    step = TrainStep(model, path, Optimizers(model, cfg.train))
    result = step(batches)      # pulls the next batch (timed as `data`); None when there is none
    result.loss, result.seconds["forward"], ...

The trainer (grlib.train.loop), `bench train` and the negatives ablation run this one step, so a
benchmark times exactly what trains. What runs for later batches while a step computes (negatives
prepared ahead) is a schedule's business (grlib.train.prefetch).
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from torch import nn

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
    """model (an encoder whose `embed` is the item table), its negative path and its optimizers."""

    def __init__(self, model: nn.Module, path: NegativePath, opt: Optimizers):
        self.model, self.path, self.opt = model, path, opt

    def __call__(self, batches: Iterator[JaggedBatch]) -> StepResult | None:
        t0 = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            return None
        t1 = time.perf_counter()
        user = self.model(batch)  # [T, d]
        t2 = time.perf_counter()
        loss = self.path.loss(user, self.model.embed, batch)
        t3 = time.perf_counter()
        self.opt.zero_grad()
        loss.backward()
        t4 = time.perf_counter()
        grad_norm = self.opt.step()
        t5 = time.perf_counter()
        return StepResult(batch, float(loss.detach()), grad_norm, self.opt.lr,
                          {"data": t1 - t0, "forward": t2 - t1, "loss": t3 - t2, "backward": t4 - t3,
                           "comm": 0.0, "optimizer": t5 - t4})
