"""dropout_words: dropout from 16-bit random words, the op contract and its PyTorch reference.

    out = x * (words >= threshold) * scale        x [*] floating, words [*] int16 (x's shape)

An element is kept where its word is at least `threshold` (in [-32768, 32768]: -32768 keeps all,
32768 none) and scaled by `scale`; a dropped one is x * 0 * scale = +-0. grlib.model.dropout draws
the words and picks threshold and scale. The op's gradient with respect to x is the same op
applied to the gradient.

Implementations (grlib.ops.dropout_words(..., impl=...)): `reference` (this file: the bool mask
and two products, any device; under autograd it keeps only the bool mask for backward), `cpu`
(kernels/cpu/dropout.cpp through grlib.ops.cpu.dropout: one pass, no mask, cast or second product
as passes of their own; bitwise equal to the reference, forward and backward; it keeps the int16
words for backward).
"""
from __future__ import annotations

import torch
from torch import Tensor

from grlib.ops import registry

WORD_MIN, WORD_MAX = -(2**15), 2**15  # threshold range: every word kept .. none kept


def check_dropout_words_args(x: Tensor, words: Tensor, threshold: int) -> None:
    if not x.is_floating_point():
        raise TypeError(f"dropout_words: x must be floating point, got {x.dtype}")
    if words.dtype != torch.int16 or words.shape != x.shape:
        raise ValueError(f"dropout_words: words must be int16 of x's shape {tuple(x.shape)}, "
                         f"got {words.dtype} {tuple(words.shape)}")
    if words.device != x.device:
        raise ValueError(f"dropout_words: words must be on x's device {x.device}, got {words.device}")
    if not WORD_MIN <= threshold <= WORD_MAX:
        raise ValueError(f"dropout_words: threshold must be in [{WORD_MIN}, {WORD_MAX}], got {threshold}")


def kept(words: Tensor, threshold: int) -> Tensor:
    """words [*] int16 -> [*] bool: words >= threshold for every threshold in [-32768, 32768], 32768
    keeping none (torch would wrap the Python int 32768 to int16 -32768 and keep every word)."""
    if threshold > WORD_MAX - 1:
        return torch.zeros_like(words, dtype=torch.bool)
    return words >= threshold


def dropout_words_reference(x: Tensor, words: Tensor, threshold: int, scale: float) -> Tensor:
    """x [*], words [*] int16 -> x * (words >= threshold) * scale [*] (torch ops, autograd)."""
    return x * kept(words, threshold) * scale


registry.register("dropout_words", "reference", lambda: dropout_words_reference)
registry.register("dropout_words", "cpu", registry.lazy("cpu.dropout", "dropout_words"))


def dropout_words(x: Tensor, words: Tensor, threshold: int, scale: float, impl: str = "auto") -> Tensor:
    """x * (words >= threshold) * scale: x [*] floating, words [*] int16 -> [*] (module doc)."""
    check_dropout_words_args(x, words, threshold)
    return registry.resolve("dropout_words", x.device, impl)(x, words, threshold, scale)
