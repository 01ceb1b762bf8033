"""Negative path: per-token baseline vs shared pools, FP32 vs FP16/BF16, sync vs async vs pre-sampled.

Runs the `ablations.negatives` grid of params.yaml (flags override single fields) on the scale's
synthetic twin and MovieLens-100K: step ms, negative-path memory, negatives per token, embedding
rows per step and NDCG@10 after a fixed budget, with ratios against the per-token baseline
measured in the same run (the negatives stage's method: grlib.experiments.negatives_stage). Rows
record the OpenMP wait policy and threads (grlib.threads: PASSIVE waiting, so a busy machine does
not stall the run) and go to the bench_negatives table (ad-hoc unless --record).
"""
from __future__ import annotations

import argparse

from grlib import results, threads
from grlib.bench.common import positive_int, print_table, set_threads, thread_columns
from grlib.config import config_from_args, load_ablation

COLUMNS = {  # printed name: row key
    "dataset": "dataset", "variant": "variant", "step_ms": "step_ms", "step_x": "step_ratio",
    "mem_mb": "neg_path_mb", "mem_x": "memory_ratio", "queue_mb": "queue_mb", "P": "tokens_per_batch",
    "neg/tok": "negatives_per_token", "neg_x": "negatives_ratio", "distinct/tok": "distinct_negatives_per_token",
    "rows/step": "rows_per_step", "rows_x": "rows_ratio", "ndcg@10": "ndcg@10", "std": "ndcg@10_std",
    "seeds": "quality_seeds",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--datasets", nargs="+", default=None, help="synthetic and/or ml-100k")
    p.add_argument("--seeds", nargs="+", type=int, default=None, help="quality seeds of the precision rows")
    p.add_argument("--shared-sizes", nargs="+", type=int, default=None)
    p.add_argument("--half-formats", nargs="+", default=None, help="fp16 and/or bf16")
    p.add_argument("--samplers", nargs="+", default=None, help="extra shared-pool samplers (popularity, in-batch)")
    p.add_argument("--train-steps", type=int, default=None, help="fixed training budget per row")
    p.add_argument("--eval-users", type=int, default=None, help="users ranked per quality run (0 = all)")
    p.add_argument("--timing-steps", type=int, default=None)
    p.add_argument("--timing-rounds", type=int, default=None)
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch intra-op threads (default: grlib's, see grlib.threads)")


def grid_overrides(args: argparse.Namespace) -> dict:
    names = ["datasets", "seeds", "shared_sizes", "half_formats", "samplers", "train_steps", "eval_users",
             "timing_steps", "timing_rounds"]
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def run(args: argparse.Namespace) -> list[dict]:
    from grlib.experiments import negatives_stage

    set_threads(args.threads)
    cfg = config_from_args(args)
    ab = load_ablation("negatives", grid_overrides(args))
    rows, notes = negatives_stage.measure(cfg, ab)
    for note in notes:
        print(f"note: {note}")
    if not rows:
        raise SystemExit("bench negatives: no dataset could be loaded")
    for r in rows:
        r.update(thread_columns())
    print_table([{name: r[key] for name, key in COLUMNS.items()} for r in rows],
                f"bench negatives: scale {cfg.scale}, model {cfg.model.name} {cfg.model.n_layers}x{cfg.model.n_heads} "
                f"d={cfg.model.d_model}, batch {cfg.train.batch_size} x max_len {cfg.data.max_len}, "
                f"{threads.describe()}; ratios vs the per-token R={ab.baseline_negatives} FP32 baseline")
    print_table(negatives_stage.acceptance(rows, ab), "acceptance checks: shared pools, half precision, async sampling")
    results.append_rows("bench_negatives", rows, cfg)
    return rows
