"""Full-ranking evaluation: every item scored, no candidate sampling, no rank cap.

rank = 1 + #(items scoring strictly higher than the target) + #(other items scoring equal)
(ties count against the target, so a constant scorer gets no credit). The pad and OOV ids never
compete. HR@K = [rank <= K], NDCG@K = [rank <= K] / log2(rank + 1), MRR = 1 / rank, averaged
over users.

History masking (mask_history=True) removes from the ranking every item the user interacted with
before the target: the MovieLens protocol of SASRec and HSTU, where a user never rates an item
twice. On logs with repeat consumption (KuaiRand) it would reveal the answer: if the target is
one of the history items and the others are removed, ranking history items first puts the
target at rank 1 (a "most recent item" scorer then gets HR@1 = the repeat rate). So masking is
refused for a split where some target repeats a history item: evaluate those without masking
(`repeat_fraction` tells which protocol a split allows).

A row-sharded item table (grlib.distributed.sharded_embedding) scores only its own columns: its score
function returns ShardScores, and each rank counts the items of its columns that beat or tie the
target; summing the counts over ranks gives exactly the rank one process computes, with the
target's score taken from its owner's columns.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from grlib.schema import FIRST_ITEM_ID
from grlib.jagged import JaggedBatch

KS = (1, 10, 50)


def _history_index(history: list[np.ndarray]) -> tuple[Tensor, Tensor]:
    """(row, item) index pairs of every history item, for one scatter."""
    lengths = [len(h) for h in history]
    rows = torch.repeat_interleave(torch.arange(len(history)), torch.tensor(lengths, dtype=torch.int64))
    items = torch.from_numpy(np.concatenate(history).astype(np.int64)) if sum(lengths) else torch.zeros(0, dtype=torch.int64)
    return rows, items


def _masked_history(history: list[np.ndarray], targets: Tensor) -> tuple[Tensor, Tensor]:
    """(row, item) pairs of the history to mask; ValueError when a target is one of its row's history items."""
    rows, items = _history_index(history)
    hit = items == targets[rows]
    if bool(hit.any()):
        b = int(rows[hit][0])
        raise ValueError(f"history masking would reveal the target: row {b}'s target {int(targets[b])} is in "
                         f"its history (repeat consumption); evaluate this split with mask_history=False")
    return rows, items


def ranks_from_scores(scores: Tensor, targets: Tensor, history: list[np.ndarray] | None = None) -> Tensor:
    """scores [B, V], targets [B], history per row (masked when given) -> ranks [B] (1 = best).

    Raises ValueError when history is given and a target is one of its row's history items."""
    target_scores = scores.gather(1, targets[:, None])  # [B, 1], taken before masking
    competing = torch.ones_like(scores, dtype=torch.bool)  # [B, V]
    competing[:, :FIRST_ITEM_ID] = False
    if history is not None:
        rows, items = _masked_history(history, targets)
        competing[rows, items] = False
    competing.scatter_(1, targets[:, None], False)  # the target is counted apart from the others
    higher = ((scores > target_scores) & competing).sum(1)
    ties = ((scores == target_scores) & competing).sum(1)
    return 1 + higher + ties


@dataclass
class ShardScores:
    """One rank's columns [start, start + V_r) of the [B, V] scores, and how to sum over ranks."""

    scores: Tensor  # [B, V_r]
    start: int
    n_items: int  # V
    reduce: Callable[[Tensor], Tensor]  # a tensor summed over every rank (all-reduce)


def ranks_from_shards(shard: ShardScores, targets: Tensor, history: list[np.ndarray] | None = None) -> Tensor:
    """ranks_from_scores over the ranks' columns: the same ranks [B], computed shard by shard."""
    scores, start = shard.scores, shard.start
    B, width = scores.shape
    mine = (targets >= start) & (targets < start + width)  # [B] targets whose column is here
    target_scores = torch.zeros(B, dtype=scores.dtype)
    target_scores[mine] = scores[mine, targets[mine] - start]
    target_scores = shard.reduce(target_scores)[:, None]  # [B, 1]: the owner's value, zeros elsewhere
    competing = torch.ones_like(scores, dtype=torch.bool)  # [B, V_r]
    competing[:, :max(0, min(width, FIRST_ITEM_ID - start))] = False
    if history is not None:
        rows, items = _masked_history(history, targets)
        here = (items >= start) & (items < start + width)
        competing[rows[here], items[here] - start] = False
    competing[mine.nonzero().reshape(-1), targets[mine] - start] = False
    counts = (((scores > target_scores) | (scores == target_scores)) & competing).sum(1)  # [B]
    return 1 + shard.reduce(counts.to(torch.int64))


def metrics_from_ranks(ranks: Tensor) -> dict[str, float]:
    ranks = ranks.to(torch.float64)
    out = {f"hr@{k}": float((ranks <= k).double().mean()) for k in KS}
    for k in (10, 50):
        out[f"ndcg@{k}"] = float(((ranks <= k).double() / torch.log2(ranks + 1)).mean())
    out["mrr"] = float((1.0 / ranks).mean())
    out["users"] = int(ranks.numel())
    return out


@torch.no_grad()
def evaluate(score_fn: Callable[[JaggedBatch], Tensor], batches: Iterable[JaggedBatch],
             mask_history: bool = True) -> dict[str, float]:
    """score_fn maps a batch to [B, V] scores of the item after each sequence's last token (or to a
    ShardScores: this rank's columns; every rank then evaluates the same batches)."""
    ranks = []
    for batch in batches:
        history = batch.history if mask_history else None
        scores = score_fn(batch)
        if isinstance(scores, ShardScores):
            ranks.append(ranks_from_shards(scores, batch.eval_targets, history))
        else:
            ranks.append(ranks_from_scores(scores.float(), batch.eval_targets, history))
    return metrics_from_ranks(torch.cat(ranks))


def repeat_fraction(batches: Iterable[JaggedBatch]) -> float:
    """The share of eval targets that repeat an item of their own history (0 on MovieLens)."""
    repeats, users = 0, 0
    for batch in batches:
        rows, items = _history_index(batch.history)
        hit = torch.zeros(batch.batch_size, dtype=torch.bool)
        hit[rows[items == batch.eval_targets[rows]]] = True
        repeats, users = repeats + int(hit.sum()), users + batch.batch_size
    return repeats / users if users else 0.0


def split_repeat_fraction(data, max_len: int, splits: tuple[str, ...] = ("val", "test"),
                          batch_size: int = 1024) -> float:
    """The largest repeat_fraction over `splits` of a SequenceData: 0.0 means history masking is safe."""
    return max(repeat_fraction(data.eval_batches(s, batch_size, max_len)) for s in splits)


def last_token_scores(model: torch.nn.Module) -> Callable[[JaggedBatch], Tensor]:
    """Scores of a neural encoder: last token's vector . every item vector (model.embed: an ItemTable)."""
    def score(batch: JaggedBatch) -> Tensor:
        h = model(batch)  # [T, d]
        last = h[batch.offsets[1:] - 1]  # [B, d] (eval sequences are never empty)
        return model.embed.score_all(last)  # [B, V]
    return score


def popularity_scores(counts: np.ndarray) -> Callable[[JaggedBatch], Tensor]:
    table = torch.as_tensor(counts, dtype=torch.float32)
    return lambda batch: table.expand(batch.batch_size, -1)
