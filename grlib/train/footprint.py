"""The memory a training run needs, estimated from its Config before anything is allocated, and the
memory free to it: `python -m grlib train` (grlib.cli.train) refuses a config whose estimate exceeds
the free memory, in one line (MemoryRefused, a ConfigError: exit 2), unless --force.

    est = estimate(cfg)                                 # what the config alone shows (before any data)
    est = estimate(cfg, DataShape.from_stats(stats))    # with the prepared data's stats.json
    free = free_memory()                                # MemAvailable, cut by the cgroup's limit
    check(cfg, shape, world=2)                          # MemoryRefused when it does not fit

The estimate is arithmetic on the config (no torch, nothing built); a term a model's code makes
dominant is counted where the code makes it (fp32 = 4 bytes; T = tokens of a batch, B sequences,
N = data.max_len, d = model.d_model, H heads, L layers, V vocabulary rows, R negatives):

  resident      the runtime (interpreter, torch, polars, grlib._C), the data's token arrays, and each
                table with its gradient and Adam's two moments (4 floats per parameter; lazy Adam
                also keeps a float64 step per item row): the item table [V, d], the dense weights,
                SASRec's positions table [N, d] (its own term: it is sized by data.max_len)
  training step activations of one step: HSTU on the jagged batch, HSTU_TOKEN_FLOATS x L x T x d
                floats (model.recompute_layers: one float row per layer plus one layer's); SASRec on
                the batch padded to N (grlib.model.sasrec pads to data.max_len, not to the data's
                lengths): SASREC_TOKEN_FLOATS x L x B x N x d floats, SASREC_SCORE_BYTES x L x B x H x N^2
                for torch's attention (the [B x H, N, N] float mask merged from the causal and padding
                masks, the softmax, dropout's mask and output, all kept for backward), the causal mask
                [N, N] as bool and as the float mask torch makes of it; HSTU's padded attentions
                (model.attention_impl reference or fbgemm) B x H x N^2 x HSTU_PADDED_SCORE_BYTES per
                layer; the negatives (grlib.negatives.scoring: per-token rows [P, R, d] and their ids,
                or the shared pool [R, d] with its gradient; the full softmax's pool is every item)
  evaluation    the full ranking's scores [Be, V] with their comparisons (SCORE_BYTES a cell) and the
                normalised table [V, d], and the model's forward without gradients (SASRec: padded)

The peak is the sum of the terms: the step's and the evaluation's memory never overlap, but glibc
keeps the step's freed blocks (GRLIB_MALLOC=keep, grlib.memory) and they do not always serve the
evaluation's larger tensors. Terms that depend on the data's lengths (the jagged activations, the
negatives) are left out while the lengths are unknown: before the data is prepared the estimate is
a lower bound, which the config alone can still make too large (SASRec at smoke scale and
data.max_len 1e8: its positions table is 25.6 GB, 102 GB with its gradient and Adam's moments, and
one layer's attention 15.4 EB). With the data's stats, a batch's tokens T are bounded by its
longest windows (DataShape.batch_tokens).

Measured against the estimate with the prepared data's stats (`python -m grlib train --scale S
--model M --max-steps 3`, peak RSS = VmHWM at exit; 2 cores, torch 2.13 CPU, GRLIB_MALLOC=keep):
    smoke HSTU                          estimate 0.58 GB, peak RSS 0.52 GB
    smoke SASRec                        estimate 0.59 GB, peak RSS 0.48 GB
    smoke SASRec, data.max_len 512      estimate 2.62 GB, peak RSS 1.25 GB
    smoke SASRec, data.max_len 1024     estimate 6.91 GB, peak RSS 2.74 GB (one head: torch's fused
                                        attention holds only the [B, N, N] mask at evaluation)
    laptop HSTU                         estimate 1.32 GB, peak RSS 1.20 GB
    laptop SASRec                       estimate 1.72 GB, peak RSS 1.73 GB
One SASRec layer alone (train, forward + backward / eval, forward without gradients) fits
SASREC_SCORE_BYTES and SASREC_TOKEN_FLOATS within 5-20%: N 1024 B 64 H 1 d 64 +1.78 GB / +0.46 GB,
N 512 H 2 +1.03 / +0.51 GB, N 256 H 1 d 512 +1.13 / +0.40 GB.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from grlib.config import Config, ConfigError
from grlib.schema import FIRST_ITEM_ID

FLOAT = 4  # fp32 bytes
ADAM_COPIES = 4  # value, gradient, exp_avg, exp_avg_sq
LAZY_ADAM_STEP = 8  # lazy Adam's per-row step count (float64)
RUNTIME_BYTES = 300 * 10**6  # interpreter + torch + polars + grlib._C imported: resident when the check runs
WORKSPACE_BYTES = 200 * 10**6  # the GEMM peak measured before training (2048^2 matrices, library buffers)
EVENT_BYTES = 64  # per event: the token arrays (three int64, a bool) and the parquet read behind them
HSTU_TOKEN_FLOATS = 14  # kept per token per HSTU layer: LN(x), z [4d], attention, dropout mask, y, residual
HSTU_EVAL_TOKEN_FLOATS = 14  # a forward without gradients: a layer's tensors and those malloc keeps from the last
HSTU_PADDED_SCORE_BYTES = 40  # the padded reference: scores, biases, time buckets (int64), mask, SiLU, weights
SASREC_TOKEN_FLOATS = 30  # padded [B, N, d] floats per layer: norms, q/k/v, projections, dropouts, FFN
SASREC_SCORE_BYTES = 24  # [B, H, N, N] bytes per layer: merged float mask, softmax, dropout mask and output
SASREC_EVAL_SCORE_BYTES = 12  # without gradients or dropout: the merged float mask, and scores and softmax (H > 1)
SASREC_EVAL_TOKEN_FLOATS = 12  # padded [Be, N, d] floats of a forward without gradients
NEGATIVE_ID_BYTES = 28  # per (token, negative): int32 id, int64 flat id and inverse, local id, logQ
SCORE_BYTES = 9  # per [Be, V] cell: fp32 score, competing mask, the two comparisons and their ands
SHARED_CHUNK_BYTES = 3 * (1 << 20) * FLOAT  # the shared path's chunk of logits and its gradients

PADDED_HSTU = ("reference", "fbgemm")  # HSTU attention implementations that pad to data.max_len
PER_SEQUENCE_HSTU = ("loop", "loop_compile")  # dense [len, len] scores per sequence
N_ACTION_CODES, N_GAP_BUCKETS = 256, 32  # grlib.schema.N_ACTION_CODES, grlib.model.embeddings.N_GAP_BUCKETS
N_POS_BUCKETS, N_TIME_BUCKETS = 128, 32  # grlib.model.hstu's relative position and time bias buckets
SASREC_FFN_MULT = 1  # grlib.model.sasrec.FFN_MULT


class MemoryRefused(ConfigError):
    """A config whose estimated memory exceeds the memory free to the run (`train --force` runs it anyway)."""


QUANTILES = (0.99, 0.9, 0.5)  # the length quantiles stats.json records (length_p99, length_p90, length_p50)


@dataclass(frozen=True)
class DataShape:
    """What the data tells the estimate (None: not known yet, the terms it sizes are left out)."""

    n_items: int | None = None  # vocabulary rows, pad and OOV included (the model's item table)
    longest: int | None = None  # tokens of the longest window a batch takes (<= data.max_len)
    events: int | None = None  # tokens the prepared data holds in memory
    users: int | None = None  # sequences
    quantiles: tuple[float, ...] = ()  # the users' window lengths at QUANTILES (each <= longest)

    @classmethod
    def from_stats(cls, stats: dict, max_len: int) -> "DataShape":
        """From a prepared folder's stats.json (grlib.data.preprocess.prepare_logs): items, users,
        events, length_max and length_p99/p90/p50 (each user's sequence after the cut to max_len, its
        evaluation targets included: a window is at most min(max_len, that length))."""
        def number(key: str) -> float | None:
            value = stats.get(key)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
            return value if ok else None

        items, longest, events, users = (number(k) for k in ("items", "length_max", "events", "users"))
        window = None if longest is None else max(1, min(max_len, int(longest)))
        quantiles = tuple(number(f"length_p{round(q * 100)}") for q in QUANTILES)
        return cls(n_items=None if items is None else int(items) + FIRST_ITEM_ID, longest=window,
                   events=None if events is None else int(events), users=None if users is None else int(users),
                   quantiles=() if window is None or None in quantiles else
                   tuple(min(window, math.ceil(x)) for x in quantiles))

    def batch_tokens(self, batch: int) -> int | None:
        """An upper bound on the tokens T of a batch of `batch` sequences: the sum of the `batch`
        longest windows, where at most ceil((1 - q) x users) + 1 sequences are longer than the
        q-quantile (linear interpolation); batch x longest without the quantiles; never above the events."""
        if self.longest is None:
            return None
        if not self.users or len(self.quantiles) != len(QUANTILES):
            total = batch * self.longest
        else:  # the k-th longest window is at most longest, p99, p90, p50 as k passes each count
            counts = [min(batch, math.ceil((1 - q) * self.users) + 1) for q in QUANTILES] + [batch]
            total, done = 0, 0
            for count, cap in zip(counts, (self.longest, *self.quantiles)):
                total, done = total + max(0, count - done) * cap, max(done, count)
        return total if self.events is None else min(total, self.events)


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    settings: tuple[str, ...] = ()  # the config fields that size it (a refusal names them with their values)


@dataclass(frozen=True)
class Footprint:
    """The estimated memory of one process of a run, term by term, and the processes on this machine."""

    terms: tuple[Term, ...]
    processes: int = 1

    @property
    def per_process(self) -> int:
        """Every term: the training step's and the evaluation's memory are added although they never
        overlap, because glibc keeps the step's freed blocks (GRLIB_MALLOC=keep, grlib.memory) and
        they do not always serve the evaluation's larger tensors (laptop HSTU: the evaluation added
        0.44 GB of resident set on top of the step's 0.28 GB)."""
        return sum(t.bytes for t in self.terms)

    @property
    def total(self) -> int:
        return self.processes * self.per_process

    def largest(self, k: int = 3) -> list[Term]:
        return sorted(self.terms, key=lambda t: -t.bytes)[:k]


def human_bytes(n: float) -> str:
    """Decimal units, 3 significant digits: 25.6 GB, 2.56 EB."""
    for unit, scale in (("EB", 1e18), ("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def parameter_count(cfg: Config, n_items: int) -> tuple[int, int]:
    """(dense, item table) parameters of cfg.model for a vocabulary of n_items rows, as
    grlib.model.build_model makes them (tests/test_trust_resources.py compares with the meta-device build)."""
    m, d = cfg.model, cfg.model.d_model
    if m.name == "popularity":
        return 0, 0
    dense = (N_ACTION_CODES + N_GAP_BUCKETS) * d + 2 * d  # action and gap tables, the final LayerNorm
    if m.name == "hstu":
        per_layer = 2 * d + (d * 4 * d + 4 * d) + 2 * d + (d * d + d) + m.n_heads * (N_POS_BUCKETS + N_TIME_BUCKETS)
    else:
        ffn = SASREC_FFN_MULT * d
        per_layer = (3 * d * d + 3 * d) + (d * d + d) + (d * ffn + ffn) + (ffn * d + d) + 4 * d
        dense += cfg.data.max_len * d  # the positions table
    return dense + m.n_layers * per_layer, n_items * d


def estimate(cfg: Config, shape: DataShape = DataShape(), world: int = 1) -> Footprint:
    """The memory one process of a run of cfg needs (module doc), one of `world` ranks: each rank
    takes ceil(B / world) sequences of a training batch (dist.equal_counts; else up to B) and, with
    dist.items sharded, 1/world of the item rows; every rank evaluates whole evaluation batches."""
    m, d, N = cfg.model, cfg.model.d_model, cfg.data.max_len
    B = -(-cfg.train.batch_size // world) if cfg.dist.equal_counts else cfg.train.batch_size  # a rank's share
    Be = cfg.train.eval_batch_size
    V, L = shape.n_items, shape.longest
    tokens, eval_tokens = shape.batch_tokens(B), shape.batch_tokens(Be)  # T of the largest batches
    terms = [Term("runtime", RUNTIME_BYTES), Term("GEMM peak measurement", WORKSPACE_BYTES)]
    if shape.events is not None:
        terms.append(Term("data", shape.events * EVENT_BYTES, ("data.dataset",)))
    if V is not None:
        terms.append(Term("evaluation scores", Be * V * SCORE_BYTES + (FLOAT * V * d if m.name != "popularity" else 0),
                          ("train.eval_batch_size",)))
    if m.name == "popularity":
        return Footprint(tuple(terms), world)
    dense, _ = parameter_count(cfg, 0)
    if m.name == "sasrec":
        dense -= N * d
        terms.append(Term("SASRec positions table", ADAM_COPIES * FLOAT * N * d, ("data.max_len", "model.d_model")))
    copies = ADAM_COPIES + (world > 1)  # a rank of N also packs the dense gradients into one all-reduce buffer
    terms.append(Term("dense weights", copies * FLOAT * dense, ("model.d_model", "model.n_layers")))
    if V is not None:
        rows = -(-V // world) if cfg.dist.items != "replicated" else V
        step = LAZY_ADAM_STEP * rows if cfg.train.embedding_optimizer == "lazy_adam" else 0
        terms.append(Term("item table", ADAM_COPIES * FLOAT * rows * d + step, ("model.d_model",)))
    if m.name == "hstu":
        if tokens is not None:
            kept = (m.n_layers + HSTU_TOKEN_FLOATS) if m.recompute_layers else m.n_layers * HSTU_TOKEN_FLOATS
            terms.append(Term("HSTU activations", kept * FLOAT * tokens * d,
                              ("train.batch_size", "model.d_model", "model.n_layers")))
            terms.append(Term("HSTU evaluation activations", HSTU_EVAL_TOKEN_FLOATS * FLOAT * eval_tokens * d,
                              ("train.eval_batch_size", "model.d_model")))
        layers_at_once = 1 if m.recompute_layers else m.n_layers
        if m.attention_impl in PADDED_HSTU:
            terms.append(Term("HSTU attention (padded)",
                              HSTU_PADDED_SCORE_BYTES * layers_at_once * B * m.n_heads * N * N,
                              ("data.max_len", "train.batch_size", "model.attention_impl")))
        elif m.attention_impl in PER_SEQUENCE_HSTU and L is not None:
            terms.append(Term("HSTU attention (per sequence)",
                              HSTU_PADDED_SCORE_BYTES * layers_at_once * B * m.n_heads * L * L,
                              ("train.batch_size", "model.attention_impl")))
    else:
        layers = ("data.max_len", "train.batch_size", "model.n_layers")
        terms.append(Term("SASRec activations", SASREC_TOKEN_FLOATS * FLOAT * B * N * d * m.n_layers,
                          (*layers, "model.d_model")))
        terms.append(Term("SASRec attention", SASREC_SCORE_BYTES * B * m.n_heads * N * N * m.n_layers,
                          (*layers, "model.n_heads")))
        terms.append(Term("SASRec causal mask", N * N * (1 + FLOAT), ("data.max_len",)))
        terms.append(Term("SASRec evaluation activations", SASREC_EVAL_TOKEN_FLOATS * FLOAT * Be * N * d,
                          ("data.max_len", "train.eval_batch_size", "model.d_model")))
        terms.append(Term("SASRec evaluation attention", SASREC_EVAL_SCORE_BYTES * Be * m.n_heads * N * N,
                          ("data.max_len", "train.eval_batch_size", "model.n_heads")))
    terms += _negatives(cfg, V, tokens)
    return Footprint(tuple(terms), world)


def _negatives(cfg: Config, V: int | None, tokens: int | None) -> list[Term]:
    """The loss's negatives (grlib.negatives.scoring's module doc: what stays alive between forward and backward)."""
    neg, d = cfg.negatives, cfg.model.d_model
    width = {"fp32": 4, "fp16": 2, "bf16": 2}[neg.precision]
    if V is not None and neg.full_softmax(V):
        pool = V - FIRST_ITEM_ID
        return [Term("negatives (full softmax)", 2 * pool * d * FLOAT + SHARED_CHUNK_BYTES
                     + (0 if tokens is None else 2 * tokens * d * FLOAT), ("negatives.softmax", "model.d_model"))]
    if neg.sharing == "shared":
        held = 2 * neg.n_negatives * d * FLOAT + SHARED_CHUNK_BYTES + (0 if tokens is None else 2 * tokens * d * FLOAT)
        terms = [Term("negatives (shared)", held, ("negatives.n_negatives", "model.d_model"))]
        if neg.async_sampling:
            terms.append(Term("prefetched negatives", neg.queue_depth * neg.n_negatives * 8,
                              ("negatives.queue_depth", "negatives.n_negatives")))
        return terms
    if tokens is None:  # P <= T: unknown before the data's lengths are
        return []
    terms = [Term("negatives (per-token)", tokens * neg.n_negatives * (width * d + NEGATIVE_ID_BYTES),
                  ("negatives.n_negatives", "train.batch_size", "model.d_model"))]
    if neg.async_sampling:
        terms.append(Term("prefetched negatives", neg.queue_depth * tokens * neg.n_negatives * 4,
                          ("negatives.queue_depth", "negatives.n_negatives", "train.batch_size")))
    return terms


# ---- free memory --------------------------------------------------------------------------------

UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a number near 2**63


@dataclass(frozen=True)
class FreeMemory:
    bytes: int
    source: str  # where the figure comes from: MemAvailable, or the cgroup file that limits it


def free_memory(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> FreeMemory:
    """The memory a new allocation can take: /proc/meminfo's MemAvailable, cut by this process's
    memory cgroup (v2 memory.max, v1 memory.limit_in_bytes, the tightest over the cgroup and its
    ancestors) minus what the cgroup is charged less its inactive page cache (reclaimable, as the
    kernel reclaims it before an out-of-memory kill). Standard library only."""
    best = FreeMemory(_meminfo_available(proc / "meminfo"), "MemAvailable")
    for free, source in _cgroup_free(cgroup_root, proc / "self" / "cgroup"):
        if free < best.bytes:
            best = FreeMemory(free, source)
    return best


def _meminfo_available(meminfo: Path) -> int:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:  # no /proc/meminfo: the physical memory (an upper bound)
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return UNLIMITED


def _cgroup_free(root: Path, proc_cgroup: Path) -> list[tuple[int, str]]:
    """(limit - (charged - inactive_file), the limit's file) of each limited memory cgroup level."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split(":", 2)  # hierarchy-id:controllers:path
        if len(fields) != 3:
            continue
        controllers, rel = fields[1], fields[2]
        if controllers == "":  # cgroup v2
            base, limit_f, usage_f, inactive_key = root, "memory.max", "memory.current", "inactive_file"
        elif "memory" in controllers.split(","):  # cgroup v1
            base, limit_f, usage_f, inactive_key = (root / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
                                                    "total_inactive_file")
        else:
            continue
        folder = base / rel.strip("/")
        for level in (folder, *[p for p in folder.parents if p.is_relative_to(base)]):
            try:
                raw = (level / limit_f).read_text().strip()
                if raw == "max" or int(raw) >= UNLIMITED:
                    continue
                charged = int((level / usage_f).read_text().strip())
            except (OSError, ValueError):
                continue
            out.append((max(0, int(raw) - max(0, charged - _stat(level / "memory.stat", inactive_key))),
                        str(level / limit_f)))
    return out


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


# ---- the check ----------------------------------------------------------------------------------

def check(cfg: Config, shape: DataShape = DataShape(), world: int = 1, local: int | None = None, *,
          started: bool = True, force: bool = False) -> Footprint:
    """Raises MemoryRefused when the memory the run still needs exceeds free_memory(): `local` of its
    `world` ranks run on this machine (default: all), each needing estimate(cfg, shape, world). When
    the ranks' processes are `started` (this one process, or torchrun's ranks) their runtime is
    already resident and is not counted again; ranks that train --world N starts here are new
    processes. force: say the figures on stderr (one line) and return instead of refusing."""
    import sys

    est = estimate(cfg, shape, world)
    local = world if local is None else local
    need = local * (est.per_process - (RUNTIME_BYTES if started else 0))
    free = free_memory()
    ranks = f" for {local} ranks ({human_bytes(need / local)} each)" if local > 1 else ""
    counted = [t for t in est.largest(len(est.terms)) if not (started and t.name == "runtime")]
    terms = ", ".join(f"{t.name} {human_bytes(t.bytes)}" for t in counted[:3])
    figures = f"an estimated {human_bytes(need)}{ranks} ({terms}) with {human_bytes(free.bytes)} free ({free.source})"
    if force:
        print(f"--force: memory check skipped: training needs {figures}", file=sys.stderr, flush=True)
        return est
    if need <= free.bytes:
        return est
    sizing = next((t.settings for t in counted if t.settings), ())  # those of the largest term a setting sizes
    named = ", ".join(f"{k}={_setting(cfg, k)}" for k in sizing)
    raise MemoryRefused(f"{named + ': ' if named else ''}training needs {figures}; lower "
                        f"{'them' if len(sizing) > 1 else 'it'}, or pass --force to run anyway")


def _setting(cfg: Config, key: str) -> object:
    section, name = key.split(".", 1)
    return getattr(getattr(cfg, section), name)
