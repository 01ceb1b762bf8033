"""The compiled fused ops around attention (kernels/cpu/layer_norm_mul.cpp, layer_norm.cpp, residual_add.cpp):
layer_norm_mul, layer_norm_mul_dropout, layer_norm and residual_add, with their autograd and fake impls."""
from __future__ import annotations

import torch
from torch import Tensor

import grlib.ops.cpu  # noqa: F401  (loads grlib._C, which registers torch.ops.grlib)

_ops = torch.ops.grlib


@torch.library.register_fake("grlib::layer_norm_mul")
def _(x, u, weight, bias, eps):
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_empty(x.shape), x.new_empty(x.shape[:1], dtype=acc), x.new_empty(x.shape[:1], dtype=acc)


@torch.library.register_fake("grlib::layer_norm_mul_backward")
def _(grad, x, u, weight, bias, mean, rstd):
    return x.new_empty(x.shape), u.new_empty(u.shape), weight.new_empty(weight.shape), bias.new_empty(bias.shape)


def _setup(ctx, inputs, output) -> None:
    x, u, weight, bias, _ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, u, weight, bias, mean, rstd)


def _backward(ctx, grad_y: Tensor, grad_mean, grad_rstd):
    x, u, weight, bias, mean, rstd = ctx.saved_tensors
    dx, du, dw, db = _ops.layer_norm_mul_backward(grad_y.contiguous(), x, u, weight, bias, mean, rstd)
    return dx, du, dw, db, None


torch.library.register_autograd("grlib::layer_norm_mul", _backward, setup_context=_setup)


def layer_norm_mul(x: Tensor, u: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """x, u [N, d] -> LayerNorm(x) * u [N, d] in one pass per row."""
    return _ops.layer_norm_mul(x, u, weight, bias, float(eps))[0]


@torch.library.register_fake("grlib::layer_norm_mul_dropout")
def _(x, u, weight, bias, eps, words, threshold, scale):
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_empty(x.shape), x.new_empty(x.shape[:1], dtype=acc), x.new_empty(x.shape[:1], dtype=acc)


@torch.library.register_fake("grlib::layer_norm_mul_dropout_backward")
def _(grad, x, u, weight, bias, mean, rstd, words, threshold, scale):
    return x.new_empty(x.shape), u.new_empty(u.shape), weight.new_empty(weight.shape), bias.new_empty(bias.shape)


def _setup_dropout(ctx, inputs, output) -> None:
    x, u, weight, bias, _, words, threshold, scale = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, u, weight, bias, mean, rstd, words)  # words [N, d] int16: the mask, recomputed
    ctx.threshold, ctx.scale = threshold, scale


def _backward_dropout(ctx, grad_y: Tensor, grad_mean, grad_rstd):
    x, u, weight, bias, mean, rstd, words = ctx.saved_tensors
    dx, du, dw, db = _ops.layer_norm_mul_dropout_backward(grad_y.contiguous(), x, u, weight, bias, mean, rstd, words,
                                                          ctx.threshold, ctx.scale)
    return dx, du, dw, db, None, None, None, None


torch.library.register_autograd("grlib::layer_norm_mul_dropout", _backward_dropout, setup_context=_setup_dropout)


def layer_norm_mul_dropout(x: Tensor, u: Tensor, weight: Tensor, bias: Tensor, eps: float, words: Tensor,
                           threshold: int, scale: float) -> Tensor:
    """x, u [N, d], words [N, d] int16 -> LayerNorm(x) * u * (words >= threshold) * scale, one pass per row."""
    return _ops.layer_norm_mul_dropout(x, u, weight, bias, float(eps), words.contiguous(), threshold, float(scale))[0]


@torch.library.register_fake("grlib::layer_norm")
def _(x, weight, bias, eps, l2_eps, dtype):
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_empty(x.shape, dtype=dtype or x.dtype), x.new_empty(x.shape[:1], dtype=acc)


@torch.library.register_fake("grlib::layer_norm_backward")
def _(grad, x, weight, bias, rstd, l2_eps):
    return x.new_empty(x.shape), weight.new_empty(weight.shape), bias.new_empty(bias.shape)


def _setup_layer_norm(ctx, inputs, output) -> None:
    x, weight, bias, _, l2_eps, _ = inputs
    ctx.save_for_backward(x, weight, bias, output[1])  # x [N, d] and rstd [N]: the backward recomputes the rest
    ctx.l2_eps = l2_eps


def _backward_layer_norm(ctx, grad_y: Tensor, grad_rstd):
    x, weight, bias, rstd = ctx.saved_tensors
    dx, dw, db = _ops.layer_norm_backward(grad_y.contiguous(), x, weight, bias, rstd, ctx.l2_eps)
    return dx, dw, db, None, None, None


torch.library.register_autograd("grlib::layer_norm", _backward_layer_norm, setup_context=_setup_layer_norm)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float, l2_eps: float | None,
               dtype: torch.dtype | None) -> Tensor:
    """x [N, d] -> LayerNorm(x) (then L2-normalised if l2_eps is given) in `dtype`, one pass per row."""
    return _ops.layer_norm(x, weight, bias, float(eps), None if l2_eps is None else float(l2_eps), dtype)[0]


@torch.library.register_fake("grlib::residual_add")
def _(x, h):
    return x.new_empty(x.shape)


def _setup_residual_add(ctx, inputs, output) -> None:
    ctx.h_dtype = inputs[1].dtype


def _backward_residual_add(ctx, grad: Tensor):
    return grad, grad.to(ctx.h_dtype)


torch.library.register_autograd("grlib::residual_add", _backward_residual_add, setup_context=_setup_residual_add)


def residual_add(x: Tensor, h: Tensor) -> Tensor:
    """x [*] float32 + h [*] -> [*] float32, one pass."""
    return _ops.residual_add(x, h)
