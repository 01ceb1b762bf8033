"""The compiled CPU kernels (grlib._C, sources in kernels/cpu/): one module per op, named as the op's
module in grlib.ops, with the op's autograd and fake impls (jagged, attention, fused, matmul's
transpose_copy, embedding, dropout, lazy_adam).

Importing this package loads the extension on its instruction-set path (grlib.hardware.isa.load:
GRLIB_ISA, else the widest this CPU and build have); it fails with instructions when it is not built.
The ops live in torch.ops.grlib and work under autograd, torch.compile (fake tensors) and
torch.library.opcheck.
"""
from __future__ import annotations

import os

from grlib.hardware import isa as _isa

_C = _isa.load()  # grlib._C on GRLIB_ISA's path, or the widest this CPU and build have (registers torch.ops.grlib)
# the bf16 attention's vdpbf16ps tiles on the avx512_bf16 path: off unless asked (kernels/cpu/isa.h:
# measured slower than its float32 tiles so far; the amx path's tiles are always on)
_C.set_dpbf16_attention(os.environ.get("GRLIB_DPBF16_ATTENTION", "") == "1")
