"""Builds grlib._C from kernels/cpu/*.cpp (and the *.h they include) with torch.utils.cpp_extension.

Install with `pip install --no-build-isolation -e .` after torch: build isolation would pull a
different torch build than the one the extension must link against.
"""
import glob
import os
import platform

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

# -march=native: the extension is always compiled on the machine that runs it (make setup).
# GRLIB_PORTABLE=1 builds a generic x86-64/aarch64 binary instead.
arch = [] if os.environ.get("GRLIB_PORTABLE") == "1" else ["-march=native"]
# On x86-64, let the auto-vectorised loops (SiLU, exp, bias) use 512-bit registers where the CPU has
# them (GCC otherwise prefers 256-bit); ignored by CPUs without AVX-512.
if arch and platform.machine() in ("x86_64", "AMD64"):
    arch.append("-mprefer-vector-width=512")

# GRLIB_SKIP_EXT=1: install the package without compiling (the Makefile then builds the extension
# in place with `setup.py build_ext --inplace`, which keeps ninja's incremental build in build/).
skip_ext = os.environ.get("GRLIB_SKIP_EXT") == "1"

setup(
    ext_modules=[] if skip_ext else [
        CppExtension(
            "grlib._C",
            sorted(glob.glob("kernels/cpu/*.cpp")),
            # the shared headers: without them setuptools skips the build when only a header changed
            depends=sorted(glob.glob("kernels/cpu/*.h")),
            extra_compile_args=["-O3", "-fopenmp", "-std=c++20", *arch],
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
