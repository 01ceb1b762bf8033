"""Jagged HSTU attention on Ascend NPUs: torch-npu for the device, fbgemm-ascend for the jagged ops.

`import fbgemm_ascend` gives torch.ops.fbgemm.jagged_to_padded_dense / dense_to_jagged NPU kernels
(fbgemm-ascend 1.5.0 ships those), so the NPU path is the `fbgemm` formulation
(grlib.ops.fbgemm_attention) on NPU tensors, its dense math run by torch-npu. Without both
packages the implementation refuses with an error naming what is missing. Declared for NPU
clusters (pip install -e .[npu]); not run on the CPU machines this project is tested on.
"""
from __future__ import annotations

import importlib

from torch import Tensor

REQUIRED = {"torch_npu": "torch-npu==2.13.0", "fbgemm_ascend": "fbgemm-ascend"}


def require() -> None:
    """Imports torch-npu and fbgemm-ascend; ImportError naming every missing one otherwise."""
    missing = []
    for module, package in REQUIRED.items():
        try:
            importlib.import_module(module)
        except ImportError as err:
            missing.append(f"{package} (import {module}: {err})")
    if missing:
        raise ImportError("the 'npu' implementation needs " + " and ".join(missing) +
                          "; install them with `pip install -e .[npu]` on an Ascend machine")


def hstu_attention(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, alpha: float,
                   pos_bias: Tensor | None = None, time_bias: Tensor | None = None,
                   timestamps: Tensor | None = None) -> Tensor:
    require()
    if q.device.type != "npu":
        raise RuntimeError(f"the 'npu' implementation runs on NPU tensors, got {q.device}")
    from grlib.ops.fbgemm_attention import hstu_attention as padded_via_fbgemm

    return padded_via_fbgemm(q, k, v, offsets, max_len, alpha, pos_bias, time_bias, timestamps)
