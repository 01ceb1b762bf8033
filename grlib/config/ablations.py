"""The grids each experiment sweeps: params.yaml's `ablations` section, one frozen dataclass per
experiment, loaded by name with overrides on top (the notebooks' `ablation_overrides`).

    ab = load_ablation("train", {"seeds": [0, 1]})        # TrainAblation(seeds=[0, 1], ...)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grlib import schedules as registry
from grlib.config import choices
from grlib.config.fields import (CHECKED_BY_SECTION, FLAG, ConfigError, above, apply, at_least, check, check_fields,
                                  choice, each, param, seed)
from grlib.config.loader import as_mapping, check_dataset_overrides, dataset_section, read_params


SEEDS = each(seed())
# "scale" (the scale's own data) or a dataset name, as data.dataset takes it
DATASET_OR_SCALE = choice(("scale", *choices.DATASETS), prefix="data.dataset: ")


@dataclass(frozen=True)
class TrainAblation:
    """The grid of the training experiment (notebooks/02_train)."""

    models: list[str] = param(rule=each(choice(choices.MODELS)), factory=lambda: ["hstu", "sasrec", "popularity"])
    seeds: list[int] = param(rule=SEEDS, factory=lambda: [0])
    datasets: list[str] = param(rule=each(DATASET_OR_SCALE), factory=lambda: ["scale"])  # "scale" = the scale's own data
    # per dataset (same order): a step cap below the scale's train.max_steps, 0 = none; empty = no caps
    max_steps: list[int] = param(rule=each(at_least(0), 0), factory=list)
    # config overrides of a dataset (named as in `datasets`) on top of the scale's, e.g.
    # {"ml-100k": {"negatives.temperature": 0.2}}: load_ablation fills them from params.yaml's `datasets`
    # section (a dataset's own settings, one place for train, notebooks and stages); a dataset without an
    # entry trains with the scale's settings. Checked like load_config's overrides (unknown keys and bad
    # values are errors)
    overrides: dict[str, Any] = param(rule=CHECKED_BY_SECTION, factory=dict)
    # model.precision of HSTU's runs: fp32 (the `train` table) and any other (bf16: the same datasets, seeds
    # and budgets again, to table `train_precision`, compared with fp32 by train_stage.precision_summary)
    precisions: list[str] = param(rule=each(choice(choices.MODEL_PRECISIONS)), factory=lambda: ["fp32"])

    def __post_init__(self) -> None:
        check_fields(self, "ablations.train.")
        check(self.precisions[:1] == ["fp32"] and len(set(self.precisions)) == len(self.precisions),
              "ablations.train.precisions", f"must start with fp32 (the baseline) and name each once, "
              f"got {self.precisions}")
        check(self.precisions == ["fp32"] or "hstu" in self.models, "ablations.train.precisions",
              f"{self.precisions[1:]} train HSTU, which ablations.train.models {self.models} leaves out")
        check(not self.max_steps or len(self.max_steps) == len(self.datasets), "ablations.train.max_steps",
              f"needs one entry per dataset ({len(self.datasets)}), got {len(self.max_steps)}")
        check_dataset_overrides(self.overrides, "ablations.train.overrides")

    def dataset_overrides(self, dataset: str) -> dict[str, Any]:
        """The config overrides of `dataset` (as named in `datasets`; empty when it has none)."""
        return dict(self.overrides.get(dataset) or {})


@dataclass(frozen=True)
class KernelsAblation:
    """The grid of the attention-kernel experiment (notebooks/01_kernels, `bench kernels`)."""

    impls: list[str] = param(rule=each(choice(choices.IMPLS)), factory=lambda: ["reference", "fbgemm", "cpu"])
    regimes: list[str] = param(rule=each(choice(choices.REGIMES)), factory=lambda: ["truncated", "scaled"])

    def __post_init__(self) -> None:
        check_fields(self, "ablations.kernels.")
        check("reference" in self.impls, "ablations.kernels.impls",
              "must include 'reference' (every ratio is against it, measured in the same run)")


@dataclass(frozen=True)
class NegativesAblation:
    """The grid of the negative-sampling experiment (notebooks/04_negative_sampling, bench negatives).

    Rows (grlib.experiments.negatives_stage.variants): the per-token baseline (R = baseline_negatives, FP32,
    sync); shared pools of each size in shared_sizes; each half format at per-token R and at shared
    R = precision_shared_size; sync vs async vs pre-sampled with async_sampler at per-token
    R = baseline_negatives and at shared R = async_shared_size; each extra sampler at a shared pool of
    sampler_pool_size."""

    baseline_negatives: int = param(128, at_least(1))
    shared_sizes: list[int] = param(rule=each(at_least(1), 0), factory=lambda: [128, 512, 2048, 8192])
    half_formats: list[str] = param(rule=each(choice(choices.HALF_FORMATS), 0), factory=lambda: ["fp16"])
    precision_shared_size: int = param(2048, at_least(1))
    async_shared_size: int = param(2048, at_least(1))
    # the sampler of the sync / async / pre-sampled rows (the costliest)
    async_sampler: str = param("popularity", choice(choices.SAMPLERS))
    samplers: list[str] = param(rule=each(choice(choices.SAMPLERS), 0), factory=lambda: ["popularity", "in-batch"])
    sampler_pool_size: int = param(2048, at_least(1))
    datasets: list[str] = param(rule=each(choice(choices.NEGATIVES_DATASETS), 0),
                                factory=lambda: ["synthetic", "ml-100k"])
    seeds: list[int] = param(rule=SEEDS, factory=lambda: [0])  # quality seeds of the precision rows
    train_steps: int = param(20, at_least(1))  # fixed training budget per row (capped by the scale's epochs)
    eval_users: int = param(512, at_least(0))  # users ranked per quality run (the first ones; 0 = all)
    # timed steps per variant and round (the first of each round is dropped)
    timing_steps: int = param(4, at_least(2))
    timing_rounds: int = param(2, at_least(1))  # rounds over all variants (interleaved, so drift hits all alike)

    def __post_init__(self) -> None:
        check_fields(self, "ablations.negatives.")


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

    methods: list[str] = param(rule=each(choice(choices.BALANCERS)),
                               factory=lambda: ["random", "snake", "lpt", "kk"])
    equal_counts: bool = param(True, FLAG)
    ranks: list[int] = param(rule=each(at_least(1)), factory=lambda: [8, 64, 512, 1536])
    users_per_rank: list[int] = param(rule=each(at_least(1)), factory=lambda: [4, 8, 32])
    max_lens: list[int] = param(rule=each(at_least(1)), factory=lambda: [4096, 16384])
    sim_steps: int = param(20, at_least(1))
    pool_users: int = param(27_285, at_least(1))  # KuaiRand-27K's user count
    calibration_points: int = param(14, at_least(3))  # >= 3 points to fit 3 coefficients
    calibration_max: int = param(4096, at_least(32))
    calibration_repeats: int = param(5, at_least(1))
    sliced_ranks: int = param(8, at_least(1))
    sliced_users: int = param(8, at_least(1))
    sliced_max_len: int = param(1024, at_least(2))
    sliced_steps: int = param(5, at_least(1))
    sliced_repeats: int = param(3, at_least(1))
    pair_method: str = param("kk", choice(choices.BALANCERS))
    pair_steps: int = param(20, at_least(1))
    pair_batch_size: int = param(32, at_least(1))
    pair_max_len: int = param(1024, at_least(2))

    def __post_init__(self) -> None:
        check_fields(self, "ablations.balance.")
        check("random" in self.methods, "ablations.balance.methods",
              "must include 'random' (the 'before' of every ratio)")


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

    presets: list[str] = param(rule=each(choice(choices.PRESETS)), factory=lambda: ["gpu-8", "npu-16"])
    ranks: list[int] = param(rule=each(at_least(1)), factory=lambda: [16, 64, 512, 1536])
    users_per_rank: int = param(32, at_least(1))
    dedup_batches: int = param(4, at_least(1))
    # 4 runs as 2 nodes x 2
    gloo_ranks: list[int] = param(rule=each(choice((2, 4)), 0), factory=lambda: [2, 4])
    # bytes per peer, 64 KiB .. 4 MiB
    gloo_sizes: list[int] = param(rule=each(at_least(1)), factory=lambda: [2**k for k in range(16, 23)])
    gloo_repeats: int = param(15, at_least(1))
    lookup_users: int = param(32, at_least(1))
    lookup_repeats: int = param(5, at_least(1))
    memory_ranks: list[int] = param(rule=each(at_least(1)), factory=lambda: [8, 16, 64, 512, 1536])
    torchrec: bool = param(True, FLAG)

    def __post_init__(self) -> None:
        check_fields(self, "ablations.sparse.")
        check(len(set(self.gloo_sizes)) >= 2, "ablations.sparse.gloo_sizes",
              f"needs >= 2 distinct sizes (alpha and beta are fitted), got {self.gloo_sizes}")


@dataclass(frozen=True)
class SemiAsyncAblation:
    """The grid of the semi-asynchronous convergence study (notebooks/06_semi_async, claim C4): every
    staleness k x seed x dataset on `world` gloo ranks with a row-sharded item table; a worst case
    (worst_items hot items, learning rate worst_lr, each k of worst_staleness) on the scale's twin."""

    staleness: list[int] = param(rule=each(at_least(0)), factory=lambda: [0, 1, 2, 4])  # 0 = sync (the baseline)
    seeds: list[int] = param(rule=SEEDS, factory=lambda: [0, 1, 2])
    datasets: list[str] = param(rule=each(DATASET_OR_SCALE), factory=lambda: ["scale", "ml-100k"])
    max_steps: list[int] = param(rule=each(at_least(1)), factory=lambda: [40, 80])  # per dataset
    world: int = param(2, at_least(2))  # data-parallel ranks
    # a row-sharded table: the stale rows come through all-to-alls
    items: str = param("flat", choice(choices.SHARDED_ITEMS))
    balance: str = param("kk", choice(choices.BALANCERS))
    worst_items: int = param(200, at_least(2))
    worst_lr: float = param(0.01, above(0))
    worst_staleness: list[int] = param(rule=each(at_least(0)), factory=lambda: [0, 4, 16])
    worst_steps: int = param(40, at_least(1))
    # per dataset, config overrides on top of the scale's: as TrainAblation.overrides, params.yaml's
    # `datasets` section (filled by load_ablation), so each dataset trains as in the train stage
    overrides: dict[str, Any] = param(rule=CHECKED_BY_SECTION, factory=dict)

    def __post_init__(self) -> None:
        name = "ablations.semi_async"
        check_fields(self, f"{name}.")
        check_dataset_overrides(self.overrides, f"{name}.overrides")
        check(0 in self.staleness, f"{name}.staleness", f"needs 0 (sync, the baseline), got {self.staleness}")
        check(len(self.max_steps) == len(self.datasets), f"{name}.max_steps",
              f"needs one step budget per dataset ({len(self.datasets)}), got {self.max_steps}")


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

    # every schedule the pipeline model prices by default (grlib.schedules), params.yaml's grid a subset
    schedules: list[str] = param(rule=each(choices.SCHEDULE), factory=lambda: list(registry.priced()))
    staleness: int = param(1, at_least(1))
    pair_batch_size: int = param(32, at_least(2))  # even: two ranks of equal shares
    pair_max_len: int = param(1024, at_least(1))
    pair_items: str = param("hierarchical", choice(choices.SHARDED_ITEMS))
    pair_balance: str = param("kk", choice(choices.BALANCERS))
    pair_steps: int = param(6, at_least(1))
    warm_steps: int = param(2, at_least(1))  # the model's first step is warm-up
    rounds: int = param(5, at_least(1))
    solo_steps: int = param(8, at_least(2))  # >= 2 steps per rank (>= 3 fitted in all)
    # bytes per peer, 1 KiB .. 4 MiB
    gloo_sizes: list[int] = param(rule=each(at_least(1)), factory=lambda: [2**k for k in range(10, 23, 2)])
    gloo_repeats: int = param(9, at_least(1))
    calibration_points: int = param(7, at_least(3))  # >= 3 lengths (a quadratic)
    calibration_repeats: int = param(3, at_least(1))
    gantt_steps: int = param(3, at_least(1))
    ranks: list[int] = param(rule=each(at_least(2)), factory=lambda: [8, 64, 512, 1536])
    users_per_rank: int = param(32, at_least(1))
    regimes: list[str] = param(rule=each(choice(choices.REGIMES)), factory=lambda: ["truncated", "scaled"])
    sim_steps: int = param(5, at_least(1))
    preset: str = param("gpu-8", choice(choices.PRESETS))
    device: str = param("h100-bf16", choice(choices.DEVICES))
    value_bytes: int = param(4, at_least(1))
    mfu_sequences: int = param(4, at_least(1))
    mfu_max_len: int = param(4096, at_least(1))
    mfu_regime: str = param("scaled", choice(choices.REGIMES))
    mfu_threads: int = param(2, at_least(1))
    mfu_repeats: int = param(1, at_least(1))

    def __post_init__(self) -> None:
        name = "ablations.scaling"
        check_fields(self, f"{name}.")
        check(len(set(self.schedules)) == len(self.schedules), f"{name}.schedules",
              f"needs distinct schedules, got {self.schedules}")
        check(self.pair_batch_size % 2 == 0, f"{name}.pair_batch_size",
              f"must be even (two ranks of equal shares), got {self.pair_batch_size}")
        check(len(set(self.gloo_sizes)) >= 2, f"{name}.gloo_sizes",
              f"needs >= 2 distinct sizes (alpha and beta are fitted), got {self.gloo_sizes}")


# the grids whose `overrides` are a dataset's own settings: params.yaml's `datasets` section
DATASET_SETTINGS = ("train", "semi_async")

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
    params = params or read_params()
    values = dict(params.get("ablations", {}).get(name) or {})
    if name in DATASET_SETTINGS:
        if "overrides" in values:
            raise ConfigError(f"ablations.{name}.overrides: a dataset's settings live in params.yaml's `datasets` "
                              f"section (one place for train, the notebooks and the stages); move them there")
        values["overrides"] = dataset_section(params)
    values.update(overrides)
    return apply(ABLATIONS[name](), values, f"ablations.{name}.")
