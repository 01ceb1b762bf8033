"""The jagged layout the ops take, and its ops: B variable-length sequences stored back to back, no
padding (the batch that carries it through the model is grlib.jagged.JaggedBatch).

    lengths  = [2, 0, 3]
    values   = [a0 a1 c0 c1 c2]            # [T=5, *F]
    offsets  = [0, 2, 2, 5]                # [B+1] int64, sequence b = values[offsets[b]:offsets[b+1]]
    max_len  = 3                           # upper bound on lengths (the padded width when padding)

The ops: jagged_to_padded, padded_to_jagged, segment_sum, segment_mean, segment_expand.
Implementations: `reference` (this file: padded pure PyTorch, the ground truth every kernel is
tested against; they pad to a dense [B, N, ...] tensor and use plain torch ops, as a user without
jagged kernels would, and autograd differentiates them), `cpu` (grlib.ops.cpu.jagged), `fbgemm`
(grlib.ops.fbgemm.jagged; not segment_expand). Feature dims after the token dim are flattened
for the implementations and restored.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from grlib.ops import registry


def offsets_from_lengths(lengths: Tensor) -> Tensor:
    """[B] lengths -> [B+1] int64 offsets."""
    lengths = torch.as_tensor(lengths, dtype=torch.int64)
    out = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=out[1:])
    return out


def check_jagged(values: Tensor, offsets: Tensor, name: str = "values") -> None:
    """Cheap structural checks with messages that name the argument (no data scan on values)."""
    if not isinstance(values, Tensor) or not isinstance(offsets, Tensor):
        raise TypeError(f"{name} and offsets must be tensors, got {type(values).__name__}, {type(offsets).__name__}")
    if offsets.dim() != 1 or offsets.dtype != torch.int64 or offsets.numel() < 1:
        raise ValueError(f"offsets must be a 1-D int64 tensor of B+1 >= 1 entries, got shape "
                         f"{tuple(offsets.shape)} dtype {offsets.dtype}")
    if values.dim() < 1:
        raise ValueError(f"{name} must have a leading token dimension, got a scalar")
    if offsets.device != values.device:
        raise ValueError(f"{name} is on {values.device} but offsets on {offsets.device}")


# ---- the padded references (implementation `reference`) -----------------------------------------
def _positions(offsets: Tensor, max_len: int) -> tuple[Tensor, Tensor]:
    """mask [B, N] of real tokens (cut at max_len) and their row index into values [B, N]."""
    lengths = offsets[1:] - offsets[:-1]
    pos = torch.arange(max_len, device=offsets.device)
    mask = pos[None, :] < lengths[:, None]
    index = offsets[:-1, None] + pos[None, :]
    return mask, index


def jagged_to_padded_reference(values: Tensor, offsets: Tensor, max_len: int, padding_value: float = 0.0) -> Tensor:
    # values [T, D] -> [B, N, D]
    mask, index = _positions(offsets, max_len)
    out = values.new_full((offsets.numel() - 1, max_len, values.shape[1]), padding_value)
    return out.index_put((mask,), values[index[mask]])


def padded_to_jagged_reference(padded: Tensor, offsets: Tensor, total: int) -> Tensor:
    # padded [B, N, D] -> [T, D]; tokens past N read as 0
    mask, index = _positions(offsets, padded.shape[1])
    out = padded.new_zeros((total, padded.shape[2]))
    return out.index_put((index[mask],), padded[mask])


def segment_sum_reference(values: Tensor, offsets: Tensor) -> Tensor:
    # values [T, D] -> [B, D]: pad to the longest sequence and sum
    lengths = offsets[1:] - offsets[:-1]
    max_len = int(lengths.max()) if lengths.numel() else 0
    return jagged_to_padded_reference(values, offsets, max_len).sum(dim=1)


def segment_expand_reference(x: Tensor, offsets: Tensor, total: int) -> Tensor:
    # x [B, D] -> [T, D]
    lengths = offsets[1:] - offsets[:-1]
    return x.repeat_interleave(lengths, dim=0, output_size=total)


_REFERENCES = {"jagged_to_padded": jagged_to_padded_reference, "padded_to_jagged": padded_to_jagged_reference,
               "segment_sum": segment_sum_reference, "segment_expand": segment_expand_reference}
for _op, _fn in _REFERENCES.items():
    registry.register(_op, "reference", lambda fn=_fn: fn)
    registry.register(_op, "cpu", registry.lazy("cpu.jagged", _op))
for _op in ("jagged_to_padded", "padded_to_jagged", "segment_sum"):
    registry.register(_op, "fbgemm", registry.lazy("fbgemm.jagged", _op))


# ---- the ops ------------------------------------------------------------------------------------
def _flat(t: Tensor) -> Tensor:
    """[N, *F] -> [N, prod(F)] (also for N = 0)."""
    return t.reshape(t.shape[0], math.prod(t.shape[1:]))


def jagged_to_padded(values: Tensor, offsets: Tensor, max_len: int, padding_value: float = 0.0,
                     impl: str = "auto") -> Tensor:
    """values [T, *F], offsets [B+1] -> [B, max_len, *F]; tokens past max_len are dropped."""
    check_jagged(values, offsets)
    if max_len < 0:
        raise ValueError(f"max_len must be >= 0, got {max_len}")
    fn = registry.resolve("jagged_to_padded", values.device, impl)
    out = fn(_flat(values), offsets, max_len, padding_value)
    return out.reshape(offsets.numel() - 1, max_len, *values.shape[1:])


def padded_to_jagged(padded: Tensor, offsets: Tensor, total: int | None = None, impl: str = "auto") -> Tensor:
    """padded [B, N, *F], offsets [B+1] -> values [T, *F]; tokens past N read as 0.

    `total` (= offsets[-1]) avoids reading offsets back from the device when given."""
    check_jagged(padded, offsets, "padded")
    if padded.dim() < 2 or padded.shape[0] != offsets.numel() - 1:
        raise ValueError(f"padded must be [B={offsets.numel() - 1}, N, ...], got {tuple(padded.shape)}")
    total = int(offsets[-1]) if total is None else total
    fn = registry.resolve("padded_to_jagged", padded.device, impl)
    out = fn(padded.reshape(padded.shape[0], padded.shape[1], math.prod(padded.shape[2:])), offsets, total)
    return out.reshape(total, *padded.shape[2:])


def segment_sum(values: Tensor, offsets: Tensor, impl: str = "auto") -> Tensor:
    """values [T, *F] -> [B, *F]: the sum over each sequence's tokens (0 for empty sequences)."""
    check_jagged(values, offsets)
    fn = registry.resolve("segment_sum", values.device, impl)
    out = fn(_flat(values), offsets)
    return out.reshape(offsets.numel() - 1, *values.shape[1:])


def segment_mean(values: Tensor, offsets: Tensor, impl: str = "auto") -> Tensor:
    """values [T, *F] -> [B, *F]: the mean over each sequence's tokens (0 for empty sequences)."""
    lengths = (offsets[1:] - offsets[:-1]).clamp(min=1).to(values.dtype)
    total = segment_sum(values, offsets, impl)
    return total / lengths.reshape(-1, *([1] * (values.dim() - 1)))


def segment_expand(x: Tensor, offsets: Tensor, total: int | None = None, impl: str = "auto") -> Tensor:
    """x [B, *F] -> [T, *F]: each sequence's row repeated for each of its tokens."""
    check_jagged(x, offsets, "x")
    if x.shape[0] != offsets.numel() - 1:
        raise ValueError(f"x must have B={offsets.numel() - 1} rows, got {x.shape[0]}")
    total = int(offsets[-1]) if total is None else total
    fn = registry.resolve("segment_expand", x.device, impl)
    out = fn(_flat(x), offsets, total)
    return out.reshape(total, *x.shape[1:])
