"""grlib.negatives: samplers (chi-square), logQ correction, the scoring paths against the plain
autograd reference (hypothesis, ragged batches incl. empty and length-1 sequences), shared vs
per-token equivalence, accidental-hit masking, half precision within tolerance of FP32."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib.config import ConfigError, NegativesConfig, load_config
from grlib.data.sequences import JaggedBatch
from grlib.negatives import NegativeSample, build_negative_path, sample_stats, sampled_softmax_loss
from grlib.negatives.samplers import (InBatchSampler, PopularitySampler, UniformSampler, alias_probabilities,
                                      alias_table, build_sampler, chi_square_pvalue)


class Table:
    """model.embed stand-in (an ItemTable): rows of a fixed tensor."""

    def __init__(self, table: torch.Tensor):
        self.table = table

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table.index_select(0, ids)


def make_batch(lengths: list[int], targets: torch.Tensor) -> JaggedBatch:
    T = int(sum(lengths))
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64)
    zeros = torch.zeros(T, dtype=torch.int64)
    return JaggedBatch(item_ids=zeros, actions=zeros, timestamps=zeros, offsets=offsets,
                       max_len=max(lengths, default=1) or 1, targets=targets)


def zipf_counts(V: int, seed: int = 0) -> np.ndarray:
    """Zipf-like training counts (pad and OOV ids at 0), shuffled over the ids."""
    counts = np.zeros(V, dtype=np.int64)
    counts[2:] = np.random.default_rng(seed).permutation((1000 / np.arange(1, V - 1) ** 1.1).astype(np.int64))
    return counts


# --- samplers ------------------------------------------------------------------------------------

def test_uniform_sampler_chi_square():
    s, g = UniformSampler(52), torch.Generator().manual_seed(0)
    ids = s.draw((400, 500), torch.empty(0, dtype=torch.int64), g)
    assert ids.min() >= 2 and ids.max() <= 51
    assert chi_square_pvalue(torch.bincount(ids.flatten(), minlength=52), s.probabilities()) > 1e-3


def test_popularity_sampler_chi_square_and_power():
    counts = zipf_counts(60)
    s, g = PopularitySampler(60, counts), torch.Generator().manual_seed(1)
    ids = s.draw((200_000,), torch.empty(0, dtype=torch.int64), g)
    observed = torch.bincount(ids, minlength=60)
    expected = torch.as_tensor(counts + 1.0, dtype=torch.float64)
    expected[:2] = 0
    assert chi_square_pvalue(observed, expected / expected.sum()) > 1e-3
    assert chi_square_pvalue(observed, UniformSampler(60).probabilities()) < 1e-9  # the test has power


@settings(max_examples=60, deadline=None)
@given(weights=st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1e6)), min_size=1, max_size=300),
       rounds=st.sampled_from([0, 1, 64]))
def test_alias_table_draws_exactly_q(weights, rounds):
    """The alias table's implied distribution equals q, ids with q = 0 are never reachable; also when
    the vectorised rounds stop early and Vose's loop finishes the pairing (rounds 0 and 1)."""
    w = np.asarray(weights)
    if w.sum() == 0:
        w[0] = 1.0
    q = w / w.sum()
    prob, alias = alias_table(q, max_rounds=rounds)
    assert np.all((prob >= 0) & (prob <= 1)) and np.all((alias >= 0) & (alias < len(q)))
    np.testing.assert_allclose(alias_probabilities(prob, alias), q, rtol=0, atol=1e-12)
    zero = q == 0
    assert not (prob[zero] > 0).any() and not zero[alias[prob < 1]].any()


def test_popularity_sampler_heavy_head_and_int32():
    """A Zipf head (one item holds half the mass) over 20k items: draws in int32 follow Q."""
    V = 20_000
    counts = np.zeros(V)
    counts[2:] = 1.0
    counts[7] = V  # half of the smoothed mass
    s = PopularitySampler(V, counts)
    ids = s.draw((300, 1000), torch.empty(0, dtype=torch.int64), torch.Generator().manual_seed(3), torch.int32)
    assert ids.dtype == torch.int32 and ids.shape == (300, 1000) and ids.min() >= 2
    observed = torch.bincount(ids.flatten().long(), minlength=V)
    assert abs(observed[7] / ids.numel() - float(s.q[7])) < 4 * (0.25 / ids.numel()) ** 0.5
    coarse = torch.stack([observed[7], observed.sum() - observed[7] - observed[:2].sum()])
    assert chi_square_pvalue(coarse, torch.stack([s.q[7], 1 - s.q[7]])) > 1e-3


def test_in_batch_sampler_follows_the_batch_targets():
    targets = torch.tensor([2, 2, 2, 5, 7, 7, 9, 9, 9, 9])
    s, g = InBatchSampler(12, np.ones(12)), torch.Generator().manual_seed(2)
    ids = s.draw((100_000,), targets, g)
    assert chi_square_pvalue(torch.bincount(ids, minlength=12), s.probabilities(targets)) > 1e-3
    pool = s.pool(targets, 4, g)
    assert pool.numel() == 4 and set(pool.tolist()) <= set(targets.tolist())
    assert torch.equal(s.pool(targets, 50, g), targets)


def test_logq_matches_the_draws_partition_function_is_unbiased():
    """E[exp(s_j - log Q_j)] over draws j ~ Q equals sum_j exp(s_j): the importance-sampling identity
    that the logQ correction rests on; fails if log Q disagrees with how the ids are drawn."""
    V = 40
    counts = zipf_counts(V, seed=3)
    scores = torch.randn(V, generator=torch.Generator().manual_seed(4))
    targets = torch.repeat_interleave(torch.arange(V), torch.as_tensor(counts))
    for sampler in (PopularitySampler(V, counts), InBatchSampler(V, counts)):
        ids = sampler.draw((400_000,), targets, torch.Generator().manual_seed(5))
        w = torch.exp(scores[ids] - sampler.log_q()[ids].double())
        z = torch.exp(scores[2:].double()).sum()
        stderr = w.std() / len(w) ** 0.5
        assert abs(w.mean() - z) < 4 * stderr, sampler.name
        biased = torch.exp(scores[ids]).double().mean() * (V - 2)  # no correction: off by far
        assert abs(biased - z) > 10 * stderr


def _toy_fit(logq: bool) -> float:
    """One context, free item logits theta; targets ~ p; negatives ~ a popularity Q unrelated to p.
    Returns the total-variation distance between softmax(theta) and p after training."""
    torch.manual_seed(0)
    V, tau, T = 22, 0.05, 128
    g = torch.Generator().manual_seed(1)
    p = torch.zeros(V)
    p[2:] = torch.rand(V - 2, generator=g) + 0.2
    p /= p.sum()
    counts = np.zeros(V)
    counts[2:] = (np.arange(V - 2)[::-1] ** 2 + 1) * 10
    cfg = NegativesConfig(sampler="popularity", n_negatives=16, logq=logq, temperature=tau)
    path = build_negative_path(cfg, V, counts, seed=0)
    theta = torch.zeros(V, 1, requires_grad=True)
    opt = torch.optim.Adam([theta], lr=0.05)
    user = torch.full((T, 1), tau)  # logit_j = user . theta_j / tau = theta_j
    for _ in range(100):
        targets = torch.multinomial(p, T, replacement=True, generator=g)
        loss = path.loss(user, Table(theta), make_batch([T], targets))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return 0.5 * float((torch.softmax(theta[2:, 0].detach(), 0) - p[2:]).abs().sum())


def test_logq_correction_recovers_the_true_distribution_on_a_toy_problem():
    assert _toy_fit(logq=True) < 0.08
    assert _toy_fit(logq=False) > 0.4  # the uncorrected popularity sampler is biased


def test_samplers_refuse_bad_counts():
    with pytest.raises(ValueError, match="needs item_counts"):
        build_sampler("popularity", 10, None)
    with pytest.raises(ValueError, match="shape"):
        build_sampler("in-batch", 10, np.ones(9))
    with pytest.raises(ValueError, match="negative counts"):
        build_sampler("popularity", 3, np.array([0, 0, -1]))


def test_config_names_the_bad_field():
    for field, value in (("sharing", "pooled"), ("precision", "fp8"), ("sampler", "hard"), ("queue_depth", 0)):
        with pytest.raises(ConfigError, match=f"negatives.{field}"):
            load_config("smoke", {f"negatives.{field}": value})


# --- scoring against the reference ---------------------------------------------------------------

@st.composite
def cases(draw):
    lengths = draw(st.lists(st.integers(0, 9), min_size=0, max_size=6))
    T = sum(lengths)
    V = draw(st.integers(3, 40))
    targets = draw(st.lists(st.integers(0, V - 1).map(lambda t: 0 if t < 2 else t), min_size=T, max_size=T))
    return {
        "lengths": lengths, "V": V, "targets": torch.tensor(targets, dtype=torch.int64),
        "d": draw(st.sampled_from([4, 8])), "R": draw(st.integers(1, 24)),
        "sampler": draw(st.sampled_from(["uniform", "popularity", "in-batch"])),
        "sharing": draw(st.sampled_from(["per-token", "shared"])),
        "seed": draw(st.integers(0, 2**16)),
    }


def _inputs(case):
    g = torch.Generator().manual_seed(case["seed"])
    T = int(sum(case["lengths"]))
    user = F.normalize(torch.randn(T, case["d"], generator=g), dim=-1).requires_grad_()
    table = F.normalize(torch.randn(case["V"], case["d"], generator=g), dim=-1).requires_grad_()
    counts = torch.randint(0, 20, (case["V"],), generator=g).numpy()
    return user, table, counts, make_batch(case["lengths"], case["targets"])


def _loss_and_grads(path, user, table, batch, sample):
    path.attach(batch, sample)
    loss = path.loss(user, Table(table), batch)
    gu, gt = torch.autograd.grad(loss, [user, table], allow_unused=True, materialize_grads=True)
    return loss.detach(), gu, gt


@settings(max_examples=40)
@given(cases())
def test_path_matches_the_reference(case):
    user, table, counts, batch = _inputs(case)
    cfg = NegativesConfig(sampler=case["sampler"], sharing=case["sharing"], n_negatives=case["R"])
    path = build_negative_path(cfg, case["V"], counts, seed=case["seed"])
    sample = path.sample(batch)
    assert sample.targets.numel() == int((case["targets"] > 0).sum())
    loss, gu, gt = _loss_and_grads(path, user, table, batch, sample)
    ref = sampled_softmax_loss(user[sample.keep], table, sample.targets, sample.ids, cfg.temperature, path.logq)
    ru, rt = torch.autograd.grad(ref, [user, table], allow_unused=True, materialize_grads=True)
    assert torch.isfinite(loss) and torch.isfinite(gu).all() and torch.isfinite(gt).all()
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gu, ru, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gt, rt, rtol=1e-4, atol=1e-5)


def _whole_table_loss(path, user, weight, sample):
    """The loss scored against the whole normalised [V, d] table, in item-id space."""
    from grlib.negatives.scoring import per_token_lse, sampled_softmax, shared_lse, shared_softmax_loss
    cfg, table = path.cfg, F.normalize(weight, dim=-1)  # [V, d]
    u = user.index_select(0, sample.keep) / cfg.temperature
    pos = (u * table.index_select(0, sample.targets)).sum(-1)
    if path.logq is not None:
        pos = pos - path.logq[sample.targets]
    if sample.shared:
        pool = table.index_select(0, sample.ids)
        if cfg.precision == "fp32":
            return shared_softmax_loss(u, pool, pos, sample.ids, sample.targets, path.logq)
        return sampled_softmax(pos, shared_lse(u, pool, sample.ids, sample.targets, path.logq, cfg.precision))
    return sampled_softmax(pos, per_token_lse(u, table, sample.ids, sample.targets, path.logq, cfg.precision))


@settings(max_examples=30, deadline=None)
@given(cases(), st.sampled_from(["fp32", "fp16", "bf16"]))
def test_distinct_rows_give_the_whole_table_numbers_bitwise(case, precision):
    """The loss asks the item table for each distinct target / negative id once and normalises only
    those rows; loss and gradients equal scoring against the whole normalised table, bit for bit."""
    from grlib.model.embeddings import Embeddings
    user, _, counts, batch = _inputs(case)
    torch.manual_seed(case["seed"])
    emb = Embeddings(case["V"], case["d"])
    asked = []
    lookup = emb.lookup
    emb.lookup = lambda ids: (asked.append(ids.clone()), lookup(ids))[1]
    cfg = NegativesConfig(sampler=case["sampler"], sharing=case["sharing"], n_negatives=case["R"], precision=precision)
    path = build_negative_path(cfg, case["V"], counts, seed=case["seed"])
    sample = path.sample(batch)
    path.attach(batch, sample)
    loss = path.loss(user, emb, batch)
    got = torch.autograd.grad(loss, [user, emb.items.weight], allow_unused=True, materialize_grads=True)
    ref = _whole_table_loss(path, user, emb.items.weight, sample)
    expect = torch.autograd.grad(ref, [user, emb.items.weight], allow_unused=True, materialize_grads=True)
    assert torch.equal(loss, ref) and all(torch.equal(a, b) for a, b in zip(got, expect))
    wanted = torch.cat([sample.targets, sample.ids.reshape(-1).long()]).unique()
    assert len(asked) == 1 and torch.equal(asked[0], wanted)  # each row once, nothing else


@settings(max_examples=60)
@given(st.lists(st.integers(0, 30), max_size=20), st.lists(st.integers(0, 30), max_size=30),
       st.booleans())
def test_local_ids_index_the_distinct_ids(targets, negatives, shared):
    """Both ways of finding the distinct ids (a mask over the vocabulary, a sort for few ids of a large
    one) give the same ascending ids, and the local ids index them back to the sample's ids."""
    from grlib.negatives.path import LocalIds
    t = torch.tensor(targets, dtype=torch.int64)
    if shared:
        ids = torch.tensor(negatives, dtype=torch.int64)
    else:
        row = (negatives or [2])[:3]  # R <= 3 negatives per token
        ids = torch.tensor(row * len(targets), dtype=torch.int32).reshape(len(targets), len(row))
    sample = NegativeSample(torch.arange(t.numel()), t, ids)
    by_mask, by_sort = LocalIds.of(sample, 31), LocalIds.of(sample, 10**6)
    assert by_sort.distinct.numel() * 8 < 10**6  # (the sort branch)
    for local in (by_mask, by_sort):
        assert torch.equal(local.distinct, torch.cat([t, ids.reshape(-1).long()]).unique())
        assert torch.equal(local.distinct[local.targets], t) and torch.equal(local.distinct[local.ids.long()], ids.long())
        assert local.ids.dtype == ids.dtype and local.ids.shape == ids.shape
    assert all(torch.equal(getattr(by_mask, f), getattr(by_sort, f)) for f in ("distinct", "targets", "ids"))


def test_a_sample_prepared_by_another_path_or_before_a_restore_is_refused():
    targets = torch.tensor([3, 0, 5, 7])
    user = F.normalize(torch.randn(4, 8), dim=-1)
    table = Table(F.normalize(torch.randn(20, 8), dim=-1))
    a, b = (build_negative_path(NegativesConfig(n_negatives=4), 20, seed=s) for s in (0, 1))
    batch = make_batch([4], targets)
    a.prepare(batch)
    with pytest.raises(RuntimeError, match="prepared by another path"):
        b.loss(user, table, batch)
    a.prepare(batch)
    a.load_state_dict(a.state_dict())
    with pytest.raises(RuntimeError, match="before load_state_dict"):
        a.loss(user, table, batch)
    a.prepare(batch)  # prepared after the restore: taken (and removed from the batch)
    assert torch.isfinite(a.loss(user, table, batch)) and "negatives" not in batch.attachments


@settings(max_examples=25)
@given(cases(), st.sampled_from(["fp16", "bf16"]))
def test_half_precision_within_tolerance_of_fp32(case, precision):
    user, table, counts, batch = _inputs(case)
    out = {}
    for prec in ("fp32", precision):
        cfg = NegativesConfig(sampler=case["sampler"], sharing=case["sharing"], n_negatives=case["R"], precision=prec)
        path = build_negative_path(cfg, case["V"], counts, seed=case["seed"])
        out[prec] = _loss_and_grads(path, user, table, batch, path.sample(batch))
    # logits reach 1/temperature = 20, so the half format's unit roundoff u moves each by <= 20u
    # (u = 2^-11 fp16, 2^-8 bf16): the loss by <= 2 x 20u, gradients by <= 5 x 20u relative
    # (observed worst over 200 random cases: fp16 0.0027 / 1.8%, bf16 0.032 / 9%).
    u = {"fp16": 2.0**-11, "bf16": 2.0**-8}[precision]
    (l32, u32, t32), (lh, uh, th) = out["fp32"], out[precision]
    assert abs(float(lh - l32)) <= 2 * 20 * u
    for a, b in ((uh, u32), (th, t32)):
        assert float((a - b).norm()) <= 5 * 20 * u * float(b.norm()) + 1e-7


@settings(max_examples=60)
@given(st.lists(st.integers(0, 12), max_size=40), st.lists(st.integers(0, 12), max_size=40))
def test_accidental_hits_equal_the_dense_comparison(pool, targets):
    from grlib.negatives.scoring import accidental_hits
    pool_ids, t = torch.tensor(pool, dtype=torch.int64), torch.tensor(targets, dtype=torch.int64)
    rows, cols = accidental_hits(pool_ids, t)
    dense = (t[:, None] == pool_ids[None, :]).nonzero()  # [n, 2], rows ascending
    assert sorted(zip(rows.tolist(), cols.tolist())) == [tuple(x) for x in dense.tolist()]
    assert torch.equal(rows, rows.sort().values)


def test_fused_shared_loss_scales_with_the_upstream_gradient_and_skips_work_without_grad():
    """The FP32 shared path makes its gradients in the forward pass: a scaled loss, a second backward
    (retain_graph) and no_grad must all give what the unfused lse + sampled_softmax gives."""
    from grlib.negatives.scoring import sampled_softmax, shared_lse, shared_softmax_loss
    g = torch.Generator().manual_seed(3)
    P, R, d, V = 1200, 2000, 8, 60  # P > the 524 rows of a 2**20-logit chunk: three chunks
    u = torch.randn(P, d, generator=g).requires_grad_()
    pool = torch.randn(R, d, generator=g).requires_grad_()
    pos = torch.randn(P, generator=g).requires_grad_()
    ids, targets = torch.randint(0, V, (R,), generator=g), torch.randint(0, V, (P,), generator=g)
    ref = sampled_softmax(pos, shared_lse(u, pool, ids, targets)) * 3.0
    expect = torch.autograd.grad(ref, [u, pool, pos])
    fused = shared_softmax_loss(u, pool, pos, ids, targets) * 3.0
    torch.testing.assert_close(fused, ref)
    for _ in range(2):  # the held gradients are not consumed or modified by a backward
        got = torch.autograd.grad(fused, [u, pool, pos], retain_graph=True)
        for a, b in zip(got, expect):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    with torch.no_grad():
        torch.testing.assert_close(shared_softmax_loss(u, pool, pos, ids, targets) * 3.0, ref.detach())


def test_shared_pool_equals_per_token_when_the_pools_coincide():
    g = torch.Generator().manual_seed(7)
    V, d, T, R = 50, 16, 40, 12
    user = F.normalize(torch.randn(T, d, generator=g), dim=-1).requires_grad_()
    table = F.normalize(torch.randn(V, d, generator=g), dim=-1).requires_grad_()
    targets = torch.randint(2, V, (T,), generator=g)
    targets[::4] = 0
    batch = make_batch([10, 0, 1, 29], targets)
    counts = torch.randint(1, 30, (V,), generator=g).numpy()
    for sampler in ("uniform", "popularity"):
        for precision in ("fp32", "fp16"):
            out = {}
            for sharing in ("shared", "per-token"):
                path = build_negative_path(NegativesConfig(sampler=sampler, sharing=sharing, n_negatives=R,
                                                           precision=precision), V, counts)
                pool = torch.tensor([2, 3, 5, 8, 13, 21, 34, 3, 5, 44, 45, 46])  # [R], duplicates allowed
                pool[0] = targets[1]  # an accidental hit for token 1 (token 0 has no target)
                keep = torch.nonzero(targets > 0).squeeze(1)
                ids = pool if sharing == "shared" else pool.expand(keep.numel(), -1).int().contiguous()
                out[sharing] = _loss_and_grads(path, user, table, batch, NegativeSample(keep, targets[keep], ids))
            for a, b in zip(out["shared"], out["per-token"]):
                tol = 1e-6 if precision == "fp32" else 1e-3
                torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_accidental_hits_are_masked():
    """Every negative equals the target: the loss is exactly 0 (softmax over the positive alone)."""
    V, d = 10, 4
    user = F.normalize(torch.randn(3, d), dim=-1).requires_grad_()
    table = F.normalize(torch.randn(V, d), dim=-1).requires_grad_()
    targets = torch.tensor([4, 4, 4])
    batch = make_batch([3], targets)
    for sharing, ids in (("shared", torch.full((5,), 4)), ("per-token", torch.full((3, 5), 4, dtype=torch.int32))):
        path = build_negative_path(NegativesConfig(sharing=sharing, n_negatives=5), V)
        loss, gu, gt = _loss_and_grads(path, user, table, batch, NegativeSample(torch.arange(3), targets, ids))
        assert float(loss) == 0.0 and float(gu.abs().max()) == 0.0 and float(gt.abs().max()) == 0.0
        stats = sample_stats(NegativeSample(torch.arange(3), targets, ids))
        assert stats["negatives_per_token"] == 0.0 and stats["distinct_negatives_per_token"] == 0.0
    # one hit among three: the other two still count
    path = build_negative_path(NegativesConfig(sharing="shared", n_negatives=3), V)
    pool = torch.tensor([4, 5, 6])
    loss, *_ = _loss_and_grads(path, user, table, batch, NegativeSample(torch.arange(3), targets, pool))
    u, t = user.detach() / 0.05, table.detach()
    expect = (torch.logsumexp(torch.stack([u @ t[4], u @ t[5], u @ t[6]], 1), 1) - u @ t[4]).mean()
    torch.testing.assert_close(loss, expect)


def test_sample_stats_counts_rows_and_negatives():
    targets = torch.tensor([3, 0, 5, 7])
    batch = make_batch([4], targets)
    shared = build_negative_path(NegativesConfig(sharing="shared", n_negatives=64), 20).sample(batch)
    per_token = build_negative_path(NegativesConfig(n_negatives=64), 20).sample(batch)
    s, p = sample_stats(shared), sample_stats(per_token)
    assert s["tokens"] == p["tokens"] == 3
    assert s["negative_rows"] == 64 and p["negative_rows"] == 3 * 64
    hits = (shared.ids[None, :] == shared.targets[:, None]).sum(1).double()  # [P] accidental hits
    assert s["negatives_per_token"] == pytest.approx(float((64 - hits).mean()))
    assert 0 < hits.sum() and s["distinct_negatives_per_token"] <= 17  # 64 draws over 18 ids: hits happen
