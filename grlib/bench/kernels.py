"""HSTU attention kernels: reference vs fbgemm vs compiled cpu, forward and backward, two length regimes.

Also the fused LayerNorm(x) * u (grlib.ops.layer_norm_mul, op column) against its two-op reference
on the whole batch's tokens [T, d_model].

    python -m grlib bench kernels --max-len 1024 --json out.json [--scale laptop]

The method (KuaiRand-like lengths, one fresh child process per row, peak RSS growth, medians,
ratios against the reference of the same run) is the kernels stage's:
grlib.experiments.kernels_stage. Flags override the scale's kernels section and the
ablations.kernels grid; rows go to the table bench_kernels.
"""
from __future__ import annotations

import argparse
import os

from grlib.bench.common import print_table
from grlib.config import config_from_args, load_ablation
from grlib.config.choices import ISA_PATHS, KERNEL_DTYPES

# the columns the table prints (key, or (key, header)); every other one is in the rows (--wide, --json); isa
# where the run has several paths
COLUMNS = ("op", "impl", "isa", "dtype", "regime", "max_len", "batch", "fwd_ms", "fwd_bwd_ms", ("peak_mem_mb", "mem_mb"),
           ("frac_of_peak", "of_peak"), ("speedup_vs_reference", "speedup"), ("mem_reduction_vs_reference", "mem_saved"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-len", type=int, nargs="+", default=None, help="max lengths (default: kernels.max_lens)")
    p.add_argument("--regime", nargs="+", choices=["truncated", "scaled"], default=None,
                   help="length regimes (default: ablations.kernels.regimes)")
    p.add_argument("--impls", nargs="+", default=None, help="implementations (default: ablations.kernels.impls)")
    p.add_argument("--batch", type=int, default=None, help="sequences per comparison batch "
                   "(default: kernels.pair_budget // max_len**2)")
    p.add_argument("--whole-batch", type=int, default=None, help="sequences of the cpu-only run at the "
                   "largest max_len (default: kernels.whole_batch; 0 skips it)")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--dtype", nargs="+", choices=sorted(KERNEL_DTYPES), default=None,
                   help="the kernels' dtypes; several: each row in each, one after the other, and the column "
                        "vs_fp32 = the float32 row's fwd_bwd_ms over this one's (default: kernels.dtype)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--isa", nargs="+", choices=ISA_PATHS, default=None,
                   help="grlib._C's instruction-set paths to run, each with every row (default: the current "
                        "one: GRLIB_ISA, else the widest this CPU and build have; grlib.hardware.isa)")


def run(args: argparse.Namespace) -> list[dict]:
    from grlib.experiments import kernels_stage

    cfg = config_from_args(args)
    changes = {"max_lens": args.max_len, "whole_batch": args.whole_batch, "repeats": args.repeats,
               "dtype": args.dtype[0] if args.dtype else None}
    cfg = cfg.replace({f"kernels.{k}": v for k, v in changes.items() if v is not None})
    ablation = load_ablation("kernels", {k: v for k, v in (("impls", args.impls), ("regimes", args.regime)) if v})
    rows = kernels_stage.measure(cfg, ablation, table="bench_kernels", batch=args.batch, threads=args.threads,
                                 isas=args.isa, dtypes=args.dtype)
    first = rows[0]
    several_paths = len({r["isa"] for r in rows}) > 1
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    peaks = {(r["dtype"], r["isa"]): r for r in rows}.values()
    print_table(rows,
                f"bench kernels: H={first['heads']} D={first['head_dim']} {', '.join(dtypes)}, {first['threads']} "
                f"threads, CPU {first['cpu_model']}, grlib._C paths {', '.join(dict.fromkeys(r['isa'] for r in rows))}, "
                f"load average {os.getloadavg()[0]:.2f}\n"
                + "".join(f"frac_of_peak ({r['dtype']}): against the measured GEMM peak {r['matmul_peak_gflops']:.0f} "
                          f"GFLOP/s (before/after the rows {r['matmul_peak_before_gflops']:.0f}/"
                          f"{r['matmul_peak_after_gflops']:.0f}; on-CPU time, best of torch.mm's BLAS and oneDNN)\n"
                          for r in {r["dtype"]: r for r in rows}.values())
                + "".join(f"frac_of_nominal ({r['isa']}, {r['dtype']}): against the nominal peak "
                          f"{r['nominal_peak_gflops']:.0f} GFLOP/s = {r['nominal_peak_how']}\n" for r in peaks)
                + "of_peak: frac_of_peak; speedup: the reference row's fwd_bwd_ms over this row's (same dtype); "
                  "mem_saved: 1 - this row's peak memory / the reference row's (mem_mb: peak RSS growth, nan where "
                  "not isolated)" + ("; vs_fp32: the float32 row's fwd_bwd_ms over this row's" if len(dtypes) > 1 else ""),
                [c for c in COLUMNS if (c != "isa" or several_paths) and (c != "dtype" or len(dtypes) > 1)]
                + ([("speedup_vs_float32", "vs_fp32")] if len(dtypes) > 1 else []))
    return rows
