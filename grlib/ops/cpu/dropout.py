"""The compiled dropout_words and random_words (kernels/cpu/dropout.cpp; contract grlib/ops/dropout.py)
with their fake impls, and dropout_words' autograd (the gradient is the same op on the gradient).
Both pass torch.library.opcheck.
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


def dropout_words(x: Tensor, words: Tensor, threshold: int, scale: float) -> Tensor:
    """x [*], words [*] int16 -> x * (words >= threshold) * scale [*] in one pass (autograd: the same op)."""
    return _ops.dropout_words(x, words, threshold, float(scale))


@torch.library.register_fake("grlib::random_words")
def _(seed, n_rows, inner, rows):
    return seed.new_empty((n_rows, inner), dtype=torch.int16)


def random_words(seed: Tensor, n_rows: int, inner: int, rows: Tensor | None) -> Tensor:
    """[n_rows, inner] int16 words of the splitmix64 stream of seed, one compiled pass."""
    return _ops.random_words(seed.reshape(()), n_rows, inner, rows)
