"""This machine's nominal peak FLOP/s (the second MFU denominator), each factor with how it was found.

MFU has two denominators in grlib's rows (grlib.perf):

    measured   the fp32 (or bf16) GEMM peak timed in the same run (grlib.hardware.gemm)
    nominal    cores x FLOP per cycle per core x clock (this module), or the vendor's peak on GPU/NPU

NVIDIA's MFU (Megatron, recsys-examples) divides by the device's nominal (datasheet) peak, and so,
most likely, does the paper's 54.71%: its figure compares with `mfu_nominal`. A measured GEMM
peak sits below the nominal one (torch.mm reached 214-362 GFLOP/s on 2-core AMD EPYC VMs whose
nominal peak is at least 333), so the same step reads a higher MFU against it.

On CPU (x86-64 from /proc/cpuinfo; other architectures get the probe's figures, marked so):

    cores           physical cores among this process's allowed CPUs ((physical id, core id) pairs
                    in /proc/cpuinfo), at most torch's intra-op threads
    FLOP / cycle    vector lanes from the flags at grlib._C's path (isa: avx512f: 16 fp32, avx/avx2: 8, else 4) x 2 (an FMA
                    is two FLOPs; the `fma` flag) x FMA instructions per cycle at that width, from
                    the vendor / family / model (a table below: flags do not say how many FMA units
                    a core has, nor whether 512-bit instructions run on 256-bit datapaths); bf16 x2
                    with avx512_bf16 (vdpbf16ps: two products per fp32 lane), 1024 per core with
                    amx_bf16; without either, bf16 computes in fp32 (the fp32 figure)
    clock           the highest of: cpufreq's cpuinfo_max_freq (sysfs), the clock in the model
                    name ("@ 2.60GHz"), "cpu MHz" in /proc/cpuinfo (in a VM: the TSC), and the clock
                    measured by a chain of dependent integer adds (kernels/cpu/probe.cpp: one add
                    per cycle, timed in thread CPU time), so that a core boosting past its listed
                    clock does not make the nominal peak too low
    probe           the FMA throughput of one core measured by 16 register-resident FMA chains
                    (FLOP per cycle = its rate / the measured clock): the table's check; where it
                    exceeds the table's by over 5%, the probe's figure is used (and the description says so)

    >>> peak = nominal_peak("float32")
    >>> peak.flops, peak.describe()
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

CPUINFO = Path("/proc/cpuinfo")
CPUFREQ = Path("/sys/devices/system/cpu")
DTYPES = ("float32", "bfloat16")
PROBE_TOLERANCE = 1.05  # the probe's FLOP/cycle replaces the table's when above it by more (clock noise)

# Vendor datasheet peaks (dense, TFLOP/s) of accelerators, by a substring of the device name.
VENDOR_PEAKS = {
    "H200": {"float32": 67.0, "bfloat16": 989.0},
    "H100": {"float32": 67.0, "bfloat16": 989.0},  # SXM; PCIe parts are lower (name them before this)
    "A100": {"float32": 19.5, "bfloat16": 312.0},
    "L40S": {"float32": 91.6, "bfloat16": 362.0},
    "Ascend910B": {"float32": 94.0, "bfloat16": 376.0},
}


@dataclass(frozen=True)
class CpuInfo:
    vendor: str
    family: int
    model: int
    model_name: str
    flags: frozenset[str]
    mhz: float  # highest "cpu MHz" over the listed CPUs (nan if absent)
    cores: dict[int, tuple[str, str]] = field(default_factory=dict)  # cpu -> (physical id, core id)


def cpu_info(path: Path = CPUINFO) -> CpuInfo:
    """The first CPU's identity and flags, every CPU's core, and the highest listed clock."""
    blocks = [b for b in path.read_text().split("\n\n") if b.strip()]
    if not blocks:
        raise RuntimeError(f"{path} lists no CPU")
    rows = [dict((k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in b.splitlines()))
            for b in blocks]
    first = rows[0]
    flags = frozenset((first.get("flags") or first.get("Features") or "").split())
    mhz = [float(r["cpu MHz"]) for r in rows if r.get("cpu MHz")]
    cores = {int(r["processor"]): (r.get("physical id", "0"), r.get("core id", r["processor"]))
             for r in rows if r.get("processor", "").isdigit()}
    return CpuInfo(vendor=first.get("vendor_id", first.get("CPU implementer", "unknown")),
                   family=int(first.get("cpu family", "0") or 0), model=int(first.get("model", "0") or 0),
                   model_name=first.get("model name", "unknown"), flags=flags,
                   mhz=max(mhz) if mhz else math.nan, cores=cores)


def physical_cores(info: CpuInfo, threads: int) -> tuple[int, str]:
    """Cores a run of `threads` torch threads can use, and how that was found."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(info.cores)
    pairs = {info.cores[c] for c in allowed if c in info.cores}
    n = len(pairs) or len(allowed)
    how = f"{n} physical cores among the {len(allowed)} allowed CPUs (/proc/cpuinfo core ids)"
    if threads < n:
        return threads, f"{threads} torch threads ({how})"
    return n, how


@dataclass(frozen=True)
class VectorUnits:
    lanes: int  # fp32 lanes of the widest vector the flags allow
    fma_per_cycle: float  # vector FMA instructions per cycle at that width
    flop_per_cycle: dict[str, float]  # per dtype, per core
    how: str


def vector_units(info: CpuInfo, path: str | None = None) -> VectorUnits:
    """FLOP per cycle per core from the flags and the vendor / family / model (module doc), at the
    vector width of grlib._C's instruction-set path `path` (grlib.hardware.isa; None: the flags')."""
    f = info.flags
    if path == "avx512_bf16":  # an AVX512-BF16 CPU without AMX
        f = f - {"amx_bf16"}
    elif path == "avx512":  # an AVX-512 CPU without bf16 units
        f = f - {"avx512_bf16", "amx_bf16"}
    elif path is not None and path != "amx":  # the path's own vectors: avx2 32 bytes, generic 16
        f = f - {"avx512f", "avx512_bf16", "amx_bf16"}
        if path == "generic":
            f = f - {"avx", "avx2", "fma"}
    if "avx512f" in f:
        lanes, width = 16, "avx512f: 512-bit, 16 fp32 lanes"
    elif "avx2" in f or "avx" in f:
        lanes, width = 8, "avx: 256-bit, 8 fp32 lanes"
    elif "sse2" in f or "asimd" in f:
        lanes, width = 4, "128-bit, 4 fp32 lanes"
    else:
        lanes, width = 1, "no vector flags known here: 1 lane"
    fma = 2 if ("fma" in f or "asimd" in f) else 1  # an FMA is 2 FLOPs; without FMA, 1 per instruction
    pipes, pipes_how = _fma_pipes(info, lanes)
    fp32 = lanes * fma * pipes
    bf16, bf16_how = fp32, "no bf16 instructions: bf16 computes in fp32"
    if "amx_bf16" in f:
        bf16, bf16_how = 1024.0, "amx_bf16: 1024 bf16 FLOP per cycle per core (Intel AMX)"
    elif "avx512_bf16" in f:
        bf16, bf16_how = 2 * fp32, "avx512_bf16: vdpbf16ps, 2x the fp32 FLOP per instruction"
    how = (f"{width} x {fma} (" + ("FMA" if fma == 2 else "no FMA") + f") x {pipes:g} per cycle ({pipes_how}); "
           f"bf16: {bf16_how}")
    return VectorUnits(lanes, pipes, {"float32": float(fp32), "bfloat16": float(bf16)}, how)


def _fma_pipes(info: CpuInfo, lanes: int) -> tuple[float, str]:
    """Vector FMA instructions per cycle at `lanes` width, by microarchitecture."""
    if info.vendor == "AuthenticAMD":
        if info.family == 0x17:  # Zen, Zen+ (models < 0x30): 128-bit datapaths; Zen 2: 2 x 256-bit
            return (1.0, "AMD Zen/Zen+: 256-bit FMAs on 2 x 128-bit pipes") if info.model < 0x30 else \
                (2.0, "AMD Zen 2: 2 x 256-bit FMA pipes")
        if info.family == 0x19:  # Zen 3 (no AVX-512) and Zen 4 (512-bit instructions on 2 x 256-bit pipes)
            zen = "Zen 4" if "avx512f" in info.flags else "Zen 3"
            return (1.0, "AMD Zen 4: 512-bit FMAs on 2 x 256-bit pipes") if lanes == 16 else \
                (2.0, f"AMD {zen} (family 0x19 model {info.model:#x}): 2 x 256-bit FMA pipes")
        if info.family == 0x1A:  # Zen 5: 512-bit pipes, except the mobile parts' 256-bit datapath
            mobile = 0x20 <= info.model <= 0x2F or 0x60 <= info.model <= 0x6F
            return (1.0, "AMD Zen 5 mobile: 512-bit FMAs on 256-bit pipes") if mobile and lanes == 16 else \
                (2.0, f"AMD Zen 5 (family 0x1A model {info.model:#x}): 2 x {lanes * 32}-bit FMA pipes")
        return 2.0, f"AMD family {info.family:#x}: not in the table, 2 FMA pipes assumed"
    if info.vendor == "GenuineIntel":
        if lanes == 16:
            return 2.0, "Intel with AVX-512: 2 x 512-bit FMA units assumed (Xeon Scalable; some parts have 1)"
        return 2.0, "Intel: 2 FMA ports (Haswell and later)"
    return 2.0, f"vendor {info.vendor!r}: not in the table, 2 FMA pipes assumed"


@dataclass(frozen=True)
class Probe:
    clock_hz: float  # one add per cycle along a dependent chain
    flop_per_cycle: dict[str, float]  # the FMA (and bf16 dot-product) chains' rate / clock_hz, one core


def probe(repeats: int = 3) -> Probe:
    """The compiled probes (kernels/cpu/probe.cpp) on this thread, best of `repeats` (thread CPU time)."""
    from grlib.hardware.isa import load

    load()  # grlib._C, which registers the probes in torch.ops.grlib

    ops = torch.ops.grlib
    clock = max(a / s for a, s in (ops.probe_clock(200_000) for _ in range(repeats)))
    rates = {}
    for dtype in DTYPES:
        try:
            rates[dtype] = max(f / s for f, s in (ops.probe_fma(1_000_000, dtype == "bfloat16")
                                                  for _ in range(repeats))) / clock
        except RuntimeError:  # no FMA loop in this build (non-x86), or no AVX512-BF16 for bf16
            rates[dtype] = rates.get("float32", math.nan)
    return Probe(clock, rates)


def clock(info: CpuInfo, measured_hz: float, cpufreq: Path = CPUFREQ) -> tuple[float, str]:
    """The highest of the listed clocks and the measured one (module doc), and where it came from."""
    found = {}
    maxima = []
    for f in cpufreq.glob("cpu[0-9]*/cpufreq/cpuinfo_max_freq"):
        try:
            maxima.append(float(f.read_text()) * 1e3)  # kHz
        except (OSError, ValueError):
            continue
    if maxima:
        found["cpufreq cpuinfo_max_freq"] = max(maxima)
    name = info.model_name.replace("GHz", " GHz").split()
    if "@" in name and name.index("@") + 1 < len(name):
        try:
            found["model name"] = float(name[name.index("@") + 1]) * 1e9
        except ValueError:
            pass
    if not math.isnan(info.mhz):
        found["/proc/cpuinfo cpu MHz"] = info.mhz * 1e6
    found["measured add chain"] = measured_hz
    source = max(found, key=found.get)
    listed = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in found.items())
    return found[source], f"{found[source] / 1e9:.2f} GHz from {source} (GHz: {listed})"


@dataclass(frozen=True)
class NominalPeak:
    device: str
    dtype: str
    flops: float  # FLOP/s
    cores: int
    flop_per_cycle: float  # per core
    clock_hz: float
    probe_flops: float  # cores x the probe's FLOP per cycle x clock (nan on accelerators)
    how: str  # cores, FLOP per cycle and clock, each with its source

    def describe(self) -> str:
        return f"nominal {self.dtype} peak {self.flops / 1e9:.1f} GFLOP/s = {self.how}"


def nominal_peak(dtype: str = "float32", device: str | torch.device = "cpu", threads: int | None = None) -> NominalPeak:
    """The nominal peak of `device` for `dtype` (module doc); CPU: for `threads` (torch's now) threads."""
    if dtype not in DTYPES:
        raise ValueError(f"nominal_peak: dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    dev = torch.device(device)
    if dev.type != "cpu":
        return _vendor_peak(dev, dtype)
    info = cpu_info()
    cores, cores_how = physical_cores(info, threads or torch.get_num_threads())
    from grlib.hardware.isa import current

    path = current()
    units, measured = vector_units(info, path), probe()
    hz, clock_how = clock(info, measured.clock_hz)
    table, probed = units.flop_per_cycle[dtype], measured.flop_per_cycle[dtype]
    above = probed > PROBE_TOLERANCE * table  # the table misses this CPU's units
    per_cycle = probed if above else table
    per_cycle_how = (f"{table:g} FLOP/cycle ({units.how})" if not above else
                     f"{probed:.1f} FLOP/cycle measured by the FMA probe, above the table's {table:g} ({units.how})")
    how = (f"{cores} cores [{cores_how}] x {per_cycle_how} [probe: {probed:.1f} FLOP/cycle] x {clock_how}; "
           f"CPU {info.model_name!r} family {info.family:#x} model {info.model:#x}; grlib._C path {path}")
    return NominalPeak("cpu", dtype, cores * per_cycle * hz, cores, per_cycle, hz, cores * probed * hz, how)


def _vendor_peak(dev: torch.device, dtype: str) -> NominalPeak:
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
    elif dev.type == "npu":
        name = torch.npu.get_device_name(dev)  # type: ignore[attr-defined]
    else:
        raise ValueError(f"nominal_peak: no peak known for device type {dev.type!r}")
    key = next((k for k in VENDOR_PEAKS if k.lower() in name.replace(" ", "").lower()), None)
    if key is None:
        raise ValueError(f"nominal_peak: {name!r} is not in grlib.hardware.VENDOR_PEAKS ({', '.join(VENDOR_PEAKS)})")
    tflops = VENDOR_PEAKS[key][dtype]
    return NominalPeak(dev.type, dtype, tflops * 1e12, 1, math.nan, math.nan, math.nan,
                       f"vendor datasheet {tflops:g} TFLOP/s dense ({key}, device {name!r})")
