"""The trainer: lazy row-wise Adam, warm-up and clipping, learning on a smoke dataset, the step
timeline, model selection on validation, atomic checkpoints."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib import ops
from grlib.config import TrainConfig, load_config
from grlib.data.catalog import load_dataset
from grlib.evaluate import evaluate, last_token_scores
from grlib.model import build_model
from grlib.train import PHASES, checkpoint, train
from grlib.train.optim import BETAS, LazyAdam, Optimizers


def test_lazy_adam_equals_adam_when_every_row_is_touched():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(6, 4))
    b = torch.nn.Parameter(a.detach().clone())
    lazy, dense = LazyAdam([a], lr=1e-2), torch.optim.Adam([b], lr=1e-2, betas=(0.9, 0.98))
    for step in range(5):
        g = torch.randn(6, 4)
        a.grad, b.grad = g.clone(), g.clone()
        lazy.step()
        dense.step()
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_lazy_adam_leaves_untouched_rows_and_moments_alone():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5, 3))
    opt = LazyAdam([p], lr=1e-2)
    p.grad = torch.ones(5, 3)
    opt.step()  # every row: moments and step count 1
    before = p.detach().clone()
    m_before = opt.state[p]["exp_avg"].clone()
    g = torch.zeros(5, 3)
    g[[1, 3]] = 1.0
    p.grad = g
    opt.step()
    changed = (p.detach() != before).any(1)
    assert changed.tolist() == [False, True, False, True, False]
    assert torch.equal(opt.state[p]["exp_avg"][[0, 2, 4]], m_before[[0, 2, 4]])
    assert opt.state[p]["step"].tolist() == [1, 2, 1, 2, 1]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 70), st.sampled_from([1, 3, 16, 33]), st.integers(1, 4), st.sampled_from(["float32", "float64"]),
       st.integers(0, 2**16))
def test_lazy_adam_kernel_matches_the_reference(V, d, steps, dtype, seed):
    """The compiled one-pass kernel (impl cpu) against the PyTorch gather-update-scatter form (impl
    reference) through the dispatcher, over steps with random untouched rows (all, none, some; rows with
    a single nonzero entry), empty and one-row tables included."""
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    w = torch.randn(V, d, generator=g, dtype=dt)
    ref = [w.clone(), torch.zeros_like(w), torch.zeros_like(w), torch.zeros(V, dtype=torch.float64)]
    ker = [t.clone() for t in ref]
    group = {"lr": 0.01, "betas": BETAS, "eps": 1e-8}
    for _ in range(steps):
        grad = torch.randn(V, d, generator=g, dtype=dt)
        keep = torch.rand(V, generator=g) < torch.rand(1, generator=g)  # [V] touched rows
        grad[~keep] = 0
        if V and d > 1:
            grad[0, 1:] = 0  # a row touched through one entry only
        ops.lazy_adam_(ref[0], grad, *ref[1:], group["lr"], *group["betas"], group["eps"], impl="reference")
        ops.lazy_adam_(ker[0], grad, *ker[1:], group["lr"], *group["betas"], group["eps"], impl="cpu")
    for a, b in zip(ker, ref):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert torch.equal(ker[3], ref[3])  # step counts exactly


def test_lazy_adam_kernel_errors_name_the_argument():
    w = torch.zeros(4, 3)
    with pytest.raises(RuntimeError, match="step must be float64"):
        torch.ops.grlib.lazy_adam_(w, w.clone(), w.clone(), w.clone(), torch.zeros(4), 0.1, 0.9, 0.98, 1e-8)
    with pytest.raises(RuntimeError, match="must match the parameter"):
        torch.ops.grlib.lazy_adam_(w, torch.zeros(4, 2), w.clone(), w.clone(), torch.zeros(4, dtype=torch.float64),
                                   0.1, 0.9, 0.98, 1e-8)


def test_lazy_adam_dispatch_and_opcheck():
    """auto is the kernel on CPU; LazyAdam takes the reference for tables the kernel does not take
    (bfloat16, strided); the compiled op's schema (in-place arguments) and fake impl pass opcheck."""
    import grlib.ops.cpu.lazy_adam  # noqa: F401  (the fake impl)

    assert ops.choose("lazy_adam_", "cpu") == "cpu"
    assert ops.implementations("lazy_adam_") == ("reference", "cpu")
    g = torch.Generator().manual_seed(0)
    w = torch.randn(7, 5, generator=g)
    grad = torch.randn(7, 5, generator=g)
    grad[[1, 4]] = 0
    torch.library.opcheck(torch.ops.grlib.lazy_adam_.default,
                          (w, grad, torch.zeros_like(w), torch.zeros_like(w), torch.zeros(7, dtype=torch.float64),
                           0.01, 0.9, 0.98, 1e-8))
    for table in (w.to(torch.bfloat16), torch.randn(5, 7, generator=g).t()):  # tables the kernel refuses
        state = (torch.zeros_like(table), torch.zeros_like(table), torch.zeros(table.shape[0], dtype=torch.float64))
        with pytest.raises(RuntimeError, match="lazy_adam_"):
            ops.lazy_adam_(table.clone(), torch.ones_like(table), *state, 0.1, 0.9, 0.98, 1e-8, impl="cpu")
        p = torch.nn.Parameter(table.clone())
        p.grad = torch.ones_like(p)
        LazyAdam([p], lr=0.1).step()
        assert (p.detach() != table).all()
    with pytest.raises(ValueError, match="step must be float64"):
        ops.lazy_adam_(w, grad, torch.zeros_like(w), torch.zeros_like(w), torch.zeros(7), 0.1, 0.9, 0.98, 1e-8)


def test_warmup_and_clipping():
    model = torch.nn.Linear(3, 3)
    model.embed = torch.nn.Module()  # no embedding tables: everything is dense
    opt = Optimizers(model, TrainConfig(lr=1.0, warmup_steps=4, grad_clip=0.5))
    lrs = []
    for _ in range(6):
        lrs.append(opt.lr)
        opt.zero_grad()
        (model(torch.ones(1, 3)) * 100).sum().backward()
        norm = opt.step()
        assert norm > 0.5  # the norm before clipping is reported
    assert lrs == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


@pytest.fixture(scope="module")
def smoke_data(tmp_path_factory):
    import os

    os.environ["GRLIB_DATA_DIR"] = str(tmp_path_factory.mktemp("data"))
    cfg = load_config("smoke")
    return cfg, load_dataset(cfg)


def test_training_learns_and_records_a_timeline(smoke_data):
    cfg, ds = smoke_data
    cfg = cfg.replace({"train.epochs": 3, "train.max_steps": 0, "train.select_best": True})
    torch.manual_seed(0)
    model = build_model(cfg.model, ds.data.n_items, cfg.data.max_len)
    val = lambda m: evaluate(last_token_scores(m), ds.data.eval_batches("val", 256, cfg.data.max_len),  # noqa: E731
                             ds.mask_history)
    fit = train(model, ds.data, cfg.train, cfg.data.max_len, cfg.negatives, validate=val,
                flops_fn=lambda b: float(b.item_ids.numel()))
    per_epoch = ds.data.n_train_batches(cfg.train.batch_size)
    assert fit.steps == 3 * per_epoch == len(fit.losses) == len(fit.timeline)
    first, last = sum(fit.losses[:per_epoch]) / per_epoch, sum(fit.losses[-per_epoch:]) / per_epoch
    assert last < first, fit.losses
    assert [h["epoch"] for h in fit.val_history] == [0, 1, 2]
    best = max(fit.val_history, key=lambda h: h["ndcg@10"])
    assert fit.best_epoch == best["epoch"]
    assert val(model)["ndcg@10"] == pytest.approx(best["ndcg@10"], abs=1e-9)  # the best weights are restored
    assert set(fit.phase_seconds()) == set(PHASES) and fit.tokens_per_s > 0
    assert fit.timeline[0]["flops"] == fit.timeline[0]["tokens"]


def test_max_steps_caps_training(smoke_data):
    cfg, ds = smoke_data
    model = build_model(cfg.model, ds.data.n_items, cfg.data.max_len)
    fit = train(model, ds.data, cfg.train.__class__(max_steps=2, epochs=5), cfg.data.max_len, cfg.negatives)
    assert fit.steps == 2 and len(fit.losses) == 2


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    from grlib.io import umask

    path = tmp_path / "last.pt"
    checkpoint.save(path, {"step": 1})
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask()  # the caller's umask (not mkstemp's 0600)
    def broken(obj, fh):
        fh.write(b"half a checkpoint")
        raise OSError("disk full")
    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(path, {"step": 2})
    monkeypatch.undo()
    assert checkpoint.load(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary file left


def test_resume_refuses_a_different_config(smoke_data, tmp_path):
    cfg, ds = smoke_data
    model = build_model(cfg.model, ds.data.n_items, cfg.data.max_len)
    train(model, ds.data, TrainConfig(max_steps=1, batch_size=64), cfg.data.max_len, cfg.negatives,
          checkpoint_dir=tmp_path, checkpoint_every=1)
    with pytest.raises(ValueError, match="train.batch_size=64"):
        train(model, ds.data, TrainConfig(max_steps=2, batch_size=32), cfg.data.max_len, cfg.negatives,
              checkpoint_dir=tmp_path)


def test_lazy_adam_state_survives_a_checkpoint_round_trip(tmp_path):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(4, 3))
    opt = LazyAdam([p], lr=1e-2)
    p.grad = torch.randn(4, 3)
    opt.step()
    checkpoint.save(tmp_path / "c.pt", {"opt": opt.state_dict()})
    q = torch.nn.Parameter(p.detach().clone())
    other = LazyAdam([q], lr=1e-2)
    other.load_state_dict(checkpoint.load(tmp_path / "c.pt")["opt"])
    assert other.state[q]["step"].dtype == torch.float64
    g = torch.randn(4, 3)
    p.grad, q.grad = g.clone(), g.clone()
    opt.step()
    other.step()
    assert torch.equal(p, q)


def test_a_run_cut_by_max_steps_resumes_mid_epoch(smoke_data, tmp_path):
    """Stopping at max_steps inside an epoch keeps the position: extending max_steps continues the
    same epoch, so the losses match an uninterrupted run with the larger budget."""
    cfg, ds = smoke_data
    tcfg = TrainConfig(max_steps=2, batch_size=16, epochs=3, select_best=False)
    assert ds.data.n_train_batches(16) > 4  # the cut falls inside the first epoch

    def fresh():
        torch.manual_seed(0)
        return build_model(cfg.model, ds.data.n_items, cfg.data.max_len)

    train(fresh(), ds.data, tcfg, cfg.data.max_len, cfg.negatives, checkpoint_dir=tmp_path)
    longer = dataclasses.replace(tcfg, max_steps=4)
    resumed = train(fresh(), ds.data, longer, cfg.data.max_len, cfg.negatives, checkpoint_dir=tmp_path)
    straight = train(fresh(), ds.data, longer, cfg.data.max_len, cfg.negatives)
    assert resumed.resumed_from == 2 and resumed.losses == straight.losses
