"""Typed configuration: one dataclass per section, loaded from a named scale in params.yaml.

params.yaml holds `scale` (the default scale of `dvc repro`), `scales` (smoke, laptop, server,
paper: each a dict of sections) and `ablations` (the grids each experiment sweeps). A notebook
loads a scale and overrides single fields from its parameters cell:

    cfg = load_config("smoke", {"model.n_layers": 2, "train": {"lr": 3e-4}})
    cfg = load_config("smoke", '{"model.n_layers": 2}')   # the same mapping as YAML / JSON text

Overrides may also be YAML / JSON text (papermill's `-p overrides '{...}'` passes a string); text
that is not a mapping raises ConfigError naming the parameter. Unknown scales, sections or fields
raise ConfigError listing the valid ones; a value of the wrong type or out of range raises
ConfigError naming the field.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grlib import paths
from grlib.data.schema import ACTION_BITS


class ConfigError(ValueError):
    """A bad scale, section, field or value in params.yaml or an override."""


def _check(cond: bool, name: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{name}: {msg}")


@dataclass(frozen=True)
class DataConfig:
    dataset: str = "synthetic"  # synthetic | kuairand-pure | kuairand-1k | kuairand-27k | ml-100k
    n_users: int = 200  # synthetic only: users to generate
    length_factor: float = 0.01  # synthetic only: scales the KuaiRand-27K per-user lengths
    n_items: int = 2000  # synthetic only: catalogue size
    max_len: int = 64  # history tokens kept per user (the most recent ones)
    min_item_count: int = 1  # items seen fewer times map to the out-of-vocabulary id
    seed: int = 0
    target: str = "is_click"  # rows the model predicts: an action column (is_click, is_like, ...) or "all"
    context: str = "all"  # history tokens: "all" impressions or only the "targets"
    bucket_rows: int = 2_000_000  # preprocessing memory bound: log rows per bucket of users

    def __post_init__(self) -> None:
        valid = ("synthetic", "kuairand-pure", "kuairand-1k", "kuairand-27k", "ml-100k")
        _check(self.dataset in valid, "data.dataset", f"{self.dataset!r} is not one of {valid}")
        _check(self.n_users > 0, "data.n_users", f"must be > 0, got {self.n_users}")
        _check(self.length_factor > 0, "data.length_factor", f"must be > 0, got {self.length_factor}")
        _check(self.n_items > 1, "data.n_items", f"must be > 1, got {self.n_items}")
        _check(self.max_len >= 2, "data.max_len", f"must be >= 2, got {self.max_len}")
        _check(self.min_item_count >= 1, "data.min_item_count", f"must be >= 1, got {self.min_item_count}")
        targets = ("all", *ACTION_BITS)
        _check(self.target in targets, "data.target", f"{self.target!r} is not one of {targets}")
        _check(self.context in ("all", "targets"), "data.context",
               f"{self.context!r} is not one of ('all', 'targets')")
        _check(self.bucket_rows >= 1000, "data.bucket_rows", f"must be >= 1000, got {self.bucket_rows}")


@dataclass(frozen=True)
class ModelConfig:
    name: str = "hstu"  # hstu | sasrec | popularity
    n_layers: int = 1
    n_heads: int = 1
    d_model: int = 32  # item embedding and hidden size; per-head dims are d_model // n_heads
    dropout: float = 0.2
    attention_impl: str = "auto"  # auto | reference | fbgemm | cpu | triton | npu (see grlib.ops)

    def __post_init__(self) -> None:
        _check(self.name in ("hstu", "sasrec", "popularity"), "model.name",
               f"{self.name!r} is not one of ('hstu', 'sasrec', 'popularity')")
        _check(self.n_layers >= 1, "model.n_layers", f"must be >= 1, got {self.n_layers}")
        _check(self.n_heads >= 1, "model.n_heads", f"must be >= 1, got {self.n_heads}")
        _check(self.d_model % self.n_heads == 0, "model.d_model",
               f"{self.d_model} is not divisible by model.n_heads={self.n_heads}")
        _check(0.0 <= self.dropout < 1.0, "model.dropout", f"must be in [0, 1), got {self.dropout}")


@dataclass(frozen=True)
class NegativesConfig:
    """The negative path of the loss (grlib.negatives)."""

    sampler: str = "uniform"  # uniform | popularity | in-batch
    n_negatives: int = 128  # R: negatives per target token (per-token) or the batch's pool size (shared)
    temperature: float = 0.05
    sharing: str = "per-token"  # per-token: R draws per token | shared: one pool of R per batch
    precision: str = "fp32"  # fp32 | fp16 | bf16: negative embeddings and their product
    async_sampling: bool = False  # sample the next batches' negatives in a background worker
    queue_depth: int = 2  # batches the worker samples ahead (bounded queue)
    logq: bool = True  # subtract log Q(item) from the logits (popularity, in-batch; uniform cancels)

    def __post_init__(self) -> None:
        samplers = ("uniform", "popularity", "in-batch")
        _check(self.sampler in samplers, "negatives.sampler", f"{self.sampler!r} is not one of {samplers}")
        _check(self.n_negatives >= 1, "negatives.n_negatives", f"must be >= 1, got {self.n_negatives}")
        _check(self.temperature > 0, "negatives.temperature", f"must be > 0, got {self.temperature}")
        _check(self.sharing in ("per-token", "shared"), "negatives.sharing",
               f"{self.sharing!r} is not one of ('per-token', 'shared')")
        _check(self.precision in ("fp32", "fp16", "bf16"), "negatives.precision",
               f"{self.precision!r} is not one of ('fp32', 'fp16', 'bf16')")
        _check(self.queue_depth >= 1, "negatives.queue_depth", f"must be >= 1, got {self.queue_depth}")


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 1
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.0
    max_steps: int = 0  # 0 = no cap beyond epochs
    eval_batch_size: int = 256
    seed: int = 0
    warmup_steps: int = 0  # linear learning-rate warm-up over this many steps (0 = none)
    grad_clip: float = 1.0  # max global gradient norm (0 = no clipping)
    embedding_optimizer: str = "lazy_adam"  # lazy_adam (row-wise, touched rows only) | adamw (dense)
    select_best: bool = True  # validate after each epoch; keep the weights of the best epoch

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "eval_batch_size"):
            _check(getattr(self, name) >= 1, f"train.{name}", f"must be >= 1, got {getattr(self, name)}")
        _check(self.lr > 0, "train.lr", f"must be > 0, got {self.lr}")
        _check(self.weight_decay >= 0, "train.weight_decay", f"must be >= 0, got {self.weight_decay}")
        _check(self.max_steps >= 0, "train.max_steps", f"must be >= 0, got {self.max_steps}")
        _check(self.warmup_steps >= 0, "train.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        _check(self.grad_clip >= 0, "train.grad_clip", f"must be >= 0, got {self.grad_clip}")
        _check(self.embedding_optimizer in ("lazy_adam", "adamw"), "train.embedding_optimizer",
               f"{self.embedding_optimizer!r} is not one of ('lazy_adam', 'adamw')")


@dataclass(frozen=True)
class KernelsConfig:
    """Sizes of the attention-kernel benchmark (`bench kernels`, notebooks/01_kernels).

    Heads and head dim come from the model section. Each comparison batch holds
    max(1, pair_budget // max_len**2) sequences, so the padded reference touches the same number
    of score elements (B * max_len**2 per head) at every max_len and fits in time and memory."""

    max_lens: list[int] = field(default_factory=lambda: [256, 1024, 4096])
    pair_budget: int = 2**24  # B * max_len**2 of each comparison batch
    whole_batch: int = 32  # sequences of the compiled kernel's run at the largest max_len (no padding)
    repeats: int = 3  # timed repeats (median) after the memory run, which also warms up
    row_seconds: float = 20.0  # fewer repeats (at least one) when a row's timed runs would take longer
    dtype: str = "float32"  # float32 | bfloat16
    isolate: bool = True  # each row in a fresh child process (honest peak memory); false: in-process, no memory (smoke)

    def __post_init__(self) -> None:
        _check(len(self.max_lens) >= 1 and all(n >= 2 for n in self.max_lens), "kernels.max_lens",
               f"needs at least one length >= 2, got {self.max_lens}")
        _check(self.pair_budget >= 4, "kernels.pair_budget", f"must be >= 4, got {self.pair_budget}")
        _check(self.whole_batch >= 0, "kernels.whole_batch", f"must be >= 0 (0 = skip), got {self.whole_batch}")
        _check(self.repeats >= 1, "kernels.repeats", f"must be >= 1, got {self.repeats}")
        _check(self.row_seconds > 0, "kernels.row_seconds", f"must be > 0, got {self.row_seconds}")
        _check(self.dtype in ("float32", "bfloat16"), "kernels.dtype",
               f"{self.dtype!r} is not one of ('float32', 'bfloat16')")

    def batch_size(self, max_len: int) -> int:
        return max(1, self.pair_budget // (max_len * max_len))


@dataclass(frozen=True)
class Config:
    """One scale's resolved configuration."""

    scale: str
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    negatives: NegativesConfig = field(default_factory=NegativesConfig)
    kernels: KernelsConfig = field(default_factory=KernelsConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def params_hash(self) -> str:
        """sha256 (12 hex digits) of every field except the scale's name."""
        body = {k: v for k, v in self.to_dict().items() if k != "scale"}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]

    def replace(self, overrides: dict[str, Any]) -> "Config":
        return _apply(self, _nest(overrides), "")


SECTIONS: dict[str, type] = {f.name: f.type for f in dataclasses.fields(Config) if f.name != "scale"}


def _resolve_type(cls: type, name: str) -> Any:
    return typing.get_type_hints(cls)[name]


def _coerce(value: Any, typ: Any, name: str) -> Any:
    """Checks (and losslessly converts) a YAML/JSON value to a field's declared type."""
    origin = typing.get_origin(typ)
    if origin in (list, tuple):
        _check(isinstance(value, (list, tuple)), name, f"expected a list, got {value!r}")
        (inner, *_) = typing.get_args(typ) or (Any,)
        items = [_coerce(v, inner, f"{name}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in typing.get_args(typ):
            if option is type(None) and value is None:
                return None
            try:
                return _coerce(value, option, name)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(f"{name}: {value!r} matches none of {typ}")
    if typ is Any:
        return value
    if typ is bool:
        _check(isinstance(value, bool), name, f"expected true/false, got {value!r}")
        return value
    if typ is int:
        _check(isinstance(value, int) and not isinstance(value, bool), name, f"expected an integer, got {value!r}")
        return value
    if typ is float:
        if isinstance(value, str):  # YAML reads 1e-3 as a string
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{name}: expected a number, got {value!r}") from None
        _check(isinstance(value, (int, float)) and not isinstance(value, bool), name,
               f"expected a number, got {value!r}")
        return float(value)
    if typ is str:
        _check(isinstance(value, str), name, f"expected a string, got {value!r}")
        return value
    if dataclasses.is_dataclass(typ):
        _check(isinstance(value, dict), name, f"expected a mapping, got {value!r}")
        return _apply(typ(), value, name + ".")
    raise ConfigError(f"{name}: unsupported field type {typ}")


def _nest(overrides: dict[str, Any]) -> dict[str, Any]:
    """{'model.n_layers': 2} -> {'model': {'n_layers': 2}} (nested dicts pass through)."""
    nested: dict[str, Any] = {}
    for key, value in overrides.items():
        parts = key.split(".")
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict):
            node[parts[-1]].update(value)
        else:
            node[parts[-1]] = value
    return nested


def _apply(obj: Any, values: dict[str, Any], prefix: str) -> Any:
    """Returns obj (a dataclass instance) with the fields in `values` replaced, type-checked."""
    cls = type(obj)
    names = [f.name for f in dataclasses.fields(cls) if not (cls is Config and f.name == "scale")]
    changes = {}
    for key, value in values.items():
        if key not in names:
            what = "section" if cls is Config else "parameter"
            raise ConfigError(
                f"unknown {what} {prefix + key!r}; valid {prefix.rstrip('.') or 'top-level'} "
                f"{what}s: {', '.join(names)}"
            )
        typ = _resolve_type(cls, key)
        if dataclasses.is_dataclass(typ):
            _check(isinstance(value, dict), prefix + key, f"expected a mapping, got {value!r}")
            changes[key] = _apply(getattr(obj, key), value, f"{prefix}{key}.")
        else:
            changes[key] = _coerce(value, typ, prefix + key)
    try:
        return dataclasses.replace(obj, **changes)
    except ConfigError:
        raise
    except TypeError as err:  # pragma: no cover - guarded by the name check above
        raise ConfigError(f"{prefix}: {err}") from None


def read_params(path: Path | None = None) -> dict[str, Any]:
    path = path or paths.params_path()
    with open(path) as fh:
        params = yaml.safe_load(fh)
    if not isinstance(params, dict) or "scales" not in params:
        raise ConfigError(f"{path}: expected a mapping with a 'scales' section")
    return params


def scale_names(params: dict[str, Any] | None = None) -> list[str]:
    return list((params or read_params())["scales"])


def default_scale(params: dict[str, Any] | None = None) -> str:
    return (params or read_params()).get("scale", "smoke")


def as_mapping(value: Any, name: str, example: str = '{"model.n_layers": 2}') -> dict[str, Any]:
    """`value` as a mapping of overrides: a dict as is, YAML / JSON text parsed ("" / None: empty).
    Anything else raises ConfigError naming the parameter `name`."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at column {mark.column + 1}" if mark is not None else ""
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise ConfigError(f"{name}: not valid YAML / JSON{where} ({problem}): {value!r}") from None
        if parsed is None:
            return {}
        value = parsed
    if not isinstance(value, dict):
        raise ConfigError(f"{name}: expected a mapping such as {example}, got {value!r}")
    return value


def parse_overrides(items: list[str], option: str = "-o") -> dict[str, Any]:
    """Command-line overrides ["model.d_model=128", "train.lr=3e-4"] -> {"model.d_model": 128, ...}
    (values are YAML: numbers, true/false, lists)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{option} {item!r}: expected KEY=VALUE, e.g. {option} model.d_model=128")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ConfigError(f"{option} {item!r}: the value {value!r} is not valid YAML") from None
    return out


def load_config(scale: str | None = None, overrides: dict[str, Any] | str | None = None,
                params: dict[str, Any] | None = None) -> Config:
    """The Config of a named scale from params.yaml with `overrides` (a mapping, or YAML / JSON
    text of one) applied on top."""
    overrides = as_mapping(overrides, "overrides")
    params = params or read_params()
    scale = scale or default_scale(params)
    scales = params["scales"]
    if scale not in scales:
        raise ConfigError(f"unknown scale {scale!r}; valid scales: {', '.join(scales)}")
    cfg = _apply(Config(scale=scale), scales[scale] or {}, "")
    return cfg.replace(overrides)


@dataclass(frozen=True)
class TrainAblation:
    """The grid of the training experiment (notebooks/02_train)."""

    models: list[str] = field(default_factory=lambda: ["hstu", "sasrec", "popularity"])
    seeds: list[int] = field(default_factory=lambda: [0])
    datasets: list[str] = field(default_factory=lambda: ["scale"])  # "scale" = the scale's own data
    # per dataset (same order): a step cap below the scale's train.max_steps, 0 = none; empty = no caps
    max_steps: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for m in self.models:
            _check(m in ("hstu", "sasrec", "popularity"), "ablations.train.models", f"unknown model {m!r}")
        _check(len(self.seeds) >= 1, "ablations.train.seeds", "needs at least one seed")
        _check(len(self.datasets) >= 1, "ablations.train.datasets", "needs at least one dataset")
        for d in self.datasets:
            if d != "scale":  # a dataset name: checked by DataConfig
                try:
                    DataConfig(dataset=d)
                except ConfigError as err:
                    raise ConfigError(f"ablations.train.datasets: {err}") from None
        _check(not self.max_steps or len(self.max_steps) == len(self.datasets), "ablations.train.max_steps",
               f"needs one entry per dataset ({len(self.datasets)}), got {len(self.max_steps)}")
        _check(all(n >= 0 for n in self.max_steps), "ablations.train.max_steps", f"must be >= 0, got {self.max_steps}")


@dataclass(frozen=True)
class KernelsAblation:
    """The grid of the attention-kernel experiment (notebooks/01_kernels, `bench kernels`)."""

    impls: list[str] = field(default_factory=lambda: ["reference", "fbgemm", "cpu"])
    regimes: list[str] = field(default_factory=lambda: ["truncated", "scaled"])

    def __post_init__(self) -> None:
        valid = ("reference", "fbgemm", "cpu", "triton", "npu")
        for impl in self.impls:
            _check(impl in valid, "ablations.kernels.impls", f"unknown implementation {impl!r}; valid: {valid}")
        _check("reference" in self.impls, "ablations.kernels.impls",
               "must include 'reference' (every ratio is against it, measured in the same run)")
        for regime in self.regimes:
            _check(regime in ("truncated", "scaled"), "ablations.kernels.regimes",
                   f"unknown regime {regime!r}; valid: ('truncated', 'scaled')")
        _check(len(self.regimes) >= 1, "ablations.kernels.regimes", "needs at least one regime")




@dataclass(frozen=True)
class NegativesAblation:
    """The grid of the negative-sampling experiment (notebooks/04_negative_sampling, bench negatives).

    Rows (grlib.negatives.ablation.variants): the per-token baseline (R = baseline_negatives, FP32,
    sync); shared pools of each size in shared_sizes; each half format at per-token R and at shared
    R = precision_shared_size; sync vs async vs pre-sampled with async_sampler at per-token
    R = baseline_negatives and at shared R = async_shared_size; each extra sampler at a shared pool of
    sampler_pool_size."""

    baseline_negatives: int = 128
    shared_sizes: list[int] = field(default_factory=lambda: [128, 512, 2048, 8192])
    half_formats: list[str] = field(default_factory=lambda: ["fp16"])
    precision_shared_size: int = 2048
    async_shared_size: int = 2048
    async_sampler: str = "popularity"  # the sampler of the sync / async / pre-sampled rows (the costliest)
    samplers: list[str] = field(default_factory=lambda: ["popularity", "in-batch"])
    sampler_pool_size: int = 2048
    datasets: list[str] = field(default_factory=lambda: ["synthetic", "ml-100k"])
    seeds: list[int] = field(default_factory=lambda: [0])  # quality seeds of the precision rows
    train_steps: int = 20  # fixed training budget per row (capped by the scale's epochs)
    eval_users: int = 512  # users ranked per quality run (the first ones; 0 = all)
    timing_steps: int = 4  # timed steps per variant and round (the first of each round is dropped)
    timing_rounds: int = 2  # rounds over all variants (interleaved, so drift hits all alike)

    def __post_init__(self) -> None:
        name = "ablations.negatives"
        for f in ("baseline_negatives", "precision_shared_size", "async_shared_size", "sampler_pool_size",
                  "train_steps", "timing_rounds"):
            _check(getattr(self, f) >= 1, f"{name}.{f}", f"must be >= 1, got {getattr(self, f)}")
        _check(self.timing_steps >= 2, f"{name}.timing_steps", f"must be >= 2, got {self.timing_steps}")
        _check(self.eval_users >= 0, f"{name}.eval_users", f"must be >= 0, got {self.eval_users}")
        _check(all(r >= 1 for r in self.shared_sizes), f"{name}.shared_sizes", "sizes must be >= 1")
        for h in self.half_formats:
            _check(h in ("fp16", "bf16"), f"{name}.half_formats", f"{h!r} is not one of ('fp16', 'bf16')")
        for smp in self.samplers:
            _check(smp in ("uniform", "popularity", "in-batch"), f"{name}.samplers", f"unknown sampler {smp!r}")
        _check(self.async_sampler in ("uniform", "popularity", "in-batch"), f"{name}.async_sampler",
               f"unknown sampler {self.async_sampler!r}")
        for ds in self.datasets:
            _check(ds in ("synthetic", "ml-100k"), f"{name}.datasets", f"{ds!r} is not one of ('synthetic', 'ml-100k')")
        _check(len(self.seeds) >= 1, f"{name}.seeds", "needs at least one seed")


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
    return _apply(ABLATIONS[name](), values, f"ablations.{name}.")
