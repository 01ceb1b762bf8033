"""Jagged HSTU attention (one layer), the op contract and its padded reference.

For each sequence, query token i and key token j <= i (causal, diagonal included):

    out_i = sum_{j <= i} SiLU(alpha * q_i . k_j + bias(i, j)) * v_j / max_len

    bias(i, j) = pos_bias[h, min(i - j, P - 1)]                          (relative position)
               + time_bias[h, min(floor(log2(1 + |t_i - t_j|)), Bt - 1)]  (log-bucketed time gap)

Shapes: q, k [T, H, Dqk], v [T, H, Dv], offsets [B+1] int64, timestamps [T] int64, pos_bias [H, P],
time_bias [H, Bt]. Dividing by max_len (not the sequence's own length) follows HSTU: the
attention is not normalised by a softmax, so the scale is a fixed constant. Timestamps may be
non-monotone or equal: the time gap is taken in absolute value, and its bucket is computed exactly
on integers (floor(log2(1 + |dt|)) = bit length of |dt| + 1, minus 1), for |dt| < 2**53. A
sequence longer than max_len is an error (truncate the batch first). The bias tables may have
another floating dtype than q, k, v (e.g. float32 parameters with bfloat16 activations): they
are cast to the compute dtype; their gradients come back in their own dtype.

Implementations (grlib.ops.hstu_attention(..., impl=...)): `reference` (this file: pad, dense
einsum, mask, unpad; the ground truth), `fbgemm` (fbgemm jagged ops around the dense math;
grlib/ops/fbgemm/attention.py), `cpu` (the fused kernel, kernels/cpu/hstu_*.{h,cpp}; grlib/ops/
cpu/attention.py), `triton` (CUDA; grlib/ops/triton/attention.py), `npu` (torch-npu /
fbgemm-ascend; grlib/ops/npu/attention.py), and the non-padded peers `loop` / `loop_compile`
(dense attention per sequence, eager / torch.compile; grlib/ops/loop/attention.py). The compiled `cpu`
kernel computes in float32 for bfloat16 / float16 inputs (float64 for float64) and rounds once on
output, so it is at least as accurate as the reference run in the same low precision.

uvqk_attention(z, n_heads, ...) is HSTU's SiLU, split and attention from the fused projection
z [T, 4d]: one compiled op with the `cpu` attention, F.silu, chunk and hstu_attention otherwise.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from grlib.ops import registry
from grlib.ops.jagged import jagged_to_padded_reference, padded_to_jagged_reference


def time_buckets(dt: Tensor, n_buckets: int) -> Tensor:
    """Integer time gaps (any sign) -> min(floor(log2(1 + |dt|)), n_buckets - 1), exact for |dt| < 2**53.

    a = 1 + |dt| converts exactly to float64 below 2**53, and its biased binary exponent (bits 52-62)
    minus 1023 is floor(log2(a)): no log2 rounding just below a power of two. Read from the bits
    (a view as int64, as the C++ kernel does) rather than through torch.frexp, whose int32 exponent
    torch.compile's vectorised CPU code cannot convert to int64 (a C++ compile error)."""
    a = (dt.to(torch.int64).abs() + 1).to(torch.float64)  # exact below 2**53
    return ((a.view(torch.int64) >> 52) - 1023).clamp(max=n_buckets - 1)


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
    for name, table in (("pos_bias", pos_bias), ("time_bias", time_bias)):
        if table is not None and not table.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {table.dtype}")
    if time_bias is not None and (timestamps is None or timestamps.shape != (q.shape[0],)):
        raise ValueError(f"time_bias needs timestamps of shape [T={q.shape[0]}], got "
                         f"{None if timestamps is None else tuple(timestamps.shape)}")
    if time_bias is not None and timestamps.dtype != torch.int64:
        raise TypeError(f"timestamps must be int64 (seconds), got {timestamps.dtype}")


def check_lengths(offsets: Tensor, max_len: int) -> None:
    """Padding implementations would silently drop tokens past max_len: refuse them instead."""
    lengths = offsets[1:] - offsets[:-1]
    longest = int(lengths.max()) if lengths.numel() else 0
    if longest > max_len:
        raise ValueError(f"a sequence has {longest} tokens, more than max_len={max_len} (truncate the batch first)")


def hstu_attention_reference(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int,
                             alpha: float, pos_bias: Tensor | None = None,
                             time_bias: Tensor | None = None, timestamps: Tensor | None = None) -> Tensor:
    """Pad to [B, N, H, D], dense einsum, causal mask, unpad. Differentiable by autograd."""
    check_lengths(offsets, max_len)
    T, H = q.shape[0], q.shape[1]
    pad = lambda t: jagged_to_padded_reference(t.reshape(T, math.prod(t.shape[1:])), offsets, max_len)  # noqa: E731  [B, N, F]
    tp = pad(timestamps)[..., 0] if time_bias is not None else None  # [B, N] int64
    out = padded_attention(pad(q), pad(k), pad(v), tp, offsets, max_len, H, alpha, pos_bias, time_bias)
    return padded_to_jagged_reference(out, offsets, T).view(T, H, out.shape[-1] // H)


def padded_attention(qp: Tensor, kp: Tensor, vp: Tensor, tp: Tensor | None, offsets: Tensor, max_len: int,
                     H: int, alpha: float, pos_bias: Tensor | None, time_bias: Tensor | None) -> Tensor:
    """The dense math on padded inputs: qp, kp [B, N, H*Dqk], vp [B, N, H*Dv], tp [B, N] -> [B, N, H*Dv]."""
    B, N = qp.shape[0], max_len
    Dq, Dv = qp.shape[-1] // H, vp.shape[-1] // H
    qp, kp, vp = qp.view(B, N, H, Dq), kp.view(B, N, H, Dq), vp.view(B, N, H, Dv)  # [B, N, H, D]
    # the pointwise part runs in float32 at least (as the fused kernels do): bf16/fp16 scores are
    # upcast, so the bias-table gradients are summed in float32, not in bf16
    scores = torch.einsum("bihd,bjhd->bhij", qp, kp).to(_pointwise_dtype(qp.dtype)) * alpha  # [B, H, N, N]
    i = torch.arange(N, device=qp.device)
    if pos_bias is not None:
        rel = (i[:, None] - i[None, :]).clamp(0, pos_bias.shape[1] - 1)  # [N, N]
        scores = scores + pos_bias.to(scores.dtype)[:, rel].unsqueeze(0)  # cast first: grads summed in float32
    if time_bias is not None:
        bucket = time_buckets(tp[:, :, None] - tp[:, None, :], time_bias.shape[1])  # [B, N, N]
        scores = scores + time_bias.to(scores.dtype)[:, bucket].permute(1, 0, 2, 3)
    lengths = offsets[1:] - offsets[:-1]
    valid = (i[None, :] < lengths[:, None])  # [B, N]
    mask = (i[:, None] >= i[None, :])[None, None] & valid[:, None, :, None] & valid[:, None, None, :]
    weights = (F.silu(scores) * mask / max_len).to(vp.dtype)
    out = torch.einsum("bhij,bjhd->bihd", weights, vp)  # [B, N, H, Dv]
    return out.reshape(B, N, H * Dv)


def _pointwise_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def default_alpha(dqk: int) -> float:
    return 1.0 / math.sqrt(dqk)


registry.register("hstu_attention", "reference", lambda: hstu_attention_reference)
registry.register("hstu_attention", "fbgemm", registry.lazy("fbgemm.attention", "hstu_attention"))
registry.register("hstu_attention", "cpu", registry.lazy("cpu.attention", "hstu_attention"))
registry.register("hstu_attention", "triton", registry.lazy("triton.attention", "hstu_attention"))
registry.register("hstu_attention", "npu", registry.lazy("npu.attention", "hstu_attention"))
registry.register("hstu_attention", "loop", registry.lazy("loop.attention", "hstu_attention_loop"))
registry.register("hstu_attention", "loop_compile", registry.lazy("loop.attention", "hstu_attention_loop_compile"))
registry.register("uvqk_attention", "cpu", registry.lazy("cpu.attention", "uvqk_attention"))


def hstu_attention(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int,
                   alpha: float | None = None, pos_bias: Tensor | None = None,
                   time_bias: Tensor | None = None, timestamps: Tensor | None = None,
                   impl: str = "auto") -> Tensor:
    """Jagged causal HSTU attention: q, k [T, H, Dqk], v [T, H, Dv] -> [T, H, Dv] (module doc)."""
    check_attention_args(q, k, v, offsets, max_len, pos_bias, time_bias, timestamps)
    alpha = default_alpha(q.shape[-1]) if alpha is None else alpha
    fn = registry.resolve("hstu_attention", q.device, impl)
    return fn(q, k, v, offsets, max_len, alpha, pos_bias, time_bias, timestamps)


def uvqk_attention(z: Tensor, n_heads: int, offsets: Tensor, max_len: int, alpha: float | None = None,
                   pos_bias: Tensor | None = None, time_bias: Tensor | None = None,
                   timestamps: Tensor | None = None, impl: str = "auto") -> tuple[Tensor, Tensor]:
    """HSTU's SiLU, split and attention: z [T, 4d] (the fused projection, columns u | v | q | k) ->
    (u = SiLU(z_u) [T, d], hstu_attention(SiLU(z_q), SiLU(z_k), SiLU(z_v)) [T, n_heads, d / n_heads]).

    `impl` is the attention's implementation: `cpu` runs one fused kernel (the activations of q, k, v
    are never written out, and the backward writes dz without a concatenation); the others compose
    F.silu, chunk and their hstu_attention (the reference of the fused kernel)."""
    if z.dim() != 2 or z.shape[1] == 0 or z.shape[1] % (4 * n_heads):
        raise ValueError(f"z must be [T, 4 * n_heads * head_dim] with n_heads={n_heads}, got {tuple(z.shape)}")
    T, d = z.shape[0], z.shape[1] // 4
    alpha = default_alpha(d // n_heads) if alpha is None else alpha
    if registry.choose("hstu_attention", z.device, impl) == "cpu":
        view = z[:, :d].reshape(T, n_heads, d // n_heads)
        check_attention_args(view, view, view, offsets, max_len, pos_bias, time_bias, timestamps)
        return registry.resolve("uvqk_attention", z.device, "cpu")(
            z, n_heads, offsets, max_len, alpha, pos_bias, time_bias, timestamps)
    u, v, q, k = F.silu(z).chunk(4, dim=-1)  # 4 x [T, d]
    shape = (T, n_heads, d // n_heads)
    attn = hstu_attention(q.reshape(shape), k.reshape(shape), v.reshape(shape), offsets, max_len, alpha,
                          pos_bias, time_bias, timestamps, impl=impl)
    return u, attn
