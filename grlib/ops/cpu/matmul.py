"""The compiled transpose_copy (kernels/cpu/transpose.cpp; contract grlib/ops/matmul.py) with its fake
impl; no autograd: it serves the onednn linear's backward. Passes torch.library.opcheck.
"""
from __future__ import annotations

import torch
from torch import Tensor

import grlib.ops.cpu  # noqa: F401  (loads grlib._C, which registers torch.ops.grlib)

_ops = torch.ops.grlib


@torch.library.register_fake("grlib::transpose_copy")
def _(x):
    return x.new_empty((x.shape[1], x.shape[0]))


def transpose_copy(x: Tensor) -> Tensor:
    """x [M, N] -> x^T [N, M], contiguous (a copy: bitwise the values of x)."""
    return _ops.transpose_copy(x)
