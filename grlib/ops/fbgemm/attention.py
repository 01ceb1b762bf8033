"""Jagged HSTU attention through fbgemm's jagged operators: the library baseline a user would write.

The reference's computation with fbgemm doing the jagged <-> padded conversions:
`jagged_to_padded_dense` for q, k, v, the dense math of grlib.ops.attention.padded_attention
(einsum, bias, SiLU, causal mask), `dense_to_jagged` back; autograd goes through fbgemm's own
backward kernels. Timestamps (int64, which fbgemm's CPU kernels do not pad) are gathered by index.

(fbgemm also has `jagged_dense_bmm`, which keeps the queries jagged; on CPU its kernels are
plain loops, and an attention written with it measured 4-10x slower than padding in the
truncated regime here, so the baseline is the padded form the issue describes.)
float32, bfloat16 and float16; fbgemm's CPU jagged ops have no float64 kernels.
"""
from __future__ import annotations

import torch
from torch import Tensor

from grlib.ops import fbgemm as _fbgemm
from grlib.ops.attention import check_lengths, padded_attention


def hstu_attention(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, alpha: float,
                   pos_bias: Tensor | None = None, time_bias: Tensor | None = None,
                   timestamps: Tensor | None = None) -> Tensor:
    _fbgemm._load(q)
    check_lengths(offsets, max_len)
    T, H, N = q.shape[0], q.shape[1], max_len

    def pad(t: Tensor) -> Tensor:  # [T, H, D] -> [B, N, H*D]
        return torch.ops.fbgemm.jagged_to_padded_dense(t.reshape(T, H * t.shape[2]), [offsets], [N], 0.0)

    tp = None
    if time_bias is not None:  # [B, N] int64; positions past a sequence's end are masked anyway
        j = torch.arange(N, device=q.device)
        tp = timestamps[(offsets[:-1, None] + j[None, :]).clamp(max=max(T - 1, 0))] if T else \
            timestamps.new_zeros((offsets.numel() - 1, N))
    out = padded_attention(pad(q), pad(k), pad(v), tp, offsets, N, H, alpha, pos_bias, time_bias)  # [B, N, H*Dv]
    return torch.ops.fbgemm.dense_to_jagged(out, [offsets], T)[0].view(T, H, v.shape[2])
