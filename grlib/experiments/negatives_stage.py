"""Stage `negatives` (notebooks/04_negative_sampling): the speed / memory / quality ablation of the
negative path, its table, the checks of claim C6 (`acceptance`) and a speed-quality chart.

The method (`measure`, also `python -m grlib bench negatives`). For each dataset of the grid (from
the dataset catalogue, grlib.data.catalog: the scale's synthetic twin, MovieLens-100K; one that is
neither on disk nor downloadable is skipped with a note) and each variant of NegativesAblation
(see `variants`), one row:

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
                 epochs x batches) steps of grlib.fit.train from the same initialisation, ranked
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

import altair as alt
import numpy as np
import polars as pl
import torch
import torch.nn.functional as F

from grlib import plots, results
from grlib.config import Config, NegativesAblation, NegativesConfig
from grlib.data import catalog
from grlib.data.catalog import Dataset
from grlib.data.download import DownloadError
from grlib.data.sequences import JaggedBatch, SequenceData
from grlib.experiments import claims
from grlib.fit import assemble
from grlib.negatives.memory import peak_bytes
from grlib.negatives.path import build_negative_path, sample_stats
from grlib.progress import progress, run_of

TABLE = "negatives"


def quick(ab: NegativesAblation) -> NegativesAblation:
    """The notebook's default (smoke, JupyterLab, nbmake) grid: every kind of row once, fewer of each,
    on the synthetic twin only."""
    datasets = ["synthetic"] if "synthetic" in ab.datasets else ab.datasets[:1]
    return dataclasses.replace(ab, shared_sizes=[128, 2048], samplers=["in-batch"], seeds=ab.seeds[:1],
                               datasets=datasets, timing_steps=3, timing_rounds=1, train_steps=min(ab.train_steps, 5))


def run(cfg: Config, ab: NegativesAblation) -> dict:
    """Runs the grid; appends rows to the table `negatives`; writes metrics and figure (per scale)."""
    rows, notes = measure(cfg, ab)
    if not rows:
        raise RuntimeError("stage negatives: no dataset could be loaded; " + "; ".join(notes))
    table = results.append_rows(TABLE, rows, cfg)
    checks = pl.DataFrame(acceptance(rows, ab))
    results.write_metrics(TABLE, {"scale": cfg.scale, "notes": notes, "acceptance": checks.to_dicts(),
                                  "rows": {f"{r['dataset']} | {r['variant']}": {
                                      k: r[k] for k in ("step_ratio", "memory_ratio", "negatives_ratio", "ndcg@10")}
                                      for r in rows}}, scale=cfg.scale)
    figures = plots.save_chart(speed_quality_chart(table), "negatives_speed_quality", cfg.scale)
    return {"table": table, "acceptance": checks, "notes": notes, "figures": figures}


def ablation_view(table: pl.DataFrame) -> pl.DataFrame:
    """The columns a reader compares, one row per dataset x variant."""
    return table.select("dataset", "variant", "step_ms", "step_ratio", "neg_path_mb", "memory_ratio", "queue_mb",
                        "negatives_per_token", "negatives_ratio", "distinct_negatives_per_token", "rows_per_step",
                        "rows_ratio", "ndcg@10", "ndcg@10_std", "quality_seeds")


def family(variant: str) -> str:
    if " fp16 " in variant or " bf16 " in variant:
        return "half precision"
    if variant.startswith("per-token"):
        return "per-token"
    return "shared pool" if variant.endswith("sync") else "shared pool, other sampler"


def speed_quality_chart(table: pl.DataFrame) -> alt.Chart:
    """Step time (ratio to the baseline) against NDCG@10, point size = negatives per token."""
    trained = table.filter(pl.col("ndcg@10").is_not_nan()).with_columns(
        pl.col("variant").map_elements(family, return_dtype=pl.String).alias("family"))
    return (alt.Chart(trained).mark_point(filled=True, opacity=0.8)
            .encode(x=alt.X("step_ratio:Q", title="step time / per-token baseline", scale=alt.Scale(zero=False)),
                    y=alt.Y("ndcg@10:Q", title="test NDCG@10 (fixed budget)", scale=alt.Scale(zero=False)),
                    size=alt.Size("negatives_per_token:Q", title="negatives / token", scale=alt.Scale(type="log")),
                    color=alt.Color("family:N"), tooltip=["variant", "step_ms", "neg_path_mb", "ndcg@10"])
            .properties(width=300, height=220)
            .facet(column=alt.Column("dataset:N"))
            .properties(title="Negative sampling: speed vs quality"))


# ---- the method: the grid, the measurements, the checks -----------------------------------------
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


def _round(v: Variant, schedule, batches: list[JaggedBatch]) -> list[float]:
    """One timed pass of `batches` through a variant's schedule (the trainer's: grlib.fit.assemble;
    async: the prefetch schedule): step intervals in ms, the first one dropped."""
    if v.sampling == "presampled":
        for b in batches:
            schedule.step.path.prepare(b)
    intervals, last = [], time.perf_counter()
    with closing(schedule.run(batches)) as steps:
        for _ in steps:
            now = time.perf_counter()
            intervals.append((now - last) * 1e3)
            last = now
    return intervals[1:]


def measure_step_times(vs: list[Variant], cfg: Config, data: SequenceData, batches: list[JaggedBatch],
                       rounds: int, seed: int = 0) -> dict[str, float]:
    """Median step ms per variant over `rounds` interleaved rounds (variant order rotated per round)."""
    from grlib.model import build_model

    runners = {}
    for v in vs:
        torch.manual_seed(seed)
        model = build_model(cfg.model, data.n_items)
        model.train()
        run_cfg = dataclasses.replace(cfg, negatives=v.negatives(cfg.negatives))
        runners[v.name] = assemble(model, data, run_cfg, seed=seed)
    times: dict[str, list[float]] = {v.name: [] for v in vs}
    for r in progress(range(rounds), desc="timing rounds"):
        for v in vs[r % len(vs):] + vs[:r % len(vs)]:
            times[v.name] += _round(v, runners[v.name], batches)
    return {name: statistics.median(t) for name, t in times.items()}


def measure_quality(v: Variant, cfg: Config, data: SequenceData, ab: NegativesAblation, seed: int,
                    mask_history: bool) -> dict:
    """Test NDCG@10 / HR@10 after the fixed budget (see module doc) with grlib.fit.train."""
    from grlib.evaluate import evaluate, last_token_scores
    from grlib.fit import train
    from grlib.model import build_model

    n_batches = data.n_train_batches(cfg.train.batch_size)
    steps = min(ab.train_steps, cfg.train.epochs * n_batches)
    tcfg = dataclasses.replace(cfg.train, seed=seed, epochs=math.ceil(steps / n_batches), max_steps=steps)
    run_cfg = dataclasses.replace(cfg, train=tcfg, negatives=v.negatives(cfg.negatives))
    torch.manual_seed(seed)
    model = build_model(cfg.model, data.n_items)
    fit = train(model, data, run_cfg)
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


def run_dataset(cfg: Config, ab: NegativesAblation, ds: Dataset, vs: list[Variant]) -> list[dict]:
    name, data, seed = ds.name, ds.data, ab.seeds[0]
    batches = fixed_batches(data, cfg, ab.timing_steps, seed)
    biggest = max(batches, key=lambda b: int((b.targets > 0).sum()))
    step_ms = measure_step_times(vs, cfg, data, batches, ab.timing_rounds, seed)
    # history masking only where no target repeats a history item (grlib.evaluate; the twin has repeats)
    mask = ds.mask_history
    rows = []
    n_runs, done = sum(len(ab.seeds if v.all_seeds else ab.seeds[:1]) for v in vs if v.trains), 0  # "run i of n"
    for v in progress(vs, desc=f"{name}: memory + quality"):
        row = {"dataset": name, "variant": v.name, "sharing": v.sharing, "n_negatives": v.n_negatives,
               "precision": v.precision, "sampling": v.sampling, "sampler": v.sampler, "baseline": v.baseline,
               "step_ms": step_ms[v.name], **measure_memory(v, cfg, data, biggest, seed),
               **measure_stats(v, cfg, data, batches, seed)}
        seeds = (ab.seeds if v.all_seeds else ab.seeds[:1]) if v.trains else []
        runs = []
        for s in seeds:  # progress lines say "run i of n" over the dataset's quality runs
            done += 1
            with run_of(done, n_runs, f"{name} {v.name} seed {s}"):
                runs.append(measure_quality(v, cfg, data, ab, s, mask))
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


def measure(cfg: Config, ab: NegativesAblation) -> tuple[list[dict], list[str]]:
    """Every dataset x variant row; and notes on datasets that were skipped (with the reason)."""
    vs = variants(ab)
    rows, notes = [], []
    for name in ab.datasets:
        try:
            ds = catalog.load_dataset(cfg, name)
        except (FileNotFoundError, DownloadError) as err:  # absent and not downloadable here: said, not hidden
            notes.append(f"{name}: skipped, {err}")
            continue
        rows += run_dataset(cfg, ab, ds, vs)
    return rows, notes


def acceptance(rows: list[dict], ab: NegativesAblation) -> list[dict]:
    """The three checks of claim C6 (sharing, half precision, async), per dataset, from the ablation
    rows; thresholds from the claims registry."""
    share_t, half_t, async_t = (claims.target(f"C6.{k}") for k in ("sharing", "half", "async"))
    out = []
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        by = {r["variant"]: r for r in rows if r["dataset"] == ds}
        base = next(r for r in by.values() if r["baseline"])
        shared = [r for r in by.values() if r["sharing"] == "shared" and r["precision"] == "fp32"
                  and r["sampling"] == "sync" and r["sampler"] == "uniform"
                  and share_t.bound("negatives vs per-token").holds(r["negatives_ratio"])]
        if shared:
            best = min(shared, key=lambda r: r["n_negatives"])  # the smallest pool with enough negatives
            out.append({"dataset": ds, "target": share_t.key, "check": f"sharing: {share_t.threshold}",
                        "row": best["variant"], "figure": f"{best['negatives_ratio']:.1f}x negatives, "
                        f"{best['step_ratio']:.2f}x step",
                        "met": share_t.bound("step time vs per-token").holds(best["step_ratio"])})
        for h in ab.half_formats:
            for fp32 in (base, by.get(Variant("shared", ab.precision_shared_size).name)):
                half = by.get(dataclasses.replace(_variant_of(fp32), precision=h, baseline=False).name) if fp32 else None
                if half is None:
                    continue
                mem = half["neg_path_mb"] / fp32["neg_path_mb"]
                rel = abs(half["ndcg@10"] - fp32["ndcg@10"]) / fp32["ndcg@10"] if fp32["ndcg@10"] else float("nan")
                out.append({"dataset": ds, "target": half_t.key, "check": f"{h}: {half_t.threshold}",
                            "row": half["variant"], "figure": f"{mem:.1%} memory, {rel:.2%} NDCG@10 change "
                            f"({len(half['quality_seeds'].split(','))} seeds)",
                            "met": (half_t.bound("memory vs fp32").holds(mem)
                                    and half_t.bound("NDCG@10 change").holds(rel))})
        for sharing, r in (("per-token", ab.baseline_negatives), ("shared", ab.async_shared_size)):
            sync, pre, asy = (by.get(Variant(sharing, r, sampler=ab.async_sampler, sampling=m).name)
                              for m in ("sync", "presampled", "async"))
            if pre and asy:
                ratio = asy["step_ms"] / pre["step_ms"]
                sync_ratio = f" (sync {sync['step_ms'] / pre['step_ms']:.3f}x)" if sync else ""
                out.append({"dataset": ds, "target": async_t.key, "check": f"async: {async_t.threshold}",
                            "row": asy["variant"], "figure": f"{ratio:.3f}x{sync_ratio}", "met": async_t.met(ratio)})
    return out


def _variant_of(row: dict) -> Variant:
    return Variant(row["sharing"], row["n_negatives"], row["precision"], row["sampling"], row["sampler"])
