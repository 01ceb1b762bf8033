"""The ops through fbgemm's jagged operators, the library baseline a user would write: jagged (the
conversions and segment_sum) and attention (padded via fbgemm). Here: which fbgemm is installed,
and the check every one of them runs before its first fbgemm call."""
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
