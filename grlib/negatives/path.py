"""The per-token uniform baseline of the negative path (see grlib.negatives)."""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from grlib.config import NegativesConfig
from grlib.data.schema import FIRST_ITEM_ID
from grlib.data.sequences import JaggedBatch


def sampled_softmax_loss(user: Tensor, items: Tensor, targets: Tensor, negatives: Tensor,
                         temperature: float) -> Tensor:
    """user [P, d], items [V, d] (both normalised), targets [P], negatives [P, R] ids -> scalar.

    A negative equal to the token's own target (an accidental hit) is masked out."""
    if targets.numel() == 0:
        return user.sum() * 0.0
    pos_logit = (user * items[targets]).sum(-1, keepdim=True)  # [P, 1]
    neg_logit = torch.einsum("pd,prd->pr", user, items[negatives])  # [P, R]
    neg_logit = neg_logit.masked_fill(negatives == targets[:, None], -torch.inf)
    logits = torch.cat([pos_logit, neg_logit], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros_like(targets))


class NegativePath:
    """Uniform per-token negatives, sampled on the critical path (the paper's baseline)."""

    def __init__(self, cfg: NegativesConfig, n_items: int, seed: int = 0):
        self.cfg, self.n_items = cfg, n_items
        self.generator = torch.Generator().manual_seed(seed)

    def wrap(self, batches: Iterable[JaggedBatch]) -> Iterator[JaggedBatch]:
        return iter(batches)

    def loss(self, user: Tensor, embed, batch: JaggedBatch) -> Tensor:
        """user [T, d] normalised; embed.item_table() [V, d] normalised; batch.targets [T]."""
        keep = batch.targets > 0
        targets = batch.targets[keep]  # [P]
        negatives = torch.randint(FIRST_ITEM_ID, self.n_items, (targets.numel(), self.cfg.n_negatives),
                                  generator=self.generator)  # [P, R]
        return sampled_softmax_loss(user[keep], embed.item_table(), targets, negatives, self.cfg.temperature)

    def close(self) -> None:
        pass


def build_negative_path(cfg: NegativesConfig, n_items: int, item_counts: np.ndarray | None = None,
                        seed: int = 0) -> NegativePath:
    """The negative path configured by cfg (item_counts: training popularity, for samplers that use it)."""
    if cfg.sampler != "uniform":
        raise NotImplementedError(f"negatives.sampler={cfg.sampler!r} is not implemented yet")
    return NegativePath(cfg, n_items, seed)
