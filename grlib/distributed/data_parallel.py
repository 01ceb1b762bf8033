"""Data-parallel training: N ranks train the model one process trains on the same global batches.

The global batch is the unit. Every rank reads the same global batch (the same data order, the
same seed), a balancer (grlib.distributed.balance) assigns its sequences to ranks from their costs, and
each rank trains the sub-batch it owns:

    global batch  [ s0 s1 s2 s3 s4 s5 ]          every rank, same order
    costs         [ c0 c1 c2 c3 c4 c5 ]          flops or tokens of each sequence
    assign(costs, P=2, "kk")  ->  owner [0 1 1 0 1 0]
    rank 0: select([0, 3, 5]) -> forward, loss * P_0 / P_global, backward ─┐
    rank 1: select([1, 2, 4]) -> forward, loss * P_1 / P_global, backward ─┴─ all-reduce SUM of
            gradients (+ the loss, + which parameters got one) -> identical optimizer steps

The gradients go in one flat buffer after backward (GradientSync), or, under the `overlap` and
`pipelined` schedules,
in buckets of dist.bucket_bytes launched from backward's hooks as their gradients are produced
(grlib.distributed.buckets.BucketedSync); the same sums either way.

Why the result equals one process's: the loss of one process is the mean over the global batch's
P_global target tokens; each rank's loss is the mean over its own P_r, weighted by P_r / P_global,
so the summed gradients are the single-process gradients (up to float summation order). The
negatives are drawn for the global batch with the shared generator (every rank draws the same ids)
and each rank keeps its tokens' rows; dropout draws the global batch's words and keeps the local
rows (grlib.model.dropout.global_rows). Balancing only moves sequences between ranks, never out of
the global batch, so balanced runs equal it too, within float summation order.

Planning (assignment, negatives, the local sub-batch) is pure host work: under the prefetch and
semisync schedules (grlib.distributed.schedules, built by grlib.fit.assemble) a worker thread plans step i+1 while step i computes. Every step the
ranks all-gather a fingerprint of the global batch (sequences, tokens, a length checksum), so ranks
that read different data (another seed, another dataset) stop with an error instead of training
silently apart. The global batch need not be read whole: grlib.fit.fit_rank gives the Planner
grlib.data.share.GlobalBatch, known by its lengths, whose select(rows) reads only this rank's
sequences and whose targets (the negatives' draw) are read once per step, so a rank holds no copy
of the dataset.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from grlib.config import DistConfig, ModelConfig
from grlib.distributed.balance import METHODS, assign, imbalance
from grlib.distributed.buckets import BucketedSync
from grlib.distributed.cost import FlopsCost, QuadraticCost
from grlib.distributed.sharded_embedding import ShardedRows, sum_over
from grlib.jagged import JaggedBatch
from grlib.model.dropout import global_rows
from grlib.negatives.path import ATTACHMENT, NegativePath, NegativeSample, PreparedSample
from grlib.train.optim import Optimizers
from grlib.train.step import TrainStep

class RankMismatch(RuntimeError):
    """The ranks disagree on the global batch (different data, seed or order)."""


def cost_function(cfg: DistConfig, model: ModelConfig) -> Callable[[np.ndarray], np.ndarray]:
    """Per-sequence cost of lengths [B]: 'flops' (grlib.perf's training FLOPs), 'tokens', or the
    calibrated 'quadratic' c0 + a*s + b*s^2 (grlib.distributed.cost)."""
    if cfg.cost == "tokens":
        return lambda lengths: np.asarray(lengths, dtype=np.float64)
    if cfg.cost == "flops":
        return FlopsCost(model)
    if cfg.cost == "quadratic":
        if len(cfg.quadratic) != 3:
            raise ValueError("dist.quadratic: cost 'quadratic' needs its (c0, a, b), calibrated by the launching "
                             "process (python -m grlib train) or given with -o dist.quadratic=[c0,a,b]")
        return QuadraticCost(*cfg.quadratic)
    raise ValueError(f"dist.cost must be 'flops', 'tokens' or 'quadratic', got {cfg.cost!r}")


@dataclass
class RankPlan:
    """One rank's share of one global batch, ready to train."""

    local: JaggedBatch  # this rank's sequences, its negatives attached
    token_index: Tensor  # [T_local] int64: each local token's position in the global batch
    total_tokens: int  # T_global
    weight: float  # P_local / P_global: the local mean loss's share of the global mean
    loads: np.ndarray  # [P] the cost per rank of the assignment (the balancer's model)
    fingerprint: Tensor  # [3] int64: sequences, tokens, length checksum of the global batch
    plan_s: float  # seconds spent planning (in the schedule's worker, or inline under sync)


class Planner:
    """Global batch -> this rank's RankPlan; deterministic, so every rank computes the same assignment."""

    def __init__(self, path: NegativePath, rank: int, world: int, balance: str = "none", *,
                 equal_counts: bool = True, cost: Callable[[np.ndarray], np.ndarray] | None = None, seed: int = 0):
        if balance not in METHODS:
            raise ValueError(f"balance must be one of {METHODS}, got {balance!r}")
        self.path, self.rank, self.world = path, rank, world
        self.method, self.equal_counts, self.seed = balance, equal_counts, seed
        self.cost = cost or (lambda lengths: np.asarray(lengths, dtype=np.float64))
        self.count = 0  # global batches planned (the random balancer's per-step seed)

    def __call__(self, batch: JaggedBatch) -> RankPlan:
        start = time.perf_counter()
        lengths = batch.lengths().numpy()  # [B]
        costs = self.cost(lengths)  # [B]
        owner = assign(costs, self.world, self.method, equal_counts=self.equal_counts, seed=self.seed + self.count)
        self.count += 1
        rows = owner.rows(self.rank)  # [B_r] ascending
        local = batch.select(rows)
        starts = batch.offsets[:-1][torch.from_numpy(rows)]  # [B_r]
        token_index = (torch.repeat_interleave(starts - local.offsets[:-1], local.lengths())
                       + torch.arange(local.num_tokens))  # [T_local]
        self.path.prepare(batch)  # the global batch's negatives: the same ids on every rank
        prepared: PreparedSample = batch.attachments.pop(ATTACHMENT)
        sample = local_sample(prepared.sample, token_index, local.targets)
        local.attachments[ATTACHMENT] = PreparedSample(sample, prepared.state, prepared.stamp)
        p_global = prepared.sample.targets.numel()
        check = int((np.arange(1, lengths.size + 1) * lengths).sum() % (2**61 - 1))
        return RankPlan(local, token_index, batch.num_tokens, sample.targets.numel() / p_global if p_global else 0.0,
                        owner.loads(costs), torch.tensor([batch.batch_size, batch.num_tokens, check]),
                        time.perf_counter() - start)


def local_sample(whole: NegativeSample, token_index: Tensor, local_targets: Tensor) -> NegativeSample:
    """The rows of a global batch's sample that belong to the local tokens (token_index [T_local])."""
    keep = torch.nonzero(local_targets > 0).reshape(-1)  # [P_local] positions among the local tokens
    at = torch.searchsorted(whole.keep, token_index[keep])  # [P_local] rows of the global sample
    ids = whole.ids if whole.shared else whole.ids[at]  # [R] or [P_local, R]
    return NegativeSample(keep, whole.targets[at], ids)


class GradientSync:
    """All-reduce (SUM) of every gradient, the step's loss and which parameters got a gradient, in one
    flat buffer. A parameter no rank gave a gradient keeps None (as on one process)."""

    def __init__(self, params: list[nn.Parameter], group=None):
        self.params, self.group = params, group

    def __call__(self, loss: Tensor) -> tuple[float, float]:
        """-> (global loss, seconds inside the all-reduce)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flags = torch.tensor([p.grad is not None for p in self.params], dtype=grads[0].dtype)  # [n]
        flat = torch.cat([g.reshape(-1) for g in grads] + [flags, loss.detach().reshape(1).to(grads[0].dtype)])
        start = time.perf_counter()
        dist.all_reduce(flat, group=self.group)
        waited = time.perf_counter() - start
        n_params = len(self.params)
        got = flat[-1 - n_params:-1] > 0  # [n] some rank gave this parameter a gradient
        at = 0
        for i, (p, g) in enumerate(zip(self.params, grads)):
            p.grad = flat[at:at + g.numel()].view_as(p) if got[i] else None
            at += g.numel()
        return float(flat[-1]), waited


class DataParallelStep(TrainStep):
    """The training step of one rank: TrainStep's phases on this rank's share of the global batch
    (dropout on the global batch's rows, the loss weighted P_local / P_global), then the gradients
    all-reduced (the comm phase): in one buffer after backward, or with `bucket_bytes` in buckets
    launched during backward (BucketedSync; the comm phase is then what is left to wait for). Row
    shards of a sharded item table are not all-reduced: their owners hold their whole gradient."""

    def __init__(self, model: nn.Module, path: NegativePath, opt: Optimizers, group=None,
                 bucket_bytes: int | None = None):
        super().__init__(model, path, opt)
        self.group = group
        self.tables = [m for m in model.modules() if isinstance(m, ShardedRows)]
        shards = {id(p) for m in self.tables for p in m.parameters()}
        dense = [p for p in model.parameters() if p.requires_grad and id(p) not in shards]
        self.sync = GradientSync(dense, group) if bucket_bytes is None else BucketedSync(dense, bucket_bytes, group)
        if shards:
            opt.sharded, opt.reduce = frozenset(shards), sum_over(group)
        self._sent = (0, 0)
        self._waited = 0.0
        self.stream_grads = None  # pipelined: this step's StreamGrads (grlib.distributed.stream), set by the schedule

    def begin(self, plan: RankPlan):
        self._sent = self._link_bytes()
        check_same_batch(plan.fingerprint, self.group)
        if isinstance(self.sync, BucketedSync):
            self.sync.arm()
        return plan.local, global_rows(plan.total_tokens, plan.token_index), plan.weight

    def reduce(self, loss: Tensor) -> tuple[float, dict[str, float]]:
        if isinstance(self.sync, BucketedSync):
            global_loss, figures = self.sync(loss)
            self._waited = figures.pop("allreduce_s")
        else:
            (global_loss, self._waited), figures = self.sync(loss), {}
        if self.stream_grads is not None:  # the item rows' gradients sent on the stream: wait for them
            figures.update(self.stream_grads.finish())
            self.stream_grads = None
        return global_loss, figures

    def figures(self, plan: RankPlan, t0: float) -> dict[str, float]:
        intra, inter = np.subtract(self._link_bytes(), self._sent)
        return {"t_start": t0, "allreduce_s": self._waited, "plan_s": plan.plan_s, "imbalance_model": imbalance(plan.loads),
                "global_tokens": plan.total_tokens, "items_intra_bytes": float(intra), "items_inter_bytes": float(inter)}

    def _link_bytes(self) -> tuple[int, int]:
        """Bytes this rank has sent for the sharded item tables so far (intra-node, inter-node)."""
        return (sum(m.counters.intra_bytes for m in self.tables), sum(m.counters.inter_bytes for m in self.tables))


def check_same_batch(fingerprint: Tensor, group=None) -> None:
    """All-gathers the global batch's fingerprint; RankMismatch when the ranks disagree."""
    world = dist.get_world_size(group)
    seen = [torch.empty_like(fingerprint) for _ in range(world)]
    dist.all_gather(seen, fingerprint, group=group)
    if any(not torch.equal(s, seen[0]) for s in seen):
        rows = ", ".join(f"rank {r}: {s.tolist()}" for r, s in enumerate(seen))
        raise RankMismatch(f"the ranks read different global batches (sequences, tokens, checksum): {rows}; "
                           f"every rank needs the same data, seed and batch size")


def broadcast_parameters(model: nn.Module, group=None) -> None:
    """Rank 0's weights on every rank (they start equal from the seed; this makes it so regardless)."""
    with torch.no_grad():
        for t in model.state_dict().values():
            dist.broadcast(t, src=0, group=group)
