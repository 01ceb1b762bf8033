"""GRLIB_ISA limits torch's GEMM libraries (grlib.gemm_limits): oneDNN and MKL run the forced path's
vectors from the first GEMM, the user's own settings win, and a child follows its own path."""
import os
import subprocess
import sys

import pytest

from grlib import gemm_limits
from grlib.hardware import isa


def test_each_path_sets_its_limits_and_the_users_win():
    assert gemm_limits.limited_environ("avx512", {}) == {}
    assert gemm_limits.limited_environ(None, {}) == {}
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
    assert gemm_limits.limited_environ("avx512", env) == {"PATH": "x"}
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
    return next(line for line in proc.stdout.splitlines() if ",isa:" in line).split(",isa:")[1]


@pytest.mark.skipif("avx2" not in isa.cpu_paths(), reason="needs an x86-64 CPU with AVX2 + FMA")
def test_grlib_isa_avx2_runs_onednn_as_an_avx2_cpu():
    base = {k: v for k, v in os.environ.items()
            if k not in (*gemm_limits.VARIABLES, gemm_limits.MARK, gemm_limits.ENV)}
    assert _onednn_isa({**base, "GRLIB_ISA": "avx2"}) == "Intel AVX2"
    assert _onednn_isa({**base, "GRLIB_ISA": "generic"}) == "Intel SSE4.1"
    if "avx512f" in isa.cpu_flags():
        # unlimited, oneDNN picks 512-bit vectors or better: it names them "AVX-512 ..." on Zen 4/5,
        # "AVX10.1 and Intel AMX ..." on a Xeon with AMX tiles (amx_tile in /proc/cpuinfo)
        default = _onednn_isa(base)
        assert any(name in default for name in ("AVX-512", "AVX10", "AMX")), default
