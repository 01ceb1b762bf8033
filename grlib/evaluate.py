"""Full-ranking evaluation: every item scored, history items masked, no rank cap.

rank = 1 + #(items scoring strictly higher than the target) + #(other items scoring equal)
(ties count against the target, so a constant scorer gets no credit). Items the user has already
interacted with before the target, and the pad / OOV ids, are excluded unless they are the target.
HR@K = [rank <= K], NDCG@K = [rank <= K] / log2(rank + 1), MRR = 1 / rank, averaged over users.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch
from torch import Tensor

from grlib.data.schema import FIRST_ITEM_ID
from grlib.data.sequences import JaggedBatch

KS = (1, 10, 50)


def ranks_from_scores(scores: Tensor, targets: Tensor, history: list[np.ndarray]) -> Tensor:
    """scores [B, V], targets [B], history per row -> ranks [B] (1 = best)."""
    target_scores = scores.gather(1, targets[:, None])  # [B, 1], taken before masking
    scores = scores.clone()
    scores[:, :FIRST_ITEM_ID] = -torch.inf
    for b, seen in enumerate(history):
        if len(seen):
            scores[b, torch.as_tensor(seen)] = -torch.inf
    scores.scatter_(1, targets[:, None], -torch.inf)  # the target is counted apart from the others
    higher = (scores > target_scores).sum(1)
    ties = (scores == target_scores).sum(1)
    return 1 + higher + ties


def metrics_from_ranks(ranks: Tensor) -> dict[str, float]:
    ranks = ranks.to(torch.float64)
    out = {f"hr@{k}": float((ranks <= k).double().mean()) for k in KS}
    for k in (10, 50):
        out[f"ndcg@{k}"] = float(((ranks <= k).double() / torch.log2(ranks + 1)).mean())
    out["mrr"] = float((1.0 / ranks).mean())
    out["users"] = int(ranks.numel())
    return out


@torch.no_grad()
def evaluate(score_fn: Callable[[JaggedBatch], Tensor], batches: Iterable[JaggedBatch]) -> dict[str, float]:
    """score_fn maps a batch to [B, V] scores of the item after each sequence's last token."""
    ranks = []
    for batch in batches:
        ranks.append(ranks_from_scores(score_fn(batch).float(), batch.eval_targets, batch.history))
    return metrics_from_ranks(torch.cat(ranks))


def last_token_scores(model: torch.nn.Module) -> Callable[[JaggedBatch], Tensor]:
    """Scores of a neural encoder: last token's vector . every item vector."""
    def score(batch: JaggedBatch) -> Tensor:
        h = model(batch)  # [T, d]
        last = h[batch.offsets[1:] - 1]  # [B, d] (eval sequences are never empty)
        return last @ model.embed.item_table().T  # [B, V]
    return score


def popularity_scores(counts: np.ndarray) -> Callable[[JaggedBatch], Tensor]:
    table = torch.as_tensor(counts, dtype=torch.float32)
    return lambda batch: table.expand(batch.batch_size, -1)
