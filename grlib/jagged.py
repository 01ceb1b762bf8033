"""The jagged batch: B sequences of tokens stored back to back (values + offsets, no padding).

Three users with 2, 0 and 3 events (B = 3 sequences, T = 5 tokens):

    user            a        b    c
    item_ids     [ a0  a1 |     | c0  c1  c2 ]     [T] int64  (actions, timestamps: the same layout)
    targets      [ a1  0  |     | c1  0   c3 ]     [T] int64  next item to predict after each token,
                                                              0 = none (not a target, or past the window)
    offsets      [ 0,     2,    2,          5 ]    [B+1] int64: sequence b = tokens offsets[b]:offsets[b+1]
    lengths()    [ 2,     0,    3 ]                [B]
    max_len      3                                 upper bound on lengths (the attention's scale)
    eval_targets [ a2,    b0,   c3 ]               [B] (val / test batches only)
    history      [ [..], [..],  [..] ]             per user: item ids before the eval target (numpy)

    select([2, 0])  ->  item_ids [ c0 c1 c2 | a0 a1 ]   offsets [0, 3, 5]
    split(2)        ->  rows 0-1: item_ids [ a0 a1 | ]  offsets [0, 2, 2]
                        row  2:   item_ids [ c0 c1 c2 ] offsets [0, 3]
    cat(split(2))   ->  the batch again

`attachments` holds what a stage ahead of the step computed for this batch (the negative path's
sample, grlib.negatives.path), keyed by name. Attachments describe the batch's own tokens, so
`select`, `split` and `cat` do not carry them; `to(device)` moves those that have a `to`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

TOKEN_FIELDS = ("item_ids", "actions", "timestamps", "targets")  # [T] each


@dataclass(eq=False)
class JaggedBatch:
    """B sequences, T tokens in all (layout above)."""

    item_ids: Tensor  # [T] int64
    actions: Tensor  # [T] int64
    timestamps: Tensor  # [T] int64 seconds
    offsets: Tensor  # [B+1] int64
    max_len: int
    targets: Tensor  # [T] int64 next item to predict after each token, 0 = none (train)
    eval_targets: Tensor | None = None  # [B] item to predict after the last token (val/test)
    history: list[np.ndarray] | None = None  # per user: item ids seen before the eval target
    attachments: dict[str, Any] = field(default_factory=dict)  # per-batch results of earlier stages

    @property
    def batch_size(self) -> int:
        return self.offsets.numel() - 1

    @property
    def num_tokens(self) -> int:
        return self.item_ids.numel()

    def lengths(self) -> Tensor:  # [B]
        return self.offsets[1:] - self.offsets[:-1]

    def nbytes(self) -> int:
        """Bytes of the batch's tensors and history arrays (attachments not counted)."""
        tensors = [getattr(self, f) for f in TOKEN_FIELDS] + [self.offsets]
        if self.eval_targets is not None:
            tensors.append(self.eval_targets)
        return (sum(t.numel() * t.element_size() for t in tensors)
                + sum(h.nbytes for h in self.history or []))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "JaggedBatch":
        """The batch on `device` (history stays in host memory; attachments with a `to` move too)."""
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return replace(self, **{f: move(getattr(self, f)) for f in (*TOKEN_FIELDS, "offsets")},
                       eval_targets=None if self.eval_targets is None else move(self.eval_targets),
                       attachments={k: v.to(device) if hasattr(v, "to") else v for k, v in self.attachments.items()})

    def select(self, rows: Sequence[int] | Tensor | np.ndarray) -> "JaggedBatch":
        """The sub-batch of sequences `rows` (in that order; repeats allowed), offsets rebuilt."""
        rows = torch.as_tensor(np.asarray(rows, dtype=np.int64) if not isinstance(rows, Tensor) else rows,
                               dtype=torch.int64, device=self.offsets.device).reshape(-1)  # [B']
        starts, lengths = self.offsets[rows], self.lengths()[rows]  # [B'], [B']
        offsets = torch.zeros(rows.numel() + 1, dtype=torch.int64, device=self.offsets.device)
        torch.cumsum(lengths, 0, out=offsets[1:])
        token = (torch.arange(int(offsets[-1]), device=offsets.device)
                 - torch.repeat_interleave(offsets[:-1] - starts, lengths))  # [T'] indices into the batch's tokens
        rows_np = rows.cpu().numpy()
        return JaggedBatch(
            **{f: getattr(self, f)[token] for f in TOKEN_FIELDS}, offsets=offsets, max_len=self.max_len,
            eval_targets=None if self.eval_targets is None else self.eval_targets[rows],
            history=None if self.history is None else [self.history[r] for r in rows_np])

    def rows(self, start: int, stop: int) -> "JaggedBatch":
        """The sub-batch of the consecutive sequences start..stop-1 (its tensors are views)."""
        if not 0 <= start <= stop <= self.batch_size:
            raise IndexError(f"rows {start}:{stop} out of a batch of {self.batch_size} sequences")
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        return JaggedBatch(
            **{f: getattr(self, f)[lo:hi] for f in TOKEN_FIELDS}, offsets=self.offsets[start:stop + 1] - lo,
            max_len=self.max_len, eval_targets=None if self.eval_targets is None else self.eval_targets[start:stop],
            history=None if self.history is None else self.history[start:stop])

    def split(self, parts: int) -> list["JaggedBatch"]:
        """`parts` sub-batches of consecutive sequences, their sizes differing by at most one (the
        first B % parts one larger); some are empty when parts > B."""
        if parts < 1:
            raise ValueError(f"parts must be >= 1, got {parts}")
        size, extra = divmod(self.batch_size, parts)
        bounds = np.cumsum([0] + [size + (i < extra) for i in range(parts)])
        return [self.rows(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]

    @staticmethod
    def cat(batches: Sequence["JaggedBatch"]) -> "JaggedBatch":
        """The sequences of `batches` one after the other (max_len: the largest)."""
        if not batches:
            raise ValueError("cat needs at least one batch")
        if len({b.eval_targets is None for b in batches}) > 1 or len({b.history is None for b in batches}) > 1:
            raise ValueError("cat: every batch must have eval_targets and history, or none")
        first = batches[0]
        shifts = np.cumsum([0] + [b.num_tokens for b in batches[:-1]])
        zero = torch.zeros(1, dtype=torch.int64, device=first.offsets.device)
        offsets = torch.cat([zero] + [b.offsets[1:] + int(s) for b, s in zip(batches, shifts)])
        return JaggedBatch(
            **{f: torch.cat([getattr(b, f) for b in batches]) for f in TOKEN_FIELDS}, offsets=offsets,
            max_len=max(b.max_len for b in batches),
            eval_targets=None if first.eval_targets is None else torch.cat([b.eval_targets for b in batches]),
            history=None if first.history is None else [h for b in batches for h in b.history])
