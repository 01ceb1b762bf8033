"""Shared benchmark helpers: table printing and thread settings (timing and KuaiRand-like lengths:
grlib.experiments.measure)."""
from __future__ import annotations

import polars as pl
import torch


def print_table(rows: list[dict], title: str) -> pl.DataFrame:
    df = pl.DataFrame(rows)
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=200, float_precision=3):
        print(f"\n{title}\n{df}")
    return df


def set_threads(n: int | None) -> None:
    if n:
        torch.set_num_threads(n)
