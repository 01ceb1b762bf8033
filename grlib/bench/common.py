"""What the bench commands share: printing a table (grlib.terminal's layout within 120 columns;
`--wide` sets show_all) and argument helpers. polars and torch are imported where they are used:
a bench's parser imports this module, and `bench NAME --help` answers without them
(tests/test_cli_startup.py)."""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from grlib import threads
from grlib.config import load_ablation
from grlib.terminal import format_table, wrap

if TYPE_CHECKING:
    import polars as pl

show_all = False  # `bench ... --wide` (set by grlib.bench's runner): every column


def print_table(rows: list[dict], title: str, columns: Sequence[str | tuple[str, str]] | None = None) -> pl.DataFrame:
    """Prints `title` and the rows as a table within 120 characters a line; returns the rows as a
    DataFrame. columns: the keys a reader compares, in order (a (key, header) pair shows a shorter
    header); None: every key, as many as fit. The other keys are named under the table (--wide
    shows them)."""
    import polars as pl

    df = pl.DataFrame(rows)
    print()
    print("\n".join(wrap(line) for line in title.split("\n")))
    print(format_table(rows, None if show_all else columns, every=show_all))
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


def options(cls, args: argparse.Namespace):
    """The dataclass `cls` (an experiment's options) from the parsed arguments of the same names."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


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
