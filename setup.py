"""Builds grlib._C from kernels/cpu/*.cpp (and the *.h they include) with torch.utils.cpp_extension.

Install with `pip install --no-build-isolation -e .` after torch: build isolation would pull a
different torch build than the one the extension must link against.
"""
import glob
import os
import platform

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

# Instruction sets: every kernel file is compiled once per path (kernels/cpu/isa.h: avx512, avx2,
# generic, each under its own target options) and the op runs the path chosen at run time
# (grlib.hardware.isa, GRLIB_ISA), so the base flags are the baseline ISA, tuned for this CPU:
#   (default)                 -march=x86-64 -mtune=native: the avx512, avx2 and generic paths
#   GRLIB_ISA_BUILD=x86-64-v3 -march=x86-64-v3, no avx512 path: no AVX-512 instruction in the
#                             library (what an AVX2-only CPU runs; tests/test_isa.py checks objdump)
#   GRLIB_PORTABLE=1          -mtune=generic instead of native (a binary for other machines)
# Off x86-64 (aarch64) only the generic path is built (NEON is its baseline).
isa_build = os.environ.get("GRLIB_ISA_BUILD", "")
if isa_build not in ("", "x86-64-v3"):
    raise SystemExit(f"error: GRLIB_ISA_BUILD={isa_build!r}: must be empty or x86-64-v3")
tune = "generic" if os.environ.get("GRLIB_PORTABLE") == "1" else "native"
arch = []
if platform.machine() in ("x86_64", "AMD64"):
    arch = [f"-march={isa_build or 'x86-64'}", f"-mtune={tune}"]
    if isa_build:
        arch.append("-DGRLIB_NO_AVX512")
elif tune == "native":
    arch = ["-mcpu=native"]

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
            extra_compile_args=["-O3", "-fopenmp", "-std=c++20", "-Wno-psabi", *arch],
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
