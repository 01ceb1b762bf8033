"""Append-only result tables (one part file per append, one folder per scale) with metadata,
latest-per-configuration, atomic writes, metrics per scale."""
from __future__ import annotations

import dataclasses
import json

import polars as pl
import pytest

from grlib import results
from grlib.config import load_config


def test_rows_carry_metadata_and_append(isolated_outputs):
    smoke, laptop = load_config("smoke"), load_config("laptop")
    results.append_rows("t", [{"model": "a", "ndcg": 0.1}], laptop)
    results.append_rows("t", [{"model": "a", "ndcg": 0.2, "seed": 3}], smoke)
    table = results.read_table("t")
    assert table.height == 2
    for col in results.META_COLUMNS:
        assert col in table.columns
    assert table["scale"].to_list() == ["laptop", "smoke"]  # the smoke run left the laptop row
    assert table["seed"].to_list() == [0, 3]
    hw = json.loads(table["hardware"][0])
    assert {"cpu", "cores_logical", "torch", "fbgemm", "device"} <= set(hw)
    assert table["params_hash"][0] == laptop.params_hash()
    assert [p.parent.name for p in results.parts("t")] == ["scale=laptop", "scale=smoke"]
    assert results.read_table("t", "smoke")["ndcg"].to_list() == [0.2]


def test_latest_per_configuration(isolated_outputs):
    cfg = load_config("smoke")
    results.append_rows("t", [{"model": "a", "v": 1.0}, {"model": "b", "v": 2.0}], cfg)
    results.append_rows("t", [{"model": "a", "v": 3.0}], cfg)
    table = results.read_table("t")
    table = table.with_columns(pl.Series("timestamp", ["2026-01-01", "2026-01-01", "2026-01-02"]))
    latest = results.latest(table, ["model"])
    assert dict(zip(latest["model"], latest["v"])) == {"a": 3.0, "b": 2.0}


def test_new_columns_are_added_not_dropped(isolated_outputs):
    cfg = load_config("smoke")
    results.append_rows("t", [{"a": 1}], cfg)
    results.append_rows("t", [{"a": 2, "b": "x"}], cfg)
    table = results.read_table("t")
    assert table["b"].to_list() == [None, "x"]


def test_failed_write_leaves_table_intact(isolated_outputs, monkeypatch):
    cfg = load_config("smoke")
    results.append_rows("t", [{"a": 1}], cfg)
    folder = results.scale_dir("t", "smoke")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def boom(self, *a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", boom)
    with pytest.raises(OSError, match="disk full"):
        results.append_rows("t", [{"a": 2}], cfg)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # no temp file left
    assert results.read_table("t")["a"].to_list() == [1]


def test_bad_rows_are_refused(isolated_outputs):
    cfg = load_config("smoke")
    with pytest.raises(ValueError, match="no rows"):
        results.append_rows("t", [], cfg)
    with pytest.raises(ValueError, match="metadata columns \\['scale'\\]"):
        results.append_rows("t", [{"scale": "x"}], cfg)
    with pytest.raises(ValueError, match="table name"):
        results.table_dir("../evil")
    with pytest.raises(ValueError, match="scale '../x'"):
        results.append_rows("t", [{"a": 1}], dataclasses.replace(cfg, scale="../x"))
    with pytest.raises(ValueError, match="run_id 'a/b'"):
        results.append_rows("t", [{"a": 1}], cfg, run_id="a/b")


def test_metrics_json(isolated_outputs):
    path = results.write_metrics("m", {"x": 1.5}, scale="laptop")
    assert path == isolated_outputs / "results" / "metrics" / "laptop" / "m.json"
    assert json.loads(path.read_text()) == {"x": 1.5}
    with pytest.raises(ValueError, match="metrics say scale 'smoke', written under 'laptop'"):
        results.write_metrics("m", {"scale": "smoke"}, scale="laptop")
