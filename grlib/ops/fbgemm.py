"""The same ops through fbgemm's jagged operators: the library baseline a user would write."""
from __future__ import annotations

import functools
import importlib.metadata

import torch
from torch import Tensor

# Distributions that each install the module `fbgemm_gpu`; exactly one may be present.
FBGEMM_DISTRIBUTIONS = ("fbgemm-gpu-cpu", "fbgemm-gpu", "fbgemm-gpu-genai")


def installed_fbgemm() -> list[str]:
    """The fbgemm distributions installed in this environment, as 'name==version'."""
    found = []
    for name in FBGEMM_DISTRIBUTIONS:
        try:
            found.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


@functools.cache
def check_fbgemm() -> None:
    """Refuses an environment with no fbgemm or with two (a CPU and a CUDA wheel overwrite each
    other's files in site-packages/fbgemm_gpu, and whichever was installed last half wins)."""
    found = installed_fbgemm()
    if len(found) > 1:
        raise ImportError(f"mixed fbgemm installs: {', '.join(found)}; keep one: pip uninstall -y "
                          f"{' '.join(f.split('==')[0] for f in found)} and reinstall grlib with one "
                          "extra: pip install -e '.[cpu]' (CPU), '.[cuda]' (CUDA) or '.[npu]' (Ascend)")
    if not found:
        raise ImportError("the 'fbgemm' implementation needs fbgemm: pip install -e '.[cpu]' (CPU), "
                          "'.[cuda]' (CUDA) or '.[npu]' (Ascend)")


def _load(t: Tensor) -> None:
    if t.dtype == torch.float64:
        raise TypeError("fbgemm's jagged ops have no float64 kernels; use float32/bfloat16 or impl='cpu'")
    check_fbgemm()
    import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)


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
