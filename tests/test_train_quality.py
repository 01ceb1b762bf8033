"""The train stage's per-dataset settings (params.yaml `datasets`, as ablations.train.overrides) and the peer library's figures
beside ours (train_stage.PEERS in the summary, claims target W1.peer in the report)."""
from __future__ import annotations

import json

import polars as pl
import pytest

from grlib import results
from grlib.config import ConfigError, load_ablation, load_config
from grlib.experiments import claims, data_stage, report, train_stage


def test_overrides_are_valid_mappings_of_a_dataset():
    two = {"datasets": ["scale", "ml-100k"], "max_steps": []}
    with pytest.raises(ConfigError, match=r"ablations.train.overrides: 'netflix' is not a dataset: one of \('scale', "):
        load_ablation("train", {**two, "overrides": {"netflix": {}}})
    with pytest.raises(ConfigError, match=r"ablations.train.overrides.ml-100k: expected a mapping"):
        load_ablation("train", {**two, "overrides": {"ml-100k": 0.2}})
    with pytest.raises(ConfigError, match=r"ablations.train.overrides.ml-100k: unknown parameter 'negatives.temp'"):
        load_ablation("train", {**two, "overrides": {"ml-100k": {"negatives.temp": 0.2}}})
    with pytest.raises(ConfigError, match=r"overrides.scale: negatives.softmax: 'all' is not one of"):
        load_ablation("train", {**two, "overrides": {"scale": {"negatives.softmax": "all"}}})
    with pytest.raises(ConfigError, match=r"ablations.train.overrides: expected a mapping"):
        load_ablation("train", {**two, "overrides": [{}, {}]})
    ab = load_ablation("train", {**two, "overrides": {"ml-100k": {"negatives": {"temperature": 0.2}}}})
    assert ab.dataset_overrides("scale") == {}
    assert ab.dataset_overrides("ml-100k") == {"negatives": {"temperature": 0.2}}
    # a grid of other datasets keeps params.yaml's ML-100K entry, unused
    assert load_ablation("train", {"datasets": ["scale"], "max_steps": []}).dataset_overrides("scale") == {}


def test_laptop_ml100k_trains_a_full_softmax_and_the_twin_a_sampled_one():
    """params.yaml: ML-100K's 1,682 items get the full softmax; the twin's 5,000 keep the sampled pool."""
    cfg, ab = load_config("laptop"), load_ablation("train")
    by_name = {name: cfg.replace(ab.dataset_overrides(name)) for name in ab.datasets}
    assert not by_name["scale"].negatives.full_softmax(cfg.data.n_items + 2)
    assert by_name["ml-100k"].negatives.full_softmax(1682 + 2)
    assert by_name["scale"] == cfg  # the twin's settings are the scale's
    # the step budget each dataset really gets (the tighter of the scale's cap and the grid's): 400 for
    # ML-100K at laptop scale, while the smoke scale's cap keeps every run at a few steps
    budgets = {name: train_stage.step_budget(by_name[name].train.max_steps, cap)
               for name, cap in zip(ab.datasets, ab.max_steps, strict=True)}
    assert budgets == {"scale": 40, "ml-100k": 400}
    assert by_name["ml-100k"].train.epochs * 15 >= 400  # 943 users / batch 64: 15 steps per epoch
    smoke = load_config("smoke")
    assert all(train_stage.step_budget(smoke.replace(ab.dataset_overrides(name)).train.max_steps, cap) <= 3
               for name, cap in zip(ab.datasets, ab.max_steps, strict=True))


def test_run_applies_and_records_each_datasets_overrides(isolated_outputs):
    cfg = load_config("smoke")
    data_stage.run(cfg)
    base = {"models": ["hstu"], "seeds": [0], "datasets": ["scale"], "max_steps": [2]}
    plain = train_stage.run(cfg, load_ablation("train", base))["table"].row(0, named=True)
    over = {"negatives.softmax": "full", "negatives.temperature": 0.5}
    with_over = load_ablation("train", {**base, "overrides": {"scale": over}})
    full = train_stage.run(cfg, with_over)["table"].row(0, named=True)
    assert json.loads(plain["overrides"]) == {} and json.loads(full["overrides"]) == over
    assert plain["steps"] == full["steps"] == 2 and plain["final_loss"] != full["final_loss"]
    again = train_stage.run(cfg, with_over)["table"].row(0, named=True)
    assert again["final_loss"] == full["final_loss"]  # the overrides, not chance, changed the loss


def _rows(hstu: float, sasrec: float, pop: float, dataset: str = "ml-100k") -> list[dict]:
    row = {"dataset": dataset, "test_hr@10": 0.2, "test_mrr": 0.1, "val_ndcg@10": 0.1, "params": 10, "train_s": 1.0,
           "tokens_per_s": 1.0, "mfu": 0.1}
    return [dict(row, model=m, seed=s, **{"test_ndcg@10": v + 0.001 * s})
            for m, v in (("hstu", hstu), ("sasrec", sasrec), ("popularity", pop)) for s in (0, 1, 2)]


def test_summary_sets_the_peer_figures_beside_ours():
    summ = train_stage.summary(pl.DataFrame(_rows(0.1, 0.09, 0.04) + _rows(0.4, 0.39, 0.02, "synthetic")))
    ml = {r["model"]: r for r in summ.filter(pl.col("dataset") == "ml-100k").iter_rows(named=True)}
    sasrec, pop = train_stage.peer("ml-100k", "sasrec"), train_stage.peer("ml-100k", "popularity")
    assert (sasrec.ndcg10, pop.ndcg10) == (0.0973, 0.0441) and "RecBole 1.2.1" in sasrec.source
    assert ml["sasrec"]["peer_ndcg@10"] == 0.0973 and ml["popularity"]["peer_ndcg@10"] == 0.0441
    assert ml["hstu"]["peer_ndcg@10"] is None  # the peer ran no HSTU
    assert ml["hstu"]["vs_peer_sasrec"] == pytest.approx(0.101 / 0.0973)
    assert ml["sasrec"]["vs_peer_sasrec"] == pytest.approx(0.091 / 0.0973)
    syn = summ.filter(pl.col("dataset") == "synthetic")
    assert syn["peer_ndcg@10"].is_null().all() and syn["vs_peer_sasrec"].is_null().all()
    assert train_stage.peer_table().height == len(train_stage.PEERS)


@pytest.mark.parametrize("hstu, met", [(0.0990, True), (0.0950, False)])
def test_report_checks_hstu_against_the_peer_sasrec(isolated_outputs, hstu, met):
    results.append_rows("train", _rows(hstu, 0.09, 0.04), load_config("smoke"))
    rows = report.claims("smoke").filter(pl.col("target") == "W1.peer")
    assert rows.height == 1 and rows["met"].to_list() == [met]
    mean = hstu + 0.001
    assert rows["ours"][0] == f"{mean / 0.0973:.2f}x ({mean:.4f} ± 0.0010, 3 seeds)"
    assert "RecBole 1.2.1 sasrec NDCG@10 0.0973" in rows["obtained"][0]
    assert claims.target("W1.peer").threshold == "HSTU NDCG@10 vs peer SASRec >= 1x"
    peers = {r["model"]: r["peer_ndcg@10"] for r in report.train_summary("smoke").iter_rows(named=True)}
    assert peers == {"hstu": None, "sasrec": 0.0973, "popularity": 0.0441}  # beside ours in the report's table


def test_report_without_ml100k_rows_says_the_peer_target_is_not_measured(isolated_outputs):
    results.append_rows("train", _rows(0.4, 0.39, 0.02, "synthetic"), load_config("smoke"))
    row = report.claims("smoke").filter(pl.col("target") == "W1.peer").row(0, named=True)
    assert row["verdict"] == "not measured yet" and row["met"] is None
