"""Training: a small trainer loop over jagged batches; the loss comes from grlib.negatives."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from grlib.config import NegativesConfig, TrainConfig
from grlib.data.sequences import SequenceData
from grlib.negatives import build_negative_path
from grlib.progress import progress


@dataclass
class TrainResult:
    steps: int = 0
    seconds: float = 0.0
    tokens: int = 0
    losses: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def train(model: nn.Module, data: SequenceData, cfg: TrainConfig, max_len: int,
          negatives: NegativesConfig) -> TrainResult:
    """Adam on every parameter for cfg.epochs (or cfg.max_steps); deterministic per cfg.seed."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    path = build_negative_path(negatives, data.n_items, data.train_item_counts(), seed=cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    model.train()
    result = TrainResult()
    start = time.perf_counter()
    total = cfg.epochs * data.n_train_batches(cfg.batch_size)
    if cfg.max_steps:
        total = min(total, cfg.max_steps)
    batches = (b for _ in range(cfg.epochs) for b in data.train_batches(cfg.batch_size, max_len, rng))
    for batch in progress(path.wrap(batches), desc="train", total=total):
        if result.steps >= total:
            break
        user = model(batch)
        loss = path.loss(user, model.embed, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        result.steps += 1
        result.tokens += batch.item_ids.numel()
        result.losses.append(loss.item())
    path.close()
    result.seconds = time.perf_counter() - start
    model.eval()
    return result
