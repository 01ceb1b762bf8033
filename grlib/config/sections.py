"""The sections of a scale, one frozen dataclass each (data, model, train, negatives, kernels), and
Config, one scale's resolved set of them. Each section checks its own values on construction."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from dataclasses import dataclass, field
from typing import Any

from grlib import schedules
from grlib.config import choices
from grlib.config.fields import (FLAG, above, apply, at_least, check, check_fields, choice, each, fraction, nest,
                                  not_below, param, real, seed)
from grlib.schema import FIRST_ITEM_ID


@dataclass(frozen=True)
class DataConfig:
    dataset: str = param("synthetic", choice(choices.DATASETS))
    n_users: int = param(200, at_least(1))  # synthetic only: users to generate
    length_factor: float = param(0.01, above(0))  # synthetic only: scales the KuaiRand-27K per-user lengths
    n_items: int = param(2000, at_least(2))  # synthetic only: catalogue size
    max_len: int = param(64, at_least(2))  # history tokens kept per user (the most recent ones)
    min_item_count: int = param(1, at_least(1))  # items seen fewer times map to the out-of-vocabulary id
    seed: int = param(0, seed())
    # rows the model predicts: an action column (is_click, is_like, ...) or "all"
    target: str = param("is_click", choice(choices.TARGETS))
    context: str = param("all", choice(choices.CONTEXTS))  # history tokens: "all" impressions or only the "targets"
    bucket_rows: int = param(2_000_000, at_least(1000))  # preprocessing memory bound: log rows per bucket of users

    def __post_init__(self) -> None:
        check_fields(self, "data.")


@dataclass(frozen=True)
class ModelConfig:
    name: str = param("hstu", choice(choices.MODELS))
    n_layers: int = param(1, at_least(1))
    n_heads: int = param(1, at_least(1))
    d_model: int = param(32, at_least(1))  # item embedding and hidden size; per-head dims are d_model // n_heads
    dropout: float = param(0.2, fraction())
    # auto or one of choices.IMPLS (whether it implements HSTU attention here: grlib.ops)
    attention_impl: str = param("auto", choice(("auto", *choices.IMPLS)))
    # bf16: HSTU's projections on bf16 copies (grlib.model.hstu)
    precision: str = param("fp32", choice(choices.MODEL_PRECISIONS))
    # activation checkpointing: each HSTU layer keeps only its input and recomputes the rest in backward
    recompute_layers: bool = param(False, FLAG)

    def __post_init__(self) -> None:
        check_fields(self, "model.")
        check(self.d_model % self.n_heads == 0, "model.d_model",
              f"{self.d_model} is not divisible by model.n_heads={self.n_heads}")
        check(self.precision == "fp32" or self.name == "hstu", "model.precision",
              f"{self.precision} is implemented for model.name=hstu only, got {self.name}")
        check(not self.recompute_layers or self.name == "hstu", "model.recompute_layers",
              f"is implemented for model.name=hstu only, got {self.name}")


@dataclass(frozen=True)
class NegativesConfig:
    """The negative path of the loss (grlib.negatives)."""

    sampler: str = param("uniform", choice(choices.SAMPLERS))
    # R: negatives per target token (per-token) or the batch's pool size (shared)
    n_negatives: int = param(128, at_least(1))
    temperature: float = param(0.05, above(0))
    # per-token: R draws per token | shared: one pool of R per batch
    sharing: str = param("per-token", choice(choices.SHARING))
    precision: str = param("fp32", choice(choices.PRECISIONS))  # negative embeddings and their product
    async_sampling: bool = param(False, FLAG)  # sample the next batches' negatives in a background worker
    queue_depth: int = param(2, at_least(1))  # batches the worker samples ahead (bounded queue)
    logq: bool = param(True, FLAG)  # subtract log Q(item) from the logits (popularity, in-batch; uniform cancels)
    # sampled | full (every item, no sampler) | auto (full if V-2 <= R)
    softmax: str = param("sampled", choice(choices.SOFTMAX))

    def __post_init__(self) -> None:
        check_fields(self, "negatives.")

    def full_softmax(self, n_items: int) -> bool:
        """Whether the loss scores every real item (ids FIRST_ITEM_ID..n_items-1) rather than samples:
        softmax "full", or "auto" with a catalogue no larger than the pool of n_negatives."""
        return self.softmax == "full" or (self.softmax == "auto" and n_items - FIRST_ITEM_ID <= self.n_negatives)


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = param(1, at_least(1))
    batch_size: int = param(32, at_least(1))
    lr: float = param(1e-3, above(0))
    weight_decay: float = param(0.0, not_below(0))
    max_steps: int = param(0, at_least(0))  # 0 = no cap beyond epochs
    eval_batch_size: int = param(256, at_least(1))
    seed: int = param(0, seed())
    warmup_steps: int = param(0, at_least(0))  # linear learning-rate warm-up over this many steps (0 = none)
    grad_clip: float = param(1.0, not_below(0))  # max global gradient norm (0 = no clipping)
    # lazy_adam (row-wise, touched rows only) | adamw (dense)
    embedding_optimizer: str = param("lazy_adam", choice(choices.EMBEDDING_OPTIMIZERS))
    select_best: bool = param(True, FLAG)  # validate after each epoch; keep the weights of the best epoch

    def __post_init__(self) -> None:
        check_fields(self, "train.")


@dataclass(frozen=True)
class KernelsConfig:
    """Sizes of the attention-kernel benchmark (`bench kernels`, notebooks/01_kernels).

    Heads and head dim come from the model section. Each comparison batch holds
    max(1, pair_budget // max_len**2) sequences, so the padded reference touches the same number
    of score elements (B * max_len**2 per head) at every max_len and fits in time and memory."""

    max_lens: list[int] = param(rule=each(at_least(2)), factory=lambda: [256, 1024, 4096])
    pair_budget: int = param(2**24, at_least(4))  # B * max_len**2 of each comparison batch
    # sequences of the compiled kernel's run at the largest max_len (no padding; 0 = skip)
    whole_batch: int = param(32, at_least(0))
    repeats: int = param(3, at_least(1))  # timed repeats (median) after the memory run, which also warms up
    # fewer repeats (at least one) when a row's timed runs would take longer
    row_seconds: float = param(20.0, above(0))
    dtype: str = param("float32", choice(choices.KERNEL_DTYPES))
    # each row in a fresh child process (honest peak memory); false: in-process, no memory (smoke)
    isolate: bool = param(True, FLAG)

    def __post_init__(self) -> None:
        check_fields(self, "kernels.")

    def batch_size(self, max_len: int) -> int:
        return max(1, self.pair_budget // (max_len * max_len))


@dataclass(frozen=True)
class DistConfig:
    """The `dist` section: how one training run spreads over processes (grlib.distributed). The same
    model trains on 1 or N ranks (grlib.distributed.data_parallel); `-o dist.balance=kk` or train's
    flags (--world, --balance, ...) set it, and one process refuses every field it would not read."""

    world: int = param(1, at_least(1))  # ranks in all
    nodes: int = param(1, at_least(1))  # world = nodes x ranks per node
    backend: str = param("auto", choice(choices.BACKENDS))  # auto = nccl on CUDA, hccl on Ascend, gloo on CPU
    balance: str = param("none", choice(choices.BALANCERS))  # how the global batch's sequences go to ranks
    equal_counts: bool = param(True, FLAG)  # every rank gets B // P or B // P + 1 sequences
    cost: str = param("flops", choice(choices.BALANCE_COSTS))  # the per-sequence cost the balancer evens out
    # cost "quadratic": (c0, a, b) of c0 + a*s + b*s^2 (grlib.distributed.cost); empty: calibrated at launch
    quadratic: tuple[float, ...] = param((), each(real(), 0))
    # a registered schedule (grlib.schedules: sync, prefetch = step i+1 planned during step i, semisync,
    # overlap, pipelined, a plugin's); its traits say which of staleness and bucket_bytes it reads
    schedule: str = param("prefetch", choices.SCHEDULE)
    staleness: int = param(0, at_least(0))  # stale schedules: input item rows of batch i+k looked up k updates early
    # bucketed schedules: the dense gradients all-reduced in buckets of at most this many bytes during backward
    bucket_bytes: int = param(25 * 2**20, at_least(1))  # torch DDP's 25 MiB (grlib.distributed.buckets)
    items: str = param("replicated", choice(choices.ITEM_SHARDING))  # the item table on every rank, or row-sharded
    dedup: str = param("rank", choice(choices.ITEM_DEDUP))  # ids de-duplicated before the all-to-all (sharded items)
    timeout_s: float = param(300.0, above(0))  # a collective waiting longer fails (a dead rank ends the others)

    def __post_init__(self) -> None:
        check_fields(self, "dist.")
        check(self.world % self.nodes == 0, "dist.nodes",
              f"must divide dist.world={self.world}: one of "
              f"{[n for n in range(1, self.world + 1) if self.world % n == 0]}, got {self.nodes}")
        spec, stale, bucketed = schedules.get(self.schedule), schedules.with_trait("stale"), schedules.with_trait("bucketed")
        check(self.staleness == 0 or spec.stale, "dist.staleness", f"must be 0 unless dist.schedule is "
              f"{' or '.join(map(repr, stale))}; got {self.staleness} with {self.schedule!r}")
        check(self.bucket_bytes == 25 * 2**20 or spec.bucketed, "dist.bucket_bytes", f"is read by dist.schedule "
              f"{' and '.join(map(repr, bucketed))} only; got {self.bucket_bytes} with {self.schedule!r}")
        check(self.dedup != "node" or self.items == "hierarchical", "dist.dedup",
              f"'node' de-duplicates inside the two-stage exchange: needs dist.items='hierarchical', got {self.items!r}")
        check(len(self.quadratic) in (0, 3) and (not self.quadratic or self.cost == "quadratic"), "dist.quadratic",
              f"(c0, a, b) of dist.cost='quadratic' (empty: calibrated when the run starts), "
              f"got {self.quadratic} with cost {self.cost!r}")


@dataclass(frozen=True)
class Config:
    """One scale's resolved configuration."""

    scale: str
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    negatives: NegativesConfig = field(default_factory=NegativesConfig)
    kernels: KernelsConfig = field(default_factory=KernelsConfig)
    dist: DistConfig = field(default_factory=DistConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def params_hash(self) -> str:
        """sha256 (12 hex digits) of every field except the scale's name."""
        body = {k: v for k, v in self.to_dict().items() if k != "scale"}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]

    def replace(self, overrides: dict[str, Any]) -> "Config":
        """This config with `overrides` ({"model.n_layers": 2} or {"model": {"n_layers": 2}}) applied."""
        return with_sections(self, nest(overrides))


SECTIONS: dict[str, type] = {name: typ for name, typ in typing.get_type_hints(Config).items() if name != "scale"}


def with_sections(cfg: Config, values: dict[str, Any]) -> Config:
    """`cfg` with whole or partial sections replaced: {"model": {"n_layers": 2}, ...} (not dotted)."""
    return apply(cfg, values, "", kind="section", fixed=("scale",))
