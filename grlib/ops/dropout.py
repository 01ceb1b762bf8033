"""dropout_words: dropout from 16-bit random words, the op contract and its PyTorch reference.

    out = x * (words >= threshold) * scale        x [*] floating, words [*] int16 (x's shape)

An element is kept where its word is at least `threshold` (in [-32768, 32768]: -32768 keeps all,
32768 none) and scaled by `scale`; a dropped one is x * 0 * scale = +-0. grlib.model.dropout draws
the words and picks threshold and scale. The op's gradient with respect to x is the same op
applied to the gradient.

random_words(seed, n_rows, inner, rows=None): the words themselves, int16 [n_rows, inner], from a
counter-based stream: word e of the batch (e = row * inner + j, `row` the row's index in the whole
batch: rows[r] when given, else r) is bits 16 (e % 4) .. 16 (e % 4) + 15 of splitmix64(seed, e // 4),
splitmix64(seed, i) = mix(seed + (i + 1) * 0x9E3779B97F4A7C15) (Steele et al., OOPSLA 2014: the
(i + 1)-th output of SplittableRandom(seed)). Any word is computed without the ones before it: a
data-parallel rank draws only its own rows, and the work splits over threads (torch's CPU generator
draws serially: 12 ms for the 3.1M 64-bit words of one [8192, 1536] dropout here). `reference` is the
same arithmetic in torch int64 ops (which wrap modulo 2**64), `cpu` the compiled loop; bitwise equal.

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


def _signed(u: int) -> int:  # a uint64 constant as the int64 of the same bits
    return u - (1 << 64) if u >= 1 << 63 else u


_GAMMA, _MIX1, _MIX2 = (_signed(u) for u in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _shr(z: Tensor, k: int) -> Tensor:
    """Logical right shift of int64 bits by k in 1..63 (torch's >> is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def check_random_words_args(seed: Tensor, n_rows: int, inner: int, rows: Tensor | None) -> None:
    if seed.dtype != torch.int64 or seed.numel() != 1:
        raise ValueError(f"random_words: seed must be one int64, got {seed.dtype} {tuple(seed.shape)}")
    if n_rows < 0 or inner < 0:
        raise ValueError(f"random_words: n_rows and inner must be >= 0, got {n_rows} and {inner}")
    if rows is not None and (rows.dtype != torch.int64 or rows.shape != (n_rows,)):
        raise ValueError(f"random_words: rows must be int64 [n_rows={n_rows}], got {rows.dtype} {tuple(rows.shape)}")


def random_words_reference(seed: Tensor, n_rows: int, inner: int, rows: Tensor | None) -> Tensor:
    """[n_rows, inner] int16 words of the splitmix64 stream of seed (module doc), in torch int64 ops."""
    dev = seed.device
    r = rows.to(dev) if rows is not None else torch.arange(n_rows, device=dev)
    e = (r.view(-1, 1) * inner + torch.arange(inner, device=dev)).view(-1)  # [n_rows * inner] element index
    z = seed.reshape(()) + ((e >> 2) + 1) * _GAMMA  # wraps modulo 2**64
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    z = z ^ _shr(z, 31)
    w = (z >> 16 * (e & 3)) & 0xFFFF  # [0, 65535]: shifts <= 48, so the sign's copies never reach the low 16 bits
    return (w - ((w >> 15) << 16)).to(torch.int16).view(n_rows, inner)  # the same 16 bits as int16


registry.register("random_words", "reference", lambda: random_words_reference)
registry.register("random_words", "cpu", registry.lazy("cpu.dropout", "random_words"))
registry.register("dropout_words", "reference", lambda: dropout_words_reference)
registry.register("dropout_words", "cpu", registry.lazy("cpu.dropout", "dropout_words"))


def dropout_words(x: Tensor, words: Tensor, threshold: int, scale: float, impl: str = "auto") -> Tensor:
    """x * (words >= threshold) * scale: x [*] floating, words [*] int16 -> [*] (module doc)."""
    check_dropout_words_args(x, words, threshold)
    return registry.resolve("dropout_words", x.device, impl)(x, words, threshold, scale)


def random_words(seed: Tensor, n_rows: int, inner: int, rows: Tensor | None = None, impl: str = "auto") -> Tensor:
    """[n_rows, inner] int16 words of the splitmix64 stream of `seed` (a one-element int64 tensor);
    rows [n_rows] int64: each row's index in the whole batch (None: 0 .. n_rows - 1) (module doc)."""
    check_random_words_args(seed, n_rows, inner, rows)
    return registry.resolve("random_words", seed.device, impl)(seed, n_rows, inner, rows)
