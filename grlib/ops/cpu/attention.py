"""The compiled jagged HSTU attention (kernels/cpu/hstu_*; design in hstu_attention.h) with autograd
and fake impls.

torch.ops.grlib.hstu_attention is the forward; its backward is a second compiled op,
torch.ops.grlib.hstu_attention_backward, returning (dq, dk, dv, dpos_bias, dtime_bias) with an
empty bias gradient for an absent table. Both pass torch.library.opcheck.

torch.ops.grlib.hstu_uvqk_attention fuses HSTU's SiLU, split and attention: from the projection
z [T, 4d] (columns u | v | q | k) it returns SiLU(z_u) and the attention of SiLU(z_q), SiLU(z_k),
SiLU(z_v) without writing those activations out; its backward writes dz [T, 4d] directly (no
concatenation of four gradients, no separate SiLU backward pass).
"""
from __future__ import annotations

import torch
from torch import Tensor

import grlib.ops.cpu  # noqa: F401  (loads grlib._C, which registers torch.ops.grlib)
from grlib.ops.attention import check_lengths

_ops = torch.ops.grlib


@torch.library.register_fake("grlib::hstu_attention")
def _(q, k, v, offsets, max_len, alpha, pos_bias, time_bias, timestamps) -> Tensor:
    return v.new_empty(v.shape)  # [T, H, Dv]


@torch.library.register_fake("grlib::hstu_attention_backward")
def _(grad, q, k, v, offsets, max_len, alpha, pos_bias, time_bias, timestamps, mode=0):
    def bias_grad(table):
        return q.new_empty((0,)) if table is None else table.new_empty(table.shape)

    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            bias_grad(pos_bias), bias_grad(time_bias))


def _setup(ctx, inputs, output) -> None:
    q, k, v, offsets, max_len, alpha, pos_bias, time_bias, timestamps = inputs
    ctx.save_for_backward(q, k, v, offsets, pos_bias, time_bias, timestamps)
    ctx.max_len, ctx.alpha = max_len, alpha


def _backward(ctx, grad: Tensor):
    q, k, v, offsets, pos_bias, time_bias, timestamps = ctx.saved_tensors
    dq, dk, dv, dpos, dtime = _ops.hstu_attention_backward(
        grad, q, k, v, offsets, ctx.max_len, ctx.alpha, pos_bias, time_bias, timestamps)
    return (dq, dk, dv, None, None, None,
            dpos if pos_bias is not None else None, dtime if time_bias is not None else None, None)


torch.library.register_autograd("grlib::hstu_attention", _backward, setup_context=_setup)


@torch.library.register_fake("grlib::hstu_uvqk_attention")
def _(z, offsets, max_len, alpha, n_heads, pos_bias, time_bias, timestamps):
    T, d = z.shape[0], z.shape[1] // 4
    return z.new_empty((T, d)), z.new_empty((T, n_heads, d // n_heads))


@torch.library.register_fake("grlib::hstu_uvqk_attention_backward")
def _(grad_u, grad_attn, z, offsets, max_len, alpha, n_heads, pos_bias, time_bias, timestamps, mode=0):
    def bias_grad(table):
        return z.new_empty((0,)) if table is None else table.new_empty(table.shape)

    return z.new_empty(z.shape), bias_grad(pos_bias), bias_grad(time_bias)


def _setup_uvqk(ctx, inputs, output) -> None:
    z, offsets, max_len, alpha, n_heads, pos_bias, time_bias, timestamps = inputs
    ctx.save_for_backward(z, offsets, pos_bias, time_bias, timestamps)
    ctx.max_len, ctx.alpha, ctx.n_heads = max_len, alpha, n_heads


def _backward_uvqk(ctx, grad_u: Tensor | None, grad_attn: Tensor | None):
    z, offsets, pos_bias, time_bias, timestamps = ctx.saved_tensors
    T, d = z.shape[0], z.shape[1] // 4
    grad_u = z.new_zeros((T, d)) if grad_u is None else grad_u
    grad_attn = z.new_zeros((T, ctx.n_heads, d // ctx.n_heads)) if grad_attn is None else grad_attn
    dz, dpos, dtime = _ops.hstu_uvqk_attention_backward(
        grad_u, grad_attn, z, offsets, ctx.max_len, ctx.alpha, ctx.n_heads, pos_bias, time_bias, timestamps)
    return (dz, None, None, None, None, dpos if pos_bias is not None else None,
            dtime if time_bias is not None else None, None)


torch.library.register_autograd("grlib::hstu_uvqk_attention", _backward_uvqk, setup_context=_setup_uvqk)


def uvqk_attention(z: Tensor, n_heads: int, offsets: Tensor, max_len: int, alpha: float,
                   pos_bias: Tensor | None = None, time_bias: Tensor | None = None,
                   timestamps: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """z [T, 4d] -> (SiLU(z_u) [T, d], attention [T, n_heads, d / n_heads]); the fused kernel."""
    check_lengths(offsets, max_len)
    if time_bias is None:
        timestamps = None
    return _ops.hstu_uvqk_attention(z, offsets, max_len, float(alpha), n_heads, pos_bias, time_bias, timestamps)


def hstu_attention(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, alpha: float,
                   pos_bias: Tensor | None = None, time_bias: Tensor | None = None,
                   timestamps: Tensor | None = None) -> Tensor:
    """q, k [T, H, Dqk], v [T, H, Dv] -> [T, H, Dv]; the fused kernel, forward and backward."""
    check_lengths(offsets, max_len)  # the kernel checks too; this gives the same ValueError as the others
    if time_bias is None:
        timestamps = None  # unused without a time table: do not save it for backward
    return _ops.hstu_attention(q, k, v, offsets, max_len, float(alpha), pos_bias, time_bias, timestamps)
