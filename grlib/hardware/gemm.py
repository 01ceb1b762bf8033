"""The measured GEMM peak of this machine, the first MFU denominator (grlib.perf; the second is
grlib.hardware.nominal).

The peak is the best GEMM this machine runs, timed in the same run as the steps it divides, never
cached: warm square GEMMs (median of 5 repeats, best of the sizes 1024 and 2048; a cold first GEMM
reads about half) through each GEMM library torch offers on CPU, the BLAS behind torch.mm (MKL)
and oneDNN (torch.ops.mkldnn._linear_pointwise), each GEMM timed by its on-CPU time so that other
jobs' share of the cores does not pass for a lower peak (see measure_peak_flops). The best library
is the peak: MKL's sgemm takes its AVX2 path on AMD CPUs (about 100 GFLOP/s per Zen 5 core against
oneDNN's 230 with AVX-512), and a peak of the slower library alone made every MFU about 2x too
high. A peak cached while the machine was busy read 81.6 instead of 367 GFLOP/s and made every
later MFU 4.5x too high. Around a run of steps:

    with measured_peak() as peak:          # measures before, and after on exit
        ...steps...
    mfu = perf.mfu(flops, seconds, peak.flops)   # peak.flops = max(before, after)

The higher of the two is used: load that comes or goes during the steps can only lower a
measurement, so the higher one is the closer to the machine's peak (and gives the lower MFU).
"""
from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from grlib.hardware.isa import require_bf16

PEAK_SIZES = (1024, 2048)


GEMM_LIBRARIES = ("blas", "onednn")


def _gemm(library: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor):
    """a [n, n] x b [n, n] through `library`: the BLAS of torch.mm, or oneDNN (a . b^T, the same FLOPs)."""
    if library == "blas":
        return lambda: torch.mm(a, b, out=out)
    if library == "onednn":
        linear = torch.ops.mkldnn._linear_pointwise
        return lambda: linear(a, b, None, "none", [], "")
    raise ValueError(f"GEMM library must be one of {', '.join(GEMM_LIBRARIES)}, got {library!r}")


def gemm_libraries() -> tuple[str, ...]:
    """The GEMM libraries torch offers here (oneDNN where torch was built with it and the CPU runs it)."""
    return GEMM_LIBRARIES if torch.backends.mkldnn.is_available() else ("blas",)


def measure_peak_flops(sizes: tuple[int, ...] = PEAK_SIZES, repeats: int = 5, warmup: int = 2,
                       dtype: torch.dtype = torch.float32) -> dict:
    """The GEMM peak of this CPU in `dtype`: the best over `sizes` and GEMM libraries (module doc) of
    the median rate of warm square GEMMs.

    A GEMM's time is its on-CPU time: min(wall, process CPU time / threads). Quiet, the two agree
    (within the threads' idle share at the end of a GEMM). When other jobs share the cores, the
    wall time also counts the time the threads waited for a core, and a wall-clock peak falls with
    the load (2 busy processes on 2 cores: about half) while the steps it divides are hit less
    (their serial parts wait for one core, not two), so MFU would rise with the load; the on-CPU
    rate is the hardware's. The min keeps the peak at or above the wall-clock one (never an MFU
    above the wall-clock MFU) should another thread of this process burn CPU meanwhile.
    Returns peak_flops, peak_flops_wall (the same from wall times alone), the best per library
    (per_library: {"blas": ..., "onednn": ...}) and both per size of the best library."""
    if dtype == torch.bfloat16:  # a CPU without bf16 GEMMs: said in a millisecond, not by oneDNN after minutes
        require_bf16("model.precision=bf16 (the bf16 GEMM peak)")
    threads = torch.get_num_threads()
    per_library, per_size, per_size_wall = {}, {}, {}
    for library in gemm_libraries():
        sized, sized_wall = {}, {}
        for n in sizes:
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            gemm = _gemm(library, a, b, torch.empty(n, n, dtype=dtype))
            for _ in range(warmup):
                gemm()
            walls, on_cpu = [], []
            for _ in range(repeats):
                wall, cpu = time.perf_counter(), time.process_time()
                gemm()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                walls.append(wall)
                on_cpu.append(min(wall, cpu / threads))
            sized[n] = 2 * n ** 3 / statistics.median(on_cpu)
            sized_wall[n] = 2 * n ** 3 / statistics.median(walls)
        per_library[library] = max(sized.values())
        if per_library[library] >= max(per_library.values()):
            per_size, per_size_wall = sized, sized_wall
    best = max(per_library, key=per_library.get)
    return {"peak_flops": per_library[best], "peak_flops_wall": max(per_size_wall.values()), "library": best,
            "per_library": per_library, "per_size": per_size, "per_size_wall": per_size_wall,
            "dtype": str(dtype).removeprefix("torch."), "threads": threads}


def peak_flops(dtype: torch.dtype = torch.float32) -> float:
    """This machine's GEMM peak (FLOP/s) in `dtype`, measured now (no cache: it sees the load of this moment)."""
    return float(measure_peak_flops(dtype=dtype)["peak_flops"])


@dataclass
class Peak:
    """The GEMM peak (FLOP/s) measured before and after a run of steps (measured_peak)."""
    before: float
    after: float = math.nan  # set when the `with` block ends
    before_wall: float = math.nan  # the same from wall times alone (measure_peak_flops' peak_flops_wall)
    after_wall: float = math.nan
    per_library: dict[str, float] = field(default_factory=dict)  # the best of before and after, per library
    dtype: str = "float32"

    @property
    def flops(self) -> float:
        """The peak MFU divides by: the higher of before and after."""
        if math.isnan(self.after):
            raise RuntimeError("Peak.flops read inside its measured_peak() block: "
                               "the after-measurement is not taken yet")
        return max(self.before, self.after)

    @property
    def flops_wall(self) -> float:
        return max(self.before_wall, self.after_wall)

    def describe(self) -> str:
        """One line for a table title: the peak, before/after, and each library's best."""
        libs = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in self.per_library.items())
        return (f"measured {self.dtype} GEMM peak {self.flops / 1e9:.1f} GFLOP/s (before/after "
                f"{self.before / 1e9:.1f}/{self.after / 1e9:.1f}; per library: {libs})")


@contextlib.contextmanager
def measured_peak(sizes: tuple[int, ...] = PEAK_SIZES, dtype: torch.dtype = torch.float32) -> Iterator[Peak]:
    """Measures the GEMM peak before the block and after it (not after an exception)."""
    m = measure_peak_flops(sizes, dtype=dtype)
    peak = Peak(before=m["peak_flops"], before_wall=m["peak_flops_wall"], per_library=dict(m["per_library"]),
                dtype=m["dtype"])
    yield peak
    m = measure_peak_flops(sizes, dtype=dtype)
    peak.after, peak.after_wall = m["peak_flops"], m["peak_flops_wall"]
    peak.per_library = {k: max(v, m["per_library"].get(k, 0.0)) for k, v in peak.per_library.items()}
