"""Input embeddings shared by every encoder: item, action bitmask and time gap of each token.

token embedding = sqrt(d) * item[id] + action[bitmask] + gap[log2 bucket of seconds since the
user's previous event]   (the sqrt(d) scale follows HSTU's public input preprocessor)

The item table also scores: `item_table()` is the L2-normalised [V, d] table the loss and the
evaluation take dot products with (HSTU public practice: normalised embeddings, temperature).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from grlib.data.schema import N_ACTION_CODES, PAD_ID
from grlib.data.sequences import JaggedBatch
from grlib.ops.attention import time_buckets

N_GAP_BUCKETS = 32  # log2 buckets of the gap in seconds: 2**31 s is beyond any log


def time_gaps(timestamps: Tensor, offsets: Tensor) -> Tensor:
    """[T] seconds -> [T] seconds since the previous event of the same sequence (0 for the first)."""
    prev = torch.cat([timestamps[:1], timestamps[:-1]])  # [T]
    gaps = timestamps - prev
    starts = offsets[:-1][offsets[:-1] < offsets[1:]]  # first token of each non-empty sequence
    gaps[starts] = 0
    return gaps


class Embeddings(nn.Module):
    """[T] ids, actions, timestamps -> [T, d]."""

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
        return (self.items(batch.item_ids) * math.sqrt(self.d) + self.actions(batch.actions)
                + self.gaps(gap))

    def item_table(self) -> Tensor:  # [V, d], L2-normalised rows
        return F.normalize(self.items.weight, dim=-1)

    def item_vectors(self, ids: Tensor) -> Tensor:  # [*] ids -> [*, d], L2-normalised
        return F.normalize(self.items(ids), dim=-1)


def embedding_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The sparse (per-row) tables of a model: its item embedding rows."""
    return [m.items.weight for m in module.modules() if isinstance(m, Embeddings)]
