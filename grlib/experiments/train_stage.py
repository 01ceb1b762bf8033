"""Stage `train` (notebooks/02_train): every dataset x model x seed of the ablation, trained,
selected on validation and evaluated on test by full ranking.

Datasets come from the dataset catalogue (grlib.data.catalog): "scale" is the scale's own
processed data (the `data` stage's output, e.g. the synthetic KuaiRand twin at laptop scale); any
other name (e.g. "ml-100k") is prepared once with the scale's data settings into a folder of its
own. Each dataset trains with the scale's settings and that dataset's own (params.yaml `datasets`,
filled into `ablations.train.overrides` by load_ablation; recorded per row as JSON in the `overrides`
column), under the tighter of the scale's and the dataset's step budget. A real dataset whose file is absent is skipped with
its reason (listed in `run`'s result and in the metrics JSON), never replaced.

`ablations.train.precisions` beyond fp32 (bf16) train HSTU again on every dataset and seed with that
model.precision (grlib.model.hstu: the projections on bf16 copies of the fp32 weights), to table
`train_precision`; `precision_summary` compares each with the fp32 HSTU rows of the same run (the
quality check of a bf16 training mode: test NDCG@10 within one fp32 seed-std).

PEERS: a peer library's figures on the same data and protocol (with their source), shown beside ours
in `summary` (and checked by the claims registry's W1.peer).
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import altair as alt
import polars as pl

from grlib import hardware, perf, results
from grlib.progress import run_of
from grlib.config import Config, TrainAblation
from grlib.data.catalog import PREPARED_DATA_FIELDS, dataset_config, load_dataset, load_prepared, prepared_stats
from grlib.data.download import DownloadError
from grlib.fit import fit_and_evaluate
from grlib.model.hstu import COMPUTE_DTYPES
from grlib.schema import FIRST_ITEM_ID


@dataclass(frozen=True)
class Peer:
    """A peer library's test figures on a dataset under the train stage's protocol (full ranking over
    every item, time-ordered leave-one-out, history masked on MovieLens), beside ours."""

    library: str
    model: str  # as ablations.train.models names it
    dataset: str
    ndcg10: float
    hr10: float
    mrr: float | None
    source: str


RECBOLE_RUN = ("RecBole 1.2.1 run by this project (issue 18) on the same data and protocol: all 100,000 "
               "MovieLens-100K ratings as implicit interactions, time-ordered leave-one-out, full ranking over "
               "all 1,682 items, history masked, 943 users; seed 0, max length 50, full-softmax cross-entropy, "
               "Adam 1e-3, batch 256, early stopping on validation NDCG@10")
PEERS: tuple[Peer, ...] = (
    # RecBole's own (unmasked) figures for this SASRec read 0.0580 / 0.1188
    Peer("RecBole 1.2.1", "sasrec", "ml-100k", 0.0973, 0.1856, 0.0885, RECBOLE_RUN),
    Peer("RecBole 1.2.1", "popularity", "ml-100k", 0.0441, 0.0848, None,  # exact counts; grlib counts ties against
         RECBOLE_RUN + "; exact counts, ties not counted against the target"),  # the target (grlib.evaluate)
)
PEER_TARGET_MODEL = "sasrec"  # the workbench target (claims W1.peer): HSTU >= a standard SASRec, same protocol


def peer(dataset: str, model: str = PEER_TARGET_MODEL) -> Peer | None:
    """The peer figure of `model` on `dataset`, or None."""
    return next((p for p in PEERS if p.dataset == dataset and p.model == model), None)


def peer_table() -> pl.DataFrame:
    """Every peer figure (dataset, model, library, test NDCG@10, HR@10, MRR, source)."""
    return pl.DataFrame([{"dataset": p.dataset, "model": p.model, "library": p.library, "test_ndcg@10": p.ndcg10,
                          "test_hr@10": p.hr10, "test_mrr": p.mrr, "source": p.source} for p in PEERS],
                        schema_overrides={"test_mrr": pl.Float64})


def run(cfg: Config, ablation: TrainAblation, data: str | Path | None = None) -> dict:
    """Trains the grid; appends rows to tables `train` and `train_curves`; returns
    {"table": this run's rows, "curves": curve rows, "summary": mean/std per dataset x model,
    "skipped": {dataset: reason}, "precision": the train_precision rows (empty for fp32 only),
    "precision_summary": precision_summary of them}. data: a folder `python -m grlib data prepare`
    made (the notebook's `data` parameter): the grid trains on it, with its dataset's own settings and
    its data settings, instead of ablation.datasets (any other folder: DataError)."""
    if data:
        stats = prepared_stats(Path(data))  # refuses a folder `data prepare` did not make
        cfg = cfg.replace({f"data.{k}": stats[k] for k in PREPARED_DATA_FIELDS})
        ablation = dataclasses.replace(ablation, datasets=[stats["dataset"]], max_steps=[])
    peak = perf.peak_flops() if any(m != "popularity" for m in ablation.models) else None
    rows, curves, skipped, precision_rows = [], [], {}, []
    # a precision this CPU cannot run (bf16 without AVX512-BF16, or under GRLIB_ISA=avx2): skipped, with its reason
    precisions_skipped = {p: why for p in ablation.precisions[1:] if (why := precision_missing(p)) is not None}
    for p, why in precisions_skipped.items():
        print(f"skipped precision {p!r}: {why}")
    precisions = [p for p in ablation.precisions[1:] if p not in precisions_skipped]
    peaks = {p: perf.peak_flops(COMPUTE_DTYPES[p]) for p in precisions}  # a bf16 run's MFU: the bf16 peak
    caps = ablation.max_steps or [0] * len(ablation.datasets)
    per_dataset = len(ablation.seeds) * (len(ablation.models) + len(precisions))
    n_runs, i = len(ablation.datasets) * per_dataset, 0  # progress lines say "run i of n_runs"
    for name, cap in zip(ablation.datasets, caps):
        ds_cfg = cfg.replace(ablation.dataset_overrides(name))  # the dataset's own settings (e.g. ML-100K's loss)
        try:
            ds = load_prepared(ds_cfg, Path(data)) if data else load_dataset(ds_cfg, name)
        except (FileNotFoundError, DownloadError) as err:  # absent and not downloadable here: said, not hidden
            skipped[dataset_config(ds_cfg, name).dataset] = str(err)
            print(f"skipped dataset {dataset_config(ds_cfg, name).dataset!r}: {err}")
            i += per_dataset
            continue
        for model in ablation.models:
            for seed in ablation.seeds:
                run_cfg = ds_cfg.replace({"model.name": model, "train.seed": seed,
                                          "train.max_steps": step_budget(ds_cfg.train.max_steps, cap)})
                i += 1
                with run_of(i, n_runs, f"{ds.name} {model} seed {seed}"):
                    fit = fit_and_evaluate(run_cfg, ds, peak)
                key = {"dataset": ds.name, "model": model, "seed": seed}
                rows.append({**key, **{k: v for k, v in fit.row.items() if k != "resumed_from"},
                             "overrides": json.dumps(ablation.dataset_overrides(name), sort_keys=True)})
                curves += [{**key, **c} for c in fit.curve]
        for precision in precisions:  # HSTU again in each other precision (bf16)
            for seed in ablation.seeds:
                run_cfg = ds_cfg.replace({"model.name": "hstu", "model.precision": precision, "train.seed": seed,
                                          "train.max_steps": step_budget(ds_cfg.train.max_steps, cap)})
                i += 1
                with run_of(i, n_runs, f"{ds.name} hstu {precision} seed {seed}"):
                    fit = fit_and_evaluate(run_cfg, ds, peaks[precision])
                precision_rows.append({"dataset": ds.name, "model": "hstu", "precision": precision, "seed": seed,
                                       **{k: v for k, v in fit.row.items() if k != "resumed_from"}})
    if not rows:
        raise FileNotFoundError(f"no dataset of ablations.train.datasets could be loaded: {skipped}")
    table = results.append_rows("train", rows, cfg)
    if curves:
        results.append_rows("train_curves", curves, cfg, run_id=table["run_id"][0])
    summ = summary(table)
    precision = pl.DataFrame()
    if precision_rows:
        precision = results.append_rows("train_precision", precision_rows, cfg, run_id=table["run_id"][0])
    elif precisions_skipped:  # no row, yet the stage's declared output (dvc.yaml) exists: an empty partition
        results.scale_dir("train_precision", cfg.scale).mkdir(parents=True, exist_ok=True)
    psumm = precision_summary(table, precision)
    results.write_metrics("train", {"scale": cfg.scale, "skipped": skipped, "peak_flops": peak,
                                    "precisions_skipped": precisions_skipped,
                                    "precision": psumm.to_dicts(), **{
        f"{r['dataset']}/{r['model']}": {k: r[k] for k in ("test_ndcg@10", "test_ndcg@10_std", "test_hr@10",
                                                           "vs_popularity", "peer_ndcg@10", "vs_peer_sasrec",
                                                           "seeds")}
        for r in summ.iter_rows(named=True)}}, scale=cfg.scale)
    return {"table": table, "curves": pl.DataFrame(curves), "summary": summ, "skipped": skipped,
            "precision": precision, "precision_summary": psumm, "precisions_skipped": precisions_skipped}


def precision_missing(precision: str) -> str | None:
    """Why model.precision `precision` cannot run on this CPU (grlib.hardware.isa), None when it can."""
    return hardware.isa.bf16_missing() if precision == "bf16" else None


def step_budget(scale_cap: int, dataset_cap: int) -> int:
    """The tighter of the scale's train.max_steps and the dataset's cap (0 = no cap)."""
    caps = [c for c in (scale_cap, dataset_cap) if c > 0]
    return min(caps) if caps else 0


def summary(table: pl.DataFrame) -> pl.DataFrame:
    """Mean and std over seeds per dataset x model, NDCG@10 as a multiple of popularity's, and beside it
    the peer library's NDCG@10 of the same model (`peer_ndcg@10`, null where none; PEERS) and ours as a
    multiple of the peer's standard SASRec on that dataset (`vs_peer_sasrec`, the workbench target)."""
    agg = (table.group_by("dataset", "model")
           .agg(pl.len().alias("seeds"), pl.col("params").first(),
                pl.col("test_ndcg@10").mean(), pl.col("test_ndcg@10").std().alias("test_ndcg@10_std"),
                pl.col("test_hr@10").mean(), pl.col("test_hr@10").std().alias("test_hr@10_std"),
                pl.col("test_mrr").mean(), pl.col("val_ndcg@10").mean(),
                pl.col("train_s").mean(), pl.col("tokens_per_s").mean(), pl.col("mfu").mean()))
    pop = agg.filter(pl.col("model") == "popularity").select("dataset", pl.col("test_ndcg@10").alias("_pop"))
    agg = agg.join(pop, on="dataset", how="left")
    peers = peer_table().select("dataset", "model", pl.col("test_ndcg@10").alias("peer_ndcg@10"))
    target = peers.filter(pl.col("model") == PEER_TARGET_MODEL).select("dataset", pl.col("peer_ndcg@10").alias("_peer"))
    agg = agg.join(peers, on=["dataset", "model"], how="left").join(target, on="dataset", how="left")
    return (agg.with_columns((pl.col("test_ndcg@10") / pl.col("_pop")).alias("vs_popularity"),
                             (pl.col("test_ndcg@10") / pl.col("_peer")).alias("vs_peer_sasrec"))
            .drop("_pop", "_peer").with_columns(pl.col("test_ndcg@10_std", "test_hr@10_std").fill_null(0.0))
            .sort("dataset", "test_ndcg@10", descending=[False, True]))


def precision_summary(table: pl.DataFrame, precision: pl.DataFrame) -> pl.DataFrame:
    """Per dataset and precision of `precision` (rows of table train_precision): HSTU's test NDCG@10 mean
    and std over seeds beside the fp32 HSTU rows of `table` (the same run's `train` rows), the change
    (`change`: other / fp32 - 1), the difference in fp32 seed-stds (`in_fp32_stds`: |other - fp32| / fp32
    std, the check: <= 1), and the training throughput's ratio (`tokens_per_s_vs_fp32`)."""
    if precision.height == 0:
        return pl.DataFrame()
    fp32 = (table.filter(pl.col("model") == "hstu").group_by("dataset")
            .agg(pl.col("test_ndcg@10").mean().alias("fp32_ndcg@10"),
                 pl.col("test_ndcg@10").std().fill_null(0.0).alias("fp32_ndcg@10_std"),
                 pl.col("tokens_per_s").mean().alias("_fp32_tps"), pl.len().alias("fp32_seeds")))
    other = (precision.group_by("dataset", "precision")
             .agg(pl.col("test_ndcg@10").mean(), pl.col("test_ndcg@10").std().fill_null(0.0).alias("test_ndcg@10_std"),
                  pl.col("tokens_per_s").mean().alias("_tps"), pl.len().alias("seeds")))
    diff = (pl.col("test_ndcg@10") - pl.col("fp32_ndcg@10")).abs()
    return (other.join(fp32, on="dataset", how="left")
            .with_columns((pl.col("test_ndcg@10") / pl.col("fp32_ndcg@10") - 1).alias("change"),
                          pl.when(pl.col("fp32_ndcg@10_std") > 0).then(diff / pl.col("fp32_ndcg@10_std"))
                          .otherwise(pl.when(diff == 0).then(0.0).otherwise(float("inf"))).alias("in_fp32_stds"),
                          (pl.col("_tps") / pl.col("_fp32_tps")).alias("tokens_per_s_vs_fp32"))
            .drop("_tps", "_fp32_tps").sort("dataset", "precision"))


def curves_chart(curves: pl.DataFrame) -> alt.Chart:
    """Training loss per step (left) and validation NDCG@10 per epoch (right), per dataset."""
    loss = curves.filter(pl.col("loss").is_not_null()).select("dataset", "model", "seed", "step", "loss")
    val = curves.filter(pl.col("val_ndcg@10").is_not_null()).select("dataset", "model", "seed", "epoch", "val_ndcg@10")
    color = alt.Color("model:N")
    left = (alt.Chart(loss).mark_line(opacity=0.6)
            .encode(x="step:Q", y=alt.Y("loss:Q", title="training loss"), color=color, detail="seed:N")
            .properties(width=260, height=170))
    right = (alt.Chart(val).mark_line(point=True)
             .encode(x=alt.X("epoch:Q", title="epoch"), y=alt.Y("val_ndcg@10:Q", title="validation NDCG@10"),
                     color=color, detail="seed:N")
             .properties(width=260, height=170))
    return alt.hconcat(left, right).properties(title="Learning curves")


def quality_chart(summ: pl.DataFrame) -> alt.FacetChart:
    """Test NDCG@10 per model, one panel per dataset (and scale, where several) on its own axis: bars
    the mean over seeds, whiskers one seed-std either side, each bar labelled (mean ± std, seeds),
    and a dashed line at each peer library's figure on that dataset (PEERS), labelled on its model's
    row. `summ`: `summary` (test_ndcg@10, test_ndcg@10_std) or report.train_summary (ndcg@10,
    ndcg@10_std, scale)."""
    mean, std = ("ndcg@10", "ndcg@10_std") if "ndcg@10" in summ.columns else ("test_ndcg@10", "test_ndcg@10_std")
    facets = [c for c in ("scale", "dataset") if c in summ.columns]
    peers = {(p.dataset, p.model): p for p in PEERS}
    rows = []
    for r in summ.iter_rows(named=True):
        m, sd = r[mean], r[std] or 0.0
        p = peers.get((r["dataset"], r["model"]))
        rows.append({**{c: r[c] for c in facets}, "model": r["model"], "mean": m, "lo": m - sd, "hi": m + sd,
                     "label": f"{m:.4f} ± {sd:.4f} ({r['seeds']} seed{'s' if r['seeds'] != 1 else ''})",
                     "pad": (m + sd) * 1.75,  # room on the right for the label, in each panel's own axis
                     "peer": p.ndcg10 if p else None,
                     "peer_label": f"{p.library} {p.model}: {p.ndcg10:.4f}" if p else None})
    data = pl.DataFrame(rows, schema_overrides={"peer": pl.Float64, "peer_label": pl.String})
    order = data.sort("mean", descending=True)["model"].unique(maintain_order=True).to_list()
    y = alt.Y("model:N", sort=order, title=None, scale=alt.Scale(paddingInner=0.5, paddingOuter=0.5))

    def x(field: str) -> alt.X:
        return alt.X(f"{field}:Q", title="test NDCG@10")

    bars = alt.Chart().mark_bar().encode(x=x("mean"), y=y, color=alt.Color("model:N", legend=None))
    whiskers = alt.Chart().mark_errorbar(ticks=True, color="black").encode(x=x("lo"), x2="hi:Q", y=y)
    labels = alt.Chart().mark_text(align="left", dx=4, fontSize=10).encode(x=x("hi"), y=y, text="label:N")
    room = alt.Chart().mark_point(opacity=0).encode(x=x("pad"), y=y)
    has_peer = alt.datum.peer != None  # noqa: E711  (a vega expression: not null)
    peer_line = alt.Chart().transform_filter(has_peer).mark_rule(strokeDash=[5, 3], color="black").encode(x=x("peer"))
    peer_text = (alt.Chart().transform_filter(has_peer)
                 .mark_text(align="left", baseline="top", dx=3, dy=11, fontSize=10, fontStyle="italic")
                 .encode(x=x("peer"), y=y, text="peer_label:N"))
    layered = (alt.layer(bars, whiskers, labels, room, peer_line, peer_text, data=data)
               .properties(width=330, height=alt.Step(40)))
    several = "scale" in facets and data["scale"].n_unique() > 1
    facet = {"column": alt.Column("dataset:N", title=None, header=alt.Header(labelFontSize=12, labelFontWeight="bold"))}
    if several:
        facet["row"] = alt.Row("scale:N", title="scale")
    libraries = sorted({p.library for p in PEERS if p.dataset in set(data["dataset"])})
    subtitle = ["bars: the mean over seeds; whiskers: ± one seed-std; each panel on its own axis"]
    if libraries:
        subtitle.append(f"dashed: {', '.join(libraries)}'s figure of that model on the same data and protocol "
                        "(train_stage.PEERS)")
    return (layered.facet(**facet).resolve_scale(x="independent", y="independent")
            .properties(title=alt.TitleParams("Full-ranking test NDCG@10: HSTU, SASRec, popularity", subtitle=subtitle,
                                              anchor="start")))


def finite(x: float) -> float | None:
    return x if isinstance(x, float) and math.isfinite(x) else None


def preset_table(scales: list[str] | None = None) -> pl.DataFrame:
    """Parameters of every scale's HSTU (meta device, nothing allocated): the dense encoder, and
    the item table where the vocabulary is known before processing (synthetic: data.n_items);
    for real datasets it is d_model per item of the processed vocabulary."""
    from grlib.config import load_config, scale_names
    from grlib.model import preset_parameters

    rows = []
    for scale in scales or scale_names():
        cfg = load_config(scale, {"model.name": "hstu"})
        known = cfg.data.dataset == "synthetic"
        count = preset_parameters(cfg.model, (cfg.data.n_items if known else 1) + FIRST_ITEM_ID, cfg.data.max_len)
        dense = count.dense
        rows.append({"scale": scale, "dataset": cfg.data.dataset,
                     "layers x heads": f"{cfg.model.n_layers}x{cfg.model.n_heads}", "d_model": cfg.model.d_model,
                     "max_len": cfg.data.max_len, "dense_params": dense, "params_per_item": cfg.model.d_model,
                     "item_table_params": count.embedding if known else None,
                     "params": count.total if known else None})
    return pl.DataFrame(rows)


def speed_table(table: pl.DataFrame) -> pl.DataFrame:
    """Tokens/s and MFU of this run per dataset x model (mean over seeds), and of `bench train` rows."""
    runs = (table.filter(pl.col("model") != "popularity").group_by("scale", "dataset", "model")
            .agg(pl.col("tokens_per_s").mean(), pl.col("mfu").mean(), pl.col("attention_impl").first())
            .with_columns(pl.lit("train stage").alias("source")))
    bench = results.read_table("bench_train")
    if "precision" in bench.columns:  # the fp32 rows (bench train --precision bf16 writes rows of its own)
        bench = bench.filter(pl.col("precision").fill_null("fp32") == "fp32")
    if bench.height:
        bench = (results.latest(bench, ["attention_impl"])
                 .select("scale", pl.lit("(bench batches)").alias("dataset"), pl.lit("hstu").alias("model"),
                         "tokens_per_s", "mfu", "attention_impl", pl.lit("bench train").alias("source")))
        runs = pl.concat([runs, bench], how="diagonal_relaxed")
    return runs.sort("source", "scale", "dataset", "model")
