"""The compiled jagged conversions and reductions (kernels/cpu/jagged.cpp; contract grlib/ops/
jagged.py) with their autograd and fake impls: jagged_to_padded, padded_to_jagged, segment_sum,
segment_expand.
"""
from __future__ import annotations

import torch
from torch import Tensor

import grlib.ops.cpu  # noqa: F401  (loads grlib._C, which registers torch.ops.grlib)

_ops = torch.ops.grlib


# ---- fake (meta) implementations: output shapes only --------------------------------------------
@torch.library.register_fake("grlib::jagged_to_padded")
def _(values: Tensor, offsets: Tensor, max_len: int, padding_value: float) -> Tensor:
    return values.new_empty((offsets.shape[0] - 1, max_len, values.shape[1]))


@torch.library.register_fake("grlib::padded_to_jagged")
def _(padded: Tensor, offsets: Tensor, total: int) -> Tensor:
    return padded.new_empty((total, padded.shape[2]))


@torch.library.register_fake("grlib::segment_sum")
def _(values: Tensor, offsets: Tensor) -> Tensor:
    return values.new_empty((offsets.shape[0] - 1, values.shape[1]))


@torch.library.register_fake("grlib::segment_expand")
def _(x: Tensor, offsets: Tensor, total: int) -> Tensor:
    return x.new_empty((total, x.shape[1]))


# ---- autograd: each conversion's gradient is the other one ---------------------------------------
def _save_offsets_and_total(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[1])
    ctx.total = inputs[0].shape[0]


def _j2p_backward(ctx, grad: Tensor):
    (offsets,) = ctx.saved_tensors
    return _ops.padded_to_jagged(grad.contiguous(), offsets, ctx.total), None, None, None


def _p2j_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[1])
    ctx.max_len = inputs[0].shape[1]


def _p2j_backward(ctx, grad: Tensor):
    (offsets,) = ctx.saved_tensors
    return _ops.jagged_to_padded(grad.contiguous(), offsets, ctx.max_len, 0.0), None, None


def _sum_backward(ctx, grad: Tensor):
    (offsets,) = ctx.saved_tensors
    return _ops.segment_expand(grad.contiguous(), offsets, ctx.total), None


def _expand_backward(ctx, grad: Tensor):
    (offsets,) = ctx.saved_tensors
    return _ops.segment_sum(grad.contiguous(), offsets), None, None


def _save_offsets(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[1])


torch.library.register_autograd("grlib::jagged_to_padded", _j2p_backward, setup_context=_save_offsets_and_total)
torch.library.register_autograd("grlib::padded_to_jagged", _p2j_backward, setup_context=_p2j_setup)
torch.library.register_autograd("grlib::segment_sum", _sum_backward, setup_context=_save_offsets_and_total)
torch.library.register_autograd("grlib::segment_expand", _expand_backward, setup_context=_save_offsets)


def jagged_to_padded(values: Tensor, offsets: Tensor, max_len: int, padding_value: float = 0.0) -> Tensor:
    return _ops.jagged_to_padded(values, offsets, max_len, padding_value)


def padded_to_jagged(padded: Tensor, offsets: Tensor, total: int) -> Tensor:
    return _ops.padded_to_jagged(padded, offsets, total)


def segment_sum(values: Tensor, offsets: Tensor) -> Tensor:
    return _ops.segment_sum(values, offsets)


def segment_expand(x: Tensor, offsets: Tensor, total: int) -> Tensor:
    return _ops.segment_expand(x, offsets, total)
