"""GRLIB_ISA's limit on torch's GEMM libraries: set when grlib is imported, before any GEMM runs.

GRLIB_ISA (grlib.hardware.isa) picks grlib._C's instruction-set path. The projections' GEMMs run
in torch's libraries, oneDNN and MKL, which pick their own widest code; each reads one variable
the first time it multiplies (not when torch loads):

    GRLIB_ISA     ONEDNN_MAX_CPU_ISA   MKL_ENABLE_INSTRUCTIONS   so the process runs as
    amx           (left unset)         (left unset)              the CPU it is (an AMX Xeon)
    avx512_bf16   AVX512_CORE_BF16     (left unset)              an AVX512-BF16 CPU without AMX (AMD Zen 4/5)
    avx512        AVX512_CORE          (left unset)              an AVX-512 CPU without bf16 units
    avx2          AVX2                 AVX2                      an AVX2 + FMA CPU (AMD Zen 3, Intel client)
    generic       SSE41                SSE4_2                    a CPU with 128-bit vectors

(GRLIB_ISA unset: none; MKL's float32 GEMMs are the same code on the three AVX-512 paths.)

so that GRLIB_ISA=avx2 on an AVX-512 machine runs the whole step as an AVX2-only CPU would. A
variable the user set is left as it is. The names grlib set are kept in GRLIB_GEMM_LIMITS, so that
a child process (bench kernels runs each row in one) can tell them from the user's and follow its
own GRLIB_ISA (grlib.hardware.isa.use sets them for the children it starts).

Limits apply from the process's first GEMM: switching grlib._C's path inside a process
(isa.use, bench train --isa) leaves the GEMMs as the process started. `describe()` says which
limits are in force, for the result rows (column gemm_limit).
"""
from __future__ import annotations

import os

ENV = "GRLIB_ISA"
MARK = "GRLIB_GEMM_LIMITS"  # the variables below that grlib set (comma-separated)
LIMITS = {  # GRLIB_ISA -> the GEMM libraries' variables
    "avx512_bf16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
    "avx512": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "generic": {"ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}
VARIABLES = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def _ours(environ) -> set[str]:
    return {v for v in environ.get(MARK, "").split(",") if v in VARIABLES}


def limited_environ(path: str | None, environ=None) -> dict[str, str]:
    """`environ` (default os.environ) with the GEMM limits of grlib._C's path `path` (None or
    "amx": none), the user's own values kept."""
    env = dict(os.environ if environ is None else environ)
    ours = _ours(env)
    for var in ours:  # grlib's values for another path: cleared, then set anew
        env.pop(var, None)
    wanted = LIMITS.get(path or "", {})
    set_now = []
    for var, value in wanted.items():
        if var not in env:
            env[var] = value
            set_now.append(var)
    if set_now:
        env[MARK] = ",".join(set_now)
    else:
        env.pop(MARK, None)
    return env


def apply(path: str | None = None) -> None:
    """Sets this process's environment for GRLIB_ISA (or `path`); grlib/__init__ calls it first."""
    path = path if path is not None else os.environ.get(ENV, "").strip()
    env = limited_environ(path)
    for var in (*VARIABLES, MARK):
        if var in env:
            os.environ[var] = env[var]
        else:
            os.environ.pop(var, None)


def describe(environ=None) -> str:
    """The limits in force in `environ` (default os.environ), as result rows record them: 'none' or
    'ONEDNN_MAX_CPU_ISA=AVX2 (GRLIB_ISA), MKL_ENABLE_INSTRUCTIONS=AVX2 (GRLIB_ISA)'."""
    env = os.environ if environ is None else environ
    ours = _ours(env)
    parts = [f"{v}={env[v]} ({'GRLIB_ISA' if v in ours else 'user'})" for v in VARIABLES if v in env]
    return ", ".join(parts) or "none"
