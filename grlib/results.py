"""Append-only result tables (results/tables/<name>.parquet) and metrics JSON.

Every row carries: run_id, git_rev, params_hash, scale, seed, hardware (JSON), timestamp (UTC),
plus the experiment's own columns. Rows are never rewritten: a smoke run adds smoke rows and
leaves laptop or paper rows alone; `latest` picks the newest row per configuration for reports.
Files are written to a temporary name in the same folder and renamed, so a crash leaves the old
table intact.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from grlib import manifest, paths
from grlib.config import Config

META_COLUMNS = ("run_id", "git_rev", "params_hash", "scale", "seed", "hardware", "timestamp")


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def tables_dir() -> Path:
    return paths.results_dir() / "tables"


def table_path(name: str) -> Path:
    if not name.replace("_", "").isalnum():
        raise ValueError(f"table name {name!r}: use letters, digits and '_'")
    return tables_dir() / f"{name}.parquet"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Writes `data` to `path` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_parquet(df: pl.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        df.write_parquet(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_table(name: str) -> pl.DataFrame:
    path = table_path(name)
    return pl.read_parquet(path) if path.exists() else pl.DataFrame()


def append_rows(name: str, rows: Sequence[dict[str, Any]], cfg: Config, run_id: str | None = None,
                device: str = "cpu") -> pl.DataFrame:
    """Appends rows (each a flat dict) to table `name`, adding the metadata columns; returns the new rows."""
    if not rows:
        raise ValueError(f"append_rows({name!r}): no rows")
    run_id = run_id or new_run_id()
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    meta = {
        "run_id": run_id,
        "git_rev": manifest.git_revision(),
        "params_hash": cfg.params_hash(),
        "scale": cfg.scale,
        "hardware": json.dumps(manifest.hardware(device), sort_keys=True),
        "timestamp": now,
    }
    full = []
    for row in rows:
        clash = set(row) & (set(META_COLUMNS) - {"seed"})
        if clash:
            raise ValueError(f"append_rows({name!r}): row sets metadata columns {sorted(clash)}")
        full.append({**meta, "seed": int(row.get("seed", cfg.train.seed)), **row})
    new = pl.DataFrame(full, infer_schema_length=None)
    old = read_table(name)
    table = pl.concat([old, new], how="diagonal_relaxed") if old.height else new
    atomic_write_parquet(table, table_path(name))
    return new


def latest(df: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    """The newest row per configuration (scale + keys); keeps the table's column order."""
    if df.height == 0:
        return df
    group = ["scale", *keys]
    return (df.sort("timestamp").group_by(group, maintain_order=True).last()
            .select(df.columns).sort(group))


def write_metrics(name: str, metrics: dict[str, Any]) -> Path:
    """results/metrics/<name>.json for `dvc metrics show` (atomic)."""
    path = paths.results_dir() / "metrics" / f"{name}.json"
    atomic_write_bytes(path, (json.dumps(metrics, indent=2, sort_keys=True) + "\n").encode())
    return path
