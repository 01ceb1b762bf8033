"""HSTU and SASRec on jagged batches: shapes, causality, batch independence, empty and length-1
sequences, parameter counts of the presets (the paper preset counted on the meta device)."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib.config import ConfigError, ModelConfig, load_config
from grlib.schema import FIRST_ITEM_ID
from grlib.data.sequences import JaggedBatch
from grlib.model import (ItemTable, build_model, count_parameters, embedding_parameters, parameter_count,
                         preset_parameters)
from grlib.model.embeddings import time_gaps

N_ITEMS = 40


def make_batch(lengths: list[int], max_len: int, seed: int = 0) -> JaggedBatch:
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    offsets = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int64)
    ts = torch.cumsum(torch.randint(1, 5000, (T,), generator=g), 0)
    return JaggedBatch(item_ids=torch.randint(FIRST_ITEM_ID, N_ITEMS, (T,), generator=g),
                       actions=torch.randint(0, 256, (T,), generator=g), timestamps=ts, offsets=offsets,
                       max_len=max_len, targets=torch.zeros(T, dtype=torch.int64))


def sub_batch(batch: JaggedBatch, b: int, upto: int | None = None) -> JaggedBatch:
    """Sequence b alone (its first `upto` tokens)."""
    s, e = int(batch.offsets[b]), int(batch.offsets[b + 1])
    e = e if upto is None else s + upto
    return JaggedBatch(batch.item_ids[s:e], batch.actions[s:e], batch.timestamps[s:e],
                       torch.tensor([0, e - s]), batch.max_len, batch.targets[s:e])


def model(name: str, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(name=name, n_layers=2, n_heads=2, d_model=16, dropout=0.0, attention_impl="reference", **kw)
    return build_model(cfg, N_ITEMS, max_len=8).eval()


@pytest.mark.parametrize("name", ["hstu", "sasrec"])
@settings(max_examples=15)
@given(lengths=st.lists(st.integers(0, 8), min_size=1, max_size=4), seed=st.integers(0, 1000))
def test_batch_independence_and_causality(name, lengths, seed):
    """A sequence's vectors do not depend on other sequences of the batch, nor on later tokens."""
    m = model(name)
    batch = make_batch(lengths, max_len=8, seed=seed)
    with torch.no_grad():
        out = m(batch)  # [T, d]
        assert out.shape == (sum(lengths), 16) and torch.isfinite(out).all()
        if out.numel():
            torch.testing.assert_close(out.norm(dim=-1), torch.ones(out.shape[0]))
        for b, n in enumerate(lengths):
            if n == 0:
                continue
            s = int(batch.offsets[b])
            torch.testing.assert_close(m(sub_batch(batch, b)), out[s:s + n], atol=1e-5, rtol=1e-5)
            k = (n + 1) // 2  # a prefix gives the same vectors on its tokens
            torch.testing.assert_close(m(sub_batch(batch, b, k)), out[s:s + k], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["hstu", "sasrec"])
def test_backward_reaches_every_parameter(name):
    m = model(name).train()
    batch = make_batch([5, 0, 1, 8], max_len=8)
    m(batch).pow(2).sum().backward()
    missing = [n for n, p in m.named_parameters() if p.grad is None]
    assert not missing, f"no gradient for {missing}"


@pytest.mark.parametrize("name", ["hstu", "sasrec"])
def test_the_item_table_is_reached_through_its_interface(name):
    """model.embed is an ItemTable: lookup gives the L2-normalised rows of the ids asked for,
    score_all the dot products with every normalised row, sparse_parameters the item rows."""
    m = model(name)
    assert isinstance(m.embed, ItemTable)
    weight = m.embed.items.weight  # [V, d]
    ids = torch.tensor([5, 2, 39, 5])
    rows = m.embed.lookup(ids)  # [4, 16]
    torch.testing.assert_close(rows, weight[ids] / weight[ids].norm(dim=-1, keepdim=True))
    user = torch.randn(3, 16)
    table = weight / weight.norm(dim=-1, keepdim=True).clamp_min(1e-12)  # (the pad row is zero)
    torch.testing.assert_close(m.embed.score_all(user), user @ table.T)
    assert m.embed.score_all(user).shape == (3, N_ITEMS)
    assert embedding_parameters(m) == m.embed.sparse_parameters() == [weight]
    rows.sum().backward()  # only the rows looked up get a gradient
    touched = weight.grad.ne(0).any(1).nonzero().squeeze(1).tolist()
    assert touched == [2, 5, 39]


def test_time_gaps_restart_per_sequence():
    ts = torch.tensor([10, 15, 100, 7, 9, 30])
    offsets = torch.tensor([0, 3, 3, 4, 6])
    assert time_gaps(ts, offsets).tolist() == [0, 5, 85, 0, 0, 21]


def test_sasrec_refuses_longer_batches():
    m = model("sasrec")
    with pytest.raises(ValueError, match="exceeds the model's positions"):
        m(make_batch([3], max_len=9))


def test_popularity_has_no_encoder():
    with pytest.raises(ValueError, match="popularity"):
        build_model(ModelConfig(name="popularity"), N_ITEMS)


def test_parameter_count_splits_dense_and_embeddings():
    m = model("hstu")
    count = parameter_count(m)
    assert count.embedding == N_ITEMS * 16 and count.total == count_parameters(m)
    meta = build_model(m.cfg, N_ITEMS, 8, device="meta")
    assert parameter_count(meta) == count and all(p.is_meta for p in meta.parameters())


def test_presets_from_smoke_to_paper():
    """Each preset's parameter count (meta device): smoke ~0.1M (on ML-100K's 1,684 ids: it must
    train in seconds), paper ~0.2B dense parameters (its item table comes on top: d_model per item)."""
    counts = {}
    for scale, n_items in (("smoke", 1684), ("laptop", 5000), ("paper", 1_000_000)):
        cfg = load_config(scale)
        counts[scale] = preset_parameters(cfg.model, n_items, cfg.data.max_len)
    assert 0.05e6 <= counts["smoke"].total <= 1e6, counts["smoke"]
    assert counts["smoke"].total < counts["laptop"].total < counts["paper"].total
    assert 0.18e9 <= counts["paper"].dense <= 0.22e9, counts["paper"]


@pytest.mark.parametrize("override,message", [
    ({"model.n_heads": 3}, "model.d_model: 32 is not divisible"),
    ({"model.dropout": 1.0}, "model.dropout: must be in [0, 1)"),
    ({"model.name": "gru4rec"}, "model.name: 'gru4rec' is not one of"),
    ({"train.warmup_steps": -1}, "train.warmup_steps: must be >= 0"),
    ({"train.grad_clip": -1.0}, "train.grad_clip: must be >= 0"),
    ({"train.embedding_optimizer": "sgd"}, "train.embedding_optimizer: 'sgd' is not one of"),
    ({"train.select_best": "yes"}, "train.select_best: expected true/false"),
])
def test_bad_model_and_train_values_name_the_field(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("smoke", {**override, "model.d_model": 32} if "n_heads" in str(override) else override)
