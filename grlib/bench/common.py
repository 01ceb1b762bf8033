"""Shared benchmark helpers: table printing, argument types and the thread settings every bench
row records (grlib.threads); timing and KuaiRand-like lengths: grlib.experiments.measure.
polars and torch are imported where they are used: a bench's parser imports this module, and
`bench NAME --help` answers without them (tests/test_cli_startup.py)."""
from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from grlib import threads
from grlib.config import load_ablation

if TYPE_CHECKING:
    import polars as pl


def print_table(rows: list[dict], title: str) -> pl.DataFrame:
    import polars as pl

    df = pl.DataFrame(rows)
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=200, float_precision=3):
        print(f"\n{title}\n{df}")
    return df


def positive_int(text: str) -> int:
    """argparse type of --threads and counts: an integer >= 1."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def set_threads(n: int | None) -> None:
    """torch's intra-op threads for this bench (a --threads flag); None keeps grlib's choice (grlib.threads)."""
    if n is not None:
        import torch

        torch.set_num_threads(n)


def thread_columns() -> dict[str, str | int]:
    """{"wait_policy": ..., "threads": ...}: the OpenMP wait policy and torch threads a row was measured with."""
    return threads.policy()


def ablation_from_args(name: str, args: argparse.Namespace, names: Sequence[str], quick: Callable):
    """params.yaml's ablation `name` with the flags among `names` that were given (None: not given)
    as overrides; with --quick, the stage's reduced grid `quick` of it."""
    ab = load_ablation(name, {n: getattr(args, n) for n in names if getattr(args, n) is not None})
    return quick(ab) if args.quick else ab
