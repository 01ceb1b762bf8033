"""The peaks MFU divides by (grlib.perf): this machine's GEMM peak measured in the run
(grlib.hardware.gemm: warm GEMMs, on-CPU time, the best GEMM library) and its nominal peak
(grlib.hardware.nominal: cores x FLOP per cycle x clock from /proc/cpuinfo, cpufreq and the
compiled probes, or the vendor's datasheet peak on GPU/NPU); grlib.hardware.isa: the instruction-set
path grlib._C runs (GRLIB_ISA) and whether this CPU has bf16 GEMMs."""
from grlib.hardware import isa
from grlib.hardware.gemm import (GEMM_LIBRARIES, PEAK_SIZES, Peak, gemm_libraries, measure_peak_flops,
                                 measured_peak, peak_flops)
from grlib.hardware.nominal import DTYPES, NominalPeak, cpu_info, nominal_peak, probe, vector_units

__all__ = ["isa", "GEMM_LIBRARIES", "PEAK_SIZES", "Peak", "gemm_libraries", "measure_peak_flops", "measured_peak",
           "peak_flops", "DTYPES", "NominalPeak", "cpu_info", "nominal_peak", "probe", "vector_units"]
