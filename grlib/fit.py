"""One training run, on 1 or N ranks: the model's negative path, optimizers, step and schedule
assembled in one place, trained by the loop (grlib.train.loop) and evaluated by full ranking.

    schedule = assemble(model, data, cfg.train, cfg.negatives)                   # one process
    schedule = assemble(model, data, cfg.train, cfg.negatives, runtime=rt, dist_cfg=dc)  # a rank of N
    result = train(model, data, cfg.train, max_len, cfg.negatives, runtime=rt, dist_cfg=dc)  # assemble, loop
    fit = fit_and_evaluate(cfg, ds, peak)      # build, train, validate, test -> Fit(row, curve, losses)
    fit_rank(runtime, cfg, "scale", dc)        # one rank's entry point (grlib.distributed.launch, torchrun)

Its callers: `python -m grlib train` (grlib.cli.train), the train stage, the semi-async stage,
`bench train` and the negatives stage. One process runs negatives.async_sampling's schedule
(grlib.train.prefetch: sync or prefetch); a rank of N (runtime of world > 1) starts from rank 0's
weights, shards the item table when dist_cfg.items asks for it and runs dist_cfg.schedule
(grlib.distributed.schedules) over its balanced share of every global batch (grlib.distributed.data_parallel).
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from grlib import perf, schedules
from grlib.config import Config, DistConfig, NegativesConfig, TrainConfig
from grlib.data.catalog import Dataset, load_dataset
from grlib.data.sequences import SequenceData
from grlib.distributed import data_parallel
from grlib.distributed.stream import CommStream
from grlib.distributed.sharded_embedding import shard_item_table
from grlib.distributed.topology import side_channel
from grlib.evaluate import evaluate, last_token_scores, popularity_scores
from grlib.model import build_model, parameter_count
from grlib.model.hstu import COMPUTE_DTYPES
from grlib.negatives import build_negative_path
from grlib.train import PHASES, TrainResult, loop
from grlib.train.optim import Optimizers
from grlib.train.prefetch import one_process


def assemble(model: nn.Module, data: SequenceData, cfg: TrainConfig, negatives: NegativesConfig, *,
             seed: int | None = None, runtime=None, dist_cfg: DistConfig | None = None):
    """The built schedule of one run's training of `model` (negative path seeded with `seed`, default
    cfg.seed): one process's, or with `runtime` of world N > 1 this rank's (grlib.distributed.schedules)."""
    seed = cfg.seed if seed is None else seed
    world = runtime.topology.world if runtime is not None else 1
    if world == 1:
        return one_process(model, data.n_items, data.train_item_counts(), cfg, negatives, seed)
    dc = dist_cfg or DistConfig(world=world)
    data_parallel.broadcast_parameters(model, runtime.world_group)
    if dc.items != "replicated":
        shard_item_table(model, runtime, dc.items, dc.dedup)
    path = build_negative_path(negatives, data.n_items, data.train_item_counts(), seed=seed)
    opt = Optimizers(model, cfg)
    topo = runtime.topology
    planner = data_parallel.Planner(path, topo.rank, topo.world, dc.balance, equal_counts=dc.equal_counts,
                                    cost=data_parallel.cost_function(dc, model.cfg), seed=seed)
    spec = schedules.get(dc.schedule)  # its class and traits (grlib.schedules)
    step = data_parallel.DataParallelStep(model, path, opt, runtime.world_group,
                                          bucket_bytes=dc.bucket_bytes if spec.bucketed else None)
    side = side_channel(runtime, dc.timeout_s) if step.tables and spec.side_channel else None
    stream = CommStream(side_channel(runtime, dc.timeout_s)) if step.tables and spec.stream else None
    return spec.ranks_class()(step, planner, dc.staleness, side, stream)


def train(model: nn.Module, data: SequenceData, cfg: TrainConfig, max_len: int, negatives: NegativesConfig, *,
          runtime=None, dist_cfg: DistConfig | None = None, **kwargs) -> TrainResult:
    """assemble, then grlib.train.loop.train (kwargs: validate, checkpoint_dir, flops_fn, ...)."""
    schedule = assemble(model, data, cfg, negatives, runtime=runtime, dist_cfg=dist_cfg)
    return loop.train(model, data, cfg, max_len, negatives, schedule=schedule, **kwargs)


@dataclass
class Fit:
    """What fit_and_evaluate returns: the result row, the learning-curve rows, every step's loss."""

    row: dict
    curve: list[dict] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


def fit_and_evaluate(cfg: Config, ds: Dataset, peak: float | None = None, *, checkpoint_dir: str | None = None,
                     checkpoint_every: int = 0, runtime=None, dist_cfg: DistConfig | None = None) -> Fit:
    """Trains cfg.model.name with cfg.train.seed on ds (validating every epoch, keeping the best epoch
    when cfg.train.select_best), then evaluates validation and test by full ranking. The one fit
    and evaluate of the train stage and `python -m grlib train` (which adds checkpoints: a run
    resumes only from a checkpoint of the same dataset, data and model settings)."""
    max_len, bs, data = cfg.data.max_len, cfg.train.eval_batch_size, ds.data
    val = lambda score: evaluate(score, data.eval_batches("val", bs, max_len), ds.mask_history)  # noqa: E731
    curve: list[dict] = []
    fit = None
    if cfg.model.name == "popularity":
        score = popularity_scores(data.train_item_counts())
        row = {"params": 0, "params_dense": 0, "steps": 0, "best_epoch": -1, "train_s": 0.0, "tokens_per_s": 0.0,
               "mfu": float("nan"), "attention_impl": "", "final_loss": float("nan"), "resumed_from": 0}
    else:
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model, data.n_items, max_len)
        count = parameter_count(model)  # before a data-parallel run shards the item table
        flops = lambda batch: perf.batch_flops(batch.offsets, cfg.model)  # noqa: E731
        start = time.perf_counter()
        fit = train(model, data, cfg.train, max_len, cfg.negatives, validate=lambda m: val(last_token_scores(m)),
                    flops_fn=flops, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                    identity=resume_identity(cfg, ds.name) if checkpoint_dir else None,
                    runtime=runtime, dist_cfg=dist_cfg)
        wall = time.perf_counter() - start
        score = last_token_scores(model)
        useful = sum(r["flops"] for r in fit.timeline)
        row = {"params": count.total, "params_dense": count.dense, "steps": fit.steps, "best_epoch": fit.best_epoch,
               "train_s": wall, "tokens_per_s": fit.tokens_per_s,
               "mfu": perf.mfu(useful, fit.seconds, peak) if peak and fit.seconds else float("nan"),
               "attention_impl": model.attention_impl() if cfg.model.name == "hstu" else "torch-sdpa",
               "final_loss": fit.losses[-1] if fit.losses else float("nan"), "resumed_from": fit.resumed_from}
        if runtime is not None and runtime.topology.world > 1:
            row.update(_dist_figures(fit.timeline, dist_cfg or DistConfig(world=runtime.topology.world)))
        curve = [{"step": r["step"], "epoch": r["epoch"], "loss": r["loss"],
                  **({"stale_fraction": r["stale_fraction"]} if "stale_fraction" in r else {})} for r in fit.timeline]
        curve += [{"step": h["step"], "epoch": h["epoch"], "val_ndcg@10": h["ndcg@10"]} for h in fit.val_history]
    best = [h for h in (fit.val_history if fit else []) if h["epoch"] == fit.best_epoch]
    if cfg.train.select_best and best:  # the restored best epoch's validation
        v = {k: x for k, x in best[0].items() if k not in ("epoch", "step")}
    else:
        v = val(score)
    t = evaluate(score, data.eval_batches("test", bs, max_len), ds.mask_history)
    row.update(mask_history=ds.mask_history, repeat_fraction=ds.repeat_fraction,
               **{f"val_{k}": x for k, x in v.items()}, **{f"test_{k}": x for k, x in t.items()})
    return Fit(row, curve, list(fit.losses) if fit else [])


def _dist_figures(timeline: list[dict], dist_cfg: DistConfig) -> dict:
    """This rank's figures of a data-parallel run: the layout, the balancer, the share of step time
    spent inside the gradient all-reduce (waiting for the slowest rank, then the transfer)."""
    step_s = sum(sum(r[f"{p}_s"] for p in PHASES) for r in timeline)
    wait = sum(r.get("allreduce_s", 0.0) for r in timeline)
    return {"world": dist_cfg.world, "nodes": dist_cfg.nodes, "balance": dist_cfg.balance, "items": dist_cfg.items,
            "allreduce_fraction": wait / step_s if step_s else float("nan"),
            "step_ms": 1e3 * step_s / len(timeline) if timeline else float("nan"),
            "items_inter_mb_per_step": _per_step_mb(timeline, "items_inter_bytes"),
            "items_intra_mb_per_step": _per_step_mb(timeline, "items_intra_bytes")}


def _per_step_mb(timeline: list[dict], key: str) -> float:
    return sum(r.get(key, 0.0) for r in timeline) / 2**20 / len(timeline) if timeline else float("nan")


def fit_rank(runtime, cfg: Config, dataset: str, dist_cfg: DistConfig, checkpoint_dir: str | None = None,
             checkpoint_every: int = 0, measure_peak: bool = True) -> dict:
    """One rank of `python -m grlib train --world N` (or under torchrun): loads the data (rank 0
    first, so a dataset and its flat arrays are prepared once; with N > 1 ranks each reads only the
    sequences it trains, grlib.data.share), fits, evaluates. Returns {"row", "losses", "rank"}."""
    if runtime.topology.rank != 0:
        os.environ["GRLIB_PROGRESS"] = "0"  # one progress bar: rank 0's
        runtime.barrier()
    ds = load_dataset(cfg, dataset, share=runtime.topology.world > 1)  # each rank reads its share
    if runtime.topology.rank == 0:
        runtime.barrier()
    peak = model_peak(cfg) if measure_peak else None
    fit = fit_and_evaluate(cfg, ds, peak, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                           runtime=runtime, dist_cfg=dist_cfg)
    return {"rank": runtime.topology.rank, "dataset": ds.name, "row": fit.row, "losses": fit.losses}


def model_peak(cfg: Config) -> float | None:
    """The GEMM peak (FLOP/s) in cfg.model.precision's dtype, measured now; None for popularity (no FLOPs)."""
    return perf.peak_flops(COMPUTE_DTYPES[cfg.model.precision]) if cfg.model.name != "popularity" else None


def resume_identity(cfg: Config, dataset: str) -> dict:
    """The settings a checkpoint must share to be resumed (besides train.* and negatives.*, which the
    loop checks): the dataset, the data settings and the model (any attention implementation: they
    compute the same function)."""
    data = {k: v for k, v in dataclasses.asdict(cfg.data).items() if k != "bucket_rows"}
    model = {k: v for k, v in dataclasses.asdict(cfg.model).items() if k != "attention_impl"}
    return {"dataset": dataset, "data": data, "model": model}
