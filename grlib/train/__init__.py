"""Training: a trainer loop over jagged batches; the loss comes from grlib.negatives.

    from grlib.train import train, TrainResult
    result = train(model, data, cfg.train, cfg.data.max_len, cfg.negatives, validate=..., checkpoint_dir=...)

Modules: `step` (the one training step: data, forward, loss, backward, optimizer), `prefetch`
(schedules around the step: sync, or negatives prepared ahead by a worker thread), `loop` (epochs,
timeline, model selection), `optim` (AdamW + lazy row-wise Adam for embeddings, warm-up,
clipping), `checkpoint` (atomic checkpoints, exact resume). A run's schedule is built and trained,
on 1 or N ranks, by grlib.fit (what `python -m grlib train`, grlib.cli.train, runs).
"""
from grlib.train.step import PHASES, StepResult, TrainStep

__all__ = ["PHASES", "StepResult", "TrainResult", "TrainStep", "train"]


def __getattr__(name: str):
    """`train` and `TrainResult` load the loop (and with it polars and the data modules) when first
    named: the step and the optimizers import without them (the device check, grlib.probes.device_check)."""
    if name in ("TrainResult", "train"):
        from grlib.train import loop

        return getattr(loop, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
