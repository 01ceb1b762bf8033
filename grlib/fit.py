"""One training run, on 1 or N ranks: the model's negative path, optimizers, step and schedule
assembled in one place, trained by the loop (grlib.train.loop) and evaluated by full ranking.
Every setting comes from one Config: cfg.train and cfg.negatives, and on N ranks cfg.dist.

    schedule = assemble(model, data, cfg)                  # one process (cfg.dist.world 1)
    schedule = assemble(model, data, cfg, runtime=rt)      # this rank of cfg.dist.world
    result = train(model, data, cfg, runtime=rt)           # assemble, then the loop
    fit = fit_and_evaluate(cfg, ds, peak)                  # build, train, validate, test -> Fit(row, curve, losses)
    got = fit_distributed(cfg, "scale")                    # cfg.dist.world ranks started here (or under torchrun)
    fit_rank(runtime, cfg, "scale")                        # one rank's entry (the fn launch runs on every rank)

Its callers: `python -m grlib train` (grlib.cli.train: fit_and_evaluate, fit_distributed), the train
stage (fit_and_evaluate), the semi-async stage (fit_and_evaluate on each of its ranks), the balance
stage and the scaling stage's measured runs (grlib.experiments.scaling.measured: train on each
rank), the negatives stage (assemble, train), `bench train` (grlib.experiments.mfu_steps: assemble)
and `bench load` (grlib.experiments.load: train). One process runs negatives.async_sampling's
schedule (grlib.train.prefetch: sync or prefetch); a rank of N starts from rank 0's weights, shards
the item table when cfg.dist.items asks for it and runs cfg.dist.schedule (grlib.distributed.schedules)
over its balanced share of every global batch (grlib.distributed.data_parallel).

`--balance kk` from the command line to the planner (the same name all the way):

    grlib.cli.train     --balance kk is the override dist.balance=kk; load_config -> cfg.dist.balance
    grlib.fit           fit_distributed(cfg): launch(fit_rank, cfg.dist.world, args=(cfg, ...)), or fit_rank
                        on this rank under torchrun; fit_rank -> fit_and_evaluate -> train -> assemble
    grlib.distributed   Planner(path, rank, world, cfg.dist.balance) -> balance.assign(costs, world, "kk")
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from grlib import perf, schedules
from grlib.config import Config, ConfigError, DistConfig
from grlib.data.catalog import Dataset, load_dataset
from grlib.data.sequences import SequenceData
from grlib.distributed import data_parallel
from grlib.distributed.schedules import rank_schedule
from grlib.distributed.stream import CommStream
from grlib.distributed.sharded_embedding import shard_item_table
from grlib.distributed.topology import side_channel
from grlib.evaluate import evaluate, last_token_scores, popularity_scores
from grlib.model import build_model, parameter_count
from grlib.model.hstu import COMPUTE_DTYPES
from grlib.negatives import build_negative_path
from grlib.train import PHASES, TrainResult, checkpoint, loop
from grlib.train.optim import Optimizers
from grlib.train.prefetch import one_process


def assemble(model: nn.Module, data: SequenceData, cfg: Config, *, seed: int | None = None, runtime=None):
    """The built schedule of one run's training of `model` (negative path seeded with `seed`, default
    cfg.train.seed): one process's, or with `runtime` this rank's of cfg.dist.world (grlib.distributed.schedules)."""
    seed = cfg.train.seed if seed is None else seed
    world = _check_layout(cfg.dist, runtime)
    if world == 1:
        return one_process(model, data.n_items, data.train_item_counts(), cfg.train, cfg.negatives, seed)
    dc = cfg.dist
    data_parallel.broadcast_parameters(model, runtime.world_group)
    if dc.items != "replicated":
        shard_item_table(model, runtime, dc.items, dc.dedup)
    path = build_negative_path(cfg.negatives, data.n_items, data.train_item_counts(), seed=seed)
    opt = Optimizers(model, cfg.train)
    topo = runtime.topology
    planner = data_parallel.Planner(path, topo.rank, topo.world, dc.balance, equal_counts=dc.equal_counts,
                                    cost=data_parallel.cost_function(dc, model.cfg), seed=seed)
    spec = schedules.get(dc.schedule)  # its class and traits (grlib.schedules)
    step = data_parallel.DataParallelStep(model, path, opt, runtime.world_group,
                                          bucket_bytes=dc.bucket_bytes if spec.bucketed else None)
    side = side_channel(runtime, dc.timeout_s) if step.tables and spec.side_channel else None
    stream = CommStream(side_channel(runtime, dc.timeout_s)) if step.tables and spec.stream else None
    return rank_schedule(dc.schedule)(step, planner, dc.staleness, side, stream)


def _check_layout(dc: DistConfig, runtime) -> int:
    """The world the run trains on: cfg.dist's, which must be the runtime's (1 without one)."""
    if runtime is None:
        if dc.world > 1:
            raise ValueError(f"dist.world={dc.world} but no runtime: a rank of N trains through fit_rank "
                             "(fit_distributed starts the ranks)")
        return 1
    topo = runtime.topology
    if (dc.world, dc.nodes) != (topo.world, topo.nodes):
        raise ValueError(f"dist.world={dc.world}, dist.nodes={dc.nodes} but the runtime has world {topo.world}, "
                         f"nodes {topo.nodes}: set them to the runtime's")
    return topo.world


def train(model: nn.Module, data: SequenceData, cfg: Config, max_len: int | None = None, *, runtime=None,
          **kwargs) -> TrainResult:
    """assemble, then grlib.train.loop.train on batches of at most `max_len` (default cfg.data.max_len)
    tokens (kwargs: validate, checkpoint_dir, flops_fn, ...)."""
    schedule = assemble(model, data, cfg, runtime=runtime)
    max_len = cfg.data.max_len if max_len is None else max_len
    return loop.train(model, data, cfg.train, max_len, cfg.negatives, schedule=schedule, **kwargs)


@dataclass
class Fit:
    """What fit_and_evaluate returns: the result row, the learning-curve rows, every step's loss."""

    row: dict
    curve: list[dict] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


def fit_and_evaluate(cfg: Config, ds: Dataset, peak: float | None = None, *, checkpoint_dir: str | None = None,
                     checkpoint_every: int = 0, runtime=None) -> Fit:
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
        fit = train(model, data, cfg, max_len, validate=lambda m: val(last_token_scores(m)),
                    flops_fn=flops, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                    identity=resume_identity(cfg, ds.name) if checkpoint_dir else None, runtime=runtime)
        wall = time.perf_counter() - start
        score = last_token_scores(model)
        useful = sum(r["flops"] for r in fit.timeline)
        row = {"params": count.total, "params_dense": count.dense, "steps": fit.steps, "best_epoch": fit.best_epoch,
               "train_s": wall, "tokens_per_s": fit.tokens_per_s,
               "mfu": perf.mfu(useful, fit.seconds, peak) if peak and fit.seconds else float("nan"),
               "attention_impl": model.attention_impl() if cfg.model.name == "hstu" else "torch-sdpa",
               "final_loss": fit.losses[-1] if fit.losses else float("nan"), "resumed_from": fit.resumed_from}
        if runtime is not None and runtime.topology.world > 1:
            row.update(_dist_figures(fit.timeline, cfg.dist))
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


def _dist_figures(timeline: list[dict], dc: DistConfig) -> dict:
    """This rank's figures of a data-parallel run: the layout, the balancer, the share of step time
    spent inside the gradient all-reduce (waiting for the slowest rank, then the transfer)."""
    step_s = sum(sum(r[f"{p}_s"] for p in PHASES) for r in timeline)
    wait = sum(r.get("allreduce_s", 0.0) for r in timeline)
    return {"world": dc.world, "nodes": dc.nodes, "balance": dc.balance, "items": dc.items,
            "allreduce_fraction": wait / step_s if step_s else float("nan"),
            "step_ms": 1e3 * step_s / len(timeline) if timeline else float("nan"),
            "items_inter_mb_per_step": _per_step_mb(timeline, "items_inter_bytes"),
            "items_intra_mb_per_step": _per_step_mb(timeline, "items_intra_bytes")}


def _per_step_mb(timeline: list[dict], key: str) -> float:
    return sum(r.get(key, 0.0) for r in timeline) / 2**20 / len(timeline) if timeline else float("nan")


def fit_rank(runtime, cfg: Config, dataset: str, checkpoint_dir: str | None = None, checkpoint_every: int = 0,
             measure_peak: bool = True) -> dict:
    """One rank of `python -m grlib train --world N` (or under torchrun): loads the data (rank 0
    first, so a dataset and its flat arrays are prepared once; with N > 1 ranks each reads only the
    sequences it trains, grlib.data.share), fits, evaluates. Returns {"rank", "dataset", "row", "losses"}."""
    if runtime.topology.rank != 0:
        os.environ["GRLIB_PROGRESS"] = "0"  # one progress bar: rank 0's
        runtime.barrier()
    ds = load_dataset(cfg, dataset, share=runtime.topology.world > 1)  # each rank reads its share
    if runtime.topology.rank == 0:
        runtime.barrier()
    peak = model_peak(cfg) if measure_peak else None
    fit = fit_and_evaluate(cfg, ds, peak, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                           runtime=runtime)
    return {"rank": runtime.topology.rank, "dataset": ds.name, "row": fit.row, "losses": fit.losses}


def fit_distributed(cfg: Config, dataset: str, checkpoint_dir: str | None = None,
                    checkpoint_every: int = 0) -> dict | None:
    """A run on cfg.dist.world ranks -> rank 0's fit_rank result. Under torchrun (WORLD_SIZE > 1) this
    process is one rank (None unless rank 0: rank 0 reports), cfg.dist's world and nodes set from
    torchrun's variables; otherwise cfg.dist.world processes start here (grlib.distributed.launch),
    after the dataset is prepared once and dist.cost 'quadratic' without coefficients calibrated."""
    from grlib.distributed.launch import launch
    from grlib.distributed.topology import Topology, init_runtime

    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    if env_world > 1:
        topo = Topology.from_env()
        if cfg.dist.world not in (1, env_world):
            raise ConfigError(f"--world (dist.world) = {cfg.dist.world} but torchrun started WORLD_SIZE={env_world} "
                              f"ranks; leave --world out under torchrun")
        cfg = calibrated(cfg.replace({"dist.world": env_world, "dist.nodes": topo.nodes}), launcher=False)
        with init_runtime(topo, backend=cfg.dist.backend, timeout_s=cfg.dist.timeout_s) as runtime:
            got = fit_rank(runtime, cfg, dataset, checkpoint_dir, checkpoint_every)
        return got if topo.rank == 0 else None
    if checkpoint_dir:  # a rank's file that is not data: refused here in one line, before any rank starts
        checkpoint.vet_rank_files(checkpoint_dir, cfg.dist.world)
    cfg = calibrated(cfg)  # the row's params_hash covers the coefficients
    load_dataset(cfg, dataset)  # prepared here once, before the ranks read it
    return launch(fit_rank, cfg.dist.world, nodes=cfg.dist.nodes, backend=cfg.dist.backend,
                  args=(cfg, dataset, checkpoint_dir, checkpoint_every),
                  timeout_s=max(cfg.dist.timeout_s, 3600.0))[0]


def calibrated(cfg: Config, launcher: bool = True) -> Config:
    """cfg, with dist.cost 'quadratic' and no dist.quadratic given calibrated first (c0, a, b of one
    HSTU layer of cfg.model, timed at lengths 16 .. data.max_len; grlib.distributed.cost) by the
    launching process: the ranks plan alike only on equal coefficients."""
    import numpy as np

    from grlib.distributed.cost import calibrate_layer, fit_quadratic

    if cfg.dist.cost != "quadratic" or cfg.dist.quadratic:
        return cfg
    if not launcher:  # each torchrun rank would time its own coefficients
        raise ConfigError("--cost quadratic: calibrated by the launching process; under torchrun give "
                          "-o dist.quadratic=[c0,a,b], use --cost flops or tokens, or start the ranks here "
                          "with --world N")
    if cfg.model.name != "hstu":
        raise ConfigError(f"--cost quadratic: calibrated on an HSTU layer; --model {cfg.model.name} needs "
                          f"--cost flops or tokens")
    lengths = sorted({int(round(x)) for x in np.geomspace(16, max(cfg.data.max_len, 64), 6)})
    points = calibrate_layer(cfg.model, lengths, repeats=3)
    fit = fit_quadratic([p["length"] for p in points], [p["seconds_per_sequence"] for p in points])
    print(f"--cost quadratic: calibrated c0={fit.c0:.3g} a={fit.a:.3g} b={fit.b:.3g} s (r2 {fit.r2:.3f}) on one "
          f"HSTU layer at lengths {lengths}", file=sys.stderr, flush=True)
    return cfg.replace({"dist.quadratic": [fit.c0, fit.a, fit.b]})


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
