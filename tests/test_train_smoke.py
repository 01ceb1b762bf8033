"""The training stage end to end at the smoke scale, through grlib (what 02_train calls)."""
from __future__ import annotations

import json
import math

import polars as pl

from grlib import results
from grlib.config import load_ablation, load_config
from grlib.experiments import claims, data_stage, report, train_stage


def test_smoke_stage_chain(isolated_outputs):
    cfg = load_config("smoke")
    data_stage.run(cfg)
    out = train_stage.run(cfg, load_ablation("train", {"seeds": [0, 1], "datasets": ["scale"], "max_steps": [0],
                                                       "precisions": ["fp32", "bf16"]}))
    table = out["table"]
    assert set(table["model"]) == {"hstu", "sasrec", "popularity"} and table.height == 6
    assert set(table["dataset"]) == {"synthetic"} and not table["mask_history"].any()  # the twin has repeats
    for row in table.iter_rows(named=True):
        assert 0 <= row["test_ndcg@10"] <= 1 and row["test_users"] > 0
        if row["model"] != "popularity":
            assert row["steps"] > 0 and math.isfinite(row["final_loss"]) and row["params"] > 0
            assert 0 < row["mfu"] < 1 and row["tokens_per_s"] > 0
    summary = out["summary"]
    assert summary.filter(summary["model"] == "popularity")["vs_popularity"].to_list() == [1.0]
    assert set(out["curves"]["model"]) == {"hstu", "sasrec"}
    assert results.read_table("train_curves").height == out["curves"].height
    metrics = json.loads(results.metrics_path("train", "smoke").read_text())
    assert set(metrics) >= {"synthetic/hstu", "synthetic/sasrec", "synthetic/popularity", "skipped"}
    missing = train_stage.precision_missing("bf16")  # a CPU without bf16 GEMMs (or GRLIB_ISA=avx2): skipped, said
    if missing is not None:
        assert out["precisions_skipped"] == metrics["precisions_skipped"] == {"bf16": missing}
        assert out["precision"].height == 0
        c7 = report.run("smoke")["claims"].filter(pl.col("target") == "C7.bf16").row(0, named=True)
        assert c7["ours"] == "not measured on this CPU" and c7["met"] is None
        return
    bf16 = out["precision"]  # HSTU again in bf16, per seed, to a table of its own
    assert bf16.height == 2 and set(bf16["precision"]) == {"bf16"} and set(bf16["model"]) == {"hstu"}
    assert bf16["run_id"].to_list() == table["run_id"][:2].to_list()  # the train run's id: compared within it
    fp32 = table.filter(table["model"] == "hstu")
    assert bf16["final_loss"].to_list() != fp32["final_loss"].to_list()  # a different computation, trained
    ps = out["precision_summary"].row(0, named=True)
    assert ps["seeds"] == ps["fp32_seeds"] == 2 and math.isclose(ps["fp32_ndcg@10"], fp32["test_ndcg@10"].mean())
    assert math.isclose(ps["in_fp32_stds"], abs(ps["test_ndcg@10"] - ps["fp32_ndcg@10"]) / ps["fp32_ndcg@10_std"])
    assert metrics["precision"][0]["precision"] == "bf16"
    rep = report.run("smoke")
    assert rep["summary"].height == 3 and all(p.exists() for p in rep["figures"])
    assert results.read_table("train").height == 6
    c7 = rep["claims"].filter(rep["claims"]["target"] == "C7.bf16").row(0, named=True)
    assert c7["ours"] == f"{ps['in_fp32_stds']:.2f}" and c7["met"] == (ps["in_fp32_stds"] <= 1)


def test_preset_table_counts_every_scale():
    table = train_stage.preset_table()
    assert table["scale"].to_list()[:4] == ["smoke", "laptop", "server", "paper"]
    paper = table.filter(table["scale"] == "paper").row(0, named=True)
    assert 0.18e9 <= paper["dense_params"] <= 0.22e9 and paper["item_table_params"] is None


def test_ablation_grid_checks_and_step_budgets():
    import pytest

    from grlib.config import ConfigError

    with pytest.raises(ConfigError, match="ablations.train.max_steps: needs one entry per dataset"):
        load_ablation("train", {"datasets": ["scale", "ml-100k"], "max_steps": [40]})
    with pytest.raises(ConfigError, match="ablations.train.datasets: data.dataset: 'netflix' is not one of"):
        load_ablation("train", {"datasets": ["netflix"]})
    assert [train_stage.step_budget(a, b) for a, b in ((3, 40), (120, 40), (120, 0), (0, 0))] == [3, 40, 120, 0]


def test_report_claims_read_the_newest_run_of_each_table(isolated_outputs):
    cfg = load_config("smoke")
    base = {"op": "hstu_attention", "whole_batch": False, "regime": "scaled", "max_len": 1024, "batch": 8,
            "tokens": 100, "fill": 0.1, "fwd_ms": 1.0, "peak_mem_mb": 1.0, "gflops": 1.0, "frac_of_peak": 0.1}
    old = [dict(base, impl="reference", fwd_bwd_ms=10.0, speedup_vs_reference=1.0, mem_reduction_vs_reference=0.0),
           dict(base, impl="cpu", fwd_bwd_ms=1.0, speedup_vs_reference=10.0, mem_reduction_vs_reference=0.9)]
    results.append_rows("kernels", old, cfg)
    new = [dict(old[0]), dict(old[1], fwd_bwd_ms=8.0, speedup_vs_reference=1.25, mem_reduction_vs_reference=0.5)]
    results.append_rows("kernels", new, cfg)
    rep = report.run("smoke")
    c1 = rep["claims"].filter(rep["claims"]["target"].is_in(["C1.speedup", "C1.memory"]))
    assert c1.height == 2 and not c1["met"].any()  # the newer, slower run decides, not the older one
    assert c1["ours"].to_list() == ["1.25x", "50%"]
    assert "| C1 fused jagged operators remove padding |" in rep["markdown"].read_text()
    laptop = report.run("laptop")["claims"]  # no laptop rows: every claim listed, none measured
    assert set(laptop["target"]) == set(claims.TARGETS) and set(laptop["verdict"]) == {"not measured yet"}
