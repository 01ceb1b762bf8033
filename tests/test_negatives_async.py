"""The asynchronous sampler: identical results to sync sampling through the trainer, worker failures
surface in the training loop, bounded look-ahead, clean shutdown (no thread left behind)."""
from __future__ import annotations

import os
import threading
from contextlib import closing
from itertools import islice
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from grlib.config import load_config
from grlib.data import catalog
from grlib.data.sequences import SequenceData
from grlib.model import build_model
from grlib.negatives import build_negative_path
from grlib.negatives.path import NegativePath
from grlib.train import train
from grlib.train.prefetch import PrefetchError, PrefetchSchedule, PrefetchWorker


def _worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("grlib-prefetch")]


@pytest.fixture
def smoke(isolated_outputs):
    cfg = load_config("smoke", {"train.max_steps": 4})
    catalog.prepare(cfg)
    return cfg, SequenceData.load(catalog.folder(cfg))


def _fit(cfg, data, **negatives):
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, data.n_items)
    neg = cfg.replace({f"negatives.{k}": v for k, v in negatives.items()}).negatives
    return train(model, data, cfg.train, cfg.data.max_len, neg).losses


@pytest.mark.parametrize("sharing,sampler", [("per-token", "popularity"), ("shared", "in-batch")])
def test_async_training_is_identical_to_sync(smoke, monkeypatch, sharing, sampler):
    cfg, data = smoke
    used: list[torch.Tensor] = []
    take = NegativePath._take

    def recording(self, batch):
        sample = take(self, batch)
        used.append(sample.ids.clone())
        return sample

    monkeypatch.setattr(NegativePath, "_take", recording)
    sync = _fit(cfg, data, sharing=sharing, sampler=sampler, async_sampling=False)
    sync_ids, used[:] = list(used), []
    asyn = _fit(cfg, data, sharing=sharing, sampler=sampler, async_sampling=True)
    # the same ids, drawn in the same order, scored under the same weights
    assert len(sync) == 4 and all(torch.equal(a, b) for a, b in zip(sync_ids, used, strict=True))
    # equal losses up to MKL's run-to-run rounding (it differs with memory alignment, sync vs sync too)
    assert sync == pytest.approx(asyn, rel=1e-6)
    assert not _worker_threads()


def test_worker_failure_surfaces_in_the_training_loop(smoke, monkeypatch):
    cfg, data = smoke
    calls = {"n": 0}
    original = NegativePath._draw  # what the worker runs per batch (through prepare)

    def failing(self, batch):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ValueError("sampler exploded")
        return original(self, batch)

    monkeypatch.setattr(NegativePath, "_draw", failing)
    with pytest.raises(PrefetchError, match="batch 2: ValueError: sampler exploded") as err:
        _fit(cfg, data, async_sampling=True)
    assert isinstance(err.value.__cause__, ValueError)
    assert not _worker_threads()


def test_source_failure_surfaces():
    def batches():
        yield 1
        raise OSError("disk gone")

    with PrefetchWorker(batches(), lambda b: b * 2) as worker:
        assert next(worker) == (1, 2)
        with pytest.raises(PrefetchError, match="OSError: disk gone"):
            next(worker)
    assert not _worker_threads()


def test_lookahead_is_bounded_and_close_stops_the_worker():
    pulled = []

    def endless():
        i = 0
        while True:
            pulled.append(i)
            yield i
            i += 1

    ran = threading.Semaphore(0)
    worker = PrefetchWorker(endless(), lambda b: ran.release() or b, depth=2)
    assert next(worker) == (0, 0)
    for _ in range(3):  # the worker runs 2 beyond the one taken (a timeout only turns a hang into a failure)
        assert ran.acquire(timeout=60)
    worker.close()  # it finishes what it was allowed, no more
    assert pulled == [0, 1, 2]  # taken + depth: it pulled nothing from the source it may not start
    assert not worker.alive and not _worker_threads()
    worker.close()  # idempotent
    with pytest.raises(StopIteration):
        next(worker)


class _Pull:
    """Stands in for TrainStep: a step pulls one batch and returns it; prepare does nothing."""

    path = SimpleNamespace(prepare=lambda batch: None)

    def __call__(self, feed):
        return next(feed, None)


def test_closing_the_schedules_steps_stops_the_worker():
    batch_list = [object() for _ in range(50)]
    steps = PrefetchSchedule(_Pull(), depth=2).run(batch_list)
    assert next(steps) is batch_list[0]
    steps.close()  # e.g. the trainer stops early (max_steps) and closes its steps
    assert not _worker_threads()
    with closing(PrefetchSchedule(_Pull(), depth=2).run(batch_list)) as steps:
        assert [next(steps) for _ in range(3)] == batch_list[:3]
    assert not _worker_threads()
    assert list(PrefetchSchedule(_Pull(), depth=3).run(batch_list)) == batch_list  # to the end, in order
    assert not _worker_threads()


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        PrefetchWorker([], lambda b: b, depth=0)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts OS threads through /proc (Linux only)")
@pytest.mark.parametrize("sharing,sampler", [("per-token", "popularity"), ("per-token", "uniform"),
                                             ("shared", "in-batch"), ("per-token", "in-batch")])
def test_sampling_in_a_thread_starts_no_thread_pool(smoke, sharing, sampler):
    """What the async worker runs starts no OpenMP team of its own: two extra spinning threads make
    libgomp throttle every parallel region of the training threads (async step 1.1-1.2x pre-sampled
    on 2 cores before the samplers moved to numpy)."""
    cfg, data = smoke
    neg = cfg.replace({"negatives.sharing": sharing, "negatives.sampler": sampler}).negatives
    path = build_negative_path(neg, data.n_items, data.train_item_counts())
    batches = list(islice(data.train_batches(64, cfg.data.max_len, np.random.default_rng(0)), 3))
    (torch.randn(1 << 21) * 2).sum()  # the main thread's team exists before counting
    before = len(os.listdir("/proc/self/task"))
    seen: list[int] = []

    def work():
        for b in batches:
            path.sample(b)
        seen.append(len(os.listdir("/proc/self/task")))

    th = threading.Thread(target=work)
    th.start()
    th.join()
    assert seen == [before + 1]  # the worker itself, nothing more
