"""Input embeddings shared by every encoder: item, action bitmask and time gap of each token.

token embedding = sqrt(d) * item[id] + action[bitmask] + gap[log2 bucket of seconds since the
user's previous event]   (the sqrt(d) scale follows HSTU's public input preprocessor); one op,
grlib.ops.embedding_sum (the compiled kernel on CPU: one pass over the tokens each way), over the
local item table, or over the item rows already looked up (rows looked up ahead, a row-sharded
table's lookup) as a table of T rows that token t reads row t of

The item table also scores (HSTU public practice: L2-normalised embeddings, temperature). The loss
and the evaluation reach it only through the ItemTable interface, the seam where a row-sharded
table plugs in:

    lookup(ids)         [N] distinct ids -> [N, d] their L2-normalised rows (differentiable); only
                        these rows are normalised (the loss looks each row up once per step,
                        grlib.negatives.path)
    score_all(user)     [B, d] -> [B, V] dot products with every normalised row (full ranking); a
                        row-sharded table (grlib.distributed.sharded_embedding) replaces `items` and
                        returns its own columns (grlib.evaluate.ShardScores)
    sparse_parameters() the row-wise tables (lazy Adam, grlib.train.optim)
"""
from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from grlib import ops
from grlib.schema import N_ACTION_CODES, PAD_ID
from grlib.jagged import JaggedBatch
from grlib.ops.attention import time_buckets

ITEM_ROWS = "item_rows"  # batch.attachments key: the batch's item rows [T, d] looked up ahead (grlib.distributed.schedules)
N_GAP_BUCKETS = 32  # log2 buckets of the gap in seconds: 2**31 s is beyond any log


def time_gaps(timestamps: Tensor, offsets: Tensor) -> Tensor:
    """[T] seconds -> [T] seconds since the previous event of the same sequence (0 for the first)."""
    prev = torch.cat([timestamps[:1], timestamps[:-1]])  # [T]
    gaps = timestamps - prev
    starts = offsets[:-1][offsets[:-1] < offsets[1:]]  # first token of each non-empty sequence
    gaps[starts] = 0
    return gaps


@runtime_checkable
class ItemTable(Protocol):
    """The item embeddings as the loss and the evaluation see them (module doc)."""

    def lookup(self, ids: Tensor) -> Tensor: ...  # [N] -> [N, d], L2-normalised rows

    def score_all(self, user: Tensor) -> Tensor: ...  # [B, d] -> [B, V]

    def sparse_parameters(self) -> list[nn.Parameter]: ...


class Embeddings(nn.Module):
    """[T] ids, actions, timestamps -> [T, d]; the item table behind ItemTable."""

    def __init__(self, n_items: int, d: int):
        super().__init__()
        self.d = d
        self.items = nn.Embedding(n_items, d, padding_idx=PAD_ID)
        self.actions = nn.Embedding(N_ACTION_CODES, d)
        self.gaps = nn.Embedding(N_GAP_BUCKETS, d)
        for table in (self.items, self.actions, self.gaps):
            nn.init.trunc_normal_(table.weight, std=0.02, a=-0.04, b=0.04)
        with torch.no_grad():
            self.items.weight[PAD_ID].zero_()

    def forward(self, batch: JaggedBatch) -> Tensor:  # -> [T, d]
        gap = time_buckets(time_gaps(batch.timestamps, batch.offsets), N_GAP_BUCKETS)
        rows = batch.attachments.get(ITEM_ROWS)  # looked up ahead (a semi-synchronous schedule), else now
        if rows is None and isinstance(self.items, nn.Embedding):  # the three lookups and the sum in one op
            return ops.embedding_sum(self.items.weight, self.actions.weight, self.gaps.weight, batch.item_ids,
                                     batch.actions, gap, math.sqrt(self.d), self.items.padding_idx)
        if rows is None:  # a row-sharded table: its lookup, then the same op over the looked-up rows
            rows = self.items(batch.item_ids)  # [T, d]
        tokens = torch.arange(rows.shape[0], device=rows.device)  # token t reads row t of `rows`
        return ops.embedding_sum(rows, self.actions.weight, self.gaps.weight, tokens, batch.actions, gap,
                                 math.sqrt(self.d))

    def lookup(self, ids: Tensor) -> Tensor:  # [N] ids -> [N, d], L2-normalised
        return F.normalize(self.items(ids), dim=-1)

    def score_all(self, user: Tensor) -> Tensor:  # [B, d] -> [B, V] (a sharded table: its own columns)
        if not isinstance(self.items, nn.Embedding):  # a row-sharded table (grlib.distributed.sharded_embedding)
            return self.items.score(user)
        return user @ F.normalize(self.items.weight, dim=-1).T

    def sparse_parameters(self) -> list[nn.Parameter]:
        return [self.items.weight]


def embedding_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The sparse (per-row) tables of a model: those of its item tables."""
    return [p for m in module.modules() if isinstance(m, ItemTable) for p in m.sparse_parameters()]
