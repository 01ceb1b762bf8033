"""Streaming preprocessing: raw KuaiRand-schema logs (CSV files or frames) -> sequences.parquet,
vocab.parquet and stats.json, in memory bounded by one bucket of users.

  pass 1  every source is scanned lazily (polars streaming engine) and sunk to parquet,
          partitioned by bucket = user_id mod K, K = estimated rows / bucket_rows;
  vocab   video counts read back from those parts (memory ~ distinct videos, not rows);
  pass 2  one bucket at a time: video ids through the vocabulary, sort by (user, time_ms, file
          order), `sequences.group_sequences` (the in-memory `build_sequences` uses the same
          function), appended to sequences.parquet as row groups.

Rows of sequences.parquet are ordered by (user_id mod K, user_id); K = 1 (small inputs) gives
plain user order. Pass 1 parses the 13 columns the sequences use (USED_COLUMNS); a missing
column, an empty file, or an empty / non-integer value in those columns raises DataError naming
the file and, for a value, its line and column (found by a diagnosis scan that runs only on
error). `read_log` checks all 19 columns and the field count of every line. The output folder
appears only when complete (built in a temporary sibling, renamed); the parts need about 43 bytes
of temporary disk per row.
"""
from __future__ import annotations

import csv
import json
import math
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from grlib.data.download import check_disk
from grlib.data.schema import ACTION_BITS, LOG_COLUMNS, LOG_SCHEMA, OOV_ID, DataError
from grlib.data.sequences import event_columns, group_sequences, vocab_from_counts
from grlib.progress import bar

USED_COLUMNS = ("user_id", "video_id", "time_ms", *ACTION_BITS, "play_time_ms", "duration_ms")
BYTES_PER_ROW = 60  # a KuaiRand log row is 60-95 bytes of CSV: the low end sizes the buckets
SOURCE_BITS = 40  # file order key = source index << 40 | row index inside the source
PART_BYTES_PER_ROW = 43  # pass-1 parts: _row, user, video, time 8 each; actions 2; play, duration 4; target 1
Source = Path | pl.DataFrame


def check_header(path: Path) -> list[str]:
    """The header of a raw log CSV; DataError if the file is missing, empty or lacks a column."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    with open(path, "rb") as fh:
        first, second = fh.readline(), fh.readline()
    if not first.strip():
        raise DataError(f"{path}: empty file (expected a header line with the {len(LOG_COLUMNS)} "
                        f"KuaiRand log columns)")
    header = [c.strip().strip('"') for c in first.decode("utf-8-sig", errors="replace").strip().split(",")]
    missing = [c for c in LOG_COLUMNS if c not in header]
    if missing:
        raise DataError(f"{path}, line 1: missing column{'s' * (len(missing) > 1)} "
                        f"{', '.join(map(repr, missing))} (header: {', '.join(header)})")
    if not second.strip():
        raise DataError(f"{path}: no data rows after the header")
    return header


def scan_log(path: Path, columns: Sequence[str] = LOG_COLUMNS, row_index: str | None = None) -> pl.LazyFrame:
    """One raw log CSV as a lazy frame with LOG_SCHEMA's dtypes (header checked first)."""
    check_header(path)
    lf = pl.scan_csv(path, schema_overrides=LOG_SCHEMA, infer_schema=False, row_index_name=row_index)
    return lf.select(*([row_index] if row_index else []), *columns)


def read_log(path: Path) -> pl.DataFrame:
    """A whole raw log CSV, all 19 columns with LOG_SCHEMA's dtypes; bad values raise DataError."""
    try:
        df = scan_log(path).collect()
    except pl.exceptions.PolarsError as err:
        raise diagnose([Path(path)], LOG_COLUMNS, err) from err
    if sum(df.null_count().row(0)):
        raise diagnose([Path(path)], LOG_COLUMNS, None)
    return df


def _first_bad_value(path: Path, columns: Sequence[str]) -> DataError | None:
    """The first empty or non-integer cell of `columns` in a CSV (a diagnosis pass, on error only)."""
    lf = pl.scan_csv(path, infer_schema=False, row_index_name="_line")  # every column as text
    bad = [(pl.col(c).is_null() | pl.col(c).str.strip_chars().cast(LOG_SCHEMA[c], strict=False).is_null())
           .alias(f"_bad_{c}") for c in columns]
    try:
        hit = (lf.with_columns(bad).filter(pl.any_horizontal(f"_bad_{c}" for c in columns))
               .head(1).collect())
    except pl.exceptions.PolarsError:
        return _first_ragged_line(path)
    if hit.height == 0:
        return None
    row = hit.row(0, named=True)
    col = next(c for c in columns if row[f"_bad_{c}"])
    line, value = row["_line"] + 2, row[col]  # line 1 is the header
    what = "empty value" if value is None or not value.strip() else f"{value!r} is not an integer"
    return DataError(f"{path}, line {line}, column {col!r}: {what} (expected {LOG_SCHEMA[col]})")


def _first_ragged_line(path: Path) -> DataError | None:
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        for line, fields in enumerate(reader, start=2):
            if len(fields) != len(header):
                return DataError(f"{path}, line {line}: {len(fields)} fields, the header has {len(header)}")
    return None


def diagnose(sources: Sequence[Source], columns: Sequence[str], err: Exception | None) -> DataError:
    """A DataError naming the first bad file / line / column among `sources`."""
    for i, src in enumerate(sources):
        if isinstance(src, pl.DataFrame):
            nulls = src.select(columns).with_row_index("_row").filter(pl.any_horizontal(pl.col(columns).is_null()))
            if nulls.height:
                row = nulls.row(0, named=True)
                col = next(c for c in columns if row[c] is None)
                return DataError(f"source {i} (a frame), row {row['_row']}, column {col!r}: empty value")
        else:
            found = _first_bad_value(src, columns)
            if found is not None:
                return found
    names = ", ".join(str(s) if isinstance(s, Path) else "<frame>" for s in sources)
    return DataError(f"{names}: cannot read the log ({err})")


def _lazy_source(i: int, src: Source) -> pl.LazyFrame:
    if isinstance(src, pl.DataFrame):
        missing = [c for c in USED_COLUMNS if c not in src.columns]
        if missing:
            raise DataError(f"source {i} (a frame): missing column{'s' * (len(missing) > 1)} "
                            f"{', '.join(map(repr, missing))}")
        lf = src.lazy().select(USED_COLUMNS).cast({c: LOG_SCHEMA[c] for c in USED_COLUMNS}).with_row_index("_row")
    else:
        lf = scan_log(Path(src), USED_COLUMNS, row_index="_row")
    return lf.with_columns((pl.col("_row").cast(pl.Int64) + (i << SOURCE_BITS)).alias("_row"))


def estimated_rows(sources: Sequence[Source]) -> int:
    return sum(s.height if isinstance(s, pl.DataFrame) else Path(s).stat().st_size // BYTES_PER_ROW
               for s in sources)


def prepare_logs(sources: Sequence[Source], out: Path, *, max_len: int, min_item_count: int = 1,
                 target: str = "is_click", context: str = "all", bucket_rows: int = 2_000_000,
                 extra_stats: dict | None = None) -> dict:
    """Raw logs -> out/{sequences,vocab}.parquet + out/stats.json (replacing out atomically).

    Returns the stats: rows read, users (kept / in the log), items (vocabulary / distinct videos),
    events and targets kept, per-user length quantiles before (raw_length_*) and after the cut
    to max_len (length_*), click and long-view rates of the rows, buckets used."""
    if not sources:
        raise DataError("no input files")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        stats = _prepare(list(sources), tmp, max_len, min_item_count, target, context, bucket_rows)
        stats = {**(extra_stats or {}), **stats}
        (tmp / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return stats


def _prepare(sources: list[Source], work: Path, max_len: int, min_item_count: int, target: str,
             context: str, bucket_rows: int) -> dict:
    rows = estimated_rows(sources)
    check_disk(work, rows * PART_BYTES_PER_ROW, "hold the preprocessing parts")
    n_buckets = max(1, math.ceil(rows / bucket_rows))
    parts = work / "_parts"
    columns = event_columns(target)
    frames = [_lazy_source(i, s).select("_row", *columns, (pl.col("user_id").fill_null(0) % n_buckets).alias("_bucket"))
              .cast({"play_time_ms": pl.Int32, "duration_ms": pl.Int32}) for i, s in enumerate(sources)]
    try:  # pass 1: stream every source into per-bucket Arrow IPC parts (uncompressed: CPU-bound)
        pl.concat(frames).sink_ipc(pl.PartitionBy(parts, key="_bucket", include_key=False),
                                   mkdir=True, compression=None)
    except pl.exceptions.PolarsError as err:
        raise diagnose(sources, USED_COLUMNS, err) from err
    buckets = sorted(parts.glob("_bucket=*"), key=lambda p: int(p.name.split("=")[1]))
    counts = _count_videos(buckets)
    if counts.height == 0:
        raise DataError(f"{', '.join(map(str, sources))}: no rows")
    vocab = vocab_from_counts(counts, min_item_count)
    to_item = _vocab_lookup(counts, vocab)

    empty = group_sequences(pl.LazyFrame(schema=_events_schema()), max_len, context)
    writer = pq.ParquetWriter(work / "sequences.parquet", empty.collect().to_arrow().schema)
    acc = {"rows": 0, "clicks": 0, "long_views": 0, "events": 0, "targets": 0}
    raw_lengths, kept_lengths = [], []
    try:
        with bar(len(buckets), desc="sequences") as progress:
            for folder in buckets:
                ev = _read_bucket(folder)
                if sum(ev.null_count().row(0)):  # an empty cell in a used column (user_id: in bucket 0)
                    raise diagnose(sources, USED_COLUMNS, None)
                ev = to_item(ev).sort(["user_id", "time_ms", "_row"])
                acc["rows"] += ev.height
                acc["clicks"] += int((ev["actions"] & ACTION_BITS["is_click"] > 0).sum())
                acc["long_views"] += int((ev["actions"] & ACTION_BITS["long_view"] > 0).sum())
                raw_lengths.append(ev.group_by("user_id").len()["len"])
                seqs = group_sequences(ev.lazy(), max_len, context).collect()
                lengths = seqs["item_ids"].list.len()
                kept_lengths.append(lengths)
                acc["events"] += int(lengths.sum())
                acc["targets"] += int(seqs["is_target"].list.sum().sum())
                if seqs.height:
                    writer.write_table(seqs.to_arrow().cast(writer.schema))
                progress.update(1)
    finally:
        writer.close()
    shutil.rmtree(parts)
    vocab.write_parquet(work / "vocab.parquet")
    raw, kept = pl.concat(raw_lengths), pl.concat(kept_lengths)
    return {
        "rows": acc["rows"], "users": kept.len(), "users_in_log": raw.len(), "items": vocab.height,
        "videos_in_log": counts.height, "events": acc["events"], "targets": acc["targets"],
        **_quantiles(kept, "length"), **_quantiles(raw, "raw_length"),
        "click_rate": acc["clicks"] / acc["rows"], "long_view_rate": acc["long_views"] / acc["rows"],
        "buckets": len(buckets), "max_len": max_len, "min_item_count": min_item_count,
        "target": target, "context": context,
    }


def _read_bucket(folder: Path, columns: list[str] | None = None) -> pl.DataFrame:
    return pl.concat([pl.read_ipc(f, columns=columns) for f in sorted(folder.glob("*.ipc"))])


def _count_videos(buckets: list[Path]) -> pl.DataFrame:
    """(video_id, count) over every bucket: a bincount while the ids are compact non-negative
    integers (KuaiRand re-indexes them 0..n-1), else a polars group-by."""
    dense = np.zeros(0, dtype=np.int64)
    partial = []
    for folder in buckets:
        ids = _read_bucket(folder, ["video_id"])["video_id"]
        if partial or ids.min() < 0 or ids.max() >= 16 * ids.len() + len(dense) + (1 << 20):
            partial.append(ids.value_counts(name="count"))
            continue
        if ids.max() >= len(dense):
            dense = np.concatenate([dense, np.zeros(ids.max() + 1 - len(dense), dtype=np.int64)])
        dense += np.bincount(ids.to_numpy(), minlength=len(dense))
    seen = np.flatnonzero(dense)
    counts = pl.DataFrame({"video_id": seen.astype(np.int64), "count": dense[seen]})
    if partial:
        counts = (pl.concat([counts.cast({"count": pl.UInt32}), *[p.cast({"count": pl.UInt32}) for p in partial]])
                  .group_by("video_id").agg(pl.col("count").sum()))
    return counts


def _events_schema() -> dict[str, pl.DataType]:
    return {"user_id": pl.Int64, "item_ids": pl.Int32, "time_ms": pl.Int64, "actions": pl.Int16,
            "play_time_ms": pl.Int64, "duration_ms": pl.Int64, "is_target": pl.Boolean}


def _vocab_lookup(counts: pl.DataFrame, vocab: pl.DataFrame):
    """A function mapping a bucket's video_id column to item_ids: a dense array gather when the
    video ids are compact (KuaiRand re-indexes them 0..n-1), else a hash join."""
    lo, hi = counts["video_id"].min(), counts["video_id"].max()
    if lo >= 0 and hi < 16 * counts.height + (1 << 20):
        table = np.full(hi + 1, OOV_ID, dtype=np.int32)
        table[vocab["video_id"].to_numpy()] = vocab["item_id"].to_numpy()

        def dense(ev: pl.DataFrame) -> pl.DataFrame:
            items = table[ev["video_id"].to_numpy()]
            return ev.drop("video_id").with_columns(pl.Series("item_ids", items))
        return dense

    ids = vocab.select("video_id", pl.col("item_id").alias("item_ids"))

    def join(ev: pl.DataFrame) -> pl.DataFrame:
        return (ev.join(ids, on="video_id", how="left", maintain_order="left")
                .with_columns(pl.col("item_ids").fill_null(OOV_ID)).drop("video_id"))
    return join


def _quantiles(lengths: pl.Series, prefix: str) -> dict[str, float | int]:
    if lengths.len() == 0:
        return {f"{prefix}_{k}": 0 for k in ("min", "p50", "p90", "p99", "max")}
    return {f"{prefix}_min": int(lengths.min()),
            **{f"{prefix}_p{int(q * 100)}": float(lengths.quantile(q, "linear")) for q in (0.5, 0.9, 0.99)},
            f"{prefix}_max": int(lengths.max())}
