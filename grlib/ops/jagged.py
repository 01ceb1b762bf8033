"""The jagged layout the ops take: B variable-length sequences stored back to back, no padding
(the batch that carries it through the model is grlib.jagged.JaggedBatch).

    lengths  = [2, 0, 3]
    values   = [a0 a1 c0 c1 c2]            # [T=5, *F]
    offsets  = [0, 2, 2, 5]                # [B+1] int64, sequence b = values[offsets[b]:offsets[b+1]]
    max_len  = 3                           # upper bound on lengths (the padded width when padding)
"""
from __future__ import annotations

import torch
from torch import Tensor


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
