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

    def __post_init__(self) -> None:
        for m in self.models:
            check(m in choices.MODELS, "ablations.train.models", f"unknown model {m!r}")
        check(len(self.seeds) >= 1, "ablations.train.seeds", "needs at least one seed")
        check(len(self.datasets) >= 1, "ablations.train.datasets", "needs at least one dataset")
        for d in self.datasets:
            if d != "scale":  # a dataset name, as data.dataset takes it
                one_of(d, choices.DATASETS, "ablations.train.datasets: data.dataset")
        check(not self.max_steps or len(self.max_steps) == len(self.datasets), "ablations.train.max_steps",
              f"needs one entry per dataset ({len(self.datasets)}), got {len(self.max_steps)}")
        check(all(n >= 0 for n in self.max_steps), "ablations.train.max_steps", f"must be >= 0, got {self.max_steps}")
        for ds, o in self.overrides.items():
            name = f"ablations.train.overrides.{ds}"
            check(ds == "scale" or ds in choices.DATASETS, "ablations.train.overrides",
                  f"{ds!r} is not a dataset: one of {('scale', *choices.DATASETS)}")
            check(isinstance(o, dict), name, f"expected a mapping such as {{negatives.temperature: 0.2}}, got {o!r}")
            try:
                with_sections(Config("check"), nest(o))
            except ConfigError as err:
                raise ConfigError(f"{name}: {err}") from None

    def dataset_overrides(self, dataset: str) -> dict[str, Any]:
        """The config overrides of `dataset` (as named in `datasets`; empty when it has none)."""
        return dict(self.overrides.get(dataset) or {})


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


ABLATIONS: dict[str, type] = {"train": TrainAblation, "kernels": KernelsAblation, "negatives": NegativesAblation}


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
