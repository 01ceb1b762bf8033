"""The compiled ops of the training step outside attention, with their fake impls and autograd:
dropout_words (kernels/cpu/dropout.cpp; contract grlib/ops/dropout.py) and lazy_adam_
(kernels/cpu/lazy_adam.cpp; contract grlib/ops/lazy_adam.py), embedding_sum (kernels/cpu/embedding_sum.cpp;
contract grlib/ops/embedding.py) and transpose_copy (kernels/cpu/transpose.cpp;
contract grlib/ops/matmul.py; no autograd: it serves the linear layer's backward). All pass
torch.library.opcheck.
"""
from __future__ import annotations

import torch
from torch import Tensor

import grlib.ops.cpu  # noqa: F401  (loads grlib._C, which registers torch.ops.grlib)

_ops = torch.ops.grlib


@torch.library.register_fake("grlib::dropout_words")
def _(x, words, threshold, scale):
    return x.new_empty(x.shape)  # [*], contiguous


def _setup_dropout(ctx, inputs, output) -> None:
    _, words, threshold, scale = inputs
    ctx.save_for_backward(words)  # [*] int16: the mask is recomputed from the words in backward
    ctx.threshold, ctx.scale = threshold, scale


def _dropout_backward(ctx, grad: Tensor):
    (words,) = ctx.saved_tensors
    return _ops.dropout_words(grad, words, ctx.threshold, ctx.scale), None, None, None


torch.library.register_autograd("grlib::dropout_words", _dropout_backward, setup_context=_setup_dropout)


@torch.library.register_fake("grlib::lazy_adam_")
def _(w, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps) -> None:
    return None  # in place: no outputs


@torch.library.register_fake("grlib::transpose_copy")
def _(x):
    return x.new_empty((x.shape[1], x.shape[0]))


def transpose_copy(x: Tensor) -> Tensor:
    """x [M, N] -> x^T [N, M], contiguous (a copy: bitwise the values of x)."""
    return _ops.transpose_copy(x)


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


def dropout_words(x: Tensor, words: Tensor, threshold: int, scale: float) -> Tensor:
    """x [*], words [*] int16 -> x * (words >= threshold) * scale [*] in one pass (autograd: the same op)."""
    return _ops.dropout_words(x, words, threshold, float(scale))


def lazy_adam_(w: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: Tensor, lr: float,
               beta1: float, beta2: float, eps: float) -> None:
    """One lazy Adam step on w [V, d] in place (contiguous float32 / float64 CPU tables)."""
    _ops.lazy_adam_(w, grad, exp_avg, exp_avg_sq, step, float(lr), float(beta1), float(beta2), float(eps))
