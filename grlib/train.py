"""Training: sampled-softmax loss and a small trainer loop over jagged batches.

Loss (HSTU public practice): L2-normalised user and item vectors, dot product / temperature,
one positive and `n_negatives` uniform negatives per target token; a negative equal to the
token's positive (an accidental hit) is masked out.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from grlib.config import TrainConfig
from grlib.data.schema import FIRST_ITEM_ID
from grlib.data.sequences import SequenceData
from grlib.progress import progress


def sampled_softmax_loss(user: Tensor, items: Tensor, targets: Tensor, n_negatives: int,
                         temperature: float, generator: torch.Generator | None = None) -> Tensor:
    """user [T, d] (normalised), items [V, d] (normalised), targets [T] (0 = no target) -> scalar."""
    keep = targets > 0
    u, pos = user[keep], targets[keep]  # [P, d], [P]
    if pos.numel() == 0:
        return user.sum() * 0.0
    neg = torch.randint(FIRST_ITEM_ID, items.shape[0], (pos.numel(), n_negatives), generator=generator)
    pos_logit = (u * items[pos]).sum(-1, keepdim=True)  # [P, 1]
    neg_logit = torch.einsum("pd,prd->pr", u, items[neg])  # [P, R]
    neg_logit = neg_logit.masked_fill(neg == pos[:, None], -torch.inf)  # accidental hits
    logits = torch.cat([pos_logit, neg_logit], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros_like(pos))


@dataclass
class TrainResult:
    steps: int = 0
    seconds: float = 0.0
    tokens: int = 0
    losses: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def train(model: nn.Module, data: SequenceData, cfg: TrainConfig, max_len: int) -> TrainResult:
    """Adam on every parameter for cfg.epochs (or cfg.max_steps); deterministic per cfg.seed."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    model.train()
    result = TrainResult()
    start = time.perf_counter()
    total = cfg.epochs * data.n_train_batches(cfg.batch_size)
    if cfg.max_steps:
        total = min(total, cfg.max_steps)
    batches = (b for _ in range(cfg.epochs) for b in data.train_batches(cfg.batch_size, max_len, rng))
    for batch in progress(batches, desc="train", total=total):
        if result.steps >= total:
            break
        user = model(batch)
        loss = sampled_softmax_loss(user, model.embed.item_table(), batch.targets, cfg.n_negatives,
                                    cfg.temperature, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        result.steps += 1
        result.tokens += batch.item_ids.numel()
        result.losses.append(loss.item())
    result.seconds = time.perf_counter() - start
    model.eval()
    return result
