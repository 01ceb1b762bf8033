"""The paper preset (shrunk) checkpoints and resumes exactly with async negative sampling on.

Shrunk: the synthetic twin instead of KuaiRand-27K (offline), a tiny model, users and max_len;
kept from the paper preset: async_sampling true, its sampler (uniform), a shared pool, FP16 rows.
The async worker draws ahead of training, so the checkpoint must hold the sampler state as of the
next batch to train; equality is exact (bitwise losses): the same ids, the same data order and
deterministic kernels give the same arithmetic in the same order.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from grlib.config import load_config
from grlib.data.catalog import load_dataset
from grlib.model import build_model
from grlib.negatives import build_negative_path
from grlib.train import checkpoint, train
from grlib.train.prefetch import PrefetchWorker

SHRINK = {"data.dataset": "synthetic", "data.n_users": 120, "data.length_factor": 0.005, "data.n_items": 400,
          "data.max_len": 32, "data.min_item_count": 1, "model.n_layers": 1, "model.n_heads": 2,
          "model.d_model": 32, "train.batch_size": 16, "train.epochs": 3, "train.max_steps": 0,
          "train.select_best": False, "negatives.n_negatives": 64}


@pytest.fixture(scope="module")
def paper_small(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        data_dir = tmp_path_factory.mktemp("data")
        mp.setenv("GRLIB_DATA_DIR", str(data_dir))
        cfg = load_config("paper", SHRINK)
        assert (cfg.negatives.async_sampling, cfg.negatives.sampler) == (True, "uniform")  # the paper's path
        yield cfg, load_dataset(cfg), data_dir


def _fresh(cfg, ds):
    torch.manual_seed(0)
    return build_model(cfg.model, ds.data.n_items, cfg.data.max_len)


def test_paper_preset_async_checkpoint_resumes_exactly(paper_small, tmp_path, monkeypatch):
    cfg, ds, _ = paper_small
    per_epoch = ds.data.n_train_batches(cfg.train.batch_size)
    K, N = 5, per_epoch + 4  # the checkpoint falls mid-epoch (the worker is ahead); the resume crosses an epoch
    assert K < per_epoch < N
    tcfg = dataclasses.replace(cfg.train, max_steps=N)

    real_save = checkpoint.save

    def keep_step_k(path, state):  # the run goes on after step K; keep a copy of that checkpoint
        real_save(path, state)
        if state["position"]["step"] == K:
            shutil.copy(path, tmp_path / "k.pt")

    monkeypatch.setattr(checkpoint, "save", keep_step_k)
    with_ckpt = train(_fresh(cfg, ds), ds.data, tcfg, cfg.data.max_len, cfg.negatives,
                      checkpoint_dir=tmp_path / "run", checkpoint_every=1)
    monkeypatch.undo()

    (tmp_path / "resume").mkdir()
    shutil.copy(tmp_path / "k.pt", tmp_path / "resume" / "last.pt")
    # everything rebuilt from the file: a new model, optimizer, negative path, worker and data iterator
    resumed = train(_fresh(cfg, ds), ds.data, tcfg, cfg.data.max_len, cfg.negatives, checkpoint_dir=tmp_path / "resume")
    straight = train(_fresh(cfg, ds), ds.data, tcfg, cfg.data.max_len, cfg.negatives)
    sync = train(_fresh(cfg, ds), ds.data, tcfg, cfg.data.max_len,
                 dataclasses.replace(cfg.negatives, async_sampling=False))
    assert resumed.resumed_from == K and len(straight.losses) == N
    assert resumed.losses == straight.losses  # the next step's loss and every later one, bitwise
    assert with_ckpt.losses == straight.losses  # checkpointing does not disturb the run
    assert sync.losses == straight.losses  # async draws the sync path's ids


def test_state_dict_is_the_state_as_of_the_next_batch(paper_small):
    """After training on batch i of an async path (the worker already drew i+1, i+2), a new path
    loaded from state_dict() draws batch i+1's ids exactly."""
    cfg, ds, _ = paper_small
    batches = list(itertools.islice(ds.data.train_batches(16, cfg.data.max_len, np.random.default_rng(0)), 5))
    counts = ds.data.train_item_counts()
    path = build_negative_path(cfg.negatives, ds.data.n_items, counts, seed=3)
    with PrefetchWorker(batches, path.prepare, depth=cfg.negatives.queue_depth) as worker:  # the prefetch schedule's
        it = (batch for batch, _ in worker)
        for _ in range(2):
            b = next(it)
            path._take(b)  # what loss() does first
        state = path.state_dict()
        b3 = next(it)
        expected = path._take(b3).ids
    assert not torch.equal(state["generator"], path.generator.get_state())  # the worker had drawn ahead

    other = build_negative_path(cfg.negatives, ds.data.n_items, counts, seed=99)
    other.load_state_dict(state)
    assert torch.equal(other.sample(batches[2]).ids, expected)


def _cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    overrides = [x for k, v in SHRINK.items() for x in ("-o", f"{k}={v}")]
    return subprocess.run([sys.executable, "-m", "grlib", "train", "--scale", "paper", *overrides, *args],
                          env=env, capture_output=True, text=True, timeout=300)


def test_paper_preset_resumes_through_the_cli_and_says_so(paper_small, tmp_path):
    """A separate process resumes from the checkpoint of a run cut at step K (async on) and matches
    an uninterrupted run's losses; it says where it resumed from."""
    _, _, data_dir = paper_small
    env = {**os.environ, "GRLIB_DATA_DIR": str(data_dir), "GRLIB_RESULTS_DIR": str(tmp_path / "results"),
           "OMP_NUM_THREADS": "1", "GRLIB_PROGRESS": "0"}
    ckpt = tmp_path / "ckpt"
    first = _cli(["--max-steps", "4", "--checkpoint-dir", str(ckpt)], env)
    assert first.returncode == 0, first.stderr
    assert "resuming" not in first.stderr
    resumed = _cli(["--max-steps", "7", "--checkpoint-dir", str(ckpt), "--losses", str(tmp_path / "r.json")], env)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {ckpt / 'last.pt'} at step 4" in resumed.stderr
    straight = _cli(["--max-steps", "7", "--losses", str(tmp_path / "s.json")], env)
    assert straight.returncode == 0, straight.stderr
    r, s = (json.loads((tmp_path / f"{x}.json").read_text()) for x in "rs")
    assert len(r) == len(s) == 7 and r == s
