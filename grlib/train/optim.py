"""Optimizers of the trainer: AdamW for dense weights, lazy (row-wise) Adam for embedding rows,
linear warm-up, gradient clipping.

LazyAdam updates only the rows of a table that received a gradient in the step (their moments
and their own step counts, as torch.optim.SparseAdam and TF's LazyAdam do); untouched rows keep
their values and moments. Dense Adam would keep moving every row with stale momentum, and would
cost O(V * d) per step in moments for rows the batch never saw.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from grlib import ops
from grlib.config import TrainConfig
from grlib.model.embeddings import embedding_parameters
from grlib.ops.lazy_adam import kernel_fits

BETAS = (0.9, 0.98)  # HSTU public training (generative-recommenders): Adam, betas (0.9, 0.98)


class LazyAdam(torch.optim.Optimizer):
    """Adam on the rows of 2-D parameters whose gradient row is nonzero (dense gradients in)."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = BETAS, eps: float = 1e-8):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dim() != 2:
                    raise ValueError(f"LazyAdam updates rows of 2-D tables, got shape {tuple(p.shape)}")
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                    # per-row step counts; the key "step" keeps torch's load_state_dict from casting them
                    # to the parameter's dtype (float32 counts would change the bias corrections after resume)
                    state["step"] = torch.zeros(p.shape[0], dtype=torch.float64, device=p.device)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                # auto: the one-pass cpu kernel on CPU; the torch reference for tables it does not take
                impl = "auto" if kernel_fits(p, p.grad, m, v) else "reference"
                ops.lazy_adam_(p, p.grad, m, v, state["step"], group["lr"], *group["betas"], group["eps"], impl=impl)


class Optimizers:
    """The dense and sparse optimizers and their shared warm-up schedule, stepped together."""

    def __init__(self, model: nn.Module, cfg: TrainConfig):
        sparse = embedding_parameters(model) if cfg.embedding_optimizer == "lazy_adam" else []
        ids = {id(p) for p in sparse}
        dense = [p for p in model.parameters() if id(p) not in ids and p.requires_grad]
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.clip = cfg.grad_clip
        self.sharded: frozenset[int] = frozenset()  # ids of parameters each rank holds a part of (row shards)
        self.reduce = None  # sums a tensor over ranks (set with `sharded` by grlib.distributed.data_parallel)
        self.opts: list[torch.optim.Optimizer] = [
            torch.optim.AdamW(dense, lr=cfg.lr, betas=BETAS, weight_decay=cfg.weight_decay, fused=True)]
        if sparse:
            self.opts.append(LazyAdam(sparse, lr=cfg.lr))
        warmup = cfg.warmup_steps
        factor = (lambda step: min(1.0, (step + 1) / warmup)) if warmup else (lambda step: 1.0)
        self.schedules = [torch.optim.lr_scheduler.LambdaLR(o, factor) for o in self.opts]

    def zero_grad(self) -> None:
        for o in self.opts:
            o.zero_grad(set_to_none=True)

    def step(self) -> float:
        """Clips (if configured), steps every optimizer and schedule; returns the gradient norm."""
        norm = clip_norm(self.params, self.clip, self.sharded, self.reduce)
        for o in self.opts:
            o.step()
        for s in self.schedules:
            s.step()
        return norm

    @property
    def lr(self) -> float:
        return self.opts[0].param_groups[0]["lr"]

    def state_dict(self) -> dict:
        return {"opts": [o.state_dict() for o in self.opts], "schedules": [s.state_dict() for s in self.schedules]}

    def load_state_dict(self, state: dict) -> None:
        for o, s in zip(self.opts, state["opts"], strict=True):
            o.load_state_dict(s)
        for o, s in zip(self.schedules, state["schedules"], strict=True):
            o.load_state_dict(s)


def clip_norm(params: list[Tensor], max_norm: float, sharded: frozenset[int] = frozenset(),
              reduce=None) -> float:
    """Clips the global gradient norm to max_norm (0: only measures it); returns the norm before.
    Parameters in `sharded` are parts of one tensor spread over ranks: their squared norms are
    summed over ranks with `reduce` (every rank then clips by the same global norm)."""
    if sharded:
        return _clip_sharded(params, max_norm, sharded, reduce)
    grads = [p for p in params if p.grad is not None]
    if not grads:
        return 0.0
    # torch.nn.utils.clip_grad_norm_'s arithmetic, without its multiply by 1.0 when the norm is under
    # max_norm (a pass over every gradient, 10 ms of the paper-like bf16 step): the same bits either way
    grad_list = [p.grad for p in grads]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grad_list]))
    if max_norm > 0:
        coef = max_norm / (norm + 1e-6)  # a float32 tensor, as torch computes it
        if float(coef) < 1.0:
            torch._foreach_mul_(grad_list, coef)
    return float(norm)


def _clip_sharded(params: list[Tensor], max_norm: float, sharded: frozenset[int], reduce) -> float:
    grads = [p.grad for p in params if p.grad is not None]
    mine = sum(float(torch.linalg.vector_norm(p.grad, dtype=torch.float64)) ** 2
               for p in params if p.grad is not None and id(p) in sharded)
    same = sum(float(torch.linalg.vector_norm(p.grad, dtype=torch.float64)) ** 2
               for p in params if p.grad is not None and id(p) not in sharded)
    total = (same + float(reduce(torch.tensor([mine], dtype=torch.float64))[0])) ** 0.5
    if max_norm > 0:
        coef = min(1.0, max_norm / (total + 1e-6))
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
    return total
