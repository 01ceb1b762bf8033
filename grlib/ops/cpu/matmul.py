"""The compiled transpose_copy (kernels/cpu/transpose.cpp; contract grlib/ops/matmul.py) with its fake
impl; no autograd: it serves the onednn linear's backward. Passes torch.library.opcheck.
"""
from __future__ import annotations

import torch
from torch import Tensor

import grlib.ops.cpu  # noqa: F401  (loads grlib._C, which registers torch.ops.grlib)

_ops = torch.ops.grlib


@torch.library.register_fake("grlib::transpose_copy")
def _(x, ones_row=False, dtype=None):
    return x.new_empty((x.shape[1] + int(ones_row), x.shape[0]), dtype=dtype or x.dtype)


def transpose_copy(x: Tensor, ones_row: bool = False, dtype: torch.dtype | None = None) -> Tensor:
    """x [M, N] -> x^T [N, M], contiguous (a copy: bitwise the values of x); ones_row: [N + 1, M] with
    a last row of ones; dtype: x's, or float32 for bfloat16 x (widened: the same values)."""
    return _ops.transpose_copy(x, ones_row, dtype)
