"""The sections of a scale, one frozen dataclass each (data, model, train, negatives, kernels), and
Config, one scale's resolved set of them. Each section checks its own values on construction."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from dataclasses import dataclass, field
from typing import Any

from grlib.config import choices
from grlib.config.fields import apply, check, nest, one_of
from grlib.schema import FIRST_ITEM_ID


@dataclass(frozen=True)
class DataConfig:
    dataset: str = "synthetic"  # choices.DATASETS
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
        one_of(self.dataset, choices.DATASETS, "data.dataset")
        check(self.n_users > 0, "data.n_users", f"must be > 0, got {self.n_users}")
        check(self.length_factor > 0, "data.length_factor", f"must be > 0, got {self.length_factor}")
        check(self.n_items > 1, "data.n_items", f"must be > 1, got {self.n_items}")
        check(self.max_len >= 2, "data.max_len", f"must be >= 2, got {self.max_len}")
        check(self.min_item_count >= 1, "data.min_item_count", f"must be >= 1, got {self.min_item_count}")
        one_of(self.target, choices.TARGETS, "data.target")
        one_of(self.context, choices.CONTEXTS, "data.context")
        check(self.bucket_rows >= 1000, "data.bucket_rows", f"must be >= 1000, got {self.bucket_rows}")


@dataclass(frozen=True)
class ModelConfig:
    name: str = "hstu"  # choices.MODELS
    n_layers: int = 1
    n_heads: int = 1
    d_model: int = 32  # item embedding and hidden size; per-head dims are d_model // n_heads
    dropout: float = 0.2
    attention_impl: str = "auto"  # auto or one of choices.IMPLS (resolved and checked by grlib.ops)
    precision: str = "fp32"  # choices.MODEL_PRECISIONS; bf16: HSTU's projections on bf16 copies (grlib.model.hstu)

    def __post_init__(self) -> None:
        one_of(self.name, choices.MODELS, "model.name")
        check(self.n_layers >= 1, "model.n_layers", f"must be >= 1, got {self.n_layers}")
        check(self.n_heads >= 1, "model.n_heads", f"must be >= 1, got {self.n_heads}")
        check(self.d_model % self.n_heads == 0, "model.d_model",
              f"{self.d_model} is not divisible by model.n_heads={self.n_heads}")
        check(0.0 <= self.dropout < 1.0, "model.dropout", f"must be in [0, 1), got {self.dropout}")
        one_of(self.precision, choices.MODEL_PRECISIONS, "model.precision")
        check(self.precision == "fp32" or self.name == "hstu", "model.precision",
              f"{self.precision} is implemented for model.name=hstu only, got {self.name}")


@dataclass(frozen=True)
class NegativesConfig:
    """The negative path of the loss (grlib.negatives)."""

    sampler: str = "uniform"  # choices.SAMPLERS
    n_negatives: int = 128  # R: negatives per target token (per-token) or the batch's pool size (shared)
    temperature: float = 0.05
    sharing: str = "per-token"  # per-token: R draws per token | shared: one pool of R per batch
    precision: str = "fp32"  # choices.PRECISIONS: negative embeddings and their product
    async_sampling: bool = False  # sample the next batches' negatives in a background worker
    queue_depth: int = 2  # batches the worker samples ahead (bounded queue)
    logq: bool = True  # subtract log Q(item) from the logits (popularity, in-batch; uniform cancels)
    softmax: str = "sampled"  # choices.SOFTMAX: sampled | full (every item, no sampler) | auto (full if V-2 <= R)

    def __post_init__(self) -> None:
        one_of(self.sampler, choices.SAMPLERS, "negatives.sampler")
        check(self.n_negatives >= 1, "negatives.n_negatives", f"must be >= 1, got {self.n_negatives}")
        check(self.temperature > 0, "negatives.temperature", f"must be > 0, got {self.temperature}")
        one_of(self.sharing, choices.SHARING, "negatives.sharing")
        one_of(self.precision, choices.PRECISIONS, "negatives.precision")
        check(self.queue_depth >= 1, "negatives.queue_depth", f"must be >= 1, got {self.queue_depth}")
        one_of(self.softmax, choices.SOFTMAX, "negatives.softmax")

    def full_softmax(self, n_items: int) -> bool:
        """Whether the loss scores every real item (ids FIRST_ITEM_ID..n_items-1) rather than samples:
        softmax "full", or "auto" with a catalogue no larger than the pool of n_negatives."""
        return self.softmax == "full" or (self.softmax == "auto" and n_items - FIRST_ITEM_ID <= self.n_negatives)


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
            check(getattr(self, name) >= 1, f"train.{name}", f"must be >= 1, got {getattr(self, name)}")
        check(self.lr > 0, "train.lr", f"must be > 0, got {self.lr}")
        check(self.weight_decay >= 0, "train.weight_decay", f"must be >= 0, got {self.weight_decay}")
        check(self.max_steps >= 0, "train.max_steps", f"must be >= 0, got {self.max_steps}")
        check(self.warmup_steps >= 0, "train.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        check(self.grad_clip >= 0, "train.grad_clip", f"must be >= 0, got {self.grad_clip}")
        one_of(self.embedding_optimizer, choices.EMBEDDING_OPTIMIZERS, "train.embedding_optimizer")


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
    dtype: str = "float32"  # choices.KERNEL_DTYPES
    isolate: bool = True  # each row in a fresh child process (honest peak memory); false: in-process, no memory (smoke)

    def __post_init__(self) -> None:
        check(len(self.max_lens) >= 1 and all(n >= 2 for n in self.max_lens), "kernels.max_lens",
              f"needs at least one length >= 2, got {self.max_lens}")
        check(self.pair_budget >= 4, "kernels.pair_budget", f"must be >= 4, got {self.pair_budget}")
        check(self.whole_batch >= 0, "kernels.whole_batch", f"must be >= 0 (0 = skip), got {self.whole_batch}")
        check(self.repeats >= 1, "kernels.repeats", f"must be >= 1, got {self.repeats}")
        check(self.row_seconds > 0, "kernels.row_seconds", f"must be > 0, got {self.row_seconds}")
        one_of(self.dtype, choices.KERNEL_DTYPES, "kernels.dtype")

    def batch_size(self, max_len: int) -> int:
        return max(1, self.pair_budget // (max_len * max_len))


@dataclass(frozen=True)
class DistConfig:
    """How one training run spreads over processes (grlib.dist). Not a section of a scale: the
    same model trains on 1 or N ranks (grlib.dist.data_parallel), so these are run options."""

    world: int = 1  # ranks in all
    nodes: int = 1  # world = nodes x ranks per node
    backend: str = "auto"  # choices.BACKENDS: auto = nccl on CUDA, hccl on Ascend, gloo on CPU
    balance: str = "none"  # choices.BALANCERS: how the global batch's sequences go to ranks
    equal_counts: bool = True  # every rank gets B // P or B // P + 1 sequences
    cost: str = "flops"  # choices.BALANCE_COSTS: the per-sequence cost the balancer evens out
    quadratic: tuple[float, ...] = ()  # cost "quadratic": (c0, a, b) of c0 + a*s + b*s^2 (grlib.dist.cost)
    schedule: str = "prefetch"  # choices.SCHEDULES: sync | prefetch (step i+1 planned during step i) | semisync
    staleness: int = 0  # semisync: input item rows of batch i+k looked up k updates early (0 = sync)
    items: str = "replicated"  # choices.ITEM_SHARDING: the item table on every rank, or row-sharded
    dedup: str = "rank"  # choices.ITEM_DEDUP: ids de-duplicated before the all-to-all (sharded items)
    timeout_s: float = 300.0  # a collective waiting longer fails (a dead rank ends the others)

    def __post_init__(self) -> None:
        check(self.world >= 1, "dist.world", f"must be >= 1, got {self.world}")
        check(self.nodes >= 1 and self.world % self.nodes == 0, "dist.nodes",
              f"must divide dist.world={self.world}: one of "
              f"{[n for n in range(1, self.world + 1) if self.world % n == 0]}, got {self.nodes}")
        one_of(self.backend, choices.BACKENDS, "dist.backend")
        one_of(self.balance, choices.BALANCERS, "dist.balance")
        one_of(self.cost, choices.BALANCE_COSTS, "dist.cost")
        check(self.timeout_s > 0, "dist.timeout_s", f"must be > 0, got {self.timeout_s}")
        one_of(self.schedule, choices.SCHEDULES, "dist.schedule")
        check(self.staleness >= 0 and (self.staleness == 0 or self.schedule == "semisync"), "dist.staleness",
              f"must be >= 0, and > 0 only with dist.schedule='semisync'; got {self.staleness} with {self.schedule!r}")
        one_of(self.items, choices.ITEM_SHARDING, "dist.items")
        one_of(self.dedup, choices.ITEM_DEDUP, "dist.dedup")
        check(self.dedup != "node" or self.items == "hierarchical", "dist.dedup",
              f"'node' de-duplicates inside the two-stage exchange: needs dist.items='hierarchical', got {self.items!r}")
        check((self.cost == "quadratic") == (len(self.quadratic) == 3), "dist.quadratic",
              f"needs (c0, a, b) exactly when dist.cost is 'quadratic', got {self.quadratic} with cost {self.cost!r}")


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
        """This config with `overrides` ({"model.n_layers": 2} or {"model": {"n_layers": 2}}) applied."""
        return with_sections(self, nest(overrides))


SECTIONS: dict[str, type] = {name: typ for name, typ in typing.get_type_hints(Config).items() if name != "scale"}
# DistConfig is not among them: it is a run option (grlib.cli.train's --world, --balance, ...)


def with_sections(cfg: Config, values: dict[str, Any]) -> Config:
    """`cfg` with whole or partial sections replaced: {"model": {"n_layers": 2}, ...} (not dotted)."""
    return apply(cfg, values, "", kind="section", fixed=("scale",))
