"""The training stage end to end at the smoke scale, through grlib (what 02_train calls)."""
from __future__ import annotations

import math

from grlib import results
from grlib.config import load_ablation, load_config
from grlib.experiments import data_stage, report, train_stage


def test_smoke_stage_chain(isolated_outputs):
    cfg = load_config("smoke")
    data_stage.run(cfg)
    table = train_stage.run(cfg, load_ablation("train", {"seeds": [0]}))
    assert set(table["model"]) == {"hstu", "sasrec", "popularity"}
    for row in table.iter_rows(named=True):
        assert 0 <= row["test_ndcg@10"] <= 1 and row["test_users"] > 0
        if row["model"] != "popularity":
            assert row["steps"] > 0 and math.isfinite(row["final_loss"]) and row["params"] > 0
    out = report.run()
    assert out["summary"].height == 3 and all(p.exists() for p in out["figures"])
    assert results.read_table("train").height == 3
