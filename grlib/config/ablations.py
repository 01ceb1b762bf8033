"""The grids each experiment sweeps: params.yaml's `ablations` section, one frozen dataclass per
experiment, loaded by name with overrides on top (the notebooks' `ablation_overrides`).

    ab = load_ablation("train", {"seeds": [0, 1]})        # TrainAblation(seeds=[0, 1], ...)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grlib.config import choices
from grlib.config.fields import ConfigError, apply, check, nest, one_of
from grlib.config.loader import as_mapping, read_params
from grlib.config.sections import Config, with_sections


@dataclass(frozen=True)
class TrainAblation:
    """The grid of the training experiment (notebooks/02_train)."""

    models: list[str] = field(default_factory=lambda: ["hstu", "sasrec", "popularity"])
    seeds: list[int] = field(default_factory=lambda: [0])
    datasets: list[str] = field(default_factory=lambda: ["scale"])  # "scale" = the scale's own data
    # per dataset (same order): a step cap below the scale's train.max_steps, 0 = none; empty = no caps
    max_steps: list[int] = field(default_factory=list)
    # config overrides of a dataset (named as in `datasets`) on top of the scale's, e.g.
    # {"ml-100k": {"negatives.temperature": 0.2}}; a dataset without an entry trains with the scale's
    # settings. Checked like load_config's overrides (unknown keys and bad values are errors)
    overrides: dict[str, Any] = field(default_factory=dict)
    # model.precision of HSTU's runs: fp32 (the `train` table) and any other (bf16: the same datasets, seeds
    # and budgets again, to table `train_precision`, compared with fp32 by train_stage.precision_summary)
    precisions: list[str] = field(default_factory=lambda: ["fp32"])

    def __post_init__(self) -> None:
        for m in self.models:
            check(m in choices.MODELS, "ablations.train.models", f"unknown model {m!r}")
        for p in self.precisions:
            one_of(p, choices.MODEL_PRECISIONS, "ablations.train.precisions")
        check(self.precisions[:1] == ["fp32"] and len(set(self.precisions)) == len(self.precisions),
              "ablations.train.precisions", f"must start with fp32 (the baseline) and name each once, "
              f"got {self.precisions}")
        check(self.precisions == ["fp32"] or "hstu" in self.models, "ablations.train.precisions",
              f"{self.precisions[1:]} train HSTU, which ablations.train.models {self.models} leaves out")
        check(len(self.seeds) >= 1, "ablations.train.seeds", "needs at least one seed")
        check(len(self.datasets) >= 1, "ablations.train.datasets", "needs at least one dataset")
        for d in self.datasets:
            if d != "scale":  # a dataset name, as data.dataset takes it
                one_of(d, choices.DATASETS, "ablations.train.datasets: data.dataset")
        check(not self.max_steps or len(self.max_steps) == len(self.datasets), "ablations.train.max_steps",
              f"needs one entry per dataset ({len(self.datasets)}), got {len(self.max_steps)}")
        check(all(n >= 0 for n in self.max_steps), "ablations.train.max_steps", f"must be >= 0, got {self.max_steps}")
        check_dataset_overrides(self.overrides, "ablations.train.overrides")

    def dataset_overrides(self, dataset: str) -> dict[str, Any]:
        """The config overrides of `dataset` (as named in `datasets`; empty when it has none)."""
        return dict(self.overrides.get(dataset) or {})


def check_dataset_overrides(overrides: dict[str, Any], name: str) -> None:
    """Per-dataset config overrides ({dataset: {key: value}}): known datasets, known keys, valid values."""
    for ds, o in overrides.items():
        check(ds == "scale" or ds in choices.DATASETS, name,
              f"{ds!r} is not a dataset: one of {('scale', *choices.DATASETS)}")
        check(isinstance(o, dict), f"{name}.{ds}", f"expected a mapping such as {{negatives.temperature: 0.2}}, got {o!r}")
        try:
            with_sections(Config("check"), nest(o))
        except ConfigError as err:
            raise ConfigError(f"{name}.{ds}: {err}") from None


@dataclass(frozen=True)
class KernelsAblation:
    """The grid of the attention-kernel experiment (notebooks/01_kernels, `bench kernels`)."""

    impls: list[str] = field(default_factory=lambda: ["reference", "fbgemm", "cpu"])
    regimes: list[str] = field(default_factory=lambda: ["truncated", "scaled"])

    def __post_init__(self) -> None:
        for impl in self.impls:
            check(impl in choices.IMPLS, "ablations.kernels.impls",
                  f"unknown implementation {impl!r}; valid: {choices.IMPLS}")
        check("reference" in self.impls, "ablations.kernels.impls",
              "must include 'reference' (every ratio is against it, measured in the same run)")
        for regime in self.regimes:
            check(regime in choices.REGIMES, "ablations.kernels.regimes",
                  f"unknown regime {regime!r}; valid: {choices.REGIMES}")
        check(len(self.regimes) >= 1, "ablations.kernels.regimes", "needs at least one regime")


@dataclass(frozen=True)
class NegativesAblation:
    """The grid of the negative-sampling experiment (notebooks/04_negative_sampling, bench negatives).

    Rows (grlib.experiments.negatives_stage.variants): the per-token baseline (R = baseline_negatives, FP32,
    sync); shared pools of each size in shared_sizes; each half format at per-token R and at shared
    R = precision_shared_size; sync vs async vs pre-sampled with async_sampler at per-token
    R = baseline_negatives and at shared R = async_shared_size; each extra sampler at a shared pool of
    sampler_pool_size."""

    baseline_negatives: int = 128
    shared_sizes: list[int] = field(default_factory=lambda: [128, 512, 2048, 8192])
    half_formats: list[str] = field(default_factory=lambda: ["fp16"])  # choices.HALF_FORMATS
    precision_shared_size: int = 2048
    async_shared_size: int = 2048
    async_sampler: str = "popularity"  # the sampler of the sync / async / pre-sampled rows (the costliest)
    samplers: list[str] = field(default_factory=lambda: ["popularity", "in-batch"])
    sampler_pool_size: int = 2048
    datasets: list[str] = field(default_factory=lambda: ["synthetic", "ml-100k"])  # choices.NEGATIVES_DATASETS
    seeds: list[int] = field(default_factory=lambda: [0])  # quality seeds of the precision rows
    train_steps: int = 20  # fixed training budget per row (capped by the scale's epochs)
    eval_users: int = 512  # users ranked per quality run (the first ones; 0 = all)
    timing_steps: int = 4  # timed steps per variant and round (the first of each round is dropped)
    timing_rounds: int = 2  # rounds over all variants (interleaved, so drift hits all alike)

    def __post_init__(self) -> None:
        name = "ablations.negatives"
        for f in ("baseline_negatives", "precision_shared_size", "async_shared_size", "sampler_pool_size",
                  "train_steps", "timing_rounds"):
            check(getattr(self, f) >= 1, f"{name}.{f}", f"must be >= 1, got {getattr(self, f)}")
        check(self.timing_steps >= 2, f"{name}.timing_steps", f"must be >= 2, got {self.timing_steps}")
        check(self.eval_users >= 0, f"{name}.eval_users", f"must be >= 0, got {self.eval_users}")
        check(all(r >= 1 for r in self.shared_sizes), f"{name}.shared_sizes", "sizes must be >= 1")
        for h in self.half_formats:
            one_of(h, choices.HALF_FORMATS, f"{name}.half_formats")
        for smp in self.samplers:
            check(smp in choices.SAMPLERS, f"{name}.samplers", f"unknown sampler {smp!r}")
        check(self.async_sampler in choices.SAMPLERS, f"{name}.async_sampler",
              f"unknown sampler {self.async_sampler!r}")
        for ds in self.datasets:
            one_of(ds, choices.NEGATIVES_DATASETS, f"{name}.datasets")
        check(len(self.seeds) >= 1, f"{name}.seeds", "needs at least one seed")


@dataclass(frozen=True)
class BalanceAblation:
    """The grid of the load-balancing experiment (notebooks/03_load_balancing, `bench balance`).

    calibrate   one HSTU layer of the scale's model, forward + backward on one thread, at
                calibration_points lengths from 16 to calibration_max (geometric); fit c0 + a*s + b*s^2
    simulate    every ranks x users_per_rank x max_lens cell, sim_steps global batches drawn from the
                KuaiRand-27K length fit (pool_users users), each of `methods` on the fitted costs,
                imbalance on the model and under the calibration's measured residuals
    time-sliced sliced_ranks emulated ranks x sliced_users sequences (KuaiRand-like lengths scaled to
                sliced_max_len), each rank's share timed one after another; random vs each method
    2-process   two gloo ranks train pair_steps steps of the scale's model (batch pair_batch_size,
                max_len pair_max_len) with balance none, then pair_method: all-reduce wait and step time
    """

    methods: list[str] = field(default_factory=lambda: ["random", "snake", "lpt", "kk"])
    equal_counts: bool = True
    ranks: list[int] = field(default_factory=lambda: [8, 64, 512, 1536])
    users_per_rank: list[int] = field(default_factory=lambda: [4, 8, 32])
    max_lens: list[int] = field(default_factory=lambda: [4096, 16384])
    sim_steps: int = 20
    pool_users: int = 27_285  # KuaiRand-27K's user count
    calibration_points: int = 14
    calibration_max: int = 4096
    calibration_repeats: int = 5
    sliced_ranks: int = 8
    sliced_users: int = 8
    sliced_max_len: int = 1024
    sliced_steps: int = 5
    sliced_repeats: int = 3
    pair_method: str = "kk"
    pair_steps: int = 20
    pair_batch_size: int = 32
    pair_max_len: int = 1024

    def __post_init__(self) -> None:
        name = "ablations.balance"
        check("random" in self.methods, f"{name}.methods", "must include 'random' (the 'before' of every ratio)")
        for m in self.methods:
            check(m in ("random", "snake", "lpt", "kk", "contiguous"), f"{name}.methods",
                  f"unknown method {m!r}; valid: random, snake, lpt, kk, contiguous")
        check(self.pair_method in choices.BALANCERS, f"{name}.pair_method",
              f"unknown balancer {self.pair_method!r}; valid: {choices.BALANCERS}")
        for f in ("ranks", "users_per_rank", "max_lens"):
            check(len(getattr(self, f)) >= 1 and all(v >= 1 for v in getattr(self, f)), f"{name}.{f}",
                  f"needs values >= 1, got {getattr(self, f)}")
        for f in ("sim_steps", "pool_users", "calibration_repeats", "sliced_ranks", "sliced_users", "sliced_steps",
                  "sliced_repeats", "pair_steps", "pair_batch_size"):
            check(getattr(self, f) >= 1, f"{name}.{f}", f"must be >= 1, got {getattr(self, f)}")
        check(self.calibration_points >= 3, f"{name}.calibration_points", "needs >= 3 points to fit 3 coefficients")
        check(self.calibration_max >= 32, f"{name}.calibration_max", f"must be >= 32, got {self.calibration_max}")
        check(self.sliced_max_len >= 2 and self.pair_max_len >= 2, f"{name}.sliced_max_len",
              "sliced_max_len and pair_max_len must be >= 2")


@dataclass(frozen=True)
class SparseAblation:
    """The grid of the sparse-parallelism experiment (notebooks/05_sparse_parallelism, `bench a2a`; claim C3).

    gloo      all_to_all_single timed on gloo_ranks gloo processes (2; 4 runs as 2 nodes x 2) at each of
              gloo_sizes bytes per peer, gloo_repeats times (median); alpha + beta * m fitted per message
    counters  4 ranks (2 nodes x 2) look up lookup_users users each of one training batch of the scale's
              data in a row-sharded table, flat and hierarchical; lookup_repeats timed lookups per variant
    model     each of `presets` (grlib.sim.alltoall.PRESETS) at each of `ranks`, at the paper's shape
              (users_per_rank users of KuaiRand-27K lengths cut at the paper preset's max_len, its d_model,
              fp32); de-duplication factors from dedup_batches batches of the scale's item ids
    memory    the shard each rank holds at 1, 2 and 4 ranks (measured), the paper's table at memory_ranks
              ranks (computed)
    torchrec  the same ids on 2 ranks through TorchRec's row-wise table and grlib's (when true and installed)
    """

    presets: list[str] = field(default_factory=lambda: ["gpu-8", "npu-16"])
    ranks: list[int] = field(default_factory=lambda: [16, 64, 512, 1536])
    users_per_rank: int = 32
    dedup_batches: int = 4
    gloo_ranks: list[int] = field(default_factory=lambda: [2, 4])
    gloo_sizes: list[int] = field(default_factory=lambda: [2**k for k in range(16, 23)])  # 64 KiB .. 4 MiB
    gloo_repeats: int = 15
    lookup_users: int = 32
    lookup_repeats: int = 5
    memory_ranks: list[int] = field(default_factory=lambda: [8, 16, 64, 512, 1536])
    torchrec: bool = True

    def __post_init__(self) -> None:
        name = "ablations.sparse"
        check(len(self.presets) >= 1, f"{name}.presets", "needs at least one preset")
        for f in ("ranks", "memory_ranks"):
            check(len(getattr(self, f)) >= 1 and all(v >= 1 for v in getattr(self, f)), f"{name}.{f}",
                  f"needs values >= 1, got {getattr(self, f)}")
        for r in self.gloo_ranks:
            check(r in (2, 4), f"{name}.gloo_ranks", f"{r!r} is not one of (2, 4) (4 runs as 2 nodes x 2)")
        check(len(set(self.gloo_sizes)) >= 2 and all(s >= 1 for s in self.gloo_sizes), f"{name}.gloo_sizes",
              f"needs >= 2 distinct sizes >= 1 byte (alpha and beta are fitted), got {self.gloo_sizes}")
        for f in ("users_per_rank", "dedup_batches", "gloo_repeats", "lookup_users", "lookup_repeats"):
            check(getattr(self, f) >= 1, f"{name}.{f}", f"must be >= 1, got {getattr(self, f)}")


@dataclass(frozen=True)
class SemiAsyncAblation:
    """The grid of the semi-asynchronous convergence study (notebooks/06_semi_async, claim C4): every
    staleness k x seed x dataset on `world` gloo ranks with a row-sharded item table; a worst case
    (worst_items hot items, learning rate worst_lr, each k of worst_staleness) on the scale's twin."""

    staleness: list[int] = field(default_factory=lambda: [0, 1, 2, 4])  # 0 = sync (the baseline)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    datasets: list[str] = field(default_factory=lambda: ["scale", "ml-100k"])
    max_steps: list[int] = field(default_factory=lambda: [40, 80])  # per dataset
    world: int = 2
    items: str = "flat"  # choices.ITEM_SHARDING except replicated: the stale rows come through all-to-alls
    balance: str = "kk"
    worst_items: int = 200
    worst_lr: float = 0.01
    worst_staleness: list[int] = field(default_factory=lambda: [0, 4, 16])
    worst_steps: int = 40
    # per dataset, config overrides on top of the scale's (as ablations.train.overrides: params.yaml
    # gives ML-100K the train stage's settings), so each dataset trains as in the train stage
    overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        name = "ablations.semi_async"
        check_dataset_overrides(self.overrides, f"{name}.overrides")
        check(0 in self.staleness and all(k >= 0 for k in self.staleness), f"{name}.staleness",
              f"needs 0 (sync, the baseline) and values >= 0, got {self.staleness}")
        check(len(self.seeds) >= 1, f"{name}.seeds", "needs at least one seed")
        for d in self.datasets:
            if d != "scale":
                one_of(d, choices.DATASETS, f"{name}.datasets: data.dataset")
        check(len(self.max_steps) == len(self.datasets) and all(n >= 1 for n in self.max_steps), f"{name}.max_steps",
              f"needs one step budget >= 1 per dataset ({len(self.datasets)}), got {self.max_steps}")
        check(self.world >= 2, f"{name}.world", f"must be >= 2 (data-parallel ranks), got {self.world}")
        check(self.items in ("flat", "hierarchical"), f"{name}.items",
              f"must be a sharded table ('flat' or 'hierarchical'), got {self.items!r}")
        one_of(self.balance, choices.BALANCERS, f"{name}.balance")
        check(self.worst_items > 1 and self.worst_lr > 0 and self.worst_steps >= 1, f"{name}.worst_items",
              "worst_items must be > 1, worst_lr > 0, worst_steps >= 1")
        check(all(k >= 0 for k in self.worst_staleness), f"{name}.worst_staleness", "values must be >= 0")


@dataclass(frozen=True)
class ScalingAblation:
    """The grid of the pipeline and scaling experiment (notebooks/07_scaling, `bench pipeline`; claims C5, C7).

    measured  2 gloo ranks train the scale's model (pair_batch_size sequences per global batch, max_len
              pair_max_len, items pair_items, balance pair_balance): gloo all-to-all and all-reduce at
              gloo_sizes (gloo_repeats), solo_steps steps of each rank alone, then each of `schedules`
              (semisync with `staleness`) for warm_steps + pair_steps steps, and solo_steps of rank 0 alone
              and of both at once, `rounds` times interleaved (each batch's median round counts); one
              HSTU layer calibrated at calibration_points lengths
    model     grlib.sim.pipeline at `ranks` of `preset` (grlib.sim.alltoall.PRESETS) with `device`
              (grlib.sim.scaleout.DEVICES), users_per_rank users of KuaiRand-27K lengths per `regimes`
              at the paper preset, sim_steps global batches, value_bytes per row / gradient value
    mfu       one paper-preset layer on mfu_threads threads over mfu_sequences sequences (mfu_regime
              lengths at min(mfu_max_len, the preset's max_len)), mfu_repeats timed runs
    """

    schedules: list[str] = field(default_factory=lambda: ["sync", "prefetch", "semisync"])
    staleness: int = 1
    pair_batch_size: int = 32
    pair_max_len: int = 1024
    pair_items: str = "hierarchical"
    pair_balance: str = "kk"
    pair_steps: int = 6
    warm_steps: int = 2
    rounds: int = 5
    solo_steps: int = 8
    gloo_sizes: list[int] = field(default_factory=lambda: [2**k for k in range(10, 23, 2)])  # 1 KiB .. 4 MiB
    gloo_repeats: int = 9
    calibration_points: int = 7
    calibration_repeats: int = 3
    gantt_steps: int = 3
    ranks: list[int] = field(default_factory=lambda: [8, 64, 512, 1536])
    users_per_rank: int = 32
    regimes: list[str] = field(default_factory=lambda: ["truncated", "scaled"])
    sim_steps: int = 5
    preset: str = "gpu-8"
    device: str = "h100-bf16"
    value_bytes: int = 4
    mfu_sequences: int = 4
    mfu_max_len: int = 4096
    mfu_regime: str = "scaled"
    mfu_threads: int = 2
    mfu_repeats: int = 1

    def __post_init__(self) -> None:
        name = "ablations.scaling"
        check(len(self.schedules) >= 1 and len(set(self.schedules)) == len(self.schedules), f"{name}.schedules",
              f"needs distinct schedules, got {self.schedules}")
        for s in self.schedules:
            one_of(s, choices.SCHEDULES, f"{name}.schedules")
        check(self.pair_items in ("flat", "hierarchical"), f"{name}.pair_items",
              f"must be a sharded table ('flat' or 'hierarchical'), got {self.pair_items!r}")
        one_of(self.pair_balance, choices.BALANCERS, f"{name}.pair_balance")
        check(self.pair_batch_size >= 2 and self.pair_batch_size % 2 == 0, f"{name}.pair_batch_size",
              f"must be even and >= 2 (two ranks of equal shares), got {self.pair_batch_size}")
        check(self.warm_steps >= 1, f"{name}.warm_steps", f"must be >= 1 (the model's first step), got {self.warm_steps}")
        check(self.calibration_points >= 3, f"{name}.calibration_points", "needs >= 3 lengths (a quadratic)")
        check(len(set(self.gloo_sizes)) >= 2 and min(self.gloo_sizes) >= 1, f"{name}.gloo_sizes",
              f"needs >= 2 distinct sizes >= 1 byte (alpha and beta are fitted), got {self.gloo_sizes}")
        check(len(self.ranks) >= 1 and min(self.ranks) >= 2, f"{name}.ranks", f"needs values >= 2, got {self.ranks}")
        for r in self.regimes:
            one_of(r, choices.REGIMES, f"{name}.regimes")
        one_of(self.mfu_regime, choices.REGIMES, f"{name}.mfu_regime")
        check(len(self.regimes) >= 1, f"{name}.regimes", "needs at least one regime")
        for f in ("staleness", "pair_max_len", "pair_steps", "rounds", "solo_steps", "gloo_repeats",
                  "calibration_repeats", "gantt_steps", "users_per_rank", "sim_steps", "value_bytes", "mfu_sequences",
                  "mfu_max_len", "mfu_threads", "mfu_repeats"):
            check(getattr(self, f) >= 1, f"{name}.{f}", f"must be >= 1, got {getattr(self, f)}")
        check(self.solo_steps >= 2, f"{name}.solo_steps", "needs >= 2 steps per rank (>= 3 fitted in all)")


ABLATIONS: dict[str, type] = {"train": TrainAblation, "kernels": KernelsAblation, "negatives": NegativesAblation,
                              "balance": BalanceAblation, "sparse": SparseAblation, "semi_async": SemiAsyncAblation,
                              "scaling": ScalingAblation}


def load_ablation(name: str, overrides: dict[str, Any] | str | None = None,
                  params: dict[str, Any] | None = None) -> Any:
    """The typed grid of one experiment from params.yaml's `ablations` section, with `overrides`
    (a mapping, or YAML / JSON text of one; the notebooks' `ablation_overrides`) on top."""
    overrides = as_mapping(overrides, "ablation_overrides", '{"seeds": [0]}')
    if name not in ABLATIONS:
        raise ConfigError(f"unknown ablation {name!r}; valid ablations: {', '.join(ABLATIONS)}")
    values = dict((params or read_params()).get("ablations", {}).get(name) or {})
    values.update(overrides)
    return apply(ABLATIONS[name](), values, f"ablations.{name}.")
