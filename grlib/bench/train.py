"""Training step throughput and MFU of HSTU at a scale, for every attention implementation.

MFU = useful FLOPs (grlib.perf, recsys-examples' HSTU formula on the real lengths) per second of
whole training steps (data, forward, loss, backward, optimizer) / a peak, two ways in every row:
`mfu` against the fp32 GEMM peak measured warm in the same run (perf.measured_peak: the best GEMM
library, before and after the steps; the higher one is used), `mfu_nominal` against the nominal
peak (grlib.hardware: cores x FLOP per cycle x clock, each source printed). The paper's 54.71%
compares with `mfu_nominal` (a device's nominal peak: NVIDIA's convention, most likely the
paper's). Each row also records the load average when it was measured (`load_1m`): on a shared
machine the step's wall time grows with the load, the on-CPU GEMM peak does not.
The baselines of the same run: the `reference` (padded) attention, and the model's own projection
GEMM shapes timed alone (`gemm_share_of_peak`: what the projections reach by themselves). `mfu_with_loss` adds the
sampled softmax's logit products (perf.loss_flops), which the HSTU formula leaves out. Rows record
the OpenMP wait policy and threads (grlib.threads) and go to results/tables/bench_train.parquet.
"""
from __future__ import annotations

import argparse
import os
import statistics
from contextlib import closing

import numpy as np
import torch

from grlib import hardware, ops, perf, results, threads
from grlib.bench.common import positive_int, print_table, set_threads, thread_columns
from grlib.config import config_from_args
from grlib.data.catalog import load_dataset
from grlib.experiments.measure import median_ms
from grlib.model import build_model, parameter_count
from grlib.negatives import build_negative_path
from grlib.train.optim import Optimizers
from grlib.train.prefetch import build_schedule
from grlib.train.step import PHASES, TrainStep


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=8, help="timed training steps per implementation")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--impls", default="all", help="comma-separated hstu_attention impls (default: all that run on CPU)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads (default: grlib's, see grlib.threads)")


def _batches(cfg, n: int):
    data = load_dataset(cfg, "scale").data
    it = data.train_batches(cfg.train.batch_size, cfg.data.max_len, np.random.default_rng(cfg.train.seed))
    batches = []
    while len(batches) < n:
        batch = next(it, None)
        if batch is None:
            it = data.train_batches(cfg.train.batch_size, cfg.data.max_len, np.random.default_rng(len(batches)))
            continue
        batches.append(batch)
    return data, batches


def _time_steps(cfg, data, batches, warmup: int) -> list[dict]:
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, data.n_items, cfg.data.max_len)
    model.train()
    path = build_negative_path(cfg.negatives, data.n_items, data.train_item_counts(), seed=cfg.train.seed)
    step = TrainStep(model, path, Optimizers(model, cfg.train))
    records = []
    with closing(build_schedule(step, cfg.negatives).run(batches)) as steps:
        for i, out in enumerate(steps):
            if i >= warmup:
                P = int((out.batch.targets > 0).sum())
                records.append({"tokens": out.batch.item_ids.numel(),
                                "flops": perf.batch_flops(out.batch.offsets, cfg.model),
                                "loss_flops": perf.loss_flops(P, cfg.negatives.n_negatives, cfg.model.d_model),
                                **{f"{p}_s": out.seconds[p] for p in PHASES if p != "data"}})
    return records


def _gemm_share(T: int, d: int, peak: float) -> float:
    """FLOP/s of the layer's projection GEMMs at this batch's shape ([T, d] x [d, 4d], [T, d] x [d, d]) / peak."""
    x, w1, w2 = torch.randn(T, d), torch.randn(d, 4 * d), torch.randn(d, d)
    ms = median_ms(lambda: (x @ w1, x @ w2), repeats=5, warmup=2)
    return 2 * T * d * 5 * d / (ms / 1e3) / peak


def run(args: argparse.Namespace) -> list[dict]:
    set_threads(args.threads)
    cfg = config_from_args(args, {"model.name": "hstu"})  # -o model.d_model=512: MFU at another shape
    impls = ops.runnable("hstu_attention", "cpu") if args.impls == "all" else tuple(args.impls.split(","))
    auto = ops.choose("hstu_attention", "cpu", "auto")
    data, batches = _batches(cfg, args.warmup + args.steps)
    nominal = hardware.nominal_peak("float32", threads=torch.get_num_threads())
    with perf.measured_peak() as measured:
        timed = {impl: _time_steps(cfg.replace({"model.attention_impl": impl}), data, batches, args.warmup)
                 for impl in impls}
    peaks, peak = (measured.before, measured.after), measured.flops
    load = os.getloadavg()[0]
    T = int(np.mean([b.item_ids.numel() for b in batches]))
    gemm = _gemm_share(T, cfg.model.d_model, peak)
    count = parameter_count(build_model(cfg.model, data.n_items, cfg.data.max_len, device="meta"))
    rows, base = [], None
    for impl, recs in timed.items():
        step_s = [sum(r[f"{p}_s"] for p in PHASES if p != "data") for r in recs]
        total_s, flops, loss_flops = sum(step_s), sum(r["flops"] for r in recs), sum(r["loss_flops"] for r in recs)
        step_ms = statistics.median(step_s) * 1e3
        base = step_ms if impl == "reference" else base
        rows.append({
            "attention_impl": impl, "auto": impl == auto, "d_model": cfg.model.d_model, "n_layers": cfg.model.n_layers,
            "n_heads": cfg.model.n_heads, "batch": cfg.train.batch_size, "max_len": cfg.data.max_len,
            "params": count.total, "tokens_per_step": T, "real_fraction": T / (cfg.train.batch_size * cfg.data.max_len),
            "flops_per_step": flops / len(recs), "step_ms": step_ms, "tokens_per_s": sum(r["tokens"] for r in recs) / total_s,
            **{f"{p}_share": sum(r[f"{p}_s"] for r in recs) / total_s for p in PHASES if p != "data"},
            "peak_flops": peak, "peak_before": peaks[0], "peak_after": peaks[1], "gemm_share_of_peak": gemm,
            **{f"peak_{lib}": v for lib, v in measured.per_library.items()},
            "nominal_peak_flops": nominal.flops, "nominal_peak_how": nominal.how,
            "mfu": perf.mfu(flops, total_s, peak), "mfu_nominal": perf.mfu(flops, total_s, nominal.flops),
            **thread_columns(), "load_1m": load,
            "loss_flops_per_step": loss_flops / len(recs), "mfu_with_loss": perf.mfu(flops + loss_flops, total_s, peak),
            "mfu_with_loss_nominal": perf.mfu(flops + loss_flops, total_s, nominal.flops),
        })
    for row in rows:
        row["speedup_vs_reference"] = base / row["step_ms"] if base else float("nan")
    print_table([{k: r[k] for k in ("attention_impl", "auto", "tokens_per_step", "step_ms", "tokens_per_s",
                                    "forward_share", "loss_share", "backward_share", "optimizer_share",
                                    "gemm_share_of_peak", "mfu", "mfu_nominal", "mfu_with_loss",
                                    "speedup_vs_reference")} for r in rows],
                f"bench train: scale {cfg.scale}, HSTU {cfg.model.n_layers}x{cfg.model.n_heads} d={cfg.model.d_model}, "
                f"{count}; batch {cfg.train.batch_size} x max_len {cfg.data.max_len}; {args.steps} timed steps "
                f"each; {threads.describe()}; load average {load:.2f}\n"
                f"mfu: against the {measured.describe()}\n"
                f"mfu_nominal: against the {nominal.describe()}\n"
                f"The paper's 54.71% MFU compares with mfu_nominal (a nominal peak, NVIDIA's convention).")
    results.append_rows("bench_train", rows, cfg)
    return rows
