"""The compiled embedding_sum (kernels/cpu/embedding_sum.cpp; contract grlib/ops/embedding.py) with its
fake impls and autograd (the compiled backward op). Passes torch.library.opcheck.
"""
from __future__ import annotations

import torch
from torch import Tensor

import grlib.ops.cpu  # noqa: F401  (loads grlib._C, which registers torch.ops.grlib)

_ops = torch.ops.grlib


@torch.library.register_fake("grlib::embedding_sum")
def _(items, actions, gaps, ids, acts, gap_idx, scale):
    return items.new_empty((ids.shape[0], items.shape[1]))


@torch.library.register_fake("grlib::embedding_sum_backward")
def _(grad, ids, acts, gap_idx, n_items, n_actions, n_gaps, scale, padding_idx):
    return (grad.new_empty((n_items, grad.shape[1])), grad.new_empty((n_actions, grad.shape[1])),
            grad.new_empty((n_gaps, grad.shape[1])))


def embedding_sum(items: Tensor, actions: Tensor, gaps: Tensor, ids: Tensor, acts: Tensor, gap_idx: Tensor,
                  scale: float, padding_idx: int | None) -> Tensor:
    """(items[ids] * scale + actions[acts]) + gaps[gap_idx] -> [T, d], one pass each way."""
    return _EmbeddingSum.apply(items, actions, gaps, ids.long(), acts.long(), gap_idx.long(), float(scale),
                               -1 if padding_idx is None else padding_idx)


class _EmbeddingSum(torch.autograd.Function):
    """The compiled forward and backward; padding_idx rides along (the op's schema has no use for it
    forward)."""

    @staticmethod
    def forward(ctx, items, actions, gaps, ids, acts, gap_idx, scale, padding_idx):
        ctx.save_for_backward(ids, acts, gap_idx)
        ctx.rows, ctx.scale, ctx.padding_idx = (items.shape[0], actions.shape[0], gaps.shape[0]), scale, padding_idx
        return _ops.embedding_sum(items, actions, gaps, ids, acts, gap_idx, scale)

    @staticmethod
    def backward(ctx, grad):
        ids, acts, gap_idx = ctx.saved_tensors
        d_items, d_actions, d_gaps = _ops.embedding_sum_backward(grad, ids, acts, gap_idx, *ctx.rows, ctx.scale,
                                                                 ctx.padding_idx)
        return d_items, d_actions, d_gaps, None, None, None, None, None
