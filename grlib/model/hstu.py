"""HSTU (Zhai et al., ICML 2024) and SASRec encoders on jagged batches, plus shared embeddings.

HSTU layer (pointwise SiLU attention, no softmax):
    U, V, Q, K = split(SiLU(W1 . LayerNorm(X)))
    A = hstu_attention(Q, K, V)                    # grlib.ops: causal, relative pos/time bias, / max_len
    Y = X + Dropout(W2 . (LayerNorm(A) * U))

Every encoder maps a JaggedBatch to one L2-normalised vector per token ([T, d]); scoring is a dot
product with L2-normalised item embeddings divided by a temperature (grlib.train.loss).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from grlib import ops
from grlib.config import ModelConfig
from grlib.data.schema import N_ACTION_CODES, PAD_ID
from grlib.data.sequences import JaggedBatch

N_POS_BUCKETS = 128
N_TIME_BUCKETS = 32


class Embeddings(nn.Module):
    """Item + action-bitmask embeddings of each input token ([T] ids -> [T, d])."""

    def __init__(self, n_items: int, d: int):
        super().__init__()
        self.items = nn.Embedding(n_items, d, padding_idx=PAD_ID)
        self.actions = nn.Embedding(N_ACTION_CODES, d)
        nn.init.normal_(self.items.weight, std=0.02)
        nn.init.normal_(self.actions.weight, std=0.02)

    def forward(self, batch: JaggedBatch) -> Tensor:
        return self.items(batch.item_ids) + self.actions(batch.actions)

    def item_table(self) -> Tensor:  # [n_items, d], L2-normalised
        return F.normalize(self.items.weight, dim=-1)


class HSTULayer(nn.Module):
    def __init__(self, d: int, n_heads: int, dropout: float, attention_impl: str):
        super().__init__()
        self.n_heads, self.dh, self.impl = n_heads, d // n_heads, attention_impl
        self.norm_in = nn.LayerNorm(d)
        self.uvqk = nn.Linear(d, 4 * d)
        self.norm_attn = nn.LayerNorm(d)
        self.out = nn.Linear(d, d)
        self.dropout = nn.Dropout(dropout)
        self.pos_bias = nn.Parameter(torch.zeros(n_heads, N_POS_BUCKETS))
        self.time_bias = nn.Parameter(torch.zeros(n_heads, N_TIME_BUCKETS))

    def forward(self, x: Tensor, batch: JaggedBatch) -> Tensor:  # x [T, d]
        T = x.shape[0]
        u, v, q, k = F.silu(self.uvqk(self.norm_in(x))).chunk(4, dim=-1)  # 4 x [T, d]
        shape = (T, self.n_heads, self.dh)
        attn = ops.hstu_attention(q.reshape(shape), k.reshape(shape), v.reshape(shape), batch.offsets,
                                  batch.max_len, pos_bias=self.pos_bias, time_bias=self.time_bias,
                                  timestamps=batch.timestamps, impl=self.impl)  # [T, H, dh]
        y = self.norm_attn(attn.reshape(T, -1)) * u
        return x + self.dropout(self.out(y))


class HSTU(nn.Module):
    def __init__(self, cfg: ModelConfig, n_items: int):
        super().__init__()
        self.embed = Embeddings(n_items, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(
            HSTULayer(cfg.d_model, cfg.n_heads, cfg.dropout, cfg.attention_impl) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)

    def forward(self, batch: JaggedBatch) -> Tensor:  # -> [T, d], L2-normalised
        x = self.dropout(self.embed(batch))
        for layer in self.layers:
            x = layer(x, batch)
        return F.normalize(self.norm(x), dim=-1)


class SASRec(nn.Module):
    """Causal softmax self-attention (Kang & McAuley, 2018) over padded batches, same embeddings."""

    def __init__(self, cfg: ModelConfig, n_items: int, max_positions: int = 4096):
        super().__init__()
        self.embed = Embeddings(n_items, cfg.d_model)
        self.positions = nn.Embedding(max_positions, cfg.d_model)
        nn.init.normal_(self.positions.weight, std=0.02)
        layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, 4 * cfg.d_model, cfg.dropout,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, batch: JaggedBatch) -> Tensor:  # -> [T, d]
        offsets, N = batch.offsets, batch.max_len
        lengths = offsets[1:] - offsets[:-1]
        pos = torch.arange(batch.item_ids.numel()) - torch.repeat_interleave(offsets[:-1], lengths)
        x = self.dropout(self.embed(batch) + self.positions(pos))  # [T, d]
        xp = ops.jagged_to_padded(x, offsets, N)  # [B, N, d]
        causal = torch.triu(torch.ones(N, N, dtype=torch.bool), diagonal=1)
        pad = torch.arange(N)[None, :] >= lengths[:, None]
        pad[:, 0] = False  # an all-masked row would give NaN; row 0 of an empty sequence is dropped anyway
        y = self.encoder(xp, mask=causal, src_key_padding_mask=pad)
        return F.normalize(self.norm(ops.padded_to_jagged(y, offsets, x.shape[0])), dim=-1)


def build_model(cfg: ModelConfig, n_items: int) -> nn.Module:
    if cfg.name == "hstu":
        return HSTU(cfg, n_items)
    if cfg.name == "sasrec":
        return SASRec(cfg, n_items)
    raise ValueError(f"model.name={cfg.name!r} has no neural encoder (popularity is scored in grlib.evaluate)")


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
