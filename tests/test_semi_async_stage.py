"""The semi-async stage (claim C4): its grid, its verdicts from synthetic rows, the train stage's
curve carrying the stale fraction; the notebook (nbmake) runs the quick grid on 2 gloo ranks."""
from __future__ import annotations

import polars as pl
import pytest

from grlib.config import ConfigError, load_ablation
from grlib.experiments import semi_async_stage


def test_the_grid_refuses_bad_values():
    with pytest.raises(ConfigError, match="staleness"):
        load_ablation("semi_async", {"staleness": [1, 2]})  # no sync baseline
    with pytest.raises(ConfigError, match="max_steps"):
        load_ablation("semi_async", {"max_steps": [10]})
    with pytest.raises(ConfigError, match="items"):
        load_ablation("semi_async", {"items": "replicated"})
    with pytest.raises(ConfigError, match=r"ablations.semi_async.overrides.ml-100k: .*no_such_key"):
        load_ablation("semi_async", {"overrides": {"ml-100k": {"model.no_such_key": 1}}})
    with pytest.raises(ConfigError, match="not a dataset"):
        load_ablation("semi_async", {"overrides": {"ml-1b": {"model.d_model": 64}}})


def test_runs_cover_the_grid_and_the_worst_case():
    ab = load_ablation("semi_async")
    runs = semi_async_stage.runs(ab)
    grid = [r for r in runs if r["case"] == "grid"]
    assert len(grid) == len(ab.staleness) * len(ab.seeds) * len(ab.datasets)
    worst = [r for r in runs if r["case"] == "worst"]
    assert [r["k"] for r in worst] == ab.worst_staleness
    assert all(r["overrides"] == {"data.n_items": ab.worst_items, "train.lr": ab.worst_lr} for r in worst)
    # each dataset trains with the train stage's own settings (params.yaml: one anchor for both)
    train = load_ablation("train")
    for r in grid:
        assert r["overrides"] == train.dataset_overrides(r["dataset"])
    assert any(r["overrides"] for r in grid), "params.yaml gives ML-100K its train-stage settings"


def _final(dataset: str, k: int, values: list[float]) -> list[dict]:
    return [{"part": "final", "dataset": dataset, "case": "grid", "k": k, "seed": s, "lr": 1e-3, "n_items": 100,
             "test_ndcg@10": v, "test_hr@10": 0.3, "val_ndcg@10": v, "stale_fraction": 0.1 * k}
            for s, v in enumerate(values)]


def test_acceptance_is_within_one_seed_std_or_one_percent():
    rows = (_final("a", 0, [0.40, 0.42, 0.41]) + _final("a", 1, [0.405, 0.415, 0.41])  # within std
            + _final("a", 2, [0.30, 0.31, 0.32]) + _final("a", 4, [0.2, 0.2, 0.2])       # too far; k=4: no verdict
            + _final("b", 0, [0.1, 0.1, 0.1]) + _final("b", 1, [0.1005, 0.1005, 0.1005]))  # std 0, 0.5% relative
    checks = {(r["dataset"], r["k"]): r for r in semi_async_stage.acceptance(pl.DataFrame(rows)).iter_rows(named=True)}
    assert checks[("a", 1)]["met"] is True and checks[("a", 2)]["met"] is False
    assert checks[("a", 4)]["met"] is None and checks[("b", 1)]["met"] is True
    assert checks[("a", 2)]["gap"] == pytest.approx(-0.1)
