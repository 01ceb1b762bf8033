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

The projections are grlib.ops.linear (oneDNN on CPU). With model.precision = bf16 (mixed precision,
torch.autocast's rules for a linear layer): each projection multiplies bf16 copies of its input and
of its fp32 weight and bias (oneDNN: bf16 products, fp32 accumulation, bf16 output; the input
LayerNorm writes its bf16 output directly, rounded once from fp32), so U, V, Q, K
are bf16 [T, 4d]; the attention kernel multiplies bf16 tiles with fp32 sums on AMX (on
AVX512-BF16 with GRLIB_DPBF16_ATTENTION=1; elsewhere fp32 tiles; bias and SiLU always in fp32) and
rounds its output to bf16 once; LayerNorm(A) * U and its dropout compute in fp32 and round to
bf16; the output projection's bf16 result joins the fp32 residual stream X. The casts of the fp32
weight and bias happen inside the op (grlib.ops.linear's dtype): their gradients are rounded to bf16
once (the product's output) and written to the fp32 masters' layout widened, the optimizer updates
fp32 weights, and the embeddings, the input LayerNorm, the final LayerNorm and normalisation, and
the loss stay fp32 (the loss's precision is negatives.precision). Dropout is grlib.model.dropout.FastDropout
(16-bit random words; nn.Dropout's serial Bernoulli draws took 12% of a laptop training step).

With model.recompute_layers (activation checkpointing, for long sequences at large d: the paper
preset), a training forward keeps only each layer's input [T, d] and recomputes the layer in
backward (torch.utils.checkpoint, non-reentrant): the same dropout words (torch's RNG state and the
data-parallel global rows restored), so the gradients are those of the plain forward. The layer's
forward FLOPs run twice; MFU (grlib.perf) counts the model's FLOPs once, never the recomputed ones.

The encoder maps a JaggedBatch to one L2-normalised vector per token ([T, d]): the final LayerNorm
and the normalisation are one op, grlib.ops.layer_norm(..., l2_eps), and each layer's input
LayerNorm writes the projection's dtype directly (grlib.ops.layer_norm(..., dtype)).
"""
from __future__ import annotations

import sys

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from grlib import ops
from grlib.config import ConfigError, ModelConfig
from grlib.jagged import JaggedBatch
from grlib.model import dropout as dropout_words
from grlib.model.dropout import FastDropout
from grlib.model.embeddings import Embeddings

N_POS_BUCKETS = 128  # relative positions i - j >= 127 share one bucket
N_TIME_BUCKETS = 32  # log2 buckets of |t_i - t_j| in seconds
L2_EPS = 1e-12  # the final L2 normalisation's eps (F.normalize's default)


COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # model.precision -> the projections' dtype


class Linear(nn.Linear):
    """nn.Linear (same parameters and init) whose product is grlib.ops.linear: on CPU through oneDNN
    (MKL's sgemm takes its AVX2 path on AMD CPUs; grlib/ops/matmul.py). With compute_dtype bf16, the
    product of bf16 copies of x, weight and bias (the module doc); the parameters stay fp32."""

    def __init__(self, in_features: int, out_features: int, compute_dtype: torch.dtype = torch.float32):
        super().__init__(in_features, out_features)
        self.compute_dtype = compute_dtype

    def forward(self, x: Tensor) -> Tensor:  # [T, in] -> [T, out] in compute_dtype
        dt = self.compute_dtype  # the casts inside the op (fp32 weight gradients written directly)
        return ops.linear(x, self.weight, self.bias, dtype=None if dt == self.weight.dtype == x.dtype else dt)


class HSTULayer(nn.Module):
    def __init__(self, d: int, n_heads: int, dropout: float, attention_impl: str, precision: str = "fp32"):
        super().__init__()
        self.n_heads, self.dh, self.impl = n_heads, d // n_heads, attention_impl
        self.norm_in = nn.LayerNorm(d)
        self.uvqk = Linear(d, 4 * d, COMPUTE_DTYPES[precision])
        self.norm_attn = nn.LayerNorm(d)
        self.out = Linear(d, d, COMPUTE_DTYPES[precision])
        self.dropout = FastDropout(dropout)
        self.pos_bias = nn.Parameter(torch.zeros(n_heads, N_POS_BUCKETS))
        self.time_bias = nn.Parameter(torch.zeros(n_heads, N_TIME_BUCKETS))

    def forward(self, x: Tensor, batch: JaggedBatch) -> Tensor:  # x [T, d] -> [T, d]
        T = x.shape[0]
        if T == 0:  # a batch of empty sequences: nothing to attend (the padded reference cannot view 0 tokens);
            return self.dropout(x)  # the dropout still draws (a data-parallel rank keeps the global stream)
        norm_in = self.norm_in  # LayerNorm(x) written in the projection's dtype (no cast of its own)
        z = self.uvqk(ops.layer_norm(x, norm_in.weight, norm_in.bias, norm_in.eps, dtype=self.uvqk.compute_dtype))
        # z [T, 4d]: u | v | q | k before SiLU (bf16 under model.precision bf16)
        u, attn = ops.uvqk_attention(z, self.n_heads, batch.offsets, batch.max_len, pos_bias=self.pos_bias,
                                     time_bias=self.time_bias, timestamps=batch.timestamps,
                                     impl=self.impl)  # [T, d], [T, H, dh]
        a, norm = attn.reshape(T, -1), self.norm_attn  # [T, d]
        if self.dropout.active:  # Dropout(LayerNorm(a) * u) in one op
            y = ops.layer_norm_mul_dropout(a, u, norm.weight, norm.bias, *self.dropout.draw(a.shape, a.device),
                                           eps=norm.eps)
        else:
            y = ops.layer_norm_mul(a, u, norm.weight, norm.bias, eps=norm.eps)
        return ops.residual_add(x, self.out(y))  # fp32 [T, d] (a bf16 projection is widened by the sum, one pass)


def _recomputed(layer: HSTULayer, x: Tensor, batch: JaggedBatch) -> Tensor:  # x [T, d] -> [T, d]
    """layer(x, batch) keeping only x for backward, which runs the layer again under the same RNG
    state and data-parallel rows (grlib.model.dropout.current_rows) as this forward."""
    rows = dropout_words.current_rows()

    def run(x: Tensor) -> Tensor:
        with dropout_words.rows_as(rows):
            return layer(x, batch)

    return checkpoint(run, x, use_reentrant=False, preserve_rng_state=True)


class HSTU(nn.Module):
    def __init__(self, cfg: ModelConfig, n_items: int):
        super().__init__()
        if cfg.attention_impl != "auto":  # a named implementation HSTU attention lacks, or one this machine cannot load
            try:  # the implementation's module, and the packages it imports lazily (grlib.ops.npu.require)
                fn = ops.registry.resolve("hstu_attention", "cpu", cfg.attention_impl)
                getattr(sys.modules[fn.__module__], "require", lambda: None)()
            except (ImportError, ValueError) as err:
                raise ConfigError(f"model.attention_impl: {cfg.attention_impl!r} cannot run here: {err}") from None
        self.cfg = cfg
        self.embed = Embeddings(n_items, cfg.d_model)
        self.dropout = FastDropout(cfg.dropout)
        self.layers = nn.ModuleList(
            HSTULayer(cfg.d_model, cfg.n_heads, cfg.dropout, cfg.attention_impl, cfg.precision)
            for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)

    def forward(self, batch: JaggedBatch) -> Tensor:  # -> [T, d], L2-normalised
        x = self.dropout(self.embed(batch))
        recompute = self.cfg.recompute_layers and self.training and torch.is_grad_enabled()
        for layer in self.layers:
            x = _recomputed(layer, x, batch) if recompute else layer(x, batch)
        return ops.layer_norm(x, self.norm.weight, self.norm.bias, self.norm.eps, l2_eps=L2_EPS)  # LayerNorm, L2

    def attention_impl(self, device: torch.device | str = "cpu") -> str:
        """The grlib.ops implementation the layers' attention resolves to on `device`."""
        return ops.choose("hstu_attention", device, self.cfg.attention_impl)
