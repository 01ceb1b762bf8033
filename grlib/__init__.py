"""grlib: jagged HSTU kernels, training and negatives (see README.md and docs/ARCHITECTURE.md).

The OpenMP wait policy is set here, before torch (and with it libgomp) loads, torch's thread
count when it loads (grlib.threads), malloc's keeping of freed memory (grlib.memory), and GRLIB_ISA's
limit on the GEMM libraries (grlib.gemm_limits). Importing grlib does not import torch; importing the compiled
extension grlib._C does, first (it links torch's libraries, which torch's import loads).
"""
import importlib.abc
import sys

from grlib import gemm_limits, memory, threads

threads.configure_environment()
memory.configure()  # freed blocks kept for reuse, not unmapped (grlib.memory)
threads.when_torch_loads()
gemm_limits.apply()  # GRLIB_ISA's limit on oneDNN's and MKL's code, before their first GEMM


_EXTENSION = __name__ + "._C"  # named, not imported: this package does not need the kernels


class _TorchBeforeExtension(importlib.abc.MetaPathFinder):
    """Finds nothing itself: before the compiled extension grlib._C is looked for, imports torch
    (else the extension's libc10 / libtorch are not loaded and its import fails)."""

    def find_spec(self, name, path=None, target=None):
        if name == _EXTENSION and "torch" not in sys.modules:
            import torch  # noqa: F401
        return None


if not any(isinstance(f, _TorchBeforeExtension) for f in sys.meta_path):
    sys.meta_path.insert(0, _TorchBeforeExtension())
