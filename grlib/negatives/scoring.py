"""Scoring negatives: the sampled softmax over per-token or shared negatives, FP32 / FP16 / BF16.

Notation: P = valid target tokens of the jagged batch (the jagged layout has no padded rows, and
tokens without a next-item target are dropped before scoring), R = negatives, d = embedding size,
V = rows of the table E that ids, targets and logQ index. u = the P tokens' vectors already
divided by the temperature. The negative path passes the batch's distinct looked-up rows as E and
ids local to them (grlib.negatives.path); any table indexed consistently gives the same numbers.

per-token   logit[p, r] = u[p] . E[ids[p, r]]      ids [P, R]: P*R embedding rows looked up
shared      logit[p, r] = u[p] . E[pool[r]]        pool [R]: R rows looked up, a [P, d] x [d, R] GEMM
            (intra-batch logit sharing: every token scores the same R negatives)

Both return lse[p] = log sum_r exp(logit[p, r] - log Q(id) ) over the unmasked negatives; an
accidental hit (negative id == the token's own target) is masked (MASKED, so exp() is exactly 0).
The loss is mean_p(logaddexp(pos[p], lse[p]) - pos[p]) (`sampled_softmax`).

Memory: no [P, R] tensor is held between forward and backward (forward keeps lse [P]; backward
recomputes the logits, cheap next to the lookups), the shared path never materialises all [P, R]
logits at once (it works in chunks of tokens), and the per-token table gradient is accumulated in
chunks (no [P, R, d] FP32 tensor). In FP32 the shared path is fused with the loss
(SharedSoftmaxLoss, its three GEMMs through grlib.ops.matmul_nt: oneDNN on CPU): the scalar
loss's gradients are made in the forward pass, chunk by chunk, so
nothing is recomputed and the held grad_u [P, d] and grad_pool [R, d] take the place of u and the
pool. What stays alive between forward and backward is
  per-token   the looked-up rows E[ids] [P, R, d] (in `dtype`), ids [P, R] (int32), u [P, d]
  shared      the pool rows [R, d] and u [P, d] (both in `dtype`; FP32: their gradients)
so half precision halves the dominant per-token term (jaggedness-aware FP16: only the P valid
tokens' rows are held). The product runs in the half format (the GEMM accumulates in FP32 inside
the kernel; its output is rounded to the half format on CPU and written in FP32 on CUDA through
torch.mm(out_dtype=float32)); logits, softmax, loss and every gradient are FP32 (gradients
accumulate in FP32 from the half copies, and FP16's 5-bit
exponent never meets the tiny softmax gradients: the one half-format product of the backward, the
per-token dL/du, scales each row of dL/dlogit to a maximum of 1 first).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from grlib import ops

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
MASKED = -1e9  # logit of a masked negative: exp() underflows to exactly 0; unlike -inf, no NaN gradient
# [c, R, d] FP32 gradient elements per per-token chunk: 1/64 of the held rows, within [512 KB, 16 MB]
# (fewer, larger chunks: each chunk is a few parallel regions, and thousands of tiny ones make the
# backward sensitive to any other thread on the machine, e.g. the async sampler's)
CHUNK_PER_TOKEN = (1 << 17, 1 << 22)
CHUNK_SHARED = 1 << 20  # [c, R] logits per shared chunk: 4 MB in FP32 (fewer rows in half, see _shared_budget)


def _chunks(P: int, width: int, budget: int) -> list[tuple[int, int]]:
    step = max(1, budget // max(1, width))
    return [(s, min(P, s + step)) for s in range(0, P, step)]


def accidental_hits(pool_ids: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """The (token, pool slot) pairs where pool_ids[slot] == targets[token], rows ascending: found by
    sorting the pool and binary search (no [P, R] comparison). pool_ids [R], targets [P] -> [n], [n]."""
    srt, order = torch.sort(pool_ids.long())  # [R]
    t = targets.long()
    lo = torch.searchsorted(srt, t)  # [P]
    counts = torch.searchsorted(srt, t, right=True) - lo  # [P] hits per token (duplicates in the pool count)
    rows = torch.repeat_interleave(torch.arange(t.numel(), device=t.device), counts)  # [n]
    first = torch.repeat_interleave(lo - (torch.cumsum(counts, 0) - counts), counts)  # [n]
    cols = order[first + torch.arange(rows.numel(), device=t.device)]  # [n]
    return rows, cols


def _half_mm(a: Tensor, b: Tensor) -> Tensor:
    """a [M, K] @ b [K, N] in a's dtype -> FP32 [M, N]."""
    if a.dtype == torch.float32:
        return a @ b
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)
    return (a @ b).float()  # CPU: FP32 accumulation inside oneDNN, output rounded to the half format


def _mask(logits: Tensor, ids: Tensor, targets: Tensor, logq: Tensor | None) -> Tensor:
    """In place: logits [c, R] - log Q(ids), accidental hits -> MASKED. ids [c, R] or [R]."""
    if logq is not None:
        logits.sub_(logq[ids])
    return logits.masked_fill_(ids == targets[:, None], MASKED)


class PerTokenSoftmax(torch.autograd.Function):
    """u [P, d] fp32, table [V, d] fp32, ids [P, R], targets [P], logq [V] | None -> lse [P] fp32."""

    @staticmethod
    def forward(ctx, u, table, ids, targets, logq, dtype):
        P, R = ids.shape
        src = table.detach() if dtype == table.dtype else table.detach().to(dtype)  # [V, d]
        emb = src.index_select(0, ids.reshape(-1)).view(P, R, table.shape[1])  # [P, R, d] held in dtype
        uh = u.detach().to(dtype)  # [P, d]
        lse = torch.logsumexp(PerTokenSoftmax._logits(uh, emb, ids, targets, logq), dim=1)  # [P]
        ctx.save_for_backward(u, uh, emb, ids, targets, logq, lse)
        ctx.n_items = table.shape[0]
        return lse

    @staticmethod
    def _logits(uh, emb, ids, targets, logq):  # -> [P, R] fp32 (d times smaller than emb)
        logits = torch.bmm(emb, uh.unsqueeze(-1)).squeeze(-1).float()
        return _mask(logits, ids, targets, logq)

    @staticmethod
    def backward(ctx, grad):  # grad [P] = dL/dlse
        u, uh, emb, ids, targets, logq, lse = ctx.saved_tensors
        P, R = ids.shape
        d = u.shape[1]
        g = PerTokenSoftmax._logits(uh, emb, ids, targets, logq)  # [P, R]
        g = g.sub_(lse[:, None]).exp_().mul_(grad[:, None])  # dL/dlogit [P, R]
        grad_u = grad_table = None
        if ctx.needs_input_grad[0]:
            if emb.dtype == torch.float32:
                grad_u = torch.bmm(g.unsqueeze(1), emb).squeeze(1)  # [P, d]
            else:  # in the half format, each row of g scaled to max 1 (no FP16 underflow), then back
                scale = g.amax(1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)  # [P, 1]
                gh = (g / scale).to(emb.dtype).unsqueeze(1)  # [P, 1, R]
                grad_u = torch.bmm(gh, emb).squeeze(1).float().mul_(scale)  # [P, d]
                del gh, scale
        if ctx.needs_input_grad[1]:
            grad_table = torch.zeros(ctx.n_items, d, dtype=u.dtype, device=u.device)  # [V, d]
            lo, hi = CHUNK_PER_TOKEN
            for s, e in _chunks(P, R * d, min(hi, max(lo, P * R * d // 64))):
                contrib = g[s:e].unsqueeze(-1) * u[s:e].unsqueeze(1)  # [c, R, d] fp32
                grad_table.index_add_(0, ids[s:e].reshape(-1), contrib.reshape(-1, d))
                del contrib  # before the next chunk's is made
        return grad_u, grad_table, None, None, None, None


def _shared_budget(dtype: torch.dtype) -> int:
    """Logits per shared chunk: a half-format product is made in the half format and then copied to
    FP32 (CPU), so its chunks take 4 / (4 + 2) as many rows for the same transient bytes."""
    return CHUNK_SHARED if dtype == torch.float32 else CHUNK_SHARED * 4 // (4 + torch.finfo(dtype).bits // 8)


class SharedSoftmax(torch.autograd.Function):
    """u [P, d] fp32, pool [R, d] fp32, pool_ids [R], targets [P], logq [V] | None -> lse [P] fp32."""

    @staticmethod
    def forward(ctx, u, pool, pool_ids, targets, logq, dtype):
        uh, ph = u.detach().to(dtype), pool.detach().to(dtype)  # [P, d], [R, d] held in dtype
        P, R = u.shape[0], pool.shape[0]
        lse = torch.empty(P, dtype=torch.float32, device=u.device)
        for s, e in _chunks(P, R, _shared_budget(dtype)):
            lse[s:e] = torch.logsumexp(_mask(_half_mm(uh[s:e], ph.T), pool_ids, targets[s:e], logq), dim=1)
        ctx.save_for_backward(uh, ph, pool_ids, targets, logq, lse)
        return lse

    @staticmethod
    def backward(ctx, grad):  # grad [P] = dL/dlse
        uh, ph, pool_ids, targets, logq, lse = ctx.saved_tensors
        P, R = uh.shape[0], ph.shape[0]
        pf = ph.float()  # [R, d]
        grad_u = torch.empty(uh.shape, dtype=torch.float32, device=uh.device)  # [P, d]
        grad_pool = torch.zeros_like(pf)  # [R, d]
        for s, e in _chunks(P, R, _shared_budget(uh.dtype)):
            logits = _mask(_half_mm(uh[s:e], ph.T), pool_ids, targets[s:e], logq)  # [c, R]
            g = logits.sub_(lse[s:e, None]).exp_().mul_(grad[s:e, None])  # dL/dlogit [c, R]
            grad_u[s:e] = g @ pf
            grad_pool.addmm_(g.T, uh[s:e].float())
        return grad_u, grad_pool, None, None, None, None


class SharedSoftmaxLoss(torch.autograd.Function):
    """The FP32 shared path fused with the loss: u [P, d], pool [R, d], pos [P] (all fp32),
    pool_ids [R], targets [P], logq [V] | None -> the scalar sampled_softmax(pos, lse).

    The loss is a scalar, so its gradients are known in the forward pass: each chunk's logits are
    turned into dL/dlogit while they are still in cache, and the two gradient GEMMs run there
    (dL/du = G . pool, dL/dpool = G^T . u). Backward only scales the held grad_u [P, d],
    grad_pool [R, d] and grad_pos [P] by the upstream gradient. That saves the backward's
    recomputed [P, d] x [d, R] logits GEMM (a third of the loss's work) and holds exactly the bytes
    of the unfused path (u and pool, now their gradients); the half formats keep SharedSoftmax,
    which holds the half copies instead (the jaggedness-aware memory saving)."""

    @staticmethod
    def forward(ctx, u, pool, pos, pool_ids, targets, logq):
        P, R = u.shape[0], pool.shape[0]
        u, pool, pos = u.detach(), pool.detach(), pos.detach()
        grads = any(ctx.needs_input_grad[:3])
        lse = torch.empty(P, dtype=torch.float32, device=u.device)  # [P]
        grad_u = torch.empty_like(u) if grads else None  # [P, d]
        # dL/dpool accumulated transposed, [d, R] contiguous: each chunk's u^T . G lands as a dense add
        # (adding the [R, d] view of it ran 8x slower, strided); one transposing copy at the end
        grad_pool_t = pool.new_zeros((pool.shape[1], R)) if grads else None  # [d, R]
        grad_pos = torch.empty_like(pos) if grads else None  # [P]
        chunks = _chunks(P, R, CHUNK_SHARED)
        hit_rows, hit_cols = accidental_hits(pool_ids, targets)  # [n_hits] each, rows ascending
        # hits of chunk n: hit_rows[bounds[n]:bounds[n + 1]]
        bounds = torch.searchsorted(hit_rows, torch.tensor([s for s, _ in chunks] + [P], device=u.device)).tolist()
        neg_logq = None if logq is None else logq[pool_ids]  # [R]
        for n, (s, e) in enumerate(chunks):
            logits = ops.matmul_nt(u[s:e], pool)  # [c, R]
            if neg_logq is not None:
                logits.sub_(neg_logq)
            h0, h1 = bounds[n], bounds[n + 1]
            if h1 > h0:
                logits[hit_rows[h0:h1] - s, hit_cols[h0:h1]] = MASKED
            top = logits.amax(dim=1, keepdim=True)  # [c, 1]
            total = logits.sub_(top).exp_().sum(dim=1)  # [c]; logits now hold exp(logit - top)
            lse[s:e] = top.squeeze(1) + total.log()
            if grads:  # dL/dlse = sigmoid(lse - pos) / P = -dL/dpos; dL/dlogit = softmax * dL/dlse
                w = torch.sigmoid(lse[s:e] - pos[s:e]).div_(P)  # [c]
                grad_pos[s:e] = -w
                g = logits.mul_((w / total)[:, None])  # [c, R]
                grad_u[s:e] = ops.matmul_nt(g, pool.T)  # G . pool
                # (G^T . u)^T = u^T . G, u^T as a dense copy (grlib/ops/matmul.py: oneDNN copied the strided
                # view itself; [512, 1536] float32 here: 17.6 ms for the product that way, 13.1 with transpose_copy)
                grad_pool_t += ops.matmul_nt(ops.transpose_copy(u[s:e]), g.T)
        grad_pool = ops.transpose_copy(grad_pool_t) if grads else None  # [R, d]
        ctx.save_for_backward(grad_u, grad_pool, grad_pos)
        if P == 0:
            return lse.sum()  # 0.0, as sampled_softmax gives for no tokens
        return (torch.logaddexp(pos, lse) - pos).mean()

    @staticmethod
    def backward(ctx, grad):  # grad [] = dL_total/dL
        grad_u, grad_pool, grad_pos = ctx.saved_tensors
        return grad_u * grad, grad_pool * grad, grad_pos * grad, None, None, None


def per_token_lse(u: Tensor, table: Tensor, ids: Tensor, targets: Tensor, logq: Tensor | None = None,
                  precision: str = "fp32") -> Tensor:
    return PerTokenSoftmax.apply(u, table, ids, targets, logq, DTYPES[precision])


def shared_lse(u: Tensor, pool: Tensor, pool_ids: Tensor, targets: Tensor, logq: Tensor | None = None,
               precision: str = "fp32") -> Tensor:
    return SharedSoftmax.apply(u, pool, pool_ids, targets, logq, DTYPES[precision])


def shared_softmax_loss(u: Tensor, pool: Tensor, pos: Tensor, pool_ids: Tensor, targets: Tensor,
                        logq: Tensor | None = None) -> Tensor:
    """sampled_softmax(pos, shared_lse(u, pool, ...)) in FP32, fused (SharedSoftmaxLoss)."""
    return SharedSoftmaxLoss.apply(u, pool, pos, pool_ids, targets, logq)


def sampled_softmax(pos: Tensor, lse: Tensor) -> Tensor:
    """Mean over tokens of -log softmax of the positive among [positive, negatives]:
    pos [P] (positive logits, logQ-corrected when it applies), lse [P] of the negatives."""
    if pos.numel() == 0:
        return pos.sum() * 0.0 + lse.sum() * 0.0
    return (torch.logaddexp(pos, lse) - pos).mean()


def sampled_softmax_loss(user: Tensor, items: Tensor, targets: Tensor, negatives: Tensor,
                         temperature: float, logq: Tensor | None = None) -> Tensor:
    """The reference: user [P, d], items [V, d] (both normalised), targets [P], negatives [P, R]
    or a shared pool [R] of ids, logq [V] | None -> scalar; plain autograd (einsum), FP32, every
    [P, R] tensor materialised, accidental hits masked with -inf."""
    if targets.numel() == 0:
        return user.sum() * 0.0
    negatives = negatives.long()
    if negatives.dim() == 1:
        negatives = negatives.expand(targets.numel(), -1)  # [P, R]
    pos_logit = (user * items[targets]).sum(-1, keepdim=True)  # [P, 1]
    neg_logit = torch.einsum("pd,prd->pr", user, items[negatives])  # [P, R]
    logits = torch.cat([pos_logit, neg_logit], dim=1) / temperature  # [P, R+1]
    if logq is not None:
        logits = logits - logq[torch.cat([targets[:, None], negatives], dim=1)]
    hits = torch.cat([torch.zeros_like(targets[:, None], dtype=torch.bool), negatives == targets[:, None]], 1)
    logits = logits.masked_fill(hits, -torch.inf)
    return F.cross_entropy(logits, torch.zeros_like(targets))
