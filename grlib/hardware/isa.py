"""The CPU's instruction sets as grlib sees them, and whether bf16 GEMMs can run here, read from
/proc/cpuinfo's flags in about a millisecond (never a GEMM or a probe):

    cpu_paths()         -> ("avx512", "avx2", "generic")   the vector paths whose flags this CPU has
    selected_by_flags() -> "avx2"                           GRLIB_ISA when set (checked), else the widest
    bf16_missing()      -> None or the reason bf16 GEMMs cannot run here
    require_bf16(name)  raises ConfigError "<name>: bf16 is not available on this CPU: ..."

    avx512   flags avx512f avx512bw avx512dq avx512vl avx2 fma
    avx2     flags avx2 fma
    generic  any CPU

bf16 mode (model.precision=bf16) multiplies bf16 copies through oneDNN, whose bf16 GEMMs need
AVX512-BF16 (or AMX-BF16); on a CPU without them oneDNN fails to create its primitive (a crash
after minutes of other work). GRLIB_ISA=avx2 or generic makes this process count as a CPU without
them, so that an AVX-512 machine runs the suite as an AVX2-only CPU would.
"""
from __future__ import annotations

import functools
import os
import platform

from grlib.config import ConfigError

ISAS = ("avx512", "avx2", "generic")  # widest first
ENV = "GRLIB_ISA"
NEEDS = {"avx512": ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma"),
         "avx2": ("avx2", "fma"), "generic": ()}
VECTOR_BYTES = {"avx512": 64, "avx2": 32, "generic": 16}  # of the kernels' vectors (and the nominal peak's)
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # either runs oneDNN's bf16 GEMMs


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The first CPU's flags in /proc/cpuinfo (empty where there is none)."""
    from grlib.hardware.nominal import CPUINFO, cpu_info

    return cpu_info().flags if CPUINFO.exists() else frozenset()


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else platform.processor()."""
    from grlib.hardware.nominal import CPUINFO, cpu_info

    name = cpu_info().model_name if CPUINFO.exists() else "unknown"
    return name if name != "unknown" else (platform.processor() or platform.machine())


def cpu_paths(flags: frozenset[str] | None = None) -> tuple[str, ...]:
    """The paths whose flags this CPU has (x86-64); generic only elsewhere."""
    flags = cpu_flags() if flags is None else flags
    if platform.machine() not in ("x86_64", "AMD64"):
        return ("generic",)
    return tuple(p for p in ISAS if all(f in flags for f in NEEDS[p]))


def _describe_cpu() -> str:
    have = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "avx2", "fma") if f in cpu_flags()]
    return f"this CPU ({cpu_model()}) has {' '.join(have) or 'none of avx512f, avx2, fma'}"


def selected_by_flags() -> str:
    """selected() without loading grlib._C (flags and GRLIB_ISA only; for checks before any kernel)."""
    forced = os.environ.get(ENV, "").strip()
    if forced:
        if forced not in ISAS:
            raise ConfigError(f"{ENV}={forced!r}: must be one of {', '.join(ISAS)}")
        return forced
    return cpu_paths()[0]


def bf16_missing() -> str | None:
    """Why bf16 GEMMs cannot run in this process, or None when they can (module doc)."""
    path = selected_by_flags()
    if path != "avx512":
        if any(f in cpu_flags() for f in BF16_FLAGS) and os.environ.get(ENV):
            return (f"{ENV}={path} runs this process as a CPU without avx512_bf16 (bf16 GEMMs need "
                    f"avx512_bf16 or amx_bf16 and the avx512 path)")
        return f"bf16 GEMMs (oneDNN) need the CPU flag avx512_bf16 or amx_bf16; {_describe_cpu()}"
    if not any(f in cpu_flags() for f in BF16_FLAGS):
        return f"bf16 GEMMs (oneDNN) need the CPU flag avx512_bf16 or amx_bf16; {_describe_cpu()}"
    return None


def require_bf16(name: str) -> None:
    """Raises ConfigError '<name>: ...' when bf16 GEMMs cannot run here (bf16_missing)."""
    why = bf16_missing()
    if why is not None:
        raise ConfigError(f"{name}: bf16 is not available on this CPU: {why}; use fp32")

