"""Stage `data` (notebooks/00_data): raw log -> processed sequences + stats for one scale."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import altair as alt
import polars as pl

from grlib import paths, results
from grlib.config import Config, DataConfig
from grlib.data.sequences import build_sequences, sequence_stats
from grlib.data.movielens import read_ml100k
from grlib.data.synthetic import generate_log


def processed_dir(cfg: Config) -> Path:
    return paths.data_dir() / "processed" / cfg.scale


def raw_log(cfg: DataConfig) -> pl.DataFrame:
    if cfg.dataset == "synthetic":
        return generate_log(cfg.n_users, cfg.length_factor, cfg.n_items, cfg.seed)
    if cfg.dataset == "ml-100k":
        path = paths.real_data_file("movielens_100k/u.data")
        if path is None:
            raise FileNotFoundError("data.dataset=ml-100k: movielens_100k/u.data not found in the real-data "
                                    "folder (shared/data/real beside the checkout, or GRLIB_REAL_DATA)")
        return read_ml100k(path)
    raise NotImplementedError(f"data.dataset={cfg.dataset!r} needs the KuaiRand download pipeline (not built yet)")


def prepare(cfg: Config) -> dict:
    """Writes sequences.parquet, vocab.parquet and stats.json into processed_dir(cfg), atomically."""
    out = processed_dir(cfg)
    seqs, vocab = build_sequences(raw_log(cfg.data), cfg.data.max_len, cfg.data.min_item_count)
    stats = {"dataset": cfg.data.dataset, **sequence_stats(seqs, vocab)}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        seqs.write_parquet(tmp / "sequences.parquet")
        vocab.write_parquet(tmp / "vocab.parquet")
        (tmp / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return stats


def run(cfg: Config) -> pl.DataFrame:
    """Prepares the data, appends a row to results/tables/data.parquet, returns that row."""
    stats = prepare(cfg)
    row = results.append_rows("data", [{"seed": cfg.data.seed, **stats}], cfg)
    results.write_metrics("data", {"scale": cfg.scale, **stats})
    return row


def ensure_prepared(cfg: Config) -> Path:
    """The processed folder of cfg, preparing it first when it does not exist yet (e.g. a notebook
    opened on its own in JupyterLab); under DVC the `data` stage always ran before."""
    out = processed_dir(cfg)
    if not (out / "sequences.parquet").exists():
        prepare(cfg)
    return out


def length_chart(cfg: Config) -> alt.Chart:
    """Histogram of per-user sequence lengths (log x axis) of the processed data."""
    lengths = pl.read_parquet(processed_dir(cfg) / "sequences.parquet", columns=["item_ids"]).select(
        pl.col("item_ids").list.len().alias("length"))
    return (alt.Chart(lengths).mark_bar()
            .encode(x=alt.X("length:Q", bin=alt.Bin(maxbins=40), title="events per user (kept)"),
                    y=alt.Y("count():Q", title="users"))
            .properties(title=f"Sequence lengths: {cfg.data.dataset}, scale {cfg.scale}", width=420, height=200))
