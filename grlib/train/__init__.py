"""Training: a trainer loop over jagged batches; the loss comes from grlib.negatives.

    from grlib.train import train, TrainResult
    result = train(model, data, cfg.train, cfg.data.max_len, cfg.negatives, validate=..., checkpoint_dir=...)

Modules: `loop` (the loop, timeline, model selection), `optim` (AdamW + lazy row-wise Adam for
embeddings, warm-up, clipping), `checkpoint` (atomic checkpoints, exact resume), `cli`
(`python -m grlib train`).
"""
from grlib.train.loop import PHASES, TrainResult, train

__all__ = ["PHASES", "TrainResult", "train"]
