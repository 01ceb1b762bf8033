"""`python -m grlib data prepare` and `python -m grlib bench data` end to end (small sizes)."""
from __future__ import annotations

import json

import polars as pl
import pytest

from grlib import results
from grlib.cli import main


def test_prepare_synthetic_into_a_folder(tmp_path, capsys, isolated_outputs):
    out = tmp_path / "seqs"
    assert main(["data", "prepare", "--dataset", "synthetic", "--out", str(out), "--n-users", "40",
                 "--max-len", "16", "--bucket-rows", "2000"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert json.loads((out / "stats.json").read_text()) == stats
    assert stats["dataset"] == "synthetic" and stats["buckets"] > 1 and stats["max_len"] == 16
    seqs = pl.read_parquet(out / "sequences.parquet")
    assert seqs.height == stats["users"] and seqs["val_pos"].max() <= 16
    assert (seqs["item_ids"].list.len() == seqs["test_pos"] + 1).all()  # nothing after the test target
    assert list((isolated_outputs / "data" / "raw").iterdir()) == []  # the temporary raw CSV is gone


def test_prepare_reports_bad_config_and_bad_data(tmp_path, capsys):
    assert main(["data", "prepare", "--dataset", "synthetic", "--out", str(tmp_path / "x"),
                 "--target", "is_bored"]) == 2
    assert "data.target: 'is_bored' is not one of" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_data_writes_rows_per_s_and_peak_rss(tmp_path, isolated_outputs, capsys):
    path = tmp_path / "bench.json"
    # one size, two child processes (each imports torch through grlib: a few seconds)
    assert main(["bench", "data", "--scale", "smoke", "--rows", "30000", "--n-items", "2000", "--length-factor", "0.05",
                 "--max-len", "64", "--bucket-rows", "5000", "--json", str(path), "--workdir", str(tmp_path)]) == 0
    rows = json.loads(path.read_text())
    assert [r["method"] for r in rows] == ["streaming", "in-memory", "streaming, extrapolated to KuaiRand-27K"]
    printed = capsys.readouterr().out  # a 120-column terminal holds the table (tests/test_bench_tables.py)
    assert max(len(line) for line in printed.splitlines()) <= 120 and "speed_vs_mem" in printed
    stream, memory, extra = rows
    assert stream["buckets"] > 1 and memory["buckets"] == 1 and stream["rows"] == memory["rows"]
    assert 15_000 < stream["rows"] < 60_000
    for r in (stream, memory):
        assert r["rows_per_s"] > 0 and r["cpu_s"] > 0 and r["peak_rss_mb"] >= r["idle_rss_mb"] > 10
    assert extra["rows"] == 322_278_385 and extra["seconds"] == pytest.approx(322_278_385 / stream["rows_per_s"])
    # without --record the rows go to the ad-hoc tables, never the committed ones
    assert results.read_table("bench_data", adhoc=True).height == len(rows)
    assert results.read_table("bench_data", adhoc=False).height == 0
    assert not list(tmp_path.glob("grlib-bench-data-*"))  # the CSVs are removed
