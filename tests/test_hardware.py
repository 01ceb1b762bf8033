"""The nominal peak (grlib.hardware): /proc/cpuinfo parsing, FLOP per cycle per microarchitecture,
the clock's sources, the compiled probes, and the vendor peaks of accelerators."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from grlib import hardware
from grlib.hardware import isa, nominal

ZEN5 = "fpu sse sse2 avx fma avx2 avx512f avx512_bf16"


def cpuinfo(tmp_path: Path, cpus: list[tuple[str, str]], flags: str = ZEN5, vendor: str = "AuthenticAMD",
            family: int = 26, model: int = 2, name: str = "AMD EPYC", mhz: tuple[float, ...] = (2596.1,)) -> Path:
    """A /proc/cpuinfo with one block per (physical id, core id)."""
    blocks = []
    for i, (phys, core) in enumerate(cpus):
        blocks.append(f"processor\t: {i}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
                      f"model name\t: {name}\ncpu MHz\t\t: {mhz[i % len(mhz)]}\nphysical id\t: {phys}\n"
                      f"core id\t\t: {core}\nflags\t\t: {flags}\n")
    path = tmp_path / "cpuinfo"
    path.write_text("\n".join(blocks) + "\n")
    return path


def test_cpuinfo_is_parsed(tmp_path):
    info = hardware.cpu_info(cpuinfo(tmp_path, [("0", "0"), ("0", "1")], mhz=(2596.1, 3000.0)))
    assert (info.vendor, info.family, info.model, info.model_name) == ("AuthenticAMD", 26, 2, "AMD EPYC")
    assert {"avx512f", "fma", "avx512_bf16"} <= info.flags and info.mhz == 3000.0
    assert info.cores == {0: ("0", "0"), 1: ("0", "1")}
    empty = tmp_path / "empty"
    empty.write_text("\n\n")
    with pytest.raises(RuntimeError, match="lists no CPU"):
        hardware.cpu_info(empty)


@pytest.mark.parametrize("vendor, family, model, flags, fp32, bf16", [
    ("AuthenticAMD", 0x1A, 0x02, ZEN5, 64, 128),                          # Zen 5 server: 2 x 512-bit FMA
    ("AuthenticAMD", 0x1A, 0x24, ZEN5, 32, 64),                           # Zen 5 mobile: 256-bit datapath
    ("AuthenticAMD", 0x19, 0x11, "avx avx2 fma avx512f avx512_bf16", 32, 64),  # Zen 4: double-pumped
    ("AuthenticAMD", 0x19, 0x01, "avx avx2 fma", 32, 32),                 # Zen 3: 2 x 256-bit, no bf16
    ("AuthenticAMD", 0x17, 0x01, "avx avx2 fma", 16, 16),                 # Zen 1: 2 x 128-bit
    ("GenuineIntel", 6, 0x8F, "avx avx2 fma avx512f avx512_bf16 amx_bf16", 64, 1024),  # Sapphire Rapids
    ("GenuineIntel", 6, 0x3C, "avx avx2 fma", 32, 32),                    # Haswell
    ("GenuineIntel", 6, 0x2A, "sse2 avx", 16, 16),                        # Sandy Bridge: no FMA
])
def test_flop_per_cycle_by_microarchitecture(tmp_path, vendor, family, model, flags, fp32, bf16):
    info = hardware.cpu_info(cpuinfo(tmp_path, [("0", "0")], flags=flags, vendor=vendor, family=family,
                                     model=model))
    units = hardware.vector_units(info)
    assert units.flop_per_cycle == {"float32": fp32, "bfloat16": bf16}
    assert ("no FMA" in units.how) == ("fma" not in flags.split())


def test_cores_are_physical_and_bounded_by_threads(tmp_path, monkeypatch):
    # 2 cores with 2 hardware threads each (SMT): 4 CPUs, 2 cores
    info = hardware.cpu_info(cpuinfo(tmp_path, [("0", "0"), ("0", "1"), ("0", "0"), ("0", "1")]))
    monkeypatch.setattr(nominal.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert nominal.physical_cores(info, 4)[0] == 2
    assert nominal.physical_cores(info, 1) == (1, "1 torch threads (2 physical cores among the 4 allowed "
                                                   "CPUs (/proc/cpuinfo core ids))")
    monkeypatch.setattr(nominal.os, "sched_getaffinity", lambda pid: {0, 2})  # both threads of core 0
    assert nominal.physical_cores(info, 2)[0] == 1


def test_clock_takes_the_highest_source_and_names_it(tmp_path):
    info = hardware.cpu_info(cpuinfo(tmp_path, [("0", "0")], name="Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz",
                                     mhz=(1200.0,)))
    freq = tmp_path / "sys"
    (freq / "cpu0" / "cpufreq").mkdir(parents=True)
    (freq / "cpu0" / "cpufreq" / "cpuinfo_max_freq").write_text("3900000\n")  # kHz
    hz, how = nominal.clock(info, 3.1e9, freq)
    assert hz == 3.9e9 and how.startswith("3.90 GHz from cpufreq cpuinfo_max_freq")
    assert "model name 2.50" in how and "/proc/cpuinfo cpu MHz 1.20" in how and "measured add chain 3.10" in how
    hz, how = nominal.clock(info, 4.4e9, tmp_path / "none")  # boosting past every listed clock
    assert hz == 4.4e9 and "from measured add chain" in how


def test_probes_run_on_this_cpu():
    import grlib.ops.cpu  # noqa: F401

    adds, seconds = torch.ops.grlib.probe_clock(1000)
    assert adds == 100_000 and seconds > 0
    bits = torch.ops.grlib.probe_vector_bits()
    assert bits in (0, 256, 512)
    if bits:
        flops, seconds = torch.ops.grlib.probe_fma(1000, False)
        assert flops == 1000 * {512: 2 * 16 * 16, 256: 2 * 8 * 14}[bits] and seconds > 0
    else:
        with pytest.raises(RuntimeError, match="no FMA loop"):
            torch.ops.grlib.probe_fma(1000, False)
    with pytest.raises(RuntimeError, match="iters must be > 0"):
        torch.ops.grlib.probe_fma(0, False)


@pytest.mark.parametrize("dtype", hardware.DTYPES)
def test_nominal_peak_is_cores_times_flop_per_cycle_times_clock(dtype):
    peak = hardware.nominal_peak(dtype, threads=1)
    assert peak.cores == 1 and peak.device == "cpu" and peak.dtype == dtype
    assert peak.flops == pytest.approx(peak.cores * peak.flop_per_cycle * peak.clock_hz)
    assert "FLOP/cycle" in peak.describe() and "GHz from" in peak.describe()
    import grlib.ops.cpu  # noqa: F401

    if torch.ops.grlib.probe_vector_bits() == 0:  # this path (GRLIB_ISA=generic, a non-x86 build) has no FMA loop
        assert math.isnan(peak.probe_flops)  # no figure, rather than a made-up one
        pytest.skip(f"the FMA probe: grlib._C's {isa.current()} path has no FMA loop (the table's peak "
                    "is checked above)")
    assert math.isfinite(peak.probe_flops) and peak.probe_flops > 0


def test_nominal_peak_refuses_other_dtypes():
    with pytest.raises(ValueError, match="float32, bfloat16"):
        hardware.nominal_peak("float16")


def test_vendor_peaks_of_accelerators(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: "NVIDIA H100 80GB HBM3")
    peak = hardware.nominal_peak("bfloat16", device="cuda")
    assert peak.flops == 989e12 and "vendor datasheet" in peak.how
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: "NVIDIA GeForce GT 710")
    with pytest.raises(ValueError, match="not in grlib.hardware.VENDOR_PEAKS"):
        hardware.nominal_peak("float32", device="cuda")
