"""Peak memory of a region of tensor code, on any device (CPU included).

How it measures: a TorchDispatchMode sees every ATen op run inside the region, forward and backward
(the autograd engine carries the mode into backward), and records the storage of every tensor the
ops return. After each op it drops the storages that died (weak references) and adds the new ones;
the peak is the largest sum of live bytes seen. So it counts exactly the tensors created inside the
region (activations, tensors saved for backward, gradients, masks, sampled ids) and nothing created
before it (inputs, parameters). It does not see a kernel's private scratch buffers, and a tensor
that dies inside one op is not seen at all; both are small next to the [P, R] and [P, R, d] tensors
of a negative path. Views share their base's storage and are counted once.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class PeakMemory(TorchDispatchMode):
    """with PeakMemory() as m: ...  ->  m.peak_bytes, m.current_bytes (bytes of live tensors made inside)."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.current_bytes = 0
        self.peak_bytes = 0

    def _sweep(self) -> None:
        for key in [k for k, (ref, _) in self._live.items() if ref.expired()]:
            self.current_bytes -= self._live.pop(key)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._sweep()
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and not t.is_meta:
                storage = t.untyped_storage()
                key = storage._cdata
                if key not in self._live and storage.nbytes() > 0:
                    self._live[key] = (StorageWeakRef(storage), storage.nbytes())
                    self.current_bytes += storage.nbytes()
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        return out

    def __exit__(self, *exc):
        self._sweep()
        return super().__exit__(*exc)


def peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes of the tensors that fn() creates while it runs (see the module docstring)."""
    with PeakMemory() as mem:
        fn()
    return mem.peak_bytes
