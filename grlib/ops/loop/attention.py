"""Per-sequence dense causal HSTU attention on the jagged batch: the non-padded peers of the compiled kernel.

For each sequence (tokens offsets[b] .. offsets[b+1], length s) one dense [H, s, s] score tensor,
the causal mask, the bias terms and SiLU, then the product with V: the math of the padded
reference (grlib/ops/attention.py, `padded_attention`) without padding to max_len, so the useful
FLOPs are those of the compiled kernel (2 * H * (Dqk + Dv) * s^2 per sequence, half of it on the
causal triangle's side that is masked here and skipped by the kernel). A user without jagged kernels
but with the jagged layout would write this loop.

    loop           eager PyTorch, autograd through the per-sequence ops
    loop_compile   the same per-sequence function compiled once per process by torch.compile
                   (dynamic shapes: one graph for every length; one more per dtype and bias
                   combination, and for the lengths 0 and 1 that dynamo specialises). Past torch's
                   recompile limit it raises instead of running eagerly.
                   Inductor also fails on the backward of a [1, 1] bias table (one head, one
                   bucket: an assertion in its scatter codegen), a shape no model here uses.

Pointwise work runs in float32 at least for bf16/fp16 inputs, as in the reference. An empty batch
(no tokens) returns zeros that keep every input in the graph, so its gradients are zeros as the
padded reference gives.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from grlib.ops.attention import _pointwise_dtype, check_lengths, time_buckets

RECOMPILE_LIMIT = 64  # graphs of the compiled loop per process (dtypes x bias combinations x specialised lengths)


def dense_causal(q: Tensor, k: Tensor, v: Tensor, ts: Tensor | None, alpha: Tensor, inv_n: Tensor,
                 pos_bias: Tensor | None, time_bias: Tensor | None) -> Tensor:
    """One sequence: q, k [s, H, Dqk], v [s, H, Dv], ts [s] -> [s, H, Dv]; alpha, inv_n 0-d float32
    (tensors, so that a compiled graph does not specialise on their values)."""
    s = q.shape[0]
    scores = torch.einsum("ihd,jhd->hij", q, k).to(_pointwise_dtype(q.dtype)) * alpha  # [H, s, s]
    i = torch.arange(s, device=q.device)
    if pos_bias is not None:
        rel = (i[:, None] - i[None, :]).clamp(0, pos_bias.shape[1] - 1)  # [s, s]
        scores = scores + pos_bias.to(scores.dtype)[:, rel]
    if time_bias is not None:
        bucket = time_buckets(ts[:, None] - ts[None, :], time_bias.shape[1])  # [s, s]
        scores = scores + time_bias.to(scores.dtype)[:, bucket]
    causal = i[:, None] >= i[None, :]  # [s, s]
    weights = (F.silu(scores) * causal * inv_n).to(v.dtype)  # [H, s, s]
    return torch.einsum("hij,jhd->ihd", weights, v)


@functools.cache
def _compiled():
    return torch.compile(dense_causal, dynamic=True)


def _loop(fn, q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, alpha: float,
          pos_bias: Tensor | None, time_bias: Tensor | None, timestamps: Tensor | None) -> Tensor:
    check_lengths(offsets, max_len)
    bounds = offsets.tolist()
    scale = torch.tensor(alpha, dtype=torch.float32), torch.tensor(1.0 / max_len, dtype=torch.float32)
    outs = [fn(q[a:e], k[a:e], v[a:e], timestamps[a:e] if time_bias is not None else None, *scale,
               pos_bias, time_bias)
            for a, e in zip(bounds[:-1], bounds[1:]) if e > a]
    if outs:
        return torch.cat(outs, 0)  # [T, H, Dv]
    keep = sum(t.sum() for t in (q, k, v, pos_bias, time_bias) if t is not None)  # every input in the graph
    return v.new_zeros(v.shape) + 0 * keep.to(v.dtype)


def hstu_attention_loop(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, alpha: float,
                        pos_bias: Tensor | None = None, time_bias: Tensor | None = None,
                        timestamps: Tensor | None = None) -> Tensor:
    """q, k [T, H, Dqk], v [T, H, Dv] -> [T, H, Dv]: eager per-sequence dense attention."""
    return _loop(dense_causal, q, k, v, offsets, max_len, alpha, pos_bias, time_bias, timestamps)


def hstu_attention_loop_compile(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, alpha: float,
                                pos_bias: Tensor | None = None, time_bias: Tensor | None = None,
                                timestamps: Tensor | None = None) -> Tensor:
    """The same, each sequence through torch.compile(dense_causal, dynamic=True)."""
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True):
        return _loop(_compiled(), q, k, v, offsets, max_len, alpha, pos_bias, time_bias, timestamps)
