"""Figures readable alone: the train-quality chart (a panel per dataset on its own axis, seed-std
whiskers, the peer library's figure as a labelled dashed line) and the kernels charts (a caption that
says what each implementation and length regime is)."""
from __future__ import annotations

import json

import polars as pl

from grlib.config import choices
from grlib.experiments import kernels_stage, train_stage


def _stage_summary() -> pl.DataFrame:
    """train_stage.summary's columns: two datasets on scales 10x apart, ml-100k with its peers."""
    rows = [("ml-100k", "hstu", 0.1065, 0.0039), ("ml-100k", "sasrec", 0.1049, 0.0009),
            ("ml-100k", "popularity", 0.0387, 0.0), ("synthetic", "hstu", 0.4111, 0.0032),
            ("synthetic", "sasrec", 0.4014, None)]
    return pl.DataFrame([{"dataset": d, "model": m, "seeds": 3, "test_ndcg@10": v, "test_ndcg@10_std": s}
                         for d, m, v, s in rows], schema_overrides={"test_ndcg@10_std": pl.Float64})


def _layers(spec: dict) -> dict[str, dict]:
    return {(layer["mark"] if isinstance(layer["mark"], str) else layer["mark"]["type"])
            + ("_peer" if "transform" in layer else ""): layer for layer in spec["spec"]["layer"]}


def test_quality_chart_panels_whiskers_and_peer_lines():
    chart = train_stage.quality_chart(_stage_summary())
    spec = chart.to_dict()
    assert spec["resolve"]["scale"]["x"] == "independent"  # ML-100K's 0.1 is not squeezed by the twin's 0.4
    assert spec["facet"]["column"]["field"] == "dataset"
    layers = _layers(spec)
    assert layers["errorbar"]["encoding"]["x"]["field"] == "lo" and layers["errorbar"]["encoding"]["x2"]["field"] == "hi"
    assert layers["rule_peer"]["encoding"]["x"]["field"] == "peer"
    data = next(iter(spec["datasets"].values()))
    by = {(r["dataset"], r["model"]): r for r in data}
    sasrec = by[("ml-100k", "sasrec")]
    assert (sasrec["lo"], sasrec["hi"]) == (0.1049 - 0.0009, 0.1049 + 0.0009)
    assert sasrec["peer"] == train_stage.peer("ml-100k").ndcg10 and "RecBole" in sasrec["peer_label"]
    assert by[("synthetic", "hstu")]["peer"] is None  # no peer figure there: no line
    assert by[("synthetic", "sasrec")]["hi"] == by[("synthetic", "sasrec")]["lo"]  # one seed-std unknown: 0
    assert by[("ml-100k", "hstu")]["label"] == "0.1065 ± 0.0039 (3 seeds)"
    subtitle = " ".join(spec["title"]["subtitle"])
    assert "seed-std" in subtitle and "RecBole 1.2.1" in subtitle


def test_quality_chart_takes_the_reports_summary_alike():
    """report.train_summary names the columns ndcg@10 / ndcg@10_std and adds the scale: the same data."""
    stage = _stage_summary()
    report_like = stage.rename({"test_ndcg@10": "ndcg@10", "test_ndcg@10_std": "ndcg@10_std"}).with_columns(
        pl.lit("laptop").alias("scale"))
    a = next(iter(train_stage.quality_chart(stage).to_dict()["datasets"].values()))
    b = next(iter(train_stage.quality_chart(report_like).to_dict()["datasets"].values()))
    assert [{k: v for k, v in r.items() if k != "scale"} for r in b] == a
    assert "row" not in train_stage.quality_chart(report_like).to_dict()["facet"]  # one scale: no row facet


def _kernel_rows() -> pl.DataFrame:
    rows = []
    for regime in ("truncated", "scaled"):
        for impl in ("reference", "fbgemm", "cpu", "loop", "loop_compile"):
            for max_len in (256, 1024):
                rows.append({"op": "hstu_attention", "whole_batch": False, "regime": regime, "max_len": max_len,
                             "impl": impl, "batch": 8, "tokens": 1000, "fill": 0.5, "fwd_ms": 1.0, "fwd_bwd_ms": 3.0,
                             "peak_mem_mb": 10.0, "gflops": 1.0, "frac_of_peak": 0.1, "speedup_vs_reference": 2.0,
                             "mem_reduction_vs_reference": 0.5})
    return pl.DataFrame(rows)


def test_kernels_charts_say_what_each_implementation_and_regime_is():
    df = _kernel_rows()
    for chart in (kernels_stage.ratio_chart(df), kernels_stage.latency_memory_chart(df)):
        subtitle = chart.to_dict()["title"]["subtitle"]
        for impl in ("reference", "fbgemm", "cpu", "loop", "loop_compile"):
            assert any(line.startswith(f"{impl}: ") for line in subtitle), (impl, subtitle)
        assert [line.split(":")[0] for line in subtitle if line.startswith("lengths ")] == \
            ["lengths truncated", "lengths scaled"]
    # every implementation and regime the config accepts has its words (never "see grlib.ops")
    assert set(choices.IMPLS) <= set(kernels_stage.IMPLEMENTATIONS)
    assert set(choices.REGIMES) <= set(kernels_stage.REGIMES)
    assert "see grlib.ops" not in json.dumps(kernels_stage.caption(list(choices.IMPLS), list(choices.REGIMES)))


def test_the_figures_render(tmp_path):
    """vl-convert draws both (a spec vega rejects fails here, not in the report stage)."""
    for name, chart in (("q", train_stage.quality_chart(_stage_summary())), ("k", kernels_stage.ratio_chart(_kernel_rows()))):
        chart.save(str(tmp_path / f"{name}.png"), format="png")
        assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
