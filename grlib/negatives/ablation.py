"""The speed / memory / quality ablation of the negative path (stage 04 and `bench negatives`).

For each dataset (the scale's synthetic twin, MovieLens-100K when its file is present) and each
variant of NegativesAblation (see `variants`), one row:

  step_ms        median wall time of the trainer's step (grlib.train.step: model forward, path.loss,
                 backward, the trainer's optimizers), measured as the interval between consecutive step ends, so waiting
                 for the async worker counts; every variant runs the same fixed batches, in
                 interleaved rounds (the first step of each round is dropped as warm-up)
  neg_path_mb    peak memory of the negative path: sampling + path.loss forward + backward on the
                 batch with the most target tokens, with the user vectors and the item table as
                 inputs made beforehand (grlib.negatives.memory: every tensor created inside is
                 counted while alive: ids, looked-up rows, logits, gradients)
  queue_mb       async only: host bytes of the samples the worker holds ahead (queue_depth batches)
  negatives_per_token / distinct_negatives_per_token / negative_rows / rows_per_step
                 from grlib.negatives.sample_stats, averaged over the timing batches
  ndcg@10, hr@10 full-ranking test metrics after a fixed budget: min(train_steps, the scale's
                 epochs x batches) steps of grlib.train.train from the same initialisation, ranked
                 for the first eval_users users; mean (and std) over seeds for the precision rows

Ratios (`*_ratio`) divide by the per-token baseline of the same dataset, measured in the same run.
Async and pre-sampled rows are timing rows: their negatives are the sync ones, draw for draw
(tests/test_negatives_async.py checks the ids and the losses), so they are not retrained. They use
`async_sampler` (default popularity: searchsorted draws, the costliest sampler to take off the path).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from contextlib import closing
from dataclasses import dataclass
from itertools import islice

import numpy as np
import torch
import torch.nn.functional as F

from grlib import paths
from grlib.config import Config, NegativesAblation, NegativesConfig
from grlib.data.schema import FIRST_ITEM_ID
from grlib.data.sequences import JaggedBatch, SequenceData
from grlib.evaluate import split_repeat_fraction
from grlib.negatives.memory import peak_bytes
from grlib.negatives.path import build_negative_path, sample_stats
from grlib.progress import progress
from grlib.train.optim import Optimizers
from grlib.train.prefetch import build_schedule
from grlib.train.step import TrainStep


@dataclass(frozen=True)
class Variant:
    sharing: str  # per-token | shared
    n_negatives: int
    precision: str = "fp32"
    sampling: str = "sync"  # sync | async | presampled
    sampler: str = "uniform"
    baseline: bool = False
    all_seeds: bool = False  # a precision row: trained with every seed of the grid

    @property
    def name(self) -> str:
        extra = "" if self.sampler == "uniform" else f" {self.sampler}"
        return f"{self.sharing} R={self.n_negatives} {self.precision} {self.sampling}{extra}"

    @property
    def trains(self) -> bool:
        return self.sampling == "sync"

    def negatives(self, base: NegativesConfig) -> NegativesConfig:
        return dataclasses.replace(base, sampler=self.sampler, sharing=self.sharing, n_negatives=self.n_negatives,
                                   precision=self.precision, async_sampling=self.sampling == "async")


def variants(ab: NegativesAblation) -> list[Variant]:
    """The rows of the grid, baseline first, duplicates removed."""
    R, S = ab.baseline_negatives, ab.precision_shared_size
    rows = [Variant("per-token", R, baseline=True, all_seeds=True)]
    rows += [Variant("shared", r, all_seeds=r == S) for r in ab.shared_sizes]
    rows.append(Variant("shared", S, all_seeds=True))
    for h in ab.half_formats:
        rows += [Variant("per-token", R, h, all_seeds=True), Variant("shared", S, h, all_seeds=True)]
    for sharing, r in (("per-token", R), ("shared", ab.async_shared_size)):
        rows += [Variant(sharing, r, sampler=ab.async_sampler, sampling=m) for m in ("sync", "presampled", "async")]
    rows += [Variant("shared", ab.sampler_pool_size, sampler=s) for s in ab.samplers if s != "uniform"]
    seen: dict[str, Variant] = {}
    for v in rows:
        if v.name not in seen or (v.all_seeds and not seen[v.name].all_seeds):
            seen[v.name] = v
    return list(seen.values())


def load_dataset(cfg: Config, name: str) -> SequenceData | None:
    """The scale's synthetic twin (prepared by stage `data`) or MovieLens-100K (None when absent)."""
    if name == "synthetic":
        from grlib.experiments.data_stage import ensure_prepared

        return SequenceData.load(ensure_prepared(cfg))
    if name == "ml-100k":
        from grlib.data.movielens import read_ml100k
        from grlib.data.sequences import build_sequences

        path = paths.real_data_file("movielens_100k/u.data")
        if path is None:
            return None
        seqs, vocab = build_sequences(read_ml100k(path), cfg.data.max_len, cfg.data.min_item_count)
        return SequenceData(seqs, n_items=vocab.height + FIRST_ITEM_ID)
    raise ValueError(f"unknown dataset {name!r}; valid: synthetic, ml-100k")


class _Table:
    """Stands in for model.embed (an ItemTable) in the memory measurement: a fixed normalised table."""

    def __init__(self, table: torch.Tensor):
        self.table = table

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table.index_select(0, ids)


def fixed_batches(data: SequenceData, cfg: Config, n: int, seed: int = 0) -> list[JaggedBatch]:
    rng = np.random.default_rng(seed)
    return list(islice(data.train_batches(cfg.train.batch_size, cfg.data.max_len, rng), n))


def measure_memory(v: Variant, cfg: Config, data: SequenceData, batch: JaggedBatch, seed: int = 0) -> dict:
    """Peak bytes of sampling + loss + backward of the negative path on `batch` (see module doc)."""
    neg = dataclasses.replace(v.negatives(cfg.negatives), async_sampling=False)
    path = build_negative_path(neg, data.n_items, data.train_item_counts(), seed)
    g = torch.Generator().manual_seed(seed)
    d = cfg.model.d_model
    table = F.normalize(torch.randn(data.n_items, d, generator=g), dim=-1).requires_grad_()  # [V, d]
    user = F.normalize(torch.randn(batch.item_ids.numel(), d, generator=g), dim=-1).requires_grad_()  # [T, d]
    embed = _Table(table)

    def run() -> None:
        path.loss(user, embed, batch).backward()

    run()  # warm-up; the measured run then allocates its gradients afresh
    table.grad = user.grad = None
    peak = peak_bytes(run)
    queued = cfg.negatives.queue_depth * path.sample(batch).nbytes() if v.sampling == "async" else 0
    return {"neg_path_mb": peak / 2**20, "queue_mb": queued / 2**20}


def measure_stats(v: Variant, cfg: Config, data: SequenceData, batches: list[JaggedBatch], seed: int = 0) -> dict:
    path = build_negative_path(v.negatives(cfg.negatives), data.n_items, data.train_item_counts(), seed)
    stats = [sample_stats(path.sample(b)) for b in batches]
    out = {k: float(np.mean([s[k] for s in stats])) for k in stats[0]}
    return {"tokens_per_batch": out["tokens"], "negatives_per_token": out["negatives_per_token"],
            "distinct_negatives_per_token": out["distinct_negatives_per_token"],
            "negative_rows": out["negative_rows"], "rows_per_step": out["negative_rows"] + out["positive_rows"]}


def _round(v: Variant, runner: dict, batches: list[JaggedBatch]) -> list[float]:
    """One timed pass of `batches` through a variant: step intervals in ms, the first one dropped."""
    step = TrainStep(runner["model"], runner["path"], runner["opt"])  # the trainer's step and optimizers
    if v.sampling == "presampled":
        for b in batches:
            step.path.prepare(b)
    intervals, last = [], time.perf_counter()
    with closing(build_schedule(step, step.path.cfg).run(batches)) as steps:  # async: the prefetch schedule
        for _ in steps:
            now = time.perf_counter()
            intervals.append((now - last) * 1e3)
            last = now
    return intervals[1:]


def measure_step_times(vs: list[Variant], cfg: Config, data: SequenceData, batches: list[JaggedBatch],
                       rounds: int, seed: int = 0) -> dict[str, float]:
    """Median step ms per variant over `rounds` interleaved rounds (variant order rotated per round)."""
    from grlib.model import build_model

    counts = data.train_item_counts()
    runners = {}
    for v in vs:
        torch.manual_seed(seed)
        model = build_model(cfg.model, data.n_items)
        model.train()
        runners[v.name] = {"model": model, "opt": Optimizers(model, cfg.train),
                           "path": build_negative_path(v.negatives(cfg.negatives), data.n_items, counts, seed)}
    times: dict[str, list[float]] = {v.name: [] for v in vs}
    for r in progress(range(rounds), desc="timing rounds"):
        for v in vs[r % len(vs):] + vs[:r % len(vs)]:
            times[v.name] += _round(v, runners[v.name], batches)
    return {name: statistics.median(t) for name, t in times.items()}


def measure_quality(v: Variant, cfg: Config, data: SequenceData, ab: NegativesAblation, seed: int,
                    mask_history: bool) -> dict:
    """Test NDCG@10 / HR@10 after the fixed budget (see module doc) with grlib.train.train."""
    from grlib.evaluate import evaluate, last_token_scores
    from grlib.model import build_model
    from grlib.train import train

    n_batches = data.n_train_batches(cfg.train.batch_size)
    steps = min(ab.train_steps, cfg.train.epochs * n_batches)
    tcfg = dataclasses.replace(cfg.train, seed=seed, epochs=math.ceil(steps / n_batches), max_steps=steps)
    torch.manual_seed(seed)
    model = build_model(cfg.model, data.n_items)
    fit = train(model, data, tcfg, cfg.data.max_len, v.negatives(cfg.negatives))
    ebs = cfg.train.eval_batch_size
    batches = data.eval_batches("test", ebs, cfg.data.max_len)
    if ab.eval_users:
        batches = islice(batches, math.ceil(ab.eval_users / ebs))
    m = evaluate(last_token_scores(model), batches, mask_history=mask_history)
    return {"ndcg@10": m["ndcg@10"], "hr@10": m["hr@10"], "eval_users": m["users"], "train_steps": fit.steps,
            "final_loss": fit.losses[-1] if fit.losses else float("nan")}


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def run_dataset(cfg: Config, ab: NegativesAblation, name: str, data: SequenceData, vs: list[Variant]) -> list[dict]:
    seed = ab.seeds[0]
    batches = fixed_batches(data, cfg, ab.timing_steps, seed)
    biggest = max(batches, key=lambda b: int((b.targets > 0).sum()))
    step_ms = measure_step_times(vs, cfg, data, batches, ab.timing_rounds, seed)
    # history masking only where no target repeats a history item (grlib.evaluate; the twin has repeats)
    mask = split_repeat_fraction(data, cfg.data.max_len) == 0.0
    rows = []
    for v in progress(vs, desc=f"{name}: memory + quality"):
        row = {"dataset": name, "variant": v.name, "sharing": v.sharing, "n_negatives": v.n_negatives,
               "precision": v.precision, "sampling": v.sampling, "sampler": v.sampler, "baseline": v.baseline,
               "step_ms": step_ms[v.name], **measure_memory(v, cfg, data, biggest, seed),
               **measure_stats(v, cfg, data, batches, seed)}
        seeds = (ab.seeds if v.all_seeds else ab.seeds[:1]) if v.trains else []
        runs = [measure_quality(v, cfg, data, ab, s, mask) for s in seeds]
        row["ndcg@10"], row["ndcg@10_std"] = _mean_std([r["ndcg@10"] for r in runs])
        row["hr@10"], _ = _mean_std([r["hr@10"] for r in runs])
        row["quality_seeds"] = ",".join(str(s) for s in seeds)
        row["ndcg@10_per_seed"] = ",".join(f"{r['ndcg@10']:.5f}" for r in runs)
        row["train_steps"] = runs[0]["train_steps"] if runs else 0
        row["eval_users"] = runs[0]["eval_users"] if runs else 0
        rows.append(row)
    base = next(r for r in rows if r["baseline"])
    for r in rows:
        r["step_ratio"] = r["step_ms"] / base["step_ms"]
        r["memory_ratio"] = r["neg_path_mb"] / base["neg_path_mb"]
        r["negatives_ratio"] = r["negatives_per_token"] / base["negatives_per_token"]
        r["rows_ratio"] = r["rows_per_step"] / base["rows_per_step"]
    return rows


def run(cfg: Config, ab: NegativesAblation) -> tuple[list[dict], list[str]]:
    """Every dataset x variant row; and notes on datasets that were skipped (with the reason)."""
    vs = variants(ab)
    rows, notes = [], []
    for name in ab.datasets:
        data = load_dataset(cfg, name)
        if data is None:
            notes.append(f"{name}: skipped, movielens_100k/u.data not found in the real-data folder "
                         "(shared/data/real beside the checkout, or GRLIB_REAL_DATA)")
            continue
        rows += run_dataset(cfg, ab, name, data, vs)
    return rows, notes


def acceptance(rows: list[dict], ab: NegativesAblation) -> list[dict]:
    """The three checks of claim C6 (sharing, half precision, async), per dataset, from the ablation rows."""
    out = []
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        by = {r["variant"]: r for r in rows if r["dataset"] == ds}
        base = next(r for r in by.values() if r["baseline"])
        shared = [r for r in by.values() if r["sharing"] == "shared" and r["precision"] == "fp32"
                  and r["sampling"] == "sync" and r["sampler"] == "uniform" and r["negatives_ratio"] >= 8]
        if shared:
            best = min(shared, key=lambda r: r["n_negatives"])  # the smallest pool with >= 8x
            out.append({"dataset": ds, "check": "sharing: >= 8x negatives at <= 1.2x step time",
                        "row": best["variant"], "figure": f"{best['negatives_ratio']:.1f}x negatives, "
                        f"{best['step_ratio']:.2f}x step", "met": best["step_ratio"] <= 1.2})
        for h in ab.half_formats:
            for fp32 in (base, by.get(Variant("shared", ab.precision_shared_size).name)):
                half = by.get(dataclasses.replace(_variant_of(fp32), precision=h, baseline=False).name) if fp32 else None
                if half is None:
                    continue
                mem = half["neg_path_mb"] / fp32["neg_path_mb"]
                rel = abs(half["ndcg@10"] - fp32["ndcg@10"]) / fp32["ndcg@10"] if fp32["ndcg@10"] else float("nan")
                out.append({"dataset": ds, "check": f"{h}: <= 55% memory, < 1% NDCG@10 change",
                            "row": half["variant"], "figure": f"{mem:.1%} memory, {rel:.2%} NDCG@10 change "
                            f"({len(half['quality_seeds'].split(','))} seeds)", "met": mem <= 0.55 and rel < 0.01})
        for sharing, r in (("per-token", ab.baseline_negatives), ("shared", ab.async_shared_size)):
            sync, pre, asy = (by.get(Variant(sharing, r, sampler=ab.async_sampler, sampling=m).name)
                              for m in ("sync", "presampled", "async"))
            if pre and asy:
                ratio = asy["step_ms"] / pre["step_ms"]
                sync_ratio = f" (sync {sync['step_ms'] / pre['step_ms']:.3f}x)" if sync else ""
                out.append({"dataset": ds, "check": "async: step <= 1.05x pre-sampled", "row": asy["variant"],
                            "figure": f"{ratio:.3f}x{sync_ratio}", "met": ratio <= 1.05})
    return out


def _variant_of(row: dict) -> Variant:
    return Variant(row["sharing"], row["n_negatives"], row["precision"], row["sampling"], row["sampler"])
