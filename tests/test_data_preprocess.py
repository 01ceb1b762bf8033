"""Streaming preprocessing: the same sequences as the in-memory path for any bucket count, event
filters, ties, sparse ids, stats; every bad input names the file (and line / column) and leaves
no output behind."""
from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib.data.preprocess import BYTES_PER_ROW, prepare_logs, read_log
from grlib.schema import LOG_COLUMNS, LOG_SCHEMA, DataError
from grlib.data.sequences import build_sequences
from grlib.data.synthetic import generate_log, write_log_csv


@pytest.fixture(scope="module")
def log_csv(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("raw") / "log.csv"
    write_log_csv(path, 120, 0.004, 300, seed=7)
    return path


def _read(out: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    return pl.read_parquet(out / "sequences.parquet").sort("user_id"), pl.read_parquet(out / "vocab.parquet")


@pytest.mark.parametrize("bucket_rows", [10**9, 5000, 1000])
@pytest.mark.parametrize("target,context,min_count", [("is_click", "all", 1), ("all", "all", 3),
                                                        ("long_view", "targets", 2)])
def test_streaming_equals_in_memory(log_csv, tmp_path, bucket_rows, target, context, min_count):
    stats = prepare_logs([log_csv], tmp_path / "out", max_len=24, min_item_count=min_count, target=target,
                         context=context, bucket_rows=bucket_rows)
    seqs, vocab = _read(tmp_path / "out")
    want, want_vocab = build_sequences(read_log(log_csv), 24, min_count, target=target, context=context)
    assert seqs.equals(want) and vocab.equals(want_vocab)
    assert stats["buckets"] == (1 if bucket_rows == 10**9 else stats["buckets"]) and stats["users"] == want.height
    if bucket_rows == 1000:
        assert stats["buckets"] > 5
    assert stats["events"] == int(want["item_ids"].list.len().sum())


@st.composite
def _random_logs(draw):
    n = draw(st.integers(1, 120))
    ints = lambda lo, hi: st.lists(st.integers(lo, hi), min_size=n, max_size=n)  # noqa: E731
    base = {c: [0] * n for c in LOG_COLUMNS}
    base.update(user_id=draw(ints(0, 6)), video_id=draw(ints(0, 15)), time_ms=draw(ints(0, 9)),
                is_click=draw(ints(0, 1)), long_view=draw(ints(0, 1)), play_time_ms=draw(ints(-5, 50)))
    return (pl.DataFrame(base).cast(LOG_SCHEMA), draw(st.integers(1, n)), draw(st.integers(1, 3)),
            draw(st.integers(2, 6)), draw(st.integers(1, 40)))


@settings(max_examples=30)
@given(case=_random_logs())
def test_streaming_equals_in_memory_on_random_logs(tmp_path_factory, case):
    """Random users, videos, heavy timestamp ties, any split into sources and buckets."""
    log, cut, min_count, max_len, bucket_rows = case
    out = tmp_path_factory.mktemp("prop") / "out"
    want, want_vocab = build_sequences(log, max_len, min_count)
    if want_vocab.height == 0:  # no video seen min_count times: the streaming path refuses, naming the field
        with pytest.raises(DataError, match=f"data.min_item_count={min_count}: no video is seen that often"):
            prepare_logs([log[:cut], log[cut:]], out, max_len=max_len, min_item_count=min_count,
                         bucket_rows=bucket_rows)
        assert not out.exists() or not any(p.suffix == ".parquet" for p in out.rglob("*"))
        return
    stats = prepare_logs([log[:cut], log[cut:]], out, max_len=max_len, min_item_count=min_count,
                         bucket_rows=bucket_rows)
    seqs, vocab = _read(out)
    assert seqs.equals(want) and vocab.equals(want_vocab)
    assert stats["rows"] == log.height and stats["users_in_log"] == log["user_id"].n_unique()


def test_two_files_ties_keep_file_order_and_stats(tmp_path):
    base = {c: 0 for c in LOG_COLUMNS}
    rows = [{**base, "user_id": 5, "video_id": v, "time_ms": t, "is_click": 1, "long_view": lv}
            for v, t, lv in [(11, 100, 1), (12, 100, 0), (13, 50, 0), (14, 300, 0)]]
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    pl.DataFrame(rows[:2]).cast(LOG_SCHEMA).write_csv(a)
    pl.DataFrame(rows[2:]).cast(LOG_SCHEMA).write_csv(b)
    stats = prepare_logs([a, b], tmp_path / "out", max_len=10)
    seqs, vocab = _read(tmp_path / "out")
    ids = dict(zip(vocab["item_id"], vocab["video_id"]))
    assert [ids[i] for i in seqs["item_ids"][0]] == [13, 11, 12, 14]  # time order, ties in file order
    assert seqs["n_events"].to_list() == [4] and seqs["play_time_ms"].dtype == pl.List(pl.Int32)
    assert (stats["rows"], stats["users"], stats["items"], stats["click_rate"], stats["long_view_rate"]) == (
        4, 1, 4, 1.0, 0.25)


def test_timestamp_ties_across_buckets_and_files_keep_file_order(tmp_path):
    log = generate_log(60, 0.004, 150, seed=5).with_columns((pl.col("time_ms") // 86_400_000).alias("time_ms"))
    assert log.select(pl.col("time_ms").is_duplicated().over("user_id").mean()).item() > 0.5  # many ties
    half = log.height // 2
    prepare_logs([log[:half], log[half:]], tmp_path / "out", max_len=20, bucket_rows=1000)
    seqs, vocab = _read(tmp_path / "out")
    want, want_vocab = build_sequences(log, 20)
    assert seqs.equals(want) and vocab.equals(want_vocab)


def test_sparse_video_ids_take_the_join_path(tmp_path):
    log = generate_log(40, 0.003, 100, seed=2)
    sparse = log.with_columns(pl.col("video_id") * 10**12 + 7)
    prepare_logs([log], tmp_path / "dense", max_len=16, bucket_rows=3000)
    prepare_logs([sparse], tmp_path / "sparse", max_len=16, bucket_rows=3000)
    (s1, v1), (s2, v2) = _read(tmp_path / "dense"), _read(tmp_path / "sparse")
    assert s1.equals(s2) and v2["video_id"].to_list() == [v * 10**12 + 7 for v in v1["video_id"]]


def _write(tmp_path: Path, text: str, name: str = "bad.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


HEADER = ",".join(LOG_COLUMNS)
GOOD = "1,10,20220408,900,1649380000000,1,0,0,0,0,0,1,5000,9000,0,0,0,0,1"


def _bad_row(column: str, value: str) -> str:
    fields = GOOD.split(",")
    fields[LOG_COLUMNS.index(column)] = value
    return ",".join(fields)


@pytest.mark.parametrize("text,message", [
    ("", r"bad.csv: empty file \(expected a header line"),
    (HEADER + "\n", r"bad.csv: no data rows after the header"),
    (HEADER.replace(",video_id", "") + "\n" + GOOD + "\n", r"bad.csv, line 1: missing column 'video_id'"),
    (HEADER.replace(",is_click", "").replace(",tab", "") + "\n1\n",
     r"bad.csv, line 1: missing columns 'is_click', 'tab'"),
    ("\n".join([HEADER, GOOD, GOOD, _bad_row("video_id", "12x"), GOOD]) + "\n",
     r"bad.csv, line 4, column 'video_id': '12x' is not an integer"),
    ("\n".join([HEADER, GOOD, _bad_row("time_ms", "1.6e12")]) + "\n",
     r"bad.csv, line 3, column 'time_ms': '1.6e12' is not an integer"),
    ("\n".join([HEADER, GOOD, GOOD, GOOD, _bad_row("is_click", "")]) + "\n",
     r"bad.csv, line 5, column 'is_click': empty value"),
    ("\n".join([HEADER, GOOD, _bad_row("user_id", ""), GOOD]) + "\n",
     r"bad.csv, line 3, column 'user_id': empty value"),
    ("\n".join([HEADER, GOOD, GOOD, GOOD + ",3", GOOD]) + "\n",
     r"bad.csv, line 4: 20 fields, the header has 19"),
    ("\n".join([HEADER, GOOD + ",3,4", GOOD]) + "\n",
     r"bad.csv, line 2: 21 fields, the header has 19"),
    ("\n".join([HEADER, GOOD, _bad_row("is_click", "7"), GOOD]) + "\n",
     r"bad.csv, line 3, column 'is_click': 7 is not 0 or 1"),
    ("\n".join([HEADER, GOOD, GOOD, _bad_row("long_view", "-1")]) + "\n",
     r"bad.csv, line 4, column 'long_view': -1 is not 0 or 1"),
    ("\n".join([HEADER, _bad_row("is_hate", "300"), GOOD]) + "\n",  # not even an int8: a parse error
     r"bad.csv, line 2, column 'is_hate': 300 is not 0 or 1"),
    ("\n".join([HEADER, GOOD, GOOD, _bad_row("is_rand", "2")]) + "\n",  # a column the sequences do not use
     r"bad.csv, line 4, column 'is_rand': 2 is not 0 or 1"),
    ("\n".join([HEADER, GOOD, _bad_row("tab", "")]) + "\n",
     r"bad.csv, line 3, column 'tab': empty value"),
    ("\n".join([HEADER, GOOD, _bad_row("is_like", "3"), _bad_row("is_click", "7")]) + "\n",  # the first
     r"bad.csv, line 3, column 'is_like': 3 is not 0 or 1"),
])
def test_bad_input_names_file_line_column_and_leaves_nothing(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(DataError, match=message):
        prepare_logs([path], tmp_path / "out", max_len=8)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]  # no output, no temporary folder


def test_bad_input_in_the_second_file_is_named(tmp_path, log_csv):
    bad = _write(tmp_path, "\n".join([HEADER, GOOD, _bad_row("user_id", "u1")]) + "\n")
    with pytest.raises(DataError, match=r"bad.csv, line 3, column 'user_id': 'u1' is not an integer"):
        prepare_logs([log_csv, bad], tmp_path / "out", max_len=8)


def test_read_log_checks_every_column_and_the_field_count(tmp_path):
    path = _write(tmp_path, "\n".join([HEADER, GOOD, _bad_row("tab", "main")]) + "\n")
    with pytest.raises(DataError, match=r"line 3, column 'tab': 'main' is not an integer"):
        read_log(path)
    path = _write(tmp_path, "\n".join([HEADER, GOOD, GOOD + ",3", GOOD]) + "\n")
    with pytest.raises(DataError, match=r"bad.csv, line 3: 20 fields, the header has 19"):
        read_log(path)
    path = _write(tmp_path, "\n".join([HEADER, GOOD, GOOD, _bad_row("is_follow", "5")]) + "\n")
    with pytest.raises(DataError, match=r"bad.csv, line 4, column 'is_follow': 5 is not 0 or 1"):
        read_log(path)
    with pytest.raises(DataError, match=r"bad.csv: file not found"):
        read_log(tmp_path / "none" / "bad.csv")


def test_a_header_with_an_extra_column_still_counts_fields(tmp_path):
    """Columns outside the log schema are read (and ignored), so every line's field count is checked."""
    rows = [GOOD + ",note"] * 5
    rows[3] = GOOD + ",note,oops"
    path = _write(tmp_path, "\n".join([HEADER + ",comment", *rows]) + "\n")
    with pytest.raises(DataError, match=r"bad.csv, line 5: 21 fields, the header has 20"):
        prepare_logs([path], tmp_path / "out", max_len=8)
    with pytest.raises(DataError, match=r"bad.csv, line 5: 21 fields, the header has 20"):
        read_log(path)
    rows[3] = GOOD + ","  # an empty cell in a column outside the schema is fine
    path = _write(tmp_path, "\n".join([HEADER + ",comment", *rows]) + "\n")
    assert prepare_logs([path], tmp_path / "out", max_len=8)["rows"] == 5


def test_the_first_bad_row_in_file_order_is_named_across_buckets_and_files(tmp_path, log_csv):
    """Two bad rows: the later one sits in a bucket read before the earlier one's; the earlier is named."""
    lines = log_csv.read_text().splitlines()
    click = lines[0].split(",").index("is_click")
    buckets = math.ceil((log_csv.stat().st_size // BYTES_PER_ROW) / 500)
    bucket_of = {n: int(lines[n - 1].split(",")[0]) % buckets for n in range(2, len(lines) + 1)}
    late = next(n for n in range(len(lines), 1, -1) if bucket_of[n] == 0)
    early = next(n for n in range(2, late) if bucket_of[n] > 0)
    for n, value in ((late, "9"), (early, "8")):
        fields = lines[n - 1].split(",")
        fields[click] = value
        lines[n - 1] = ",".join(fields)
    path = _write(tmp_path, "\n".join(lines) + "\n", "spoilt.csv")
    with pytest.raises(DataError, match=rf"spoilt.csv, line {early}, column 'is_click': 8 is not 0 or 1"):
        prepare_logs([path], tmp_path / "out", max_len=8, bucket_rows=500)
    with pytest.raises(DataError, match=rf"spoilt.csv, line {early}, column 'is_click': 8 "):  # 2nd file
        prepare_logs([log_csv, path], tmp_path / "out", max_len=8, bucket_rows=500)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value,dtype", [(7, pl.Int8), (300, pl.Int64)])
def test_a_frame_with_an_out_of_range_flag_is_named(tmp_path, value, dtype):
    log = generate_log(5, 0.002, 20, seed=0)
    log = log.with_columns(pl.when(pl.int_range(pl.len()) == 3).then(value).otherwise(pl.col("is_click"))
                           .cast(dtype).alias("is_click"))
    with pytest.raises(DataError, match=rf"source 1 \(a frame\), row 3, column 'is_click': {value} is not 0 or 1"):
        prepare_logs([log.clear(), log], tmp_path / "out", max_len=8)


def test_a_frame_with_a_missing_column_is_named(tmp_path):
    log = generate_log(5, 0.002, 20, seed=0).drop("time_ms")
    with pytest.raises(DataError, match=r"source 0 \(a frame\): missing column 'time_ms'"):
        prepare_logs([log], tmp_path / "out", max_len=8)


def test_not_enough_disk_for_the_parts_is_refused_before_reading(log_csv, tmp_path, monkeypatch):
    from collections import namedtuple

    from grlib.data import download

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(download.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(DataError, match=r"not enough disk to hold the preprocessing parts: needs .* bytes \+ 5%"):
        prepare_logs([log_csv], tmp_path / "out", max_len=8)
    assert list(tmp_path.iterdir()) == []
