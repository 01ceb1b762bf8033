"""Jagged HSTU attention in Triton (CUDA), forward and backward, same contract as the reference.

Grid: one program per (query tile, sequence, head) for the forward and dq passes and per (key
tile, sequence, head) for the dk/dv pass; programs past a sequence's end return at once. Each
program walks the tiles it attends to (flash-attention style, scores recomputed in backward),
so nothing of size T x max_len is stored. Bias-table gradients are accumulated in float32 with
atomic adds. Feature dims are padded to a power of two >= 16 inside the kernel (masked loads).

On a machine without CUDA the kernels run under Triton's interpreter (TRITON_INTERPRET=1 set
before triton is imported) on CPU tensors: that is how the tests check them against the
reference here; it is slow and meant for tiny shapes only.
"""
from __future__ import annotations

import os

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError as err:  # pragma: no cover - depends on the install
    raise ImportError("the 'triton' implementation needs triton (CUDA machines: pip install -e .[cuda]; "
                      "CPU interpreter tests: pip install triton==3.9.0 and TRITON_INTERPRET=1)") from err

from grlib.ops.attention import check_lengths

BLOCK = 32  # query and key tile size


@triton.jit
def _bias(pos_ptr, time_ptr, ts_ptr, h, i, j, base, mask, P, Bt, HAS_POS: tl.constexpr, HAS_TIME: tl.constexpr):
    """bias(i, j) for a tile (i [BM, 1], j [1, BN] positions in the sequence) in float32, with
    the flat bucket indices of both tables for the backward pass."""
    rel = tl.minimum(i - j, P - 1)
    rel = tl.maximum(rel, 0)
    out = tl.zeros(rel.shape, dtype=tl.float32)
    if HAS_POS:
        out += tl.load(pos_ptr + h * P + rel, mask=mask, other=0.0).to(tl.float32)
    bucket = tl.zeros(rel.shape, dtype=tl.int64)
    if HAS_TIME:
        ti = tl.load(ts_ptr + base + i, mask=mask, other=0)
        tj = tl.load(ts_ptr + base + j, mask=mask, other=0)
        dt = ti - tj
        a = tl.where(dt < 0, -dt, dt) + 1  # >= 1
        b = tl.floor(tl.log2(a.to(tl.float32))).to(tl.int64)  # off by at most one: corrected below
        b = tl.minimum(tl.maximum(b, 0), 61)
        one = tl.full(b.shape, 1, tl.int64)
        b = tl.where((one << b) > a, b - 1, b)
        b = tl.where((one << (b + 1)) <= a, b + 1, b)
        bucket = tl.minimum(b, Bt - 1)
        out += tl.load(time_ptr + h * Bt + bucket, mask=mask, other=0.0).to(tl.float32)
    return out, rel, bucket


@triton.jit
def _fwd(q_ptr, k_ptr, v_ptr, off_ptr, pos_ptr, time_ptr, ts_ptr, out_ptr, alpha, inv_n, H, D, Dv, P, Bt,
         HAS_POS: tl.constexpr, HAS_TIME: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
         BD: tl.constexpr, BDV: tl.constexpr):
    m, b, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    base = tl.load(off_ptr + b)
    L = tl.load(off_ptr + b + 1) - base
    if m * BM >= L:
        return
    i = m * BM + tl.arange(0, BM)[:, None]  # [BM, 1]
    d = tl.arange(0, BD)[None, :]
    e = tl.arange(0, BDV)[None, :]
    q = tl.load(q_ptr + (base + i) * H * D + h * D + d, mask=(i < L) & (d < D), other=0.0)
    acc = tl.zeros((BM, BDV), dtype=tl.float32)
    for j0 in range(0, tl.minimum(L, (m + 1) * BM), BN):
        jr = j0 + tl.arange(0, BN)  # [BN]
        j = jr[None, :]
        k = tl.load(k_ptr + (base + jr[:, None]) * H * D + h * D + d, mask=(jr[:, None] < L) & (d < D), other=0.0)
        v = tl.load(v_ptr + (base + jr[:, None]) * H * Dv + h * Dv + e, mask=(jr[:, None] < L) & (e < Dv), other=0.0)
        valid = (j <= i) & (i < L) & (j < L)
        bias, _, _ = _bias(pos_ptr, time_ptr, ts_ptr, h, i, j, base, valid, P, Bt, HAS_POS, HAS_TIME)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * alpha + bias
        w = tl.where(valid, s * tl.sigmoid(s) * inv_n, 0.0)
        acc += tl.dot(w.to(v.dtype), v)
    tl.store(out_ptr + (base + i) * H * Dv + h * Dv + e, acc.to(out_ptr.dtype.element_ty), mask=(i < L) & (e < Dv))


@triton.jit
def _bwd_dq(q_ptr, k_ptr, v_ptr, g_ptr, off_ptr, pos_ptr, time_ptr, ts_ptr, dq_ptr, dpos_ptr, dtime_ptr,
            alpha, inv_n, H, D, Dv, P, Bt, HAS_POS: tl.constexpr, HAS_TIME: tl.constexpr, BM: tl.constexpr,
            BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr):
    m, b, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    base = tl.load(off_ptr + b)
    L = tl.load(off_ptr + b + 1) - base
    if m * BM >= L:
        return
    i = m * BM + tl.arange(0, BM)[:, None]
    d = tl.arange(0, BD)[None, :]
    e = tl.arange(0, BDV)[None, :]
    q = tl.load(q_ptr + (base + i) * H * D + h * D + d, mask=(i < L) & (d < D), other=0.0)
    g = tl.load(g_ptr + (base + i) * H * Dv + h * Dv + e, mask=(i < L) & (e < Dv), other=0.0)
    dq = tl.zeros((BM, BD), dtype=tl.float32)
    for j0 in range(0, tl.minimum(L, (m + 1) * BM), BN):
        jr = j0 + tl.arange(0, BN)
        j = jr[None, :]
        k = tl.load(k_ptr + (base + jr[:, None]) * H * D + h * D + d, mask=(jr[:, None] < L) & (d < D), other=0.0)
        v = tl.load(v_ptr + (base + jr[:, None]) * H * Dv + h * Dv + e, mask=(jr[:, None] < L) & (e < Dv), other=0.0)
        valid = (j <= i) & (i < L) & (j < L)
        bias, rel, bucket = _bias(pos_ptr, time_ptr, ts_ptr, h, i, j, base, valid, P, Bt, HAS_POS, HAS_TIME)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * alpha + bias
        dw = tl.dot(g, tl.trans(v)).to(tl.float32)
        sg = tl.sigmoid(s)
        ds = tl.where(valid, dw * sg * (1.0 + s * (1.0 - sg)) * inv_n, 0.0)
        if HAS_POS:
            tl.atomic_add(dpos_ptr + h * P + rel, ds, mask=valid)
        if HAS_TIME:
            tl.atomic_add(dtime_ptr + h * Bt + bucket, ds, mask=valid)
        dq += tl.dot(ds.to(k.dtype), k)
    tl.store(dq_ptr + (base + i) * H * D + h * D + d, (dq * alpha).to(dq_ptr.dtype.element_ty), mask=(i < L) & (d < D))


@triton.jit
def _bwd_dkv(q_ptr, k_ptr, v_ptr, g_ptr, off_ptr, pos_ptr, time_ptr, ts_ptr, dk_ptr, dv_ptr, alpha, inv_n,
             H, D, Dv, P, Bt, HAS_POS: tl.constexpr, HAS_TIME: tl.constexpr, BM: tl.constexpr,
             BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr):
    n, b, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    base = tl.load(off_ptr + b)
    L = tl.load(off_ptr + b + 1) - base
    if n * BN >= L:
        return
    jr = n * BN + tl.arange(0, BN)
    j = jr[None, :]  # [1, BN]
    d = tl.arange(0, BD)[None, :]
    e = tl.arange(0, BDV)[None, :]
    k = tl.load(k_ptr + (base + jr[:, None]) * H * D + h * D + d, mask=(jr[:, None] < L) & (d < D), other=0.0)
    v = tl.load(v_ptr + (base + jr[:, None]) * H * Dv + h * Dv + e, mask=(jr[:, None] < L) & (e < Dv), other=0.0)
    dk = tl.zeros((BN, BD), dtype=tl.float32)
    dv = tl.zeros((BN, BDV), dtype=tl.float32)
    for i0 in range(n * BN, L, BM):
        i = i0 + tl.arange(0, BM)[:, None]  # [BM, 1]
        q = tl.load(q_ptr + (base + i) * H * D + h * D + d, mask=(i < L) & (d < D), other=0.0)
        g = tl.load(g_ptr + (base + i) * H * Dv + h * Dv + e, mask=(i < L) & (e < Dv), other=0.0)
        valid = (j <= i) & (i < L) & (j < L)
        bias, _, _ = _bias(pos_ptr, time_ptr, ts_ptr, h, i, j, base, valid, P, Bt, HAS_POS, HAS_TIME)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * alpha + bias  # [BM, BN]
        dw = tl.dot(g, tl.trans(v)).to(tl.float32)
        sg = tl.sigmoid(s)
        w = tl.where(valid, s * sg * inv_n, 0.0)
        ds = tl.where(valid, dw * sg * (1.0 + s * (1.0 - sg)) * inv_n, 0.0)
        dv += tl.dot(tl.trans(w).to(g.dtype), g)
        dk += tl.dot(tl.trans(ds).to(q.dtype), q)
    tl.store(dk_ptr + (base + jr[:, None]) * H * D + h * D + d, (dk * alpha).to(dk_ptr.dtype.element_ty),
             mask=(jr[:, None] < L) & (d < D))
    tl.store(dv_ptr + (base + jr[:, None]) * H * Dv + h * Dv + e, dv.to(dv_ptr.dtype.element_ty),
             mask=(jr[:, None] < L) & (e < Dv))


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def _check_device(q: Tensor) -> None:
    if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"the 'triton' implementation runs on CUDA tensors (got {q.device}); on CPU "
                           "use impl='cpu', or TRITON_INTERPRET=1 (set before importing triton) for tests")


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, offsets, max_len, alpha, pos_bias, time_bias, timestamps):
        q, k, v, offsets = q.contiguous(), k.contiguous(), v.contiguous(), offsets.contiguous()
        T, H, D = q.shape
        Dv, B = v.shape[2], offsets.numel() - 1
        has_pos, has_time = pos_bias is not None, time_bias is not None
        dummy = q.new_zeros(1, dtype=torch.float32)
        pos = pos_bias.contiguous() if has_pos else dummy
        time = time_bias.contiguous() if has_time else dummy
        ts = timestamps.contiguous() if has_time else offsets
        out = torch.empty(T, H, Dv, dtype=v.dtype, device=v.device)
        meta = dict(P=pos.shape[-1], Bt=time.shape[-1], HAS_POS=has_pos, HAS_TIME=has_time,
                    BM=BLOCK, BN=BLOCK, BD=_pow2(D), BDV=_pow2(Dv))
        grid = (triton.cdiv(max_len, BLOCK), B, H)
        if T and B:
            _fwd[grid](q, k, v, offsets, pos, time, ts, out, alpha, 1.0 / max_len, H, D, Dv, **meta)
        ctx.save_for_backward(q, k, v, offsets, pos, time, ts)
        ctx.args = (max_len, alpha, has_pos, has_time, meta, grid)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, offsets, pos, time, ts = ctx.saved_tensors
        max_len, alpha, has_pos, has_time, meta, grid = ctx.args
        T, H, D = q.shape
        Dv = v.shape[2]
        grad = grad.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dpos = torch.zeros(pos.shape, dtype=torch.float32, device=q.device)
        dtime = torch.zeros(time.shape, dtype=torch.float32, device=q.device)
        if T and grid[1]:
            _bwd_dq[grid](q, k, v, grad, offsets, pos, time, ts, dq, dpos, dtime, alpha, 1.0 / max_len,
                          H, D, Dv, **meta)
            _bwd_dkv[grid](q, k, v, grad, offsets, pos, time, ts, dk, dv, alpha, 1.0 / max_len, H, D, Dv, **meta)
        return (dq, dk, dv, None, None, None, dpos.to(pos.dtype) if has_pos else None,
                dtime.to(time.dtype) if has_time else None, None)


def hstu_attention(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, alpha: float,
                   pos_bias: Tensor | None = None, time_bias: Tensor | None = None,
                   timestamps: Tensor | None = None) -> Tensor:
    """q, k [T, H, Dqk], v [T, H, Dv] -> [T, H, Dv] (CUDA, or CPU under TRITON_INTERPRET=1)."""
    _check_device(q)
    check_lengths(offsets, max_len)
    return _Attention.apply(q, k, v, offsets, max_len, float(alpha), pos_bias, time_bias, timestamps)
