"""Preprocessing throughput and peak memory: synthetic KuaiRand-shaped CSV -> sequences.

The method (one fresh child process per method and N; the in-memory baseline of the same run; the
KuaiRand-27K extrapolation) is grlib.experiments.data_throughput; --rank-share measures the data
memory per rank of a data-parallel run instead (grlib.experiments.rank_share). Rows go to the table
bench_data (--rank-share: method "rank-share").
"""
from __future__ import annotations

import argparse

from grlib import results
from grlib.bench.common import options, positive_int, print_table
from grlib.config import config_from_args, parse_overrides

# the columns the table prints (key, or (key, header)); every other one is in the rows (--wide, --json)
COLUMNS = ("method", "rows", "seconds", "rows_per_s", "peak_rss_mb", ("speed_vs_in_memory", "speed_vs_mem"),
           ("rss_vs_in_memory", "rss_vs_mem"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, nargs="+", default=[5_000_000], help="log rows (one run per value)")
    p.add_argument("--length-factor", type=float, default=1.0)
    p.add_argument("--n-items", type=int, default=1_000_000, help="catalogue size (the same for every N)")
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--bucket-rows", type=int, default=2_000_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-baseline", action="store_true", help="skip the in-memory baseline")
    p.add_argument("--workdir", default=None, help="where the CSV and outputs go (default: system temp)")
    p.add_argument("--rank-share", action="store_true",
                   help="measure the data RSS per rank of a data-parallel run instead (grlib.experiments.rank_share)")
    p.add_argument("--world", type=positive_int, nargs="+", default=[1, 2, 4], help="--rank-share: ranks P")
    p.add_argument("--share-users", type=positive_int, default=2000, help="--rank-share: users of the twin")
    p.add_argument("--share-length-factor", type=float, default=0.5, help="--rank-share: the twin's length factor")
    p.add_argument("--share-max-len", type=positive_int, default=4096, help="--rank-share: data.max_len")
    p.add_argument("--batch-size", type=positive_int, default=16, help="--rank-share: sequences per global batch")
    p.add_argument("--steps", type=int, default=0, help="--rank-share: global batches planned (0: one epoch)")


def run(args: argparse.Namespace) -> list[dict]:
    from grlib.experiments import data_throughput, rank_share

    if args.rank_share:
        opt = options(rank_share.Options, args)
        cfg = config_from_args(args, rank_share.twin_overrides(opt))
        rows, summary, title = rank_share.measure(cfg, parse_overrides(args.override), opt)
        print_table(summary, title)
    else:
        cfg = config_from_args(args)
        rows, title = data_throughput.measure(options(data_throughput.Options, args))
        print_table(rows, title, COLUMNS)
    results.append_rows("bench_data", rows, cfg)
    return rows
