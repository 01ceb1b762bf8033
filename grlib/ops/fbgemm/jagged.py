"""The jagged conversions and segment_sum through fbgemm's jagged operators (contract grlib/ops/jagged.py)."""
from __future__ import annotations

import torch
from torch import Tensor

from grlib.ops.fbgemm import _load


def jagged_to_padded(values: Tensor, offsets: Tensor, max_len: int, padding_value: float = 0.0) -> Tensor:
    _load(values)
    return torch.ops.fbgemm.jagged_to_padded_dense(values, [offsets], [max_len], padding_value)


def padded_to_jagged(padded: Tensor, offsets: Tensor, total: int) -> Tensor:
    _load(padded)
    return torch.ops.fbgemm.dense_to_jagged(padded, [offsets], total)[0]


def segment_sum(values: Tensor, offsets: Tensor) -> Tensor:
    _load(values)
    lengths = offsets[1:] - offsets[:-1]
    max_len = int(lengths.max()) if lengths.numel() else 0
    return torch.ops.fbgemm.jagged_to_padded_dense(values, [offsets], [max_len], 0.0).sum(dim=1)
