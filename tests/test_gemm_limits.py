"""GRLIB_ISA limits torch's GEMM libraries (grlib.gemm_limits): oneDNN and MKL run the forced path's
vectors from the first GEMM, the user's own settings win, and a child follows its own path."""
import os
import subprocess
import sys

import pytest

from grlib import gemm_limits
from grlib.hardware import isa


def test_each_path_sets_its_limits_and_the_users_win():
    assert gemm_limits.limited_environ("amx", {}) == {}  # the widest path: the CPU as it is
    assert gemm_limits.limited_environ(None, {}) == {}
    for path, onednn in (("avx512_bf16", "AVX512_CORE_BF16"), ("avx512", "AVX512_CORE")):  # MKL: unlimited
        assert gemm_limits.limited_environ(path, {}) == {"ONEDNN_MAX_CPU_ISA": onednn,
                                                         gemm_limits.MARK: "ONEDNN_MAX_CPU_ISA"}
    env = gemm_limits.limited_environ("avx2", {"PATH": "x"})
    assert env == {"PATH": "x", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                   gemm_limits.MARK: "ONEDNN_MAX_CPU_ISA,MKL_ENABLE_INSTRUCTIONS"}
    assert gemm_limits.describe(env) == ("ONEDNN_MAX_CPU_ISA=AVX2 (GRLIB_ISA), "
                                         "MKL_ENABLE_INSTRUCTIONS=AVX2 (GRLIB_ISA)")
    # a user's value stays, and is reported as the user's
    user = gemm_limits.limited_environ("avx2", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"})
    assert user["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE" and user[gemm_limits.MARK] == "MKL_ENABLE_INSTRUCTIONS"
    assert "ONEDNN_MAX_CPU_ISA=AVX512_CORE (user)" in gemm_limits.describe(user)
    # grlib's values for one path give way to another path's (a child of a forced parent)
    assert gemm_limits.limited_environ("amx", env) == {"PATH": "x"}
    assert gemm_limits.limited_environ("avx512", env) == {"PATH": "x", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
                                                          gemm_limits.MARK: "ONEDNN_MAX_CPU_ISA"}
    generic = gemm_limits.limited_environ("generic", env)
    assert (generic["ONEDNN_MAX_CPU_ISA"], generic["MKL_ENABLE_INSTRUCTIONS"]) == ("SSE41", "SSE4_2")
    assert gemm_limits.describe({}) == "none"


def _onednn_isa(env: dict) -> str:
    code = ("import grlib, torch\n"
            "a = torch.randn(64, 64)\n"
            "torch.ops.mkldnn._linear_pointwise(a, a, None, 'none', [], '')\n")
    proc = subprocess.run([sys.executable, "-c", code], env={**env, "ONEDNN_VERBOSE": "1"}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    named = [line.split(",isa:")[1] for line in proc.stdout.splitlines() if ",isa:" in line]
    assert named, f"oneDNN printed no ISA line under ONEDNN_VERBOSE=1:\n{proc.stdout[-2000:]}"
    return named[0]


# oneDNN's wording for an ISA changes between versions and CPUs ("Intel AVX-512 with ..." on Zen 4/5,
# "Intel AVX10.1 and Intel AMX with bfloat16 ..." on a Xeon with AMX tiles, "Intel AVX2", "Intel
# SSE4.1"): the tests compare the vector width a name stands for, the first token found in it
VECTOR_BITS = (("avx10", 512), ("avx-512", 512), ("avx512", 512), ("amx", 512), ("avx2", 256), ("avx", 256),
               ("sse", 128))


def vector_bits(name: str) -> int:
    low = name.lower()
    for token, bits in VECTOR_BITS:
        if token in low:
            return bits
    raise AssertionError(f"oneDNN ISA {name!r}: none of {[t for t, _ in VECTOR_BITS]} in it; "
                         "add its width to tests/test_gemm_limits.py VECTOR_BITS")


def test_vector_bits_of_onednn_names():
    assert [vector_bits(n) for n in ("Intel AVX10.1 and Intel AMX with bfloat16 and 8-bit integer support",
                                     "Intel AVX-512 with AVX512BW, AVX512VL, and AVX512DQ extensions",
                                     "Intel AVX2", "Intel AVX2 with Intel DL Boost", "Intel AVX",
                                     "Intel SSE4.1")] == [512, 512, 256, 256, 256, 128]
    with pytest.raises(AssertionError, match="VECTOR_BITS"):
        vector_bits("Arm SVE 256")


@pytest.mark.skipif("avx2" not in isa.cpu_paths(), reason="needs an x86-64 CPU with AVX2 + FMA")
def test_grlib_isa_avx2_runs_onednn_as_an_avx2_cpu():
    base = {k: v for k, v in os.environ.items()
            if k not in (*gemm_limits.VARIABLES, gemm_limits.MARK, gemm_limits.ENV)}
    avx2 = _onednn_isa({**base, "GRLIB_ISA": "avx2"})
    assert vector_bits(avx2) == 256, avx2
    generic = _onednn_isa({**base, "GRLIB_ISA": "generic"})
    assert vector_bits(generic) == 128, generic
    if "avx512" in isa.cpu_paths():
        avx512 = _onednn_isa({**base, "GRLIB_ISA": "avx512"})
        assert vector_bits(avx512) == 512, avx512
    if "avx512f" in isa.cpu_flags():  # unlimited, oneDNN takes 512-bit vectors (or AMX tiles beside them)
        default = _onednn_isa(base)
        assert vector_bits(default) == 512, default
