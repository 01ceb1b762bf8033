"""Training step and GEMM peak under a concurrent CPU hog: quiet, then loaded, per OpenMP wait policy.

The method (one fresh process per policy, the trainer's steps and the GEMM peak quiet then under
busy processes, the ratios and targets) is grlib.experiments.load. Rows go to the `bench_load`
result table (grlib.results).

    python -m grlib bench load --scale smoke              # about a minute on 2 cores
    python -m grlib bench load --scale laptop --steps 6   # a laptop-shaped step
"""
from __future__ import annotations

import argparse
import math

from grlib import results
from grlib.bench.common import options, positive_int, print_table
from grlib.config import parse_overrides

POLICY_CHOICES = {"passive": "PASSIVE", "active": "ACTIVE", "default": "default"}
HOG_KINDS = ("python", "torch")  # grlib.experiments.load.HOG_CODE's keys (tests/test_bench_load.py)
COLUMNS = {"policy": "wait_policy", "threads": "threads", "grlib": "grlib_choice", "condition": "condition",
           "step_ms": "step_ms", "peak_GFLOP/s": "peak_gflops", "wall_peak": "peak_wall_gflops", "mfu": "mfu",
           "step_x": "step_ratio", "mfu_x": "mfu_ratio", "load_1m": "loadavg_1m"}


def _policies(text: str) -> list[str]:
    names = [s.strip().lower() for s in text.split(",") if s.strip()]
    if not names or any(n not in POLICY_CHOICES for n in names):
        raise argparse.ArgumentTypeError(f"expected comma-separated names from {', '.join(POLICY_CHOICES)}, "
                                         f"got {text!r}")
    return list(dict.fromkeys(POLICY_CHOICES[n] for n in names))


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def _count(text: str) -> int:
    return 0 if text.strip() == "0" else positive_int(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=positive_int, default=20, help="timed training steps per condition")
    p.add_argument("--warmup", type=_count, default=3, help="untimed training steps first")
    p.add_argument("--hogs", type=positive_int, default=2, help="busy processes of the loaded condition")
    p.add_argument("--hog-kind", choices=HOG_KINDS, default="python",
                   help="python: pure-Python busy loops; torch: torch jobs with torch's default OpenMP settings")
    p.add_argument("--hog-seconds", type=_seconds, default=120.0,
                   help="upper bound on a hog's life (they are stopped when the loaded measurement ends)")
    p.add_argument("--policies", type=_policies, default="passive,default",
                   help=f"comma-separated OpenMP wait policies, each in a fresh process ({', '.join(POLICY_CHOICES)})")
    p.add_argument("--threads", type=positive_int, nargs="+", default=None,
                   help="torch threads to measure each policy with (default: grlib's, see grlib.threads)")
    p.add_argument("--peak-sizes", type=positive_int, nargs="+", default=None,
                   help="square GEMM sizes of the peak measurement")


def run(args: argparse.Namespace) -> list[dict]:
    from grlib.experiments import load

    rows, cfg, mine = load.measure(args.scale, parse_overrides(args.override), options(load.Options, args))
    print_table([{k: r[v] for k, v in COLUMNS.items()} for r in rows],
                f"bench load: scale {cfg.scale}, HSTU {cfg.model.n_layers}x{cfg.model.n_heads} d={cfg.model.d_model}, "
                f"batch {cfg.train.batch_size} x max_len {cfg.data.max_len}; {args.steps} timed steps per condition, "
                f"loaded = {args.hogs} busy {args.hog_kind} processes; grlib's choice: {mine['wait_policy']}, "
                f"{mine['threads']} threads")
    for r in rows:
        if r["grlib_choice"] and r["condition"] == "loaded":
            print(f"targets ({r['wait_policy']}, {r['threads']} threads): loaded step {r['step_ratio']:.2f}x quiet "
                  f"(<= {load.STEP_TARGET:g}x: {'met' if r['step_ratio'] <= load.STEP_TARGET else 'NOT met'}), "
                  f"loaded MFU {r['mfu_ratio']:.2f}x quiet "
                  f"(<= {load.MFU_TARGET:.2f}x: {'met' if r['mfu_ratio'] <= load.MFU_TARGET else 'NOT met'})")
    results.append_rows("bench_load", rows, cfg)
    return rows
