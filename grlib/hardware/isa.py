"""Instruction-set paths of grlib._C, the one this process runs, and the CPU features bf16 needs.

grlib._C holds each kernel compiled once per path (kernels/cpu/isa.h) and runs one of them, chosen
when load() loads the extension (grlib.ops.cpu and the compiled probes call it):

    amx          avx512, and bf16 attention products on the AMX tile unit   + flags avx512_bf16 amx_bf16 amx_tile
    avx512_bf16  avx512, and bf16 attention products by vdpbf16ps          + flag avx512_bf16
    avx512       64-byte vectors, register blocks for 32 zmm registers   flags avx512f avx512bw avx512dq avx512vl avx2 fma
    avx2         32-byte vectors, register blocks for 16 ymm registers   flags avx2 fma
    generic      16-byte vectors (SSE2 on x86-64), the same blocks as avx2  any CPU

amx and avx512_bf16 are the avx512 code with the CPU's bf16 units: they differ from avx512 only
for bf16 inputs (kernels/cpu/hstu_attention_bf16.cpp); avx512 and below multiply bf16 inputs in
float32. GRLIB_ISA=<path> forces a path (an unavailable one is a ConfigError naming what the
CPU has); unset, the widest path both the CPU and the build have runs. Forcing a path makes the
process the CPU that has only that path, oneDNN and MKL included (grlib.gemm_limits): avx512_bf16
on an AMX Xeon runs as an AVX512-BF16 CPU without AMX (AMD Zen 4/5). A build without AVX-512
(GRLIB_ISA_BUILD=x86-64-v3, setup.py) has none of the first three. Everything here reads
/proc/cpuinfo's flags (about a millisecond), never a GEMM or a probe:

    load()              -> grlib._C               loaded once, on selected() (registers torch.ops.grlib)
    selected()          -> "avx2"                 the path this process runs (GRLIB_ISA or the widest)
    current()           -> "avx2"                 the path grlib._C runs now
    with use("generic"): ...                      every op of grlib._C on that path inside the block
    available()         -> ("avx512", "avx2", "generic")   paths this CPU and this build can run
    bf16_missing()      -> None or the reason bf16 GEMMs cannot run here
    require_bf16(name)  raises ConfigError "<name>: bf16 needs ..." when bf16_missing()

bf16 mode (model.precision=bf16) multiplies bf16 copies through oneDNN, whose bf16 GEMMs need
AVX512-BF16 (or AMX-BF16); on a CPU without them oneDNN fails to create its primitive (a crash
after minutes of other work). A forced path below avx512_bf16 counts as a CPU without them, so that
an AVX-512 machine runs the suite as an AVX2-only (or AVX-512 without bf16) CPU would.
"""
from __future__ import annotations

import contextlib
import functools
import os
import platform
from pathlib import Path
from collections.abc import Iterator

from grlib.config import ConfigError
from grlib.config.choices import ISA_PATHS

ISAS = ISA_PATHS  # widest first
BF16_PATHS = ("amx", "avx512_bf16")  # the paths with bf16 units
ENV = "GRLIB_ISA"
_AVX512 = ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma")
NEEDS = {"amx": (*_AVX512, "avx512_bf16", "amx_bf16", "amx_tile"), "avx512_bf16": (*_AVX512, "avx512_bf16"),
         "avx512": _AVX512, "avx2": ("avx2", "fma"), "generic": ()}
VECTOR_BYTES = {"amx": 64, "avx512_bf16": 64, "avx512": 64, "avx2": 32, "generic": 16}  # of the kernels' vectors (and the nominal peak's)
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # either runs oneDNN's bf16 GEMMs
# ONEDNN_MAX_CPU_ISA values at or above AVX512_CORE_BF16 (oneDNN's names): a lower one refuses bf16 GEMMs
ONEDNN_BF16_ISAS = frozenset({"ALL", "DEFAULT", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX",
                              "AVX512_CORE_AMX_FP16", "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16",
                              "AVX10_2_512", "AVX10_2_512_AMX_2"})


CPUINFO = Path("/proc/cpuinfo")


@functools.lru_cache(maxsize=1)
def _first_cpu() -> dict[str, str]:
    """The first CPU's block of /proc/cpuinfo (empty where there is none)."""
    if not CPUINFO.exists():
        return {}
    block = CPUINFO.read_text().split("\n\n", 1)[0]
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in block.splitlines())}


def cpu_fields() -> dict[str, str]:
    """The first CPU's fields in /proc/cpuinfo ("model name", "cpu family", ...; empty where there is none)."""
    return dict(_first_cpu())


def cpu_flags() -> frozenset[str]:
    """The first CPU's flags in /proc/cpuinfo (empty where there is none)."""
    first = _first_cpu()
    return frozenset((first.get("flags") or first.get("Features") or "").split())


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else platform.processor()."""
    return _first_cpu().get("model name") or platform.processor() or platform.machine()


def cpu_paths(flags: frozenset[str] | None = None) -> tuple[str, ...]:
    """The paths whose flags this CPU has (x86-64); generic only elsewhere."""
    flags = cpu_flags() if flags is None else flags
    if platform.machine() not in ("x86_64", "AMD64"):
        return ("generic",)
    return tuple(p for p in ISAS if all(f in flags for f in NEEDS[p]))


def built_paths() -> tuple[str, ...]:
    """The paths compiled into grlib._C (kernels/cpu/isa.h)."""
    import grlib._C as C

    return tuple(C.isa_paths())


def available() -> tuple[str, ...]:
    """The paths this CPU and this build both have, widest first."""
    built = built_paths()
    return tuple(p for p in cpu_paths() if p in built)


def _describe_cpu() -> str:
    have = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "avx2", "fma") if f in cpu_flags()]
    return f"this CPU ({cpu_model()}) has {' '.join(have) or 'none of avx512f, avx2, fma'}"


def selected() -> str:
    """The path this process runs: GRLIB_ISA when set (checked), else the widest available."""
    avail = available()
    forced = os.environ.get(ENV, "").strip()
    if not forced:
        return avail[0]
    if forced not in ISAS:
        raise ConfigError(f"{ENV}={forced!r}: must be one of {', '.join(ISAS)}")
    if forced not in avail:
        why = (f"needs the flags {' '.join(NEEDS[forced])}; {_describe_cpu()}" if forced not in cpu_paths()
               else f"this build of grlib._C has only {', '.join(built_paths())} (setup.py GRLIB_ISA_BUILD)")
        raise ConfigError(f"{ENV}={forced}: the {forced} path is not available: {why}; available: {', '.join(avail)}")
    return forced


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
    if path not in BF16_PATHS:
        if any(f in cpu_flags() for f in BF16_FLAGS) and os.environ.get(ENV):
            return (f"{ENV}={path} runs this process as a CPU without avx512_bf16 (bf16 GEMMs need "
                    f"avx512_bf16 or amx_bf16: the amx or avx512_bf16 path)")
        return f"bf16 GEMMs (oneDNN) need the CPU flag avx512_bf16 or amx_bf16; {_describe_cpu()}"
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if limit and limit not in ONEDNN_BF16_ISAS:  # set by the user (grlib sets it only below avx512_bf16)
        return (f"ONEDNN_MAX_CPU_ISA={limit} limits oneDNN below AVX512_CORE_BF16, so its bf16 GEMMs cannot run "
                f"(unset it, or set one of {', '.join(sorted(ONEDNN_BF16_ISAS))})")
    return None


def require_bf16(name: str) -> None:
    """Raises ConfigError '<name>: ...' when bf16 GEMMs cannot run here (bf16_missing)."""
    why = bf16_missing()
    if why is not None:
        raise ConfigError(f"{name}: bf16 is not available on this CPU: {why}; use fp32")


@functools.cache
def load():
    """grlib._C (the compiled kernels, kernels/cpu/), loaded once per process and set to selected():
    importing it registers torch.ops.grlib. Fails with instructions when it is not built."""
    try:
        import grlib._C as C
    except ImportError as err:  # pragma: no cover - exercised only on a broken install
        raise ImportError(
            "grlib._C (the compiled CPU kernels) is not built: run `make setup`, or "
            "`pip install --no-build-isolation -e .` after installing torch==2.13.0"
        ) from err
    C.set_isa(selected())  # GRLIB_ISA, or the widest path this CPU and build have
    return C


def current() -> str:
    """The path grlib._C runs now."""
    return load().isa()


@contextlib.contextmanager
def use(path: str) -> Iterator[str]:
    """Every op of grlib._C runs `path` inside the block (and GRLIB_ISA names it, so that bf16_missing
    and child processes agree); the path before it after. An unavailable path is a ConfigError."""
    C = load()
    before, env = C.isa(), os.environ.get(ENV)
    os.environ[ENV] = path
    try:
        C.set_isa(selected())
        yield path
    finally:
        if env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = env
        C.set_isa(before)
