"""The same ops through fbgemm's jagged operators: the library baseline a user would write."""
from __future__ import annotations

import torch
from torch import Tensor


def _load(t: Tensor) -> None:
    if t.dtype == torch.float64:
        raise TypeError("fbgemm's jagged ops have no float64 kernels; use float32/bfloat16 or impl='cpu'")
    try:
        import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
    except ImportError as err:  # pragma: no cover - fbgemm is a pinned dependency
        raise ImportError("the 'fbgemm' implementation needs fbgemm-gpu-cpu==1.8.0 (CPU) or "
                          "fbgemm-gpu (CUDA): pip install -e .") from err


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
