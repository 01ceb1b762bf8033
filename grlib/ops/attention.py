"""Jagged HSTU attention (one layer), the op contract and its padded reference.

For each sequence, query token i and key token j <= i (causal, diagonal included):

    out_i = sum_{j <= i} SiLU(alpha * q_i . k_j + bias(i, j)) * v_j / max_len

    bias(i, j) = pos_bias[h, min(i - j, P - 1)]                          (relative position)
               + time_bias[h, min(floor(log2(1 + |t_i - t_j|)), Bt - 1)]  (log-bucketed time gap)

Shapes: q, k [T, H, Dqk], v [T, H, Dv], offsets [B+1], timestamps [T] int64, pos_bias [H, P],
time_bias [H, Bt]. Dividing by max_len (not the sequence's own length) follows HSTU: the
attention is not normalised by a softmax, so the scale is a fixed constant. Timestamps may be
non-monotone or equal: the time gap is taken in absolute value. Tokens of a sequence past max_len
are not allowed (truncate the batch first).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from grlib.ops import reference as ref


def time_buckets(dt: Tensor, n_buckets: int) -> Tensor:
    """|dt| (any int/float tensor) -> log2 buckets in [0, n_buckets)."""
    return torch.floor(torch.log2(1.0 + dt.abs().to(torch.float64))).clamp(max=n_buckets - 1).to(torch.int64)


def check_attention_args(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int,
                         pos_bias: Tensor | None, time_bias: Tensor | None, timestamps: Tensor | None) -> None:
    if q.dim() != 3 or k.shape != q.shape:
        raise ValueError(f"q and k must both be [T, H, Dqk], got {tuple(q.shape)} and {tuple(k.shape)}")
    if v.dim() != 3 or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"v must be [T={q.shape[0]}, H={q.shape[1]}, Dv], got {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        raise TypeError(f"q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if offsets.dim() != 1 or offsets.dtype != torch.int64:
        raise ValueError(f"offsets must be a 1-D int64 tensor, got {tuple(offsets.shape)} {offsets.dtype}")
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    H = q.shape[1]
    for name, table in (("pos_bias", pos_bias), ("time_bias", time_bias)):
        if table is not None and (table.dim() != 2 or table.shape[0] != H or table.shape[1] < 1):
            raise ValueError(f"{name} must be [H={H}, buckets >= 1], got {tuple(table.shape)}")
    if time_bias is not None and (timestamps is None or timestamps.shape != (q.shape[0],)):
        raise ValueError(f"time_bias needs timestamps of shape [T={q.shape[0]}], got "
                         f"{None if timestamps is None else tuple(timestamps.shape)}")


def hstu_attention_reference(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int,
                             alpha: float, pos_bias: Tensor | None = None,
                             time_bias: Tensor | None = None, timestamps: Tensor | None = None) -> Tensor:
    """Pad to [B, N, H, D], dense einsum, causal mask, unpad. Differentiable by autograd."""
    B, N, T, H = offsets.numel() - 1, max_len, q.shape[0], q.shape[1]
    qp = ref.jagged_to_padded(q.reshape(T, -1), offsets, N).view(B, N, H, -1)  # [B, N, H, Dqk]
    kp = ref.jagged_to_padded(k.reshape(T, -1), offsets, N).view(B, N, H, -1)
    vp = ref.jagged_to_padded(v.reshape(T, -1), offsets, N).view(B, N, H, -1)  # [B, N, H, Dv]
    scores = torch.einsum("bihd,bjhd->bhij", qp, kp) * alpha  # [B, H, N, N]
    i = torch.arange(N, device=q.device)
    if pos_bias is not None:
        rel = (i[:, None] - i[None, :]).clamp(0, pos_bias.shape[1] - 1)  # [N, N]
        scores = scores + pos_bias[:, rel].unsqueeze(0).to(scores.dtype)
    if time_bias is not None:
        tp = ref.jagged_to_padded(timestamps.reshape(T, 1).to(torch.float64), offsets, N)[..., 0]  # [B, N]
        bucket = time_buckets(tp[:, :, None] - tp[:, None, :], time_bias.shape[1])  # [B, N, N]
        scores = scores + time_bias[:, bucket].permute(1, 0, 2, 3).to(scores.dtype)
    lengths = offsets[1:] - offsets[:-1]
    valid = (i[None, :] < lengths[:, None])  # [B, N]
    mask = (i[:, None] >= i[None, :])[None, None] & valid[:, None, :, None] & valid[:, None, None, :]
    weights = F.silu(scores) * mask / max_len
    out = torch.einsum("bhij,bjhd->bihd", weights, vp)  # [B, N, H, Dv]
    return ref.padded_to_jagged(out.reshape(B, N, -1), offsets, T).view(T, H, -1)


def default_alpha(dqk: int) -> float:
    return 1.0 / math.sqrt(dqk)
