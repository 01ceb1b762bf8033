"""Training step throughput and MFU of HSTU at a scale, for every attention implementation.

The method (C7's MFU: rows, peaks, baselines) is grlib.experiments.mfu; rows go to the table bench_train.
"""
from __future__ import annotations

import argparse

from grlib.bench.common import options, positive_int, print_table, set_threads
from grlib.config import config_from_args
from grlib.config.choices import ISA_PATHS, MODEL_PRECISIONS

# the columns the table prints (key, or (key, header)); every other one is in the rows (--wide, --json)
COLUMNS = (("attention_impl", "impl"), "isa", "compiled", ("recompute_layers", "recompute"), "auto", "step_ms",
           ("speedup_vs_reference", "speedup"), "mfu", "mfu_nominal", "mfu_with_loss", "peak_rss_mb")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=8, help="timed training steps per implementation")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (the compiled row: at least 3)")
    p.add_argument("--impls", default="all",
                   help="comma-separated hstu_attention impls (default: all that run on CPU); IMPL:recompute runs "
                        "that row with every layer recomputed in backward (model.recompute_layers), e.g. "
                        "cpu,reference:recompute where the padded model's activations would not fit in memory")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="add the torch.compile row of the plain-PyTorch model (default: on)")
    p.add_argument("--top", type=int, default=15, help="top ops to print from a profile of the auto row (0: none)")
    p.add_argument("--profile-steps", type=positive_int, default=3, help="training steps the profile of --top covers")
    p.add_argument("--precision", choices=MODEL_PRECISIONS, default="fp32",
                   help="model.precision of every row; MFU against the peaks of that dtype (default: fp32)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads (default: grlib's, see grlib.threads)")
    p.add_argument("--isa", nargs="+", choices=ISA_PATHS, default=None,
                   help="grlib._C paths to run every row on, in this one run, alternating per row (default: the "
                        "current one: GRLIB_ISA, else the widest this CPU and build have; grlib.hardware.isa); "
                        "torch's GEMM libraries keep their own code (docs/HARDWARE.md)")


def run(args: argparse.Namespace) -> list[dict]:
    from grlib import results
    from grlib.experiments import mfu

    set_threads(args.threads)
    cfg = config_from_args(args, {"model.name": "hstu", "model.precision": args.precision})  # -o model.d_model=512
    measured = mfu.measure(cfg, options(mfu.Options, args))
    print_table(measured.rows, measured.title, COLUMNS)
    if args.top > 0:
        print_table(measured.top, measured.top_title)
        print_table(measured.split, measured.split_title)
    results.append_rows("bench_train", measured.rows, cfg)
    return measured.rows
