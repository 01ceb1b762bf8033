"""Jagged conversion and reduction ops: reference vs fbgemm vs compiled cpu, forward+backward.

Also HSTU's fused projection (a linear layer through torch's BLAS and oneDNN). The method
(KuaiRand-27K lengths, medians, ratios against `reference` of the same run) is
grlib.experiments.ops_timing; rows go to results/tables/bench_ops.parquet.
"""
from __future__ import annotations

import argparse

from grlib import results
from grlib.bench.common import print_table
from grlib.config import config_from_args


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=256, help="sequences per batch")
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=7)


def run(args: argparse.Namespace) -> list[dict]:
    from grlib.experiments import ops_timing

    cfg = config_from_args(args)
    rows, title = ops_timing.measure(args.batch, args.max_len, args.dim, args.repeats)
    print_table(rows, title)
    results.append_rows("bench_ops", rows, cfg)
    return rows
