"""grlib.hardware.isa: the instruction-set paths of grlib._C, GRLIB_ISA, and bf16 refused in a few
seconds on a CPU without bf16 GEMMs (forced here with GRLIB_ISA=avx2 on an AVX-512 machine)."""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys

import pytest

from grlib.config import ConfigError
from grlib.hardware import isa

ZEN3 = frozenset("fpu sse sse2 avx fma avx2 bmi2".split())
ZEN5 = ZEN3 | {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16"}
SKYLAKE_X = ZEN3 | {"avx512f", "avx512bw", "avx512dq", "avx512vl"}  # AVX-512 without bf16
SAPPHIRE_RAPIDS = ZEN5 | {"amx_bf16", "amx_tile"}  # AVX512-BF16 and the AMX-BF16 tile unit


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the x86-64 paths")
def test_cpu_paths_follow_the_flags():
    assert isa.cpu_paths(ZEN3) == ("avx2", "generic")
    assert isa.cpu_paths(SKYLAKE_X) == ("avx512", "avx2", "generic")
    assert isa.cpu_paths(ZEN5) == ("avx512_bf16", "avx512", "avx2", "generic")
    assert isa.cpu_paths(SAPPHIRE_RAPIDS) == ("amx", "avx512_bf16", "avx512", "avx2", "generic")
    assert isa.cpu_paths(ZEN5 | {"amx_bf16"}) == isa.cpu_paths(ZEN5)  # amx needs the tile flag as well
    assert isa.cpu_paths(frozenset({"sse2"})) == ("generic",)


@pytest.mark.parametrize("flags, forced, needle", [
    (ZEN3, "", "need the CPU flag avx512_bf16"),
    (SKYLAKE_X, "", "need the CPU flag avx512_bf16"),
    (ZEN5, "avx512", "GRLIB_ISA=avx512 runs this process as a CPU without avx512_bf16"),
    (ZEN5, "avx2", "GRLIB_ISA=avx2 runs this process as a CPU without avx512_bf16"),
    (SAPPHIRE_RAPIDS, "avx512", "GRLIB_ISA=avx512 runs this process as a CPU without avx512_bf16"),
    (SAPPHIRE_RAPIDS, "avx512_bf16", None),
    (ZEN5, "generic", "GRLIB_ISA=generic runs this process as a CPU without avx512_bf16"),
    (ZEN5, "", None),
    (SAPPHIRE_RAPIDS, "", None),
])
def test_bf16_needs_the_flag_and_the_avx512_path(monkeypatch, flags, forced, needle):
    if os.uname().machine != "x86_64" and needle is None:
        pytest.skip("the avx512 path exists on x86-64 only")
    monkeypatch.setattr(isa, "cpu_flags", lambda: flags)
    monkeypatch.setenv("GRLIB_ISA", forced)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)  # (GRLIB_ISA=avx2 make test has it set)
    why = isa.bf16_missing()
    if needle is None:
        assert why is None
        isa.require_bf16("model.precision")
        return
    assert needle in why
    with pytest.raises(ConfigError, match=r"^model.precision: bf16 is not available on this CPU: .*use fp32$"):
        isa.require_bf16("model.precision")


@pytest.mark.parametrize("limit, refused", [("AVX2", True), ("avx512_core", True), ("AVX512_CORE_BF16", False),
                                           ("ALL", False)])
def test_bf16_is_refused_where_onednn_is_limited_below_bf16(monkeypatch, limit, refused):
    """A user's ONEDNN_MAX_CPU_ISA below AVX512_CORE_BF16: oneDNN would refuse the bf16 primitive."""
    monkeypatch.setattr(isa, "cpu_flags", lambda: ZEN5)
    monkeypatch.setenv("GRLIB_ISA", "")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", limit)
    why = isa.bf16_missing()
    assert (why is not None) == refused
    if refused:
        assert f"ONEDNN_MAX_CPU_ISA={limit.upper()} limits oneDNN below AVX512_CORE_BF16" in why


def test_an_unknown_forced_path_is_refused(monkeypatch):
    monkeypatch.setenv("GRLIB_ISA", "sse9")
    with pytest.raises(ConfigError, match="GRLIB_ISA='sse9': must be one of amx, avx512_bf16, avx512, avx2, "
                                          "generic"):
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


# ---- the paths of grlib._C (kernels/cpu/isa.h) -----------------------------------------------------
def _lib() -> str:
    import grlib._C as C

    return C.__file__


def test_the_build_names_its_paths_and_runs_an_available_one():
    import grlib.ops.cpu  # noqa: F401
    import grlib._C as C

    built = isa.built_paths()
    assert built[-1] == "generic" and set(built) <= set(isa.ISAS)
    assert list(built) == sorted(built, key=isa.ISAS.index)  # widest first
    assert isa.current() in isa.available() and isa.current() == C.isa()
    for path in isa.available():
        with isa.use(path):
            assert C.isa() == path and os.environ["GRLIB_ISA"] == path
    with pytest.raises(RuntimeError, match="unknown path 'sse9'"):
        C.set_isa("sse9")


def test_a_forced_path_the_cpu_lacks_names_what_it_has(monkeypatch):
    monkeypatch.setattr(isa, "cpu_flags", lambda: ZEN3)
    monkeypatch.setattr(isa, "cpu_paths", lambda flags=None: ("avx2", "generic"))
    monkeypatch.setenv("GRLIB_ISA", "avx512")
    with pytest.raises(ConfigError, match=r"GRLIB_ISA=avx512: the avx512 path is not available: needs the flags "
                                          r"avx512f .*this CPU \(.*\) has avx2 fma; available: avx2, generic"):
        isa.selected()


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the x86-64 paths")
def test_amx_forced_on_a_cpu_without_the_tile_unit_names_its_flags(monkeypatch):
    """A Zen 5 (avx512_bf16, no AMX) asked for amx: the tile flags named, the bf16 path it has listed."""
    monkeypatch.setattr(isa, "cpu_flags", lambda: ZEN5)
    monkeypatch.setattr(isa, "built_paths", lambda: isa.ISAS)
    monkeypatch.setenv("GRLIB_ISA", "amx")
    with pytest.raises(ConfigError, match=r"GRLIB_ISA=amx: the amx path is not available: needs the flags avx512f "
                                          r".* amx_bf16 amx_tile; this CPU \(.*\) has avx512f avx512_bf16 avx2 fma; "
                                          r"available: avx512_bf16, avx512, avx2, generic$"):
        isa.selected()


BF16_UNIT_INSTRUCTIONS = ("vdpbf16ps", "tdpbf16ps", "ldtilecfg", "tileloadd")


@functools.cache
def _disassembly() -> str:
    """`objdump -d -C` of grlib._C (read once per process: two tests scan it)."""
    return subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", _lib()], capture_output=True, text=True,
                          check=True).stdout


def _functions(disassembly: str) -> dict[str, list[str]]:
    """objdump -d -C text -> {function name: its instruction lines}."""
    out, name = {}, None
    for line in disassembly.splitlines():
        if line.endswith(">:") and "<" in line:
            name = line[line.index("<") + 1:-2]
            out[name] = []
        elif name is not None and line.strip():
            out[name].append(line)
    return out


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed")
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the x86-64 paths")
def test_no_avx512_instruction_outside_the_avx512_path():
    """The avx2 and generic paths hold no zmm register (what an AVX2-only CPU would fault on) and none of
    the bf16 units' instructions (vdpbf16ps, AMX tiles: the amx and avx512_bf16 paths are the avx512
    code, grlib_avx512::, with its units); a build with GRLIB_ISA_BUILD=x86-64-v3 (no avx512 path)
    holds none anywhere."""
    text = _disassembly()
    funcs = _functions(text)
    paths = {p: [n for n in funcs if f"grlib_{p}::" in n] for p in ("avx2", "generic", "avx512")}
    assert paths["avx2"] and paths["generic"], "no function of the avx2 / generic paths found"
    for p in ("avx2", "generic"):
        bad = [n for n in paths[p] if any("zmm" in ins for ins in funcs[n])]
        assert not bad, f"{p} path functions with zmm registers: {bad[:5]}"
        bad = [n for n in paths[p] if any(u in ins for ins in funcs[n] for u in BF16_UNIT_INSTRUCTIONS)]
        assert not bad, f"{p} path functions with bf16 unit instructions: {bad[:5]}"
    if "avx512" not in isa.built_paths():
        assert "zmm" not in text, "an x86-64-v3 build holds a zmm register"
    else:
        assert any("zmm" in ins for n in paths["avx512"] for ins in funcs[n])  # the check can fail


# Two x86 extensions that AMD CPUs served by the avx512 code lack: AVX512-FP16 (Intel since Sapphire
# Rapids; Zen 4 and Zen 5 have none) and VP2INTERSECT (Zen 5 and Tiger Lake only, not Zen 4). The avx512 code
# (grlib_avx512::, the avx512, avx512_bf16 and amx paths) also runs on Zen 4 and 5, while the AMX Xeon
# the bf16 paths are developed on has both extensions: one such instruction would pass every test there
# and fault (SIGILL) on an AMD CPU. FP16 mnemonics name a ph / sh operand (vaddph, vcvtsh2ss,
# vcvtps2phx); F16C's two conversions (vcvtph2ps, vcvtps2ph) and the vp* integer ops (vpshufb) are not FP16.
_FP16 = re.compile(r"v(?!p)\w*(?:(?:ph|sh)x?|(?:ph|sh)2\w+)|vmovw")
_F16C = frozenset({"vcvtph2ps", "vcvtps2ph"})


def _foreign_instructions(lines: list[str]) -> list[str]:
    """objdump instruction lines -> the mnemonics of AVX512-FP16 or VP2INTERSECT among them, in order."""
    out = []
    for line in lines:
        fields = line.split("\t")
        words = [w for w in fields[1].split() if not w.startswith("{")] if len(fields) > 1 else []
        m = words[0] if words else ""
        if (_FP16.fullmatch(m) and m not in _F16C) or m.startswith("vp2intersect"):
            out.append(m)
    return out


def test_the_foreign_instruction_check_tells_fp16_from_f16c():
    lines = ["  10:\tvaddph %zmm1,%zmm2,%zmm3", "  16:\tvcvtps2ph $0x0,%ymm0,%xmm1", "  1c:\tvcvtph2ps %xmm0,%ymm0",
             "  21:\tvpshufb %ymm1,%ymm2,%ymm3", "  26:\tvcvtsh2ss %xmm1,%xmm2,%xmm3",
             "  2c:\tvshufps $0x0,%ymm1,%ymm2,%ymm3", "  32:\t{evex} vcvtps2phx %zmm1,%ymm2",
             "  38:\tvp2intersectd %zmm1,%zmm2,%k2", "  3e:\tvdpbf16ps %zmm1,%zmm2,%zmm3",
             "  44:\tvmovshdup %xmm1,%xmm2"]
    assert _foreign_instructions(lines) == ["vaddph", "vcvtsh2ss", "vcvtps2phx", "vp2intersectd"]


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed")
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the x86-64 paths")
def test_no_instruction_an_amd_cpu_lacks():
    """grlib._C holds no AVX512-FP16 or VP2INTERSECT instruction (the comment above), on any path."""
    text = _disassembly()
    bad = {name: found for name, lines in _functions(text).items() if (found := _foreign_instructions(lines))}
    assert not bad, f"functions with instructions Zen 4 / Zen 5 lack: {dict(list(bad.items())[:5])}"


KERNEL_TESTS = ("tests/test_attention.py", "tests/test_uvqk_attention.py", "tests/test_attention_fused.py",
                "tests/test_embedding_sum.py", "tests/test_dropout.py", "tests/test_linear.py", "tests/test_train.py")


@pytest.mark.parametrize("path", ["avx2", "generic", "avx512"])
def test_the_kernel_tests_pass_on_each_path(path):
    """Every kernel test (padded references, hypothesis shapes, fwd + bwd, every dtype) on one more
    path than the process default, in a child with GRLIB_ISA set (the default path runs them in the
    suite); amx and avx512_bf16 run the avx512 code but for the bf16 attention, which
    test_attention_bf16 runs on each of them in-process. The child draws a third of the random
    cases (conftest's `paths` profile) unless HYPOTHESIS_PROFILE says otherwise."""
    import grlib.ops.cpu  # noqa: F401

    if path not in isa.available():
        pytest.skip(f"the {path} path is not available here: available {isa.available()}")
    if path == isa.current() and not os.environ.get("GRLIB_ISA"):
        pytest.skip(f"{path} is this process's default path: the suite itself runs the kernel tests on it")
    env = dict(os.environ, GRLIB_ISA=path, HYPOTHESIS_PROFILE=os.environ.get("HYPOTHESIS_PROFILE", "paths"))
    got = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist",
                          *KERNEL_TESTS], capture_output=True, text=True, env=env,
                         timeout=1800)
    assert got.returncode == 0, got.stdout[-4000:] + got.stderr[-2000:]
