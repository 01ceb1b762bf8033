"""The compiled lazy_adam_ (kernels/cpu/lazy_adam.cpp; contract grlib/ops/lazy_adam.py) with its fake
impl (in place: no outputs). Passes torch.library.opcheck.
"""
from __future__ import annotations

import torch
from torch import Tensor

import grlib.ops.cpu  # noqa: F401  (loads grlib._C, which registers torch.ops.grlib)

_ops = torch.ops.grlib


@torch.library.register_fake("grlib::lazy_adam_")
def _(w, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps) -> None:
    return None  # in place: no outputs


def lazy_adam_(w: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: Tensor, lr: float,
               beta1: float, beta2: float, eps: float) -> None:
    """One lazy Adam step on w [V, d] in place (contiguous float32 / float64 CPU tables)."""
    _ops.lazy_adam_(w, grad, exp_avg, exp_avg_sq, step, float(lr), float(beta1), float(beta2), float(eps))
