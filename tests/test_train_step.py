"""The one training step: the trainer is the step run by a schedule (so `bench train` and the
negatives ablation, which run the same step, time what trains), its phases, and the ablation's
step using the trainer's optimizers."""
from __future__ import annotations

import itertools
from contextlib import closing

import numpy as np
import pytest
import torch

from grlib.config import load_config
from grlib.experiments import train_stage
from grlib.model import build_model
from grlib.experiments import negatives_stage
from grlib.negatives import build_negative_path
from grlib.train import PHASES, TrainStep, train
from grlib.train.optim import Optimizers
from grlib.train.prefetch import PrefetchSchedule, SyncSchedule, build_schedule


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRLIB_DATA_DIR", str(tmp_path_factory.mktemp("data")))
        cfg = load_config("smoke", {"train.max_steps": 4, "train.select_best": False})
        yield cfg, train_stage.load_dataset(cfg).data


@pytest.mark.parametrize("async_sampling", [False, True])
def test_train_is_the_step_run_by_its_schedule(smoke, async_sampling):
    """train() and the step driven by hand over the same batches give the same losses and weights,
    bit for bit."""
    cfg, data = smoke
    neg = cfg.replace({"negatives.async_sampling": async_sampling, "negatives.sampler": "popularity"}).negatives
    torch.manual_seed(0)
    fitted = build_model(cfg.model, data.n_items, cfg.data.max_len)
    fit = train(fitted, data, cfg.train, cfg.data.max_len, neg)

    torch.manual_seed(0)
    model = build_model(cfg.model, data.n_items, cfg.data.max_len)
    torch.manual_seed(cfg.train.seed)  # (what train() does first: dropout draws)
    path = build_negative_path(neg, data.n_items, data.train_item_counts(), seed=cfg.train.seed)
    step = TrainStep(model, path, Optimizers(model, cfg.train))
    schedule = build_schedule(step, neg)
    assert isinstance(schedule, PrefetchSchedule if async_sampling else SyncSchedule)
    batches = data.train_batches(cfg.train.batch_size, cfg.data.max_len, np.random.default_rng(cfg.train.seed))
    model.train()
    with closing(schedule.run(batches)) as steps:
        results = list(itertools.islice(steps, cfg.train.max_steps))
    assert [r.loss for r in results] == fit.losses
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fitted.state_dict().values()))
    for r in results:
        assert set(r.seconds) == set(PHASES) and min(r.seconds.values()) >= 0 and r.total_s > 0
        assert "negatives" not in r.batch.attachments  # the step consumed the prepared sample


def test_a_step_without_a_batch_returns_none(smoke):
    cfg, data = smoke
    model = build_model(cfg.model, data.n_items, cfg.data.max_len)
    path = build_negative_path(cfg.negatives, data.n_items, data.train_item_counts())
    step = TrainStep(model, path, Optimizers(model, cfg.train))
    assert step(iter([])) is None
    assert list(SyncSchedule(step).run([])) == []


def test_the_ablation_times_the_trainers_step(smoke, monkeypatch):
    """Each timed step of the negatives ablation is a TrainStep with the trainer's optimizers (dense
    AdamW + lazy Adam for item rows), for sync, pre-sampled and async variants."""
    cfg, data = smoke
    seen: list[tuple[str, type]] = []
    call = TrainStep.__call__

    def spy(self, batches):
        out = call(self, batches)
        if out is not None:
            seen.append((type(self.opt).__name__, [type(o).__name__ for o in self.opt.opts]))
        return out

    monkeypatch.setattr(TrainStep, "__call__", spy)
    vs = [negatives_stage.Variant("per-token", 8, sampling=m, sampler="popularity") for m in ("sync", "presampled", "async")]
    batches = negatives_stage.fixed_batches(data, cfg, 3)
    times = negatives_stage.measure_step_times(vs, cfg, data, batches, rounds=1)
    assert set(times) == {v.name for v in vs} and all(t > 0 for t in times.values())
    assert seen == [("Optimizers", ["AdamW", "LazyAdam"])] * (3 * len(vs))
    assert all("negatives" not in b.attachments for b in batches)  # every prepared sample was used


@pytest.mark.parametrize("max_norm", [0.0, 0.5, 1e6])
def test_clip_norm_is_torchs_clip_bit_for_bit(max_norm):
    """grlib.train.optim.clip_norm returns torch.nn.utils.clip_grad_norm_'s norm and leaves the same
    gradients: scaled by the same float32 coefficient when over max_norm (0.5 here), untouched under it
    (1e6), only measured for max_norm 0."""
    from grlib.train.optim import clip_norm

    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in ((7, 5), (13,), (3, 4, 2))]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for t, p in zip(twins, params):
        t.grad = p.grad.clone()
    norm = clip_norm(params, max_norm)
    if max_norm > 0:
        expected = float(torch.nn.utils.clip_grad_norm_(twins, max_norm))
    else:
        expected = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t.grad) for t in twins])))
    assert norm == expected and (max_norm != 0.5 or norm > 0.5)
    for t, p in zip(twins, params):
        assert torch.equal(t.grad, p.grad)
