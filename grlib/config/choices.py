"""Every choice list of the configuration, written once: the dataclass checks (grlib.config.sections,
grlib.config.ablations) and the command-line choices use these tuples; their order is the order
error messages list them in."""
from __future__ import annotations

from grlib import schedules
from grlib.config.fields import Rule
from grlib.schema import ACTION_BITS

# data
DATASETS = ("synthetic", "kuairand-pure", "kuairand-1k", "kuairand-27k", "ml-100k")  # data.dataset
TARGETS = ("all", *ACTION_BITS)  # data.target: an action column or every row
CONTEXTS = ("all", "targets")  # data.context: history tokens are all impressions or only the targets

# model
MODELS = ("hstu", "sasrec", "popularity")  # model.name, ablations.train.models
MODEL_PRECISIONS = ("fp32", "bf16")  # model.precision: the encoder's projection GEMMs (grlib.model.hstu)
IMPLS = ("reference", "fbgemm", "cpu", "triton", "npu", "loop", "loop_compile", "onednn")  # operator implementations: ablations.kernels.impls

# negatives
SAMPLERS = ("uniform", "popularity", "in-batch")  # negatives.sampler, ablations.negatives.samplers
SHARING = ("per-token", "shared")  # negatives.sharing
PRECISIONS = ("fp32", "fp16", "bf16")  # negatives.precision
# negatives.softmax: sampled negatives | every item of the catalogue | full where the catalogue's real
# items are no more than n_negatives (a pool that large samples nothing a full softmax does not score)
SOFTMAX = ("sampled", "full", "auto")
HALF_FORMATS = tuple(p for p in PRECISIONS if p != "fp32")  # ablations.negatives.half_formats
NEGATIVES_DATASETS = ("synthetic", "ml-100k")  # ablations.negatives.datasets

# train
EMBEDDING_OPTIMIZERS = ("lazy_adam", "adamw")  # train.embedding_optimizer

# kernels
ISA_PATHS = ("amx", "avx512_bf16", "avx512", "avx2", "generic")  # GRLIB_ISA, bench --isa (grlib.hardware.isa), widest first
KERNEL_DTYPES = ("float32", "bfloat16")  # kernels.dtype
REGIMES = ("truncated", "scaled")  # ablations.kernels.regimes: real lengths cut at max_len, or scaled to it

# distributed (grlib.config.sections.DistConfig; --balance, --cost, --backend of `train`)
# dist.balance, ablations.balance.methods (grlib.distributed.balance.METHODS); none: contiguous split of the global batch
BALANCERS = ("none", "random", "snake", "lpt", "kk")
BALANCE_COSTS = ("flops", "tokens", "quadratic")  # the per-sequence cost the balancer evens out (quadratic: calibrated)
BACKENDS = ("auto", "gloo", "nccl", "hccl")
ITEM_SHARDING = ("replicated", "flat", "hierarchical")  # the item table: on every rank, or row-sharded (all-to-all)
ITEM_DEDUP = ("none", "rank", "node")  # ids sent once per rank / once per node (hierarchical only)
SHARDED_ITEMS = ("flat", "hierarchical")  # ITEM_SHARDING's row-sharded tables (ablations.semi_async.items, ...)

# dist.schedule, ablations.scaling.schedules: a registered schedule (grlib.schedules; a plugin's too, so
# the names are read when a value is checked, not when this module is imported)
SCHEDULE = Rule("must be a registered schedule (grlib.schedules)", lambda v: v in schedules.names(), ("no-such-choice",),
                lambda v: f"{v!r} is not one of {schedules.names()}")

# modelled clusters (the keys of grlib.sim.alltoall.PRESETS and grlib.sim.scaleout.DEVICES)
PRESETS = ("gpu-8", "npu-16")  # ablations.sparse.presets, ablations.scaling.preset
DEVICES = ("h100-bf16", "h100-fp32")  # ablations.scaling.device

# the parts of a stage's measurement (`bench balance --parts`, `bench a2a --parts`: their parsers
# read these without importing the stage)
BALANCE_PARTS = ("calibrate", "simulated", "time-sliced", "2-process")  # grlib.experiments.balance_stage
SPARSE_PARTS = ("gloo", "counters", "model", "memory", "torchrec")  # grlib.experiments.sparse_stage
