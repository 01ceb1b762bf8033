"""Jagged HSTU attention through fbgemm's jagged operators: the library baseline a user would write.

Queries stay jagged, keys and values are padded once per batch (fbgemm `jagged_to_padded_dense`),
and both products are fbgemm `jagged_dense_bmm` calls, one per head:

    scores_h = jagged_dense_bmm(alpha * q[:, h], offsets, K_h^T [B, Dqk, N])   # [T, N]
    out_h    = jagged_dense_bmm(SiLU(scores_h + bias) * mask / N, offsets, V_h [B, N, Dv])

So the score matrix is [T, N] per head instead of the reference's [B, N, N]: the query side of
the padding is gone (what fbgemm's jagged ops buy), the key side and the T x N intermediates
stay (what only a fused kernel removes). Autograd differentiates through fbgemm's own backward
kernels. float32, bfloat16 and float16; fbgemm's CPU jagged ops have no float64 kernels.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from grlib.ops import fbgemm as _fbgemm
from grlib.ops.attention import check_lengths, time_buckets


def hstu_attention(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, alpha: float,
                   pos_bias: Tensor | None = None, time_bias: Tensor | None = None,
                   timestamps: Tensor | None = None) -> Tensor:
    _fbgemm._load(q)
    check_lengths(offsets, max_len)
    T, H, N, B = q.shape[0], q.shape[1], max_len, offsets.numel() - 1
    pad = torch.ops.fbgemm.jagged_to_padded_dense
    Dq, Dv = k.shape[2], v.shape[2]
    kp = pad(k.reshape(T, H * Dq), [offsets], [N], 0.0).view(B, N, H, Dq)  # [B, N, H, Dqk]
    vp = pad(v.reshape(T, H * Dv), [offsets], [N], 0.0).view(B, N, H, Dv)  # [B, N, H, Dv]
    lengths = offsets[1:] - offsets[:-1]
    start = torch.repeat_interleave(offsets[:-1], lengths, output_size=T)  # [T] first token of i's sequence
    pos = torch.arange(T, device=q.device) - start  # [T] position of token i in its sequence
    j = torch.arange(N, device=q.device)
    mask = j[None, :] <= pos[:, None]  # [T, N] causal (j <= i also keeps j inside the sequence)
    buckets = []
    if pos_bias is not None:
        rel = (pos[:, None] - j[None, :]).clamp(0, pos_bias.shape[1] - 1)  # [T, N]
    if time_bias is not None:
        key = (start[:, None] + j[None, :]).clamp(max=max(T - 1, 0))  # [T, N] token index of key j
        buckets = time_buckets(timestamps[:, None] - timestamps[key], time_bias.shape[1])  # [T, N]
    pointwise = torch.float32 if q.dtype in (torch.bfloat16, torch.float16) else q.dtype  # as the reference
    outs = []
    for h in range(H):
        kt = kp[:, :, h].transpose(1, 2)  # [B, Dqk, N]
        scores = torch.ops.fbgemm.jagged_dense_bmm(q[:, h], offsets, kt, N)[0].to(pointwise) * alpha  # [T, N]
        if pos_bias is not None:
            scores = scores + pos_bias[h].to(pointwise)[rel]  # cast first: grads summed in float32
        if time_bias is not None:
            scores = scores + time_bias[h].to(pointwise)[buckets]
        weights = (F.silu(scores) * mask / max_len).to(v.dtype)
        outs.append(torch.ops.fbgemm.jagged_dense_bmm(weights, offsets, vp[:, :, h], N)[0])  # [T, Dv]
    return torch.stack(outs, dim=1)  # [T, H, Dv]
