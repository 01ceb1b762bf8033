"""The Ascend NPU backend: torch-npu for the device, fbgemm-ascend for the jagged ops (attention).

`import fbgemm_ascend` gives torch.ops.fbgemm.jagged_to_padded_dense / dense_to_jagged NPU kernels
(fbgemm-ascend 1.5.0 ships those), so the NPU path is the `fbgemm` formulation
(grlib.ops.fbgemm.attention) on NPU tensors, its dense math run by torch-npu. Without both
packages the implementation refuses with an error naming what is missing. Declared for NPU
clusters (pip install -e .[npu]); not run on the CPU machines this project is tested on.
"""
from __future__ import annotations

import importlib

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
