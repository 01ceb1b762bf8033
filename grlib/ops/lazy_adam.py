"""lazy_adam_: one step of lazy (row-wise) Adam on an embedding table, in place; the op contract
and its PyTorch reference.

For every row r of w [V, d] whose gradient row is not all zero (other rows are left alone, moments
and step count included):

    n[r] += 1;  c1 = 1 - beta1^n[r];  c2 = 1 - beta2^n[r]        (n [V] float64; c1, c2 cast to w's dtype)
    m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
    w -= lr * (m / c1) / (sqrt(v / c2) + eps)

Arguments: w, grad, exp_avg (m), exp_avg_sq (v) [V, d] of one floating dtype, step (n) [V] float64,
then lr, beta1, beta2, eps. w, exp_avg, exp_avg_sq and step are updated in place.

Implementations (grlib.ops.lazy_adam_(..., impl=...)): `reference` (this file: gather the touched
rows, update them, scatter them back; any device and dtype), `cpu` (kernels/cpu/lazy_adam.cpp
through grlib.ops.cpu.lazy_adam: each row read and written once; contiguous float32 / float64 tables,
see kernel_fits; the same operations in the same order, equal to the reference within rounding).
"""
from __future__ import annotations

import torch
from torch import Tensor

from grlib.ops import registry

KERNEL_DTYPES = (torch.float32, torch.float64)  # tables the cpu kernel updates


def check_lazy_adam_args(w: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: Tensor) -> None:
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"lazy_adam_: w must be a floating 2-D table [V, d], got {w.dtype} {tuple(w.shape)}")
    for name, t in (("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        if t.shape != w.shape or t.dtype != w.dtype or t.device != w.device:
            raise ValueError(f"lazy_adam_: {name} must match w ({w.dtype} {tuple(w.shape)} on {w.device}), "
                             f"got {t.dtype} {tuple(t.shape)} on {t.device}")
    if step.shape != (w.shape[0],) or step.dtype != torch.float64 or step.device != w.device:
        raise ValueError(f"lazy_adam_: step must be float64 [V={w.shape[0]}] on {w.device}, "
                         f"got {step.dtype} {tuple(step.shape)} on {step.device}")


def kernel_fits(w: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor) -> bool:
    """Whether the cpu kernel takes these tables: float32 / float64, contiguous (any device check is the caller's)."""
    return w.dtype in KERNEL_DTYPES and all(t.is_contiguous() for t in (w, grad, exp_avg, exp_avg_sq))


def lazy_adam_reference(w: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: Tensor, lr: float,
                        beta1: float, beta2: float, eps: float) -> None:
    """One step on w [V, d] in place: gather the touched rows, update them (_adam_rows), scatter them back."""
    touched = grad.ne(0).any(dim=1)  # [V]
    n_touched = int(touched.sum())
    if n_touched == 0:
        return
    if n_touched == w.shape[0]:  # every row: update in place, no gather / scatter
        _adam_rows(w, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps)
        return
    rows = touched.nonzero().squeeze(1)  # [R]
    wr, mr, vr, nr = w[rows], exp_avg[rows], exp_avg_sq[rows], step[rows]
    _adam_rows(wr, grad[rows], mr, vr, nr, lr, beta1, beta2, eps)
    w[rows], exp_avg[rows], exp_avg_sq[rows], step[rows] = wr, mr, vr, nr


def _adam_rows(w: Tensor, g: Tensor, m: Tensor, v: Tensor, n: Tensor, lr: float, beta1: float, beta2: float,
               eps: float) -> None:
    """One Adam step, in place, on rows w [R, d] with moments m, v [R, d] and step counts n [R]."""
    m.mul_(beta1).add_(g, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    n.add_(1)
    c1 = (1 - beta1 ** n).to(w.dtype)[:, None]  # [R, 1] per-row bias corrections
    c2 = (1 - beta2 ** n).to(w.dtype)[:, None]
    w.sub_(lr * (m / c1) / ((v / c2).sqrt_() + eps))


registry.register("lazy_adam_", "reference", lambda: lazy_adam_reference)
registry.register("lazy_adam_", "cpu", registry.lazy("cpu.lazy_adam", "lazy_adam_"))


def lazy_adam_(w: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: Tensor, lr: float,
               beta1: float, beta2: float, eps: float, impl: str = "auto") -> None:
    """One lazy Adam step in place on the rows of w [V, d] whose grad row is nonzero; moments exp_avg,
    exp_avg_sq [V, d], per-row step counts step [V] float64 (module doc). The cpu kernel takes
    contiguous float32 / float64 tables (kernel_fits)."""
    check_lazy_adam_args(w, grad, exp_avg, exp_avg_sq, step)
    registry.resolve("lazy_adam_", w.device, impl)(w, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps)
