"""HSTU (Zhai et al., ICML 2024) on jagged batches.

One layer (pointwise SiLU attention, no softmax; meta-recsys/generative-recommenders):

    U, V, Q, K = split(SiLU(W1 . LayerNorm(X) + b1))          # fused projection, [T, 4d]
    A = hstu_attention(Q, K, V)                               # grlib.ops: causal, rel. pos/time bias, / max_len
    Y = X + W2 . Dropout(LayerNorm(A) * U) + b2               # gated output, residual

Dropout(LayerNorm(A) * U) is one op, grlib.ops.layer_norm_mul_dropout (one pass over the rows
forward and one backward with the compiled kernel; the dropout's words drawn as FastDropout draws
them), and LayerNorm(A) * U without dropout (eval) grlib.ops.layer_norm_mul.

The split, the SiLU and the attention are one op, grlib.ops.uvqk_attention: with the compiled CPU
kernel, SiLU(Q, K, V) is applied inside the attention's tiles and never written out.

The projections are grlib.ops.linear (oneDNN on CPU). Dropout is grlib.model.dropout.FastDropout
(16-bit random words; nn.Dropout's serial Bernoulli draws took 12% of a laptop training step).

The encoder maps a JaggedBatch to one L2-normalised vector per token ([T, d]).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from grlib import ops
from grlib.config import ModelConfig
from grlib.jagged import JaggedBatch
from grlib.model.dropout import FastDropout
from grlib.model.embeddings import Embeddings

N_POS_BUCKETS = 128  # relative positions i - j >= 127 share one bucket
N_TIME_BUCKETS = 32  # log2 buckets of |t_i - t_j| in seconds


class Linear(nn.Linear):
    """nn.Linear (same parameters and init) whose product is grlib.ops.linear: on CPU through oneDNN
    (MKL's sgemm takes its AVX2 path on AMD CPUs; grlib/ops/matmul.py)."""

    def forward(self, x: Tensor) -> Tensor:
        return ops.linear(x, self.weight, self.bias)


class HSTULayer(nn.Module):
    def __init__(self, d: int, n_heads: int, dropout: float, attention_impl: str):
        super().__init__()
        self.n_heads, self.dh, self.impl = n_heads, d // n_heads, attention_impl
        self.norm_in = nn.LayerNorm(d)
        self.uvqk = Linear(d, 4 * d)
        self.norm_attn = nn.LayerNorm(d)
        self.out = Linear(d, d)
        self.dropout = FastDropout(dropout)
        self.pos_bias = nn.Parameter(torch.zeros(n_heads, N_POS_BUCKETS))
        self.time_bias = nn.Parameter(torch.zeros(n_heads, N_TIME_BUCKETS))

    def forward(self, x: Tensor, batch: JaggedBatch) -> Tensor:  # x [T, d] -> [T, d]
        T = x.shape[0]
        if T == 0:  # a batch of empty sequences: nothing to attend (the padded reference cannot view 0 tokens);
            return self.dropout(x)  # the dropout still draws (a data-parallel rank keeps the global stream)
        z = self.uvqk(self.norm_in(x))  # [T, 4d]: u | v | q | k before SiLU
        u, attn = ops.uvqk_attention(z, self.n_heads, batch.offsets, batch.max_len, pos_bias=self.pos_bias,
                                     time_bias=self.time_bias, timestamps=batch.timestamps,
                                     impl=self.impl)  # [T, d], [T, H, dh]
        a, norm = attn.reshape(T, -1), self.norm_attn  # [T, d]
        if self.dropout.active:  # Dropout(LayerNorm(a) * u) in one op
            y = ops.layer_norm_mul_dropout(a, u, norm.weight, norm.bias, *self.dropout.draw(a.shape, a.device),
                                           eps=norm.eps)
        else:
            y = ops.layer_norm_mul(a, u, norm.weight, norm.bias, eps=norm.eps)
        return x + self.out(y)


class HSTU(nn.Module):
    def __init__(self, cfg: ModelConfig, n_items: int):
        super().__init__()
        self.cfg = cfg
        self.embed = Embeddings(n_items, cfg.d_model)
        self.dropout = FastDropout(cfg.dropout)
        self.layers = nn.ModuleList(
            HSTULayer(cfg.d_model, cfg.n_heads, cfg.dropout, cfg.attention_impl) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)

    def forward(self, batch: JaggedBatch) -> Tensor:  # -> [T, d], L2-normalised
        x = self.dropout(self.embed(batch))
        for layer in self.layers:
            x = layer(x, batch)
        return F.normalize(self.norm(x), dim=-1)

    def attention_impl(self, device: torch.device | str = "cpu") -> str:
        """The grlib.ops implementation the layers' attention resolves to on `device`."""
        return ops.choose("hstu_attention", device, self.cfg.attention_impl)
