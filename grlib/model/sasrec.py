"""SASRec (Kang & McAuley, ICDM 2018): causal softmax self-attention, the baseline of HSTU's paper.

Same input embeddings, loss and evaluation as HSTU; learned absolute positions; pre-norm
Transformer blocks with a point-wise feed-forward of width d (as in the original SASRec). Runs
on padded [B, N, d] tensors (torch's fused attention), converted from and back to jagged.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from grlib import ops
from grlib.config import ModelConfig
from grlib.jagged import JaggedBatch
from grlib.model.embeddings import Embeddings

FFN_MULT = 1  # point-wise feed-forward width = FFN_MULT * d (SASRec: d)


class SASRec(nn.Module):
    def __init__(self, cfg: ModelConfig, n_items: int, max_len: int):
        super().__init__()
        self.cfg, self.max_len = cfg, max_len
        self.embed = Embeddings(n_items, cfg.d_model)
        self.positions = nn.Embedding(max_len, cfg.d_model)
        nn.init.trunc_normal_(self.positions.weight, std=0.02, a=-0.04, b=0.04)
        layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, FFN_MULT * cfg.d_model, cfg.dropout,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, batch: JaggedBatch) -> Tensor:  # -> [T, d], L2-normalised
        offsets, N, T = batch.offsets, batch.max_len, batch.item_ids.numel()
        if N > self.max_len:
            raise ValueError(f"batch.max_len={N} exceeds the model's positions ({self.max_len})")
        lengths = offsets[1:] - offsets[:-1]  # [B]
        pos = torch.arange(T) - torch.repeat_interleave(offsets[:-1], lengths)  # [T]
        x = self.dropout(self.embed(batch) + self.positions(pos))  # [T, d]
        xp = ops.jagged_to_padded(x, offsets, N)  # [B, N, d]
        causal = torch.triu(torch.ones(N, N, dtype=torch.bool), diagonal=1)  # True = masked
        pad = torch.arange(N)[None, :] >= lengths[:, None]  # [B, N]
        pad[:, 0] = False  # an all-masked row gives NaN; row 0 of an empty sequence is never read
        y = self.encoder(xp, mask=causal, src_key_padding_mask=pad, is_causal=True)  # [B, N, d]
        return F.normalize(self.norm(ops.padded_to_jagged(y, offsets, T)), dim=-1)
