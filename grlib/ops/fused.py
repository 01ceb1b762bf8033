"""Ops fused around attention, with their padded-free pure-torch references (the ground truth).

layer_norm_mul(x, u, weight, bias, eps) = LayerNorm(x) * u over the last dim: HSTU's
`norm_attn(A V) * U` before the output projection. The compiled kernel (kernels/cpu/
layer_norm_mul.cpp, grlib.ops.cpu.fused) does it in one pass per row and keeps only mean and
rstd for backward instead of the [N, d] LayerNorm output.

layer_norm_mul_dropout(x, u, weight, bias, eps, words, threshold, scale) = dropout_words(
LayerNorm(x) * u, words, threshold, scale) (grlib/ops/dropout.py): HSTU's `Dropout(norm_attn(A V) * U)`,
the dropout's mask applied in the same pass forward, and to the incoming gradient as the backward
reads it (keeping the int16 words, not the [N, d] product).

layer_norm(x, weight, bias, eps, l2_eps=None, dtype=None) = LayerNorm(x) over the last dim, then
(l2_eps given) F.normalize(., dim=-1, eps=l2_eps), rounded once to `dtype` (x's, or bfloat16 for
float32 x). HSTU's final LayerNorm and L2 normalisation is one op instead of a dozen passes over
[T, d] (the norm, clamp, division and their backward), and each layer's input LayerNorm writes the
bf16 input of a bf16 projection directly (no cast forward, none of the gradient back). The
compiled kernel (kernels/cpu/layer_norm.cpp, grlib.ops.cpu.fused) keeps only rstd [N] for backward.

residual_add(x, h) = x + h for a float32 residual stream x and a layer output h in bf16 (or float16,
float32): one pass (kernels/cpu/residual_add.cpp) where torch's add first widens h into a copy of its
own; bitwise torch's sum. Its gradient: the incoming one for x, the same rounded to h's dtype for h.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from grlib.ops import registry
from grlib.ops.dropout import check_dropout_words_args, dropout_words_reference


def check_layer_norm_mul_args(x: Tensor, u: Tensor, weight: Tensor, bias: Tensor, eps: float) -> None:
    if x.dim() < 1 or u.shape != x.shape:
        raise ValueError(f"x and u must have one shape [..., d], got {tuple(x.shape)} and {tuple(u.shape)}")
    if x.dtype != u.dtype or not x.is_floating_point():
        raise TypeError(f"x and u must share one floating dtype, got {x.dtype} and {u.dtype}")
    d = x.shape[-1]
    if weight.shape != (d,) or bias.shape != (d,):
        raise ValueError(f"weight and bias must be [d={d}], got {tuple(weight.shape)} and {tuple(bias.shape)}")
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")


def check_layer_norm_args(x: Tensor, weight: Tensor, bias: Tensor, eps: float, l2_eps: float | None,
                          dtype: torch.dtype | None) -> None:
    if x.dim() < 1 or not x.is_floating_point():
        raise TypeError(f"layer_norm: x must be a floating [..., d] tensor, got {x.dtype} {tuple(x.shape)}")
    d = x.shape[-1]
    if weight.shape != (d,) or bias.shape != (d,):
        raise ValueError(f"layer_norm: weight and bias must be [d={d}], got {tuple(weight.shape)} and "
                         f"{tuple(bias.shape)}")
    if eps <= 0:
        raise ValueError(f"layer_norm: eps must be > 0, got {eps}")
    if l2_eps is not None and l2_eps <= 0:
        raise ValueError(f"layer_norm: l2_eps must be > 0 (or None: no L2 normalisation), got {l2_eps}")
    if dtype not in (None, x.dtype) and not (x.dtype == torch.float32 and dtype == torch.bfloat16):
        raise TypeError(f"layer_norm: dtype must be x's ({x.dtype}) or, for float32 x, bfloat16; got {dtype}")


def layer_norm_reference(x: Tensor, weight: Tensor, bias: Tensor, eps: float, l2_eps: float | None,
                         dtype: torch.dtype | None) -> Tensor:
    """x [N, d] -> LayerNorm(x) [N, d], then F.normalize (l2_eps given), then .to(dtype) (torch ops, autograd)."""
    y = F.layer_norm(x, (x.shape[-1],), weight.to(x.dtype), bias.to(x.dtype), eps)
    if l2_eps is not None:
        y = F.normalize(y, dim=-1, eps=l2_eps)
    return y if dtype is None else y.to(dtype)


def layer_norm_mul_reference(x: Tensor, u: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """x, u [N, d] -> LayerNorm(x) * u [N, d] (two torch ops, autograd)."""
    return F.layer_norm(x, (x.shape[-1],), weight.to(x.dtype), bias.to(x.dtype), eps) * u


def layer_norm_mul_dropout_reference(x: Tensor, u: Tensor, weight: Tensor, bias: Tensor, eps: float, words: Tensor,
                                     threshold: int, scale: float) -> Tensor:
    """x, u [N, d], words [N, d] int16 -> dropout_words(LayerNorm(x) * u) (torch ops, autograd)."""
    return dropout_words_reference(layer_norm_mul_reference(x, u, weight, bias, eps), words, threshold, scale)


def check_residual_add_args(x: Tensor, h: Tensor) -> None:
    if x.dtype != torch.float32 or h.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"residual_add: x must be float32 and h bfloat16, float16 or float32, got {x.dtype} "
                        f"and {h.dtype}")
    if h.shape != x.shape:
        raise ValueError(f"residual_add: h must have x's shape {tuple(x.shape)}, got {tuple(h.shape)}")


def residual_add_reference(x: Tensor, h: Tensor) -> Tensor:
    """x [*] float32 + h [*] -> [*] float32 (torch's type promotion, autograd)."""
    return x + h


registry.register("residual_add", "reference", lambda: residual_add_reference)
registry.register("residual_add", "cpu", registry.lazy("cpu.fused", "residual_add"))
registry.register("layer_norm", "reference", lambda: layer_norm_reference)
registry.register("layer_norm", "cpu", registry.lazy("cpu.fused", "layer_norm"))
registry.register("layer_norm_mul", "reference", lambda: layer_norm_mul_reference)
registry.register("layer_norm_mul", "cpu", registry.lazy("cpu.fused", "layer_norm_mul"))
registry.register("layer_norm_mul_dropout", "reference", lambda: layer_norm_mul_dropout_reference)
registry.register("layer_norm_mul_dropout", "cpu", registry.lazy("cpu.fused", "layer_norm_mul_dropout"))


def layer_norm_mul(x: Tensor, u: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5,
                   impl: str = "auto") -> Tensor:
    """LayerNorm(x) * u over the last dim: x, u [..., d], weight, bias [d] -> [..., d]."""
    check_layer_norm_mul_args(x, u, weight, bias, eps)
    fn = registry.resolve("layer_norm_mul", x.device, impl)
    d = x.shape[-1]
    return fn(x.reshape(-1, d), u.reshape(-1, d), weight, bias, eps).reshape(x.shape)


def layer_norm_mul_dropout(x: Tensor, u: Tensor, weight: Tensor, bias: Tensor, words: Tensor, threshold: int,
                           scale: float, eps: float = 1e-5, impl: str = "auto") -> Tensor:
    """dropout_words(LayerNorm(x) * u, words, threshold, scale) over the last dim: x, u, words [..., d]
    (words int16), weight, bias [d] -> [..., d] in one pass."""
    check_layer_norm_mul_args(x, u, weight, bias, eps)
    check_dropout_words_args(x, words, threshold)
    fn = registry.resolve("layer_norm_mul_dropout", x.device, impl)
    d = x.shape[-1]
    return fn(x.reshape(-1, d), u.reshape(-1, d), weight, bias, eps, words.reshape(-1, d), threshold,
              scale).reshape(x.shape)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5, l2_eps: float | None = None,
               dtype: torch.dtype | None = None, impl: str = "auto") -> Tensor:
    """LayerNorm(x) over the last dim, then L2 normalisation (F.normalize's, eps l2_eps) if l2_eps is
    given, rounded to `dtype` (x's, or bfloat16 for float32 x): x [..., d], weight, bias [d] -> [..., d]."""
    check_layer_norm_args(x, weight, bias, eps, l2_eps, dtype)
    fn = registry.resolve("layer_norm", x.device, impl)
    d = x.shape[-1]
    return fn(x.reshape(-1, d), weight, bias, eps, l2_eps, dtype).reshape(x.shape)


def residual_add(x: Tensor, h: Tensor, impl: str = "auto") -> Tensor:
    """x [*] float32 + h [*] (bf16, float16 or float32) -> [*] float32 in one pass (module doc)."""
    check_residual_add_args(x, h)
    return registry.resolve("residual_add", x.device, impl)(x, h)
