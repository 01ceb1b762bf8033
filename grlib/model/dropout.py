"""Dropout whose mask comes from 16-bit random words: 6x cheaper than nn.Dropout on CPU.

torch's CPU dropout draws one Bernoulli variate per element through a serial generator (about
12 ms for a [6900, 256] activation here, 12% of a laptop training step of HSTU). Here every
element gets a 16-bit word r, and it is dropped when r < k = round(p * 65536): the drop probability
is k / 65536 (within 2**-17 of p), and the kept elements are scaled by 1 / (1 - k / 65536), so
E[dropout(x)] = x exactly.

The words: on CPU, one 64-bit draw of torch's default generator seeds a counter-based stream
(grlib.ops.random_words: splitmix64 of the element's index in the batch, four words per 64-bit
output), computed in parallel; elsewhere, four words per 64-bit draw of the device's generator.
Either way deterministic under torch.manual_seed and restored with torch's RNG state
(grlib.train.checkpoint), like nn.Dropout.

Data-parallel runs (grlib.distributed.data_parallel) give each token the words of its row in the
whole global batch (`global_rows`): on CPU each rank computes its own rows' words of the stream
(the same seed draw on every rank); elsewhere every rank draws the whole batch's and keeps its
rows. So a token's mask does not depend on which rank trains it, and N ranks train the model one
process trains (same masks, same generator state afterwards). Outside that context nothing changes.

The words are applied by grlib.ops.dropout_words (x * (words >= threshold) * scale): on CPU one
compiled pass (no bool mask, cast and second product as passes of their own), forward and
backward, keeping the int16 words [*] for the backward; elsewhere the torch reference, keeping
the bool mask.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from grlib import ops
from grlib.ops.dropout import kept

WORDS = 1 << 16

# (tokens of the global batch, [T_local] int64 global index of each local token) while active
_GLOBAL_ROWS: contextvars.ContextVar[tuple[int, Tensor] | None] = contextvars.ContextVar("grlib_dropout_rows",
                                                                                         default=None)


@contextlib.contextmanager
def global_rows(total: int, index: Tensor) -> Iterator[None]:
    """Within: dropout of a [T_local, ...] activation draws the words of [total, ...] and keeps the
    rows `index` [T_local] (the local tokens' positions in the global batch of `total` tokens)."""
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= total):
        raise ValueError(f"global_rows: token index out of range [0, {total})")
    token = _GLOBAL_ROWS.set((total, index))
    try:
        yield
    finally:
        _GLOBAL_ROWS.reset(token)


def current_rows() -> tuple[int, Tensor] | None:
    """The global_rows setting now (None outside one): what a recomputation must run under again."""
    return _GLOBAL_ROWS.get()


@contextlib.contextmanager
def rows_as(rows: tuple[int, Tensor] | None) -> Iterator[None]:
    """Within: the global_rows setting `rows` (from current_rows()), None included; for a layer
    recomputed in backward, which runs after the forward's global_rows block has ended."""
    token = _GLOBAL_ROWS.set(rows)
    try:
        yield
    finally:
        _GLOBAL_ROWS.reset(token)


def drop_count(p: float) -> int:
    """k: an element is dropped with probability k / 65536."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    return round(p * WORDS)


def random_words(shape: torch.Size, device: torch.device | str = "cpu") -> Tensor:
    """[shape] int16, uniform over [-32768, 32767] (under global_rows: the words of the rows of the
    global batch, see the module doc)."""
    rows = _GLOBAL_ROWS.get()
    local = rows is not None and len(shape) >= 1 and shape[0] == rows[1].numel()
    if torch.device(device).type == "cpu":  # the counter-based stream of one 64-bit seed
        seed = torch.empty((), dtype=torch.int64).random_(-(2**63), None)  # one draw of the default generator
        n_rows, inner = (shape[0], math.prod(shape[1:])) if len(shape) else (1, 1)
        return ops.random_words(seed, n_rows, inner, rows[1] if local else None).view(shape)
    if local:
        total, index = rows
        whole = _words(torch.Size((total, *shape[1:])), device)  # [total, ...]
        return whole.index_select(0, index.to(whole.device))
    return _words(torch.Size(shape), device)


def _words(shape: torch.Size, device: torch.device | str) -> Tensor:  # four words per 64-bit draw
    n = shape.numel()
    # [ceil(n / 4)], all 64 bits
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), None)
    words = words.view(torch.int16)[:n].view(shape)
    # under torch.compile, an output that views the int64 buffer as int16 breaks AOT autograd's alias
    # replay (it re-creates the view with the int64 item size: torch 2.13); a copy is not an alias
    return words.clone() if torch.compiler.is_compiling() else words


def keep_mask(shape: torch.Size, p: float, device: torch.device | str = "cpu") -> Tensor:
    """[shape] bool, True with probability 1 - drop_count(p) / 65536."""
    return kept(random_words(shape, device), drop_count(p) - WORDS // 2)


def draw(shape: torch.Size, p: float, device: torch.device | str = "cpu") -> tuple[Tensor, int, float]:
    """The words [shape] int16, threshold and scale of one dropout of probability p (what
    ops.dropout_words applies; a fused op that applies the dropout itself takes these three)."""
    k = drop_count(p)
    scale = WORDS / (WORDS - k) if k < WORDS else 0.0
    threshold = k - WORDS // 2  # kept where word >= threshold (none when p = 1)
    return random_words(shape, device), threshold, scale


def fast_dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    if not training or p == 0.0:
        return x
    return ops.dropout_words(x, *draw(x.shape, p, x.device))  # words [*] int16


class FastDropout(nn.Module):
    """Drop-in for nn.Dropout (see the module doc for the 2**-17 quantisation of p)."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        drop_count(p)  # validates
        self.p = p

    @property
    def active(self) -> bool:
        """Whether forward draws and applies a mask (training, p > 0)."""
        return self.training and self.p > 0.0

    def draw(self, shape: torch.Size, device: torch.device | str = "cpu") -> tuple[Tensor, int, float]:
        """(words, threshold, scale) of this dropout for an activation of `shape`, drawn as forward
        draws them (for an op that fuses the dropout: grlib.ops.layer_norm_mul_dropout)."""
        return draw(shape, self.p, device)

    def forward(self, x: Tensor) -> Tensor:
        return fast_dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
