"""Padded pure-PyTorch references: the ground truth every kernel is tested against.

They pad to a dense [B, N, ...] tensor and use plain torch ops, as a user without jagged kernels
would; autograd differentiates them.
"""
from __future__ import annotations

import torch
from torch import Tensor


def _positions(offsets: Tensor, max_len: int) -> tuple[Tensor, Tensor]:
    """mask [B, N] of real tokens (cut at max_len) and their row index into values [B, N]."""
    lengths = offsets[1:] - offsets[:-1]
    pos = torch.arange(max_len, device=offsets.device)
    mask = pos[None, :] < lengths[:, None]
    index = offsets[:-1, None] + pos[None, :]
    return mask, index


def jagged_to_padded(values: Tensor, offsets: Tensor, max_len: int, padding_value: float = 0.0) -> Tensor:
    # values [T, D] -> [B, N, D]
    mask, index = _positions(offsets, max_len)
    out = values.new_full((offsets.numel() - 1, max_len, values.shape[1]), padding_value)
    return out.index_put((mask,), values[index[mask]])


def padded_to_jagged(padded: Tensor, offsets: Tensor, total: int) -> Tensor:
    # padded [B, N, D] -> [T, D]; tokens past N read as 0
    mask, index = _positions(offsets, padded.shape[1])
    out = padded.new_zeros((total, padded.shape[2]))
    return out.index_put((index[mask],), padded[mask])


def segment_sum(values: Tensor, offsets: Tensor) -> Tensor:
    # values [T, D] -> [B, D]: pad to the longest sequence and sum
    lengths = offsets[1:] - offsets[:-1]
    max_len = int(lengths.max()) if lengths.numel() else 0
    return jagged_to_padded(values, offsets, max_len).sum(dim=1)


def segment_expand(x: Tensor, offsets: Tensor, total: int) -> Tensor:
    # x [B, D] -> [T, D]
    lengths = offsets[1:] - offsets[:-1]
    return x.repeat_interleave(lengths, dim=0, output_size=total)
