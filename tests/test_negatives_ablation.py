"""The negative-path ablation: its rows, its acceptance checks, and `python -m grlib bench negatives`."""
from __future__ import annotations

import json

import pytest

from grlib import results
from grlib.cli import main
from grlib.config import ConfigError, NegativesAblation, load_ablation
from grlib.experiments.negatives_stage import Variant, acceptance, variants


def test_variants_cover_the_grid_once_baseline_first():
    ab = NegativesAblation(shared_sizes=[128, 2048], half_formats=["fp16", "bf16"], samplers=["in-batch"])
    vs = variants(ab)
    names = [v.name for v in vs]
    assert len(names) == len(set(names)) and vs[0].baseline and vs[0].name == "per-token R=128 fp32 sync"
    assert {"shared R=128 fp32 sync", "shared R=2048 fp32 sync", "per-token R=128 fp16 sync",
            "shared R=2048 bf16 sync", "per-token R=128 fp32 async popularity",
            "per-token R=128 fp32 sync popularity", "shared R=2048 fp32 presampled popularity",
            "shared R=2048 fp32 sync in-batch"} <= set(names)
    assert not any(v.trains for v in vs if v.sampling != "sync")
    assert {v.name for v in vs if v.all_seeds} == {
        "per-token R=128 fp32 sync", "shared R=2048 fp32 sync", "per-token R=128 fp16 sync",
        "shared R=2048 fp16 sync", "per-token R=128 bf16 sync", "shared R=2048 bf16 sync"}
    neg = Variant("shared", 512, "bf16", "async").negatives(load_config_negatives())
    assert (neg.sharing, neg.n_negatives, neg.precision, neg.async_sampling) == ("shared", 512, "bf16", True)


def load_config_negatives():
    from grlib.config import load_config

    return load_config("smoke").negatives


def _row(variant: Variant, **figures) -> dict:
    return {"dataset": "toy", "variant": variant.name, "sharing": variant.sharing, "n_negatives": variant.n_negatives,
            "precision": variant.precision, "sampling": variant.sampling, "sampler": variant.sampler,
            "baseline": variant.baseline, "quality_seeds": "0,1,2", **figures}


def test_acceptance_reads_the_rows():
    ab = NegativesAblation(shared_sizes=[512, 2048], half_formats=["fp16"], samplers=[])
    rows = [
        _row(Variant("per-token", 128, baseline=True), step_ms=100, neg_path_mb=80, ndcg=0.1000),
        _row(Variant("shared", 512), step_ms=90, neg_path_mb=10, ndcg=0.11),
        _row(Variant("shared", 2048), step_ms=130, neg_path_mb=12, ndcg=0.12),
        _row(Variant("per-token", 128, "fp16"), step_ms=95, neg_path_mb=43, ndcg=0.1005),
        _row(Variant("shared", 2048, "fp16"), step_ms=120, neg_path_mb=12, ndcg=0.15),
        _row(Variant("per-token", 128, sampler="popularity"), step_ms=99, neg_path_mb=80, ndcg=0.1),
        _row(Variant("per-token", 128, sampler="popularity", sampling="presampled"), step_ms=90, neg_path_mb=80,
             ndcg=float("nan")),
        _row(Variant("per-token", 128, sampler="popularity", sampling="async"), step_ms=93, neg_path_mb=80,
             ndcg=float("nan")),
    ]
    negs = {512: 4.0, 2048: 16.0}
    for r in rows:
        r["ndcg@10"] = r.pop("ndcg")
        r["step_ratio"] = r["step_ms"] / 100
        r["negatives_ratio"] = negs.get(r["n_negatives"], 1.0) if r["sharing"] == "shared" else 1.0
    checks = {(c["check"].split(":")[0], c["row"]): c for c in acceptance(rows, ab)}
    sharing = checks[("sharing", "shared R=2048 fp32 sync")]  # the smallest pool with >= 8x
    assert not sharing["met"] and "16.0x negatives, 1.30x step" in sharing["figure"]
    assert checks[("fp16", "per-token R=128 fp16 sync")]["met"]  # 53.8% memory, 0.5% NDCG change
    assert not checks[("fp16", "shared R=2048 fp16 sync")]["met"]
    assert checks[("async", "per-token R=128 fp32 async popularity")]["figure"] == "1.033x (sync 1.100x)"


def test_ablation_grid_errors_name_the_field():
    with pytest.raises(ConfigError, match="ablations.negatives.half_formats"):
        load_ablation("negatives", {"half_formats": ["fp8"]})
    with pytest.raises(ConfigError, match="ablations.negatives.timing_steps"):
        load_ablation("negatives", {"timing_steps": 1})


def test_movielens_loads_for_the_ablation(real_data, isolated_outputs):
    from grlib.config import load_config
    from grlib.data.catalog import load_dataset

    ds = load_dataset(load_config("smoke"), "ml-100k")  # the catalogue, as the ablation's `measure` loads it
    data = ds.data
    assert data.n_users == 943 and data.n_items == 1682 + 2 and ds.mask_history
    assert data.train_item_counts().sum() > 943 * 25  # about max_len = 32 training targets per user


@pytest.mark.slow
def test_bench_negatives_smoke(isolated_outputs, capsys):
    out = isolated_outputs / "bench.json"
    code = main(["bench", "negatives", "--scale", "smoke", "--json", str(out), "--datasets", "synthetic",
                 "--shared-sizes", "2048", "--samplers", "in-batch", "--timing-steps", "2", "--timing-rounds", "1",
                 "--train-steps", "2", "--eval-users", "256"])
    assert code == 0
    rows = json.loads(out.read_text())
    by = {r["variant"]: r for r in rows}
    base = by["per-token R=64 fp32 sync"] if "per-token R=64 fp32 sync" in by else by["per-token R=128 fp32 sync"]
    assert base["step_ratio"] == 1.0 and base["memory_ratio"] == 1.0
    shared = by["shared R=2048 fp32 sync"]
    assert shared["negatives_ratio"] > 8 and shared["rows_ratio"] < 0.1  # R rows per batch, not P * R
    assert 0 <= shared["ndcg@10"] <= 1 and shared["train_steps"] == 2 and shared["eval_users"] == 256
    asyncs = [r for name, r in by.items() if name.startswith("per-token") and "async" in name]
    assert asyncs and all(r["queue_mb"] > 0 for r in asyncs)
    assert results.read_table("bench_negatives", adhoc=True).height == len(rows)  # no --record: ad-hoc
    printed = capsys.readouterr().out
    assert "bench negatives" in printed and "acceptance" in printed
