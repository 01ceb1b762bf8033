"""Streaming preprocessing: raw KuaiRand-schema logs (CSV files or frames) -> sequences.parquet,
vocab.parquet and stats.json, in memory bounded by one bucket of users.

  pass 1  every source is scanned lazily (polars streaming engine) and sunk to Arrow IPC parts,
          partitioned by bucket = user_id mod K, K = estimated rows / bucket_rows; each row
          also gets `_bad` (bad_row_expr: an empty cell, or a 0/1 flag outside {0, 1});
  check   the `_bad` column of every part (1 byte a row); the first bad row in file order is read
          back from its file and reported;
  vocab   video counts read back from those parts (memory ~ distinct videos, not rows);
  pass 2  one bucket at a time: video ids through the vocabulary, sort by (user, time_ms, file
          order), `sequences.group_sequences` (the in-memory `build_sequences` uses the same
          function), appended to sequences.parquet as row groups.

Rows of sequences.parquet are ordered by (user_id mod K, user_id); K = 1 (small inputs) gives
plain user order. Every column of a CSV is read, the 13 of USED_COLUMNS for the sequences and
the others only to be checked (polars counts the fields of a line only when it reads them all).
DataError, naming the file and, for a row, its line (header = line 1) and column: a missing
column, an empty file, a line with more fields than the header, an empty or non-integer value,
a 0/1 flag (FLAG_COLUMNS) with another value (a line with fewer fields shows as an empty value
in its last columns). A parse error is located by a diagnosis scan that runs only on error.
`read_log` makes the same checks.

Lines are capped before polars opens a file (check_lines, from check_header): a line, or a record
a quote keeps open over newlines, longer than MAX_LINE_BYTES (1 MiB) is a DataError naming the
file and the line, so no reader holds a hostile line whole. The check reads the file once in
8 MiB pieces: 0.5 s for an 825 MB log (11.3M rows) whose prepare takes 24 s. What a message
echoes of a file (a header, a value, a polars error) goes through grlib.schema.shown: at most
200 characters, control bytes escaped.

Output: built in a temporary sibling folder and renamed when complete (grlib.io.output_dir); an
existing folder is replaced only if it is empty or grlib made it (its marker file), else
OutputRefused. The parts need about 44 bytes of
temporary disk per row.
"""
from __future__ import annotations

import csv
import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from grlib import io
from grlib.data.download import check_disk
from grlib.schema import ACTION_BITS, FLAG_COLUMNS, LOG_COLUMNS, LOG_SCHEMA, OOV_ID, DataError, shown
from grlib.data.sequences import event_columns, group_sequences, vocab_from_counts
from grlib.progress import bar

USED_COLUMNS = ("user_id", "video_id", "time_ms", *ACTION_BITS, "play_time_ms", "duration_ms")
PREPARED_FILES = ("sequences.parquet", "vocab.parquet", "stats.json")  # what prepare_logs writes
BYTES_PER_ROW = 60  # a KuaiRand log row is 60-95 bytes of CSV: the low end sizes the buckets
SOURCE_BITS = 40  # file order key = source index << 40 | row index inside the source
PART_BYTES_PER_ROW = 44  # pass-1 parts: _row, user, video, time 8 each; actions 2; play, duration 4; target, _bad 1
Source = Path | pl.DataFrame
MAX_LINE_BYTES = 1 << 20  # the longest line a raw input file may hold (KuaiRand: 60-95 bytes a row)
READ_BYTES = 8 << 20  # one read() of check_lines
RECORD_READ_BYTES = 1 << 20  # one read() of its record check (numpy: 8 bytes of temporary memory a byte)


def check_lines(path: Path, limit: int = MAX_LINE_BYTES) -> None:
    """DataError naming the file and the line when a line of `path` holds more than `limit` bytes
    (its newline not counted), before polars or a reader holds it: polars keeps a line in memory
    several times over (a 50 MB line without a newline took 2.8 GB).

    One pass of READ_BYTES reads, memory READ_BYTES: in each piece, from the start of the line
    being checked, the last newline within the next limit + 1 bytes is looked for backwards
    (bytes.rfind), a few bytes per MiB on a log of short lines, so the pass costs about a read of
    the file. A file with a quote character gets a second pass (_check_records): a quote opens
    a field that runs on over newlines until the next quote, and such a record is held whole too."""
    path = Path(path)
    with open(path, "rb") as fh:
        start = offset = 0  # start: first byte of the line being checked; offset: of the piece read
        quoted = False
        while chunk := fh.read(READ_BYTES):
            quoted = quoted or b'"' in chunk
            end = offset + len(chunk)
            while end - start > limit:  # the line must end within limit bytes of its start
                newline = chunk.rfind(b"\n", max(start - offset, 0), start + limit + 1 - offset)
                if newline < 0:
                    raise _long_line(path, fh, start, limit)
                start = offset + newline + 1
            last = chunk.rfind(b"\n", max(start - offset, 0))
            start = offset + last + 1 if last >= 0 else start  # no newline from start to end
            offset = end
        if quoted:
            _check_records(path, fh, limit)


def _check_records(path: Path, fh, limit: int) -> None:
    """DataError when a record of the CSV open in `fh` holds more than `limit` bytes: a record
    ends at a newline after an even number of quote characters from the start of the file (an
    escaped quote is two), as polars splits a CSV into records. Reads of RECORD_READ_BYTES through
    numpy (a cumulative quote count: 8 MB of temporary memory a read)."""
    fh.seek(0)
    start = offset = odd = 0  # start: first byte of the record being read; odd: a quote is open
    while chunk := fh.read(RECORD_READ_BYTES):
        data = np.frombuffer(chunk, dtype=np.uint8)
        quotes = np.cumsum(data == ord('"'), dtype=np.int64)
        newlines = np.flatnonzero(data == ord("\n"))
        ends = newlines[(quotes[newlines] + odd) % 2 == 0] + offset  # record ends, bytes of the file
        if ends.size:
            starts = np.concatenate([[start], ends[:-1] + 1])
            over = np.flatnonzero(ends - starts > limit)
            if over.size:
                raise _long_line(path, fh, int(starts[over[0]]), limit, quoted=True)
            start = int(ends[-1]) + 1
        odd = (odd + int(quotes[-1])) % 2
        offset += len(chunk)
        if offset - start > limit:
            raise _long_line(path, fh, start, limit, quoted=True)


def _long_line(path: Path, fh, start: int, limit: int, quoted: bool = False) -> DataError:
    """DataError for the line of `fh` that starts at byte `start` and holds more than `limit` bytes
    (quoted: the record that starts there): its line number (the newlines before it, counted in
    READ_BYTES reads) and at most its first 80 bytes, escaped, with its length."""
    fh.seek(0)
    line, pos = 1, 0
    while pos < start:
        chunk = fh.read(min(READ_BYTES, start - pos))
        line, pos = line + chunk.count(b"\n"), pos + len(chunk)
    fh.seek(start)
    head, length = fh.read(80).split(b"\n")[0], 0
    fh.seek(start)
    while chunk := fh.read(READ_BYTES):  # the line's length: up to its newline
        end = chunk.find(b"\n")
        length += len(chunk) if end < 0 else end
        if end >= 0:
            break
    mib = f"{limit:,} bytes ({limit / (1 << 20):g} MiB)"
    what = f"a quote opened on this line is not closed within {mib}" if quoted else f"more than {mib}"
    return DataError(f"{path}, line {line}: {what}, the most a line may hold: {shown(head, 80, total=length)}")


def check_header(path: Path) -> list[str]:
    """The header of a raw log CSV; DataError if the file is missing, empty, lacks a column or has
    a line longer than MAX_LINE_BYTES (check_lines)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    check_lines(path)
    with open(path, "rb") as fh:
        first, second = fh.readline(MAX_LINE_BYTES + 2), fh.readline(MAX_LINE_BYTES + 2)
    if not first.strip():
        raise DataError(f"{path}: empty file (expected a header line with the {len(LOG_COLUMNS)} "
                        f"KuaiRand log columns)")
    header = [c.strip().strip('"') for c in first.decode("utf-8-sig", errors="replace").strip().split(",")]
    missing = [c for c in LOG_COLUMNS if c not in header]
    if missing:
        raise DataError(f"{path}, line 1: missing column{'s' * (len(missing) > 1)} "
                        f"{', '.join(map(repr, missing))} (header: {shown(', '.join(header))})")
    if not second.strip():
        raise DataError(f"{path}: no data rows after the header")
    return header


def scan_log(path: Path, columns: Sequence[str] = LOG_COLUMNS, row_index: str | None = None) -> pl.LazyFrame:
    """One raw log CSV as a lazy frame with LOG_SCHEMA's dtypes (header checked first; values are
    not checked: read_log and prepare_logs do that)."""
    check_header(path)
    lf = pl.scan_csv(path, schema_overrides=LOG_SCHEMA, infer_schema=False, row_index_name=row_index)
    return lf.select(*([row_index] if row_index else []), *columns)


def bad_row_expr(columns: Sequence[str], others: Sequence[str] = ()) -> pl.Expr:
    """`_bad`: True on a row with an empty cell in `columns` or a 0/1 flag of `columns` outside
    {0, 1}. `others` (text columns outside the log schema) are referenced by a term that is always
    False, so that polars reads every field of a line and so checks the field count."""
    terms = [pl.col(c).is_null() for c in columns]
    terms += [~pl.col(c).is_between(0, 1) for c in columns if c in FLAG_COLUMNS]
    terms += [(pl.col(c).str.len_bytes() < 0).fill_null(False) for c in others]
    return pl.any_horizontal(terms).fill_null(True).alias("_bad")


def _scan_checked(path: Path) -> pl.LazyFrame:
    """A raw log CSV as a lazy frame: every column (LOG_SCHEMA's dtypes, others as text), `_row`
    (0-based data row: line = _row + 2) and `_bad` over the 19 log columns. A line with more
    fields than the header, or a value that does not parse, fails the scan (PolarsError)."""
    check_header(path)
    lf = pl.scan_csv(path, schema_overrides=LOG_SCHEMA, infer_schema=False, row_index_name="_row")
    others = [c for c in lf.collect_schema().names() if c != "_row" and c not in LOG_SCHEMA]
    return lf.with_columns(bad_row_expr(LOG_COLUMNS, others))


def read_log(path: Path) -> pl.DataFrame:
    """A whole raw log CSV, all 19 columns with LOG_SCHEMA's dtypes; bad rows raise DataError."""
    path = Path(path)
    try:
        df = _scan_checked(path).collect()
    except pl.exceptions.PolarsError as err:
        raise diagnose([path], LOG_COLUMNS, err) from err
    bad = df.filter("_bad")
    if bad.height:
        raise _bad_row_error([path], int(bad["_row"][0]))
    return df.select(LOG_COLUMNS)


def _cell_problem(column: str, value: object) -> str | None:
    """What is wrong with one cell (its text, or a frame's value) of a log column, or None."""
    if value is None or not str(value).strip():
        return "empty value"
    try:
        number = int(str(value).strip())
    except ValueError:
        return f"'{shown(str(value))}' is not an integer (expected {LOG_SCHEMA[column]})"
    if column in FLAG_COLUMNS and number not in (0, 1):
        return f"{number} is not 0 or 1 (a 0/1 flag)"
    return None


def _row_error(where: str, row: dict, columns: Sequence[str], flagged: Sequence[str] = ()) -> DataError:
    """DataError for one bad row: the first of `columns` with a _cell_problem (else the first
    `flagged` column, a value polars could not parse as its dtype)."""
    for col in columns:
        problem = _cell_problem(col, row.get(col)) if col in row else None
        if problem:
            return DataError(f"{where}, column {col!r}: {problem}")
    if flagged:
        col = flagged[0]
        return DataError(f"{where}, column {col!r}: '{shown(str(row[col]))}' does not fit {LOG_SCHEMA[col]}")
    return DataError(f"{where}: bad row (no bad cell found)")


def _bad_row_error(sources: Sequence[Source], key: int) -> DataError:
    """DataError for the row of `sources` with file order key `key` (source << SOURCE_BITS | row)."""
    i, row = key >> SOURCE_BITS, key & ((1 << SOURCE_BITS) - 1)
    src = sources[i]
    if isinstance(src, pl.DataFrame):
        return _row_error(f"source {i} (a frame), row {row}", src.row(row, named=True), LOG_COLUMNS)
    values = pl.scan_csv(src, infer_schema=False).slice(row, 1).collect().row(0, named=True)
    return _row_error(f"{src}, line {row + 2}", values, LOG_COLUMNS)


def _first_bad_value(path: Path, columns: Sequence[str]) -> DataError | None:
    """The first line of a CSV with an empty, non-integer or (0/1 flag) out-of-range value in
    `columns`, or with more fields than the header (a diagnosis pass, on error only)."""
    lf = pl.scan_csv(path, infer_schema=False, row_index_name="_line")  # every column as text
    others = [c for c in lf.collect_schema().names() if c != "_line" and c not in columns]
    bad = []
    for c in columns:
        parsed = pl.col(c).str.strip_chars().cast(pl.Int64 if c in FLAG_COLUMNS else LOG_SCHEMA[c], strict=False)
        flag = pl.col(c).is_null() | parsed.is_null()
        if c in FLAG_COLUMNS:
            flag = flag | ~parsed.is_between(0, 1)
        bad.append(flag.fill_null(True).alias(f"_bad_{c}"))
    keep = [(pl.col(c).str.len_bytes() < 0).fill_null(False) for c in others]  # read every field
    try:
        hit = (lf.with_columns(bad).filter(pl.any_horizontal([f"_bad_{c}" for c in columns] + keep))
               .head(1).collect())
    except pl.exceptions.PolarsError:
        return _first_ragged_line(path)
    if hit.height == 0:
        return None
    row = hit.row(0, named=True)
    return _row_error(f"{path}, line {row['_line'] + 2}", row, columns,
                      [c for c in columns if row[f"_bad_{c}"]])


def _first_ragged_line(path: Path) -> DataError | None:
    """The first line of a CSV whose field count is not the header's, or that the csv module cannot
    read (a field over its 128 KiB limit, e.g. an unclosed quote), as a DataError; else None."""
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader, [])
            for line, fields in enumerate(reader, start=2):
                if len(fields) != len(header):
                    return DataError(f"{path}, line {line}: {len(fields)} fields, the header has {len(header)}")
        except csv.Error as err:
            return DataError(f"{path}, line {reader.line_num}: {shown(str(err))}")
    return None


def diagnose(sources: Sequence[Source], columns: Sequence[str], err: Exception | None) -> DataError:
    """A DataError naming the first bad file / line / column among `sources`."""
    for i, src in enumerate(sources):
        if isinstance(src, pl.DataFrame):
            present = [c for c in columns if c in src.columns]
            hits = src.select(present).with_row_index("_row").filter(bad_row_expr(present))
            if hits.height:
                row = hits.row(0, named=True)
                return _row_error(f"source {i} (a frame), row {row['_row']}", row, present)
        else:
            found = _first_bad_value(src, columns)
            if found is not None:
                return found
    names = ", ".join(str(s) if isinstance(s, Path) else "<frame>" for s in sources)
    return DataError(f"{names}: cannot read the log ({shown(str(err))})")


def _lazy_source(i: int, src: Source) -> pl.LazyFrame:
    """Source i with its log columns, `_row` (file order key) and `_bad`."""
    if isinstance(src, pl.DataFrame):
        missing = [c for c in USED_COLUMNS if c not in src.columns]
        if missing:
            raise DataError(f"source {i} (a frame): missing column{'s' * (len(missing) > 1)} "
                            f"{', '.join(map(repr, missing))}")
        present = [c for c in LOG_COLUMNS if c in src.columns]
        lf = (src.lazy().select(present).with_columns(bad_row_expr(present))
              .cast({c: LOG_SCHEMA[c] for c in present}).with_row_index("_row"))
    else:
        lf = _scan_checked(Path(src))
    return lf.with_columns((pl.col("_row").cast(pl.Int64) + (i << SOURCE_BITS)).alias("_row"))


def estimated_rows(sources: Sequence[Source]) -> int:
    return sum(s.height if isinstance(s, pl.DataFrame) else Path(s).stat().st_size // BYTES_PER_ROW
               for s in sources)


def check_output(out: Path) -> None:
    """OutputRefused unless prepare_logs may write `out` (see the module docstring)."""
    io.check_replaceable(Path(out))


def prepare_logs(sources: Sequence[Source], out: Path, *, max_len: int, min_item_count: int = 1,
                 target: str = "is_click", context: str = "all", bucket_rows: int = 2_000_000,
                 extra_stats: dict | None = None) -> dict:
    """Raw logs -> out/{sequences,vocab}.parquet + out/stats.json, through grlib.io.output_dir:
    `out` appears complete or not at all, and only replaces a folder grlib made.

    Returns the stats: rows read, users (kept / in the log), items (vocabulary / distinct videos),
    events and targets kept, per-user length quantiles before (raw_length_*) and after the cut
    to max_len (length_*), click and long-view rates of the rows, buckets used."""
    if not sources:
        raise DataError("no input files")
    with io.output_dir(out, what="prepared sequences (grlib.data.preprocess)") as tmp:
        stats = _prepare(list(sources), tmp, max_len, min_item_count, target, context, bucket_rows)
        stats = {**(extra_stats or {}), **stats}
        (tmp / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def _prepare(sources: list[Source], work: Path, max_len: int, min_item_count: int, target: str,
             context: str, bucket_rows: int) -> dict:
    rows = estimated_rows(sources)
    check_disk(work, rows * PART_BYTES_PER_ROW, "hold the preprocessing parts")
    n_buckets = max(1, math.ceil(rows / bucket_rows))
    parts = work / "_parts"
    columns = event_columns(target)
    frames = [_lazy_source(i, s).select("_row", *columns, (pl.col("user_id").fill_null(0) % n_buckets).alias("_bucket"),
                                        "_bad")
              .cast({"play_time_ms": pl.Int32, "duration_ms": pl.Int32}) for i, s in enumerate(sources)]
    try:  # pass 1: stream every source into per-bucket Arrow IPC parts (uncompressed: CPU-bound)
        pl.concat(frames).sink_ipc(pl.PartitionBy(parts, key="_bucket", include_key=False),
                                   mkdir=True, compression=None)
    except pl.exceptions.PolarsError as err:
        raise diagnose(sources, LOG_COLUMNS, err) from err
    buckets = sorted(parts.glob("_bucket=*"), key=lambda p: int(p.name.split("=")[1]))
    bad = _first_bad_key(buckets)
    if bad is not None:
        raise _bad_row_error(sources, bad)
    counts = _count_videos(buckets)
    if counts.height == 0:
        raise DataError(f"{', '.join(map(str, sources))}: no rows")
    vocab = vocab_from_counts(counts, min_item_count)
    if vocab.height == 0:  # every video out of the vocabulary: nothing a model could rank
        raise DataError(f"data.min_item_count={min_item_count}: no video is seen that often (the most frequent: "
                        f"{int(counts['count'].max())} times); lower data.min_item_count")
    to_item = _vocab_lookup(counts, vocab)

    empty = group_sequences(pl.LazyFrame(schema=_events_schema()), max_len, context)
    writer = pq.ParquetWriter(work / "sequences.parquet", empty.collect().to_arrow().schema)
    acc = {"rows": 0, "clicks": 0, "long_views": 0, "events": 0, "targets": 0}
    raw_lengths, kept_lengths = [], []
    try:
        with bar(len(buckets), desc="sequences") as progress:
            for folder in buckets:
                ev = to_item(_read_bucket(folder).drop("_bad")).sort(["user_id", "time_ms", "_row"])
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


def _first_bad_key(buckets: list[Path]) -> int | None:
    """The smallest file order key (`_row`) of a row with `_bad` set, over every bucket, or None."""
    first = None
    for folder in buckets:
        if _read_bucket(folder, ["_bad"])["_bad"].any():
            part = _read_bucket(folder, ["_row", "_bad"]).filter("_bad")
            key = int(part["_row"].min())
            first = key if first is None else min(first, key)
    return first


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
