"""Append-only result tables and metrics JSON, separated by scale.

    results/tables/<name>/scale=<scale>/<UTC time>-<run_id>-<random>.parquet   one part per append
    results/metrics/<scale>/<name>.json                                        the latest run's figures
    results/adhoc/tables/...                                                   rows of ad-hoc runs (not in git)

Every row carries: run_id, git_rev, params_hash, scale, seed, hardware (JSON), timestamp (UTC),
plus the experiment's own columns. Rows are never rewritten: each append writes a new part file
(temporary name, then rename: readers never see half a file), so concurrent writers, on one
machine or on several nodes of a shared filesystem, never lose a row and need no lock.
`read_table` reads every part as one frame; `latest` picks the newest row per configuration.

Ad-hoc face runs (`python -m grlib bench NAME` without --record) write under results/adhoc/:

    with results.adhoc(not args.record) as sink:
        ...                                  # append_rows / read_table use the ad-hoc tables
    print(sink.note())                       # where the rows went
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import datetime as dt
import json
import re
import secrets
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from grlib import io, manifest, paths
from grlib.config import Config

META_COLUMNS = ("run_id", "git_rev", "params_hash", "scale", "seed", "hardware", "timestamp")
_NAME = re.compile(r"[A-Za-z0-9_]+")
_SCALE = re.compile(r"[A-Za-z0-9_-]+")

# temp-then-rename writers (grlib.io), kept under their old names for the modules that import them here
atomic_write_bytes = io.atomic_write_bytes


def atomic_write_parquet(df: pl.DataFrame, path: Path) -> Path:
    return io.atomic_write(path, df.write_parquet)


@dataclasses.dataclass
class Sink:
    """Where append_rows writes in the current context, and the part files it wrote there."""
    adhoc: bool
    written: list[Path] = dataclasses.field(default_factory=list)

    def note(self) -> str:
        """One line for the user: where this run's rows went."""
        if not self.written:
            return "no result rows written"
        folders = sorted({_shown(p.parent) for p in self.written})
        where = ", ".join(folders)
        if self.adhoc:
            return f"result rows (ad-hoc, not in the committed tables; --record adds them there): {where}"
        return f"result rows recorded in {where}"


_SINK: contextvars.ContextVar[Sink | None] = contextvars.ContextVar("grlib_results_sink", default=None)


@contextlib.contextmanager
def adhoc(enabled: bool = True) -> Iterator[Sink]:
    """Within the block, append_rows and read_table use results/adhoc/tables/ when `enabled`
    (else the committed results/tables/); yields the Sink that lists the part files written."""
    sink = Sink(adhoc=enabled)
    token = _SINK.set(sink)
    try:
        yield sink
    finally:
        _SINK.reset(token)


def _adhoc(flag: bool | None) -> bool:
    if flag is not None:
        return flag
    sink = _SINK.get()
    return sink is not None and sink.adhoc


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(paths.project_root()))
    except (ValueError, FileNotFoundError):
        return str(path)


def _check(value: str, what: str, pattern: re.Pattern) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        allowed = "letters, digits, '_' and '-'" if pattern is _SCALE else "letters, digits and '_'"
        raise ValueError(f"{what} {value!r}: use {allowed}")
    return value


def check_scale(scale: str) -> str:
    """`scale` if it can name a folder (letters, digits, '_', '-'), else ValueError."""
    return _check(scale, "scale", _SCALE)


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def tables_dir(adhoc: bool | None = None) -> Path:
    """results/tables (or results/adhoc/tables in an ad-hoc context, or when adhoc=True)."""
    base = paths.results_dir()
    return base / "adhoc" / "tables" if _adhoc(adhoc) else base / "tables"


def table_dir(name: str, adhoc: bool | None = None) -> Path:
    """The folder of table `name`: one scale=<scale> folder of part files per scale."""
    return tables_dir(adhoc) / _check(name, "table name", _NAME)


def scale_dir(name: str, scale: str, adhoc: bool | None = None) -> Path:
    return table_dir(name, adhoc) / f"scale={check_scale(scale)}"


def parts(name: str, scale: str | None = None, adhoc: bool | None = None) -> list[Path]:
    """The part files of a table (every scale, or one), in file-name (= append time) order;
    dot-files (temporary files of writes in progress) are not parts."""
    folders = [scale_dir(name, scale, adhoc)] if scale else sorted(table_dir(name, adhoc).glob("scale=*"))
    found = [p for folder in folders for p in folder.glob("*.parquet") if not p.name.startswith(".")]
    return sorted(found, key=lambda p: (p.name, str(p)))


def read_table(name: str, scale: str | None = None, adhoc: bool | None = None) -> pl.DataFrame:
    """Every row of table `name` (of one scale, or all), ordered by timestamp, then part file name,
    then row order within the part; an empty frame when there is none."""
    legacy = tables_dir(adhoc) / f"{_check(name, 'table name', _NAME)}.parquet"
    if legacy.exists():
        raise ValueError(f"{legacy}: a single-file table from before part files; move its rows into "
                         f"{table_dir(name, adhoc)} with grlib.results.migrate_single_file({name!r})")
    frames = [pl.read_parquet(p) for p in parts(name, scale, adhoc)]
    if not frames:
        return pl.DataFrame()
    table = pl.concat(frames, how="diagonal_relaxed")
    return table.sort("timestamp", maintain_order=True) if "timestamp" in table.columns else table


def _part_name(when: dt.datetime, run_id: str) -> str:
    return f"{when:%Y%m%dT%H%M%S%fZ}-{run_id}-{secrets.token_hex(4)}.parquet"


def append_rows(name: str, rows: Sequence[dict[str, Any]], cfg: Config, run_id: str | None = None,
                device: str = "cpu") -> pl.DataFrame:
    """Appends rows (each a flat dict) to table `name` at cfg.scale as one new part file, adding the
    metadata columns; returns the new rows."""
    if not rows:
        raise ValueError(f"append_rows({name!r}): no rows")
    folder = scale_dir(name, cfg.scale)
    run_id = _check(run_id, "run_id", _SCALE) if run_id is not None else new_run_id()
    now = dt.datetime.now(dt.timezone.utc)
    meta = {
        "run_id": run_id,
        "git_rev": manifest.git_revision(),
        "params_hash": cfg.params_hash(),
        "scale": cfg.scale,
        "hardware": json.dumps(manifest.hardware(device), sort_keys=True),
        "timestamp": now.isoformat(timespec="seconds"),
    }
    full = []
    for row in rows:
        clash = set(row) & (set(META_COLUMNS) - {"seed"})
        if clash:
            raise ValueError(f"append_rows({name!r}): row sets metadata columns {sorted(clash)}")
        full.append({**meta, "seed": int(row.get("seed", cfg.train.seed)), **row})
    new = pl.DataFrame(full, infer_schema_length=None)
    path = atomic_write_parquet(new, folder / _part_name(now, run_id))
    sink = _SINK.get()
    if sink is not None:
        sink.written.append(path)
    return new


def migrate_single_file(name: str, adhoc: bool = False) -> list[Path]:
    """Moves the rows of a single-file table (<tables>/<name>.parquet, the layout before part files)
    into part files, one per original append (consecutive rows of one scale, run_id and timestamp),
    checks that read_table returns exactly the old frame, then deletes the old file."""
    legacy = tables_dir(adhoc) / f"{_check(name, 'table name', _NAME)}.parquet"
    old = pl.read_parquet(legacy)
    if parts(name, adhoc=adhoc):
        raise ValueError(f"{table_dir(name, adhoc)}: already holds part files; migrate into an empty table")
    key = pl.concat_str("scale", "run_id", "timestamp", separator="|")
    groups = old.with_columns((key != key.shift(1)).fill_null(True).cum_sum().alias("_append"))
    written, seen = [], collections.Counter()
    for _, part in groups.group_by("_append", maintain_order=True):
        first = part.row(0, named=True)
        second = dt.datetime.fromisoformat(first["timestamp"]).astimezone(dt.timezone.utc).replace(microsecond=0)
        when = second.replace(microsecond=seen[second])  # appends within one second: file-name order = old order
        seen[second] += 1
        path = scale_dir(name, first["scale"], adhoc) / _part_name(when, first["run_id"])
        written.append(atomic_write_parquet(part.drop("_append"), path))
    hidden = legacy.rename(legacy.with_name(f".{legacy.name}.migrated"))  # read_table refuses the old file
    try:
        if not read_table(name, adhoc=adhoc).equals(old):
            raise RuntimeError(f"{legacy}: the part files do not read back as this table; it is left as it was")
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        hidden.rename(legacy)
        raise
    hidden.unlink()
    return written


def latest(df: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    """The newest row per configuration (scale + keys); keeps the table's column order."""
    if df.height == 0:
        return df
    group = ["scale", *keys]
    return (df.sort("timestamp").group_by(group, maintain_order=True).last()
            .select(df.columns).sort(group))


def metrics_path(name: str, scale: str) -> Path:
    name = _check(name, "metrics name", _NAME)
    return paths.results_dir() / "metrics" / check_scale(scale) / f"{name}.json"


def write_metrics(name: str, metrics: dict[str, Any], scale: str) -> Path:
    """results/metrics/<scale>/<name>.json for `dvc metrics show` (atomic)."""
    if "scale" in metrics and metrics["scale"] != scale:
        raise ValueError(f"write_metrics({name!r}): metrics say scale {metrics['scale']!r}, written under {scale!r}")
    text = json.dumps(metrics, indent=2, sort_keys=True) + "\n"
    return io.atomic_write_bytes(metrics_path(name, scale), text.encode())
