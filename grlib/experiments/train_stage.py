"""Stage `train` (notebooks/02_train): every model x seed of the ablation, trained and evaluated."""
from __future__ import annotations

import polars as pl
import torch

from grlib import results
from grlib.config import Config, TrainAblation
from grlib.data.sequences import SequenceData
from grlib.evaluate import evaluate, last_token_scores, popularity_scores
from grlib.experiments.data_stage import processed_dir
from grlib.model import build_model, count_parameters
from grlib.train import train


def run_one(cfg: Config, data: SequenceData) -> dict:
    """Trains cfg.model.name with cfg.train.seed; returns val/test metrics and speed."""
    max_len, bs = cfg.data.max_len, cfg.train.eval_batch_size
    if cfg.model.name == "popularity":
        score = popularity_scores(data.train_item_counts())
        row = {"params": 0, "steps": 0, "train_s": 0.0, "tokens_per_s": 0.0, "final_loss": float("nan")}
    else:
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model, data.n_items)
        fit = train(model, data, cfg.train, max_len, cfg.negatives)
        score = last_token_scores(model)
        row = {"params": count_parameters(model), "steps": fit.steps, "train_s": fit.seconds,
               "tokens_per_s": fit.tokens_per_s, "final_loss": fit.losses[-1] if fit.losses else float("nan")}
    val = evaluate(score, data.eval_batches("val", bs, max_len))
    test = evaluate(score, data.eval_batches("test", bs, max_len))
    return {**row, **{f"val_{k}": v for k, v in val.items()}, **{f"test_{k}": v for k, v in test.items()}}


def run(cfg: Config, ablation: TrainAblation) -> pl.DataFrame:
    data = SequenceData.load(processed_dir(cfg))
    rows = []
    for model in ablation.models:
        for seed in ablation.seeds:
            run_cfg = cfg.replace({"model.name": model, "train.seed": seed})
            rows.append({"model": model, "seed": seed, **run_one(run_cfg, data)})
    table = results.append_rows("train", rows, cfg)
    summary = (table.group_by("model").agg(pl.col("test_ndcg@10").mean(), pl.col("test_hr@10").mean())
               .sort("model"))
    results.write_metrics("train", {"scale": cfg.scale, **{
        r["model"]: {"test_ndcg@10": r["test_ndcg@10"], "test_hr@10": r["test_hr@10"]}
        for r in summary.iter_rows(named=True)}})
    return table
