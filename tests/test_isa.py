"""grlib.hardware.isa: the instruction-set paths of grlib._C, GRLIB_ISA, and bf16 refused in a few
seconds on a CPU without bf16 GEMMs (forced here with GRLIB_ISA=avx2 on an AVX-512 machine)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from grlib.config import ConfigError
from grlib.hardware import isa

ZEN3 = frozenset("fpu sse sse2 avx fma avx2 bmi2".split())
ZEN5 = ZEN3 | {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16"}
SKYLAKE_X = ZEN3 | {"avx512f", "avx512bw", "avx512dq", "avx512vl"}  # AVX-512 without bf16


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the x86-64 paths")
def test_cpu_paths_follow_the_flags():
    assert isa.cpu_paths(ZEN3) == ("avx2", "generic")
    assert isa.cpu_paths(ZEN5) == ("avx512", "avx2", "generic")
    assert isa.cpu_paths(frozenset({"sse2"})) == ("generic",)


@pytest.mark.parametrize("flags, forced, needle", [
    (ZEN3, "", "need the CPU flag avx512_bf16"),
    (SKYLAKE_X, "", "need the CPU flag avx512_bf16"),
    (ZEN5, "avx2", "GRLIB_ISA=avx2 runs this process as a CPU without avx512_bf16"),
    (ZEN5, "generic", "GRLIB_ISA=generic runs this process as a CPU without avx512_bf16"),
    (ZEN5, "", None),
])
def test_bf16_needs_the_flag_and_the_avx512_path(monkeypatch, flags, forced, needle):
    if os.uname().machine != "x86_64" and needle is None:
        pytest.skip("the avx512 path exists on x86-64 only")
    monkeypatch.setattr(isa, "cpu_flags", lambda: flags)
    monkeypatch.setenv("GRLIB_ISA", forced)
    why = isa.bf16_missing()
    if needle is None:
        assert why is None
        isa.require_bf16("model.precision")
        return
    assert needle in why
    with pytest.raises(ConfigError, match=r"^model.precision: bf16 is not available on this CPU: .*use fp32$"):
        isa.require_bf16("model.precision")


def test_an_unknown_forced_path_is_refused(monkeypatch):
    monkeypatch.setenv("GRLIB_ISA", "sse9")
    with pytest.raises(ConfigError, match="GRLIB_ISA='sse9': must be one of avx512, avx2, generic"):
        isa.selected_by_flags()


def _cli(*args: str, isa_path: str = "avx2") -> subprocess.CompletedProcess:
    env = dict(os.environ, GRLIB_ISA=isa_path)
    return subprocess.run([sys.executable, "-m", "grlib", *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.parametrize("args", [
    ("train", "--scale", "smoke", "-o", "model.precision=bf16"),
    ("bench", "train", "--scale", "smoke", "--precision", "bf16", "--steps", "2", "--impls", "cpu", "--no-compile"),
])
def test_bf16_is_refused_with_one_error_line_under_avx2(args, tmp_path):
    got = _cli(*args)
    assert got.returncode == 2, got.stderr[-2000:]
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "avx512_bf16" in lines[0], got.stderr
    assert "primitive descriptor" not in got.stderr


def test_train_stage_skips_bf16_with_its_reason(monkeypatch):
    from grlib.experiments import train_stage

    monkeypatch.setenv("GRLIB_ISA", "avx2")
    assert "avx512_bf16" in train_stage.precision_missing("bf16")
    assert train_stage.precision_missing("fp32") is None
