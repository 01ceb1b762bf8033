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

import grlib.ops.cpu  # noqa: F401  (loads grlib._C: torch.ops.grlib.lazy_adam_)
from grlib.config import TrainConfig
from grlib.model.embeddings import embedding_parameters

KERNEL_DTYPES = (torch.float32, torch.float64)  # tables the CPU kernel updates (others: the reference)
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
                tensors = (p, p.grad, state["exp_avg"], state["exp_avg_sq"])
                if p.device.type == "cpu" and p.dtype in KERNEL_DTYPES and all(t.is_contiguous() for t in tensors):
                    # the compiled kernel (kernels/cpu/lazy_adam.cpp): one pass, the same update as below
                    torch.ops.grlib.lazy_adam_(p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"],
                                               group["lr"], *group["betas"], group["eps"])
                else:
                    lazy_adam_reference(p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"], group)


def lazy_adam_reference(p: Tensor, grad: Tensor, m: Tensor, v: Tensor, n: Tensor, group: dict) -> None:
    """The PyTorch form of one LazyAdam step on a table p [V, d] (in place): gather the touched rows,
    update them (_adam_rows), scatter them back. Any device; the ground truth of the CPU kernel."""
    touched = grad.ne(0).any(dim=1)  # [V]
    n_touched = int(touched.sum())
    if n_touched == 0:
        return
    if n_touched == p.shape[0]:  # every row: update in place, no gather / scatter
        _adam_rows(p, grad, m, v, n, group)
        return
    rows = touched.nonzero().squeeze(1)  # [R]
    w, mr, vr, nr = p[rows], m[rows], v[rows], n[rows]
    _adam_rows(w, grad[rows], mr, vr, nr, group)
    p[rows], m[rows], v[rows], n[rows] = w, mr, vr, nr


def _adam_rows(w: Tensor, g: Tensor, m: Tensor, v: Tensor, n: Tensor, group: dict) -> None:
    """One Adam step, in place, on rows w [R, d] with moments m, v [R, d] and step counts n [R]."""
    b1, b2 = group["betas"]
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    n.add_(1)
    c1 = (1 - b1 ** n).to(w.dtype)[:, None]  # [R, 1] per-row bias corrections
    c2 = (1 - b2 ** n).to(w.dtype)[:, None]
    w.sub_(group["lr"] * (m / c1) / ((v / c2).sqrt_() + group["eps"]))


class Optimizers:
    """The dense and sparse optimizers and their shared warm-up schedule, stepped together."""

    def __init__(self, model: nn.Module, cfg: TrainConfig):
        sparse = embedding_parameters(model) if cfg.embedding_optimizer == "lazy_adam" else []
        ids = {id(p) for p in sparse}
        dense = [p for p in model.parameters() if id(p) not in ids and p.requires_grad]
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.clip = cfg.grad_clip
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
        norm = clip_norm(self.params, self.clip)
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


def clip_norm(params: list[Tensor], max_norm: float) -> float:
    grads = [p for p in params if p.grad is not None]
    if not grads:
        return 0.0
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(grads, max_norm))
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in grads])))
