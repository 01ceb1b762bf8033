"""The non-padded peers of the compiled attention (grlib/ops/loop/attention.py): the per-sequence
dense loop, eager and torch.compile'd, against the padded reference, forward and every gradient,
on random ragged batches (empty and length-1 sequences included), with the tolerances of
tests/test_attention.py."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib import ops
from test_attention import _compare, _random_case, batches  # the same strategy and tolerances


@given(case=batches())
def test_loop_matches_reference(case):
    _compare(case, "loop")


@settings(max_examples=6)  # lengths and dims are dynamic; each dtype compiles its own graphs
@given(lengths=st.lists(st.one_of(st.sampled_from([0, 1]), st.integers(0, 70)), min_size=1, max_size=4),
       dv=st.sampled_from([8, 5]), dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 99))
def test_loop_compile_matches_reference(lengths, dv, dtype, seed):
    """Two heads and both bias tables, as in the model (inductor fails to compile the backward's
    scatter into a [1, 1] bias table: size-1 dims are specialised; not a shape the model uses)."""
    case = _random_case([*lengths, 1], H=2, D=8, Dv=dv, P=16, Bt=8, ts=(0, 10**6), seed=seed)
    case = {n: t.to(dtype) if torch.is_tensor(t) and t.is_floating_point() else t for n, t in case.items()}
    _compare(case, "loop_compile")


def test_several_long_sequences_with_both_tables():
    case = _random_case([200, 0, 1, 130, 64], H=4, D=13, Dv=7, P=100, Bt=16, ts=(-10**6, 10**6), seed=3)
    _compare(case, "loop")


def test_refuses_sequences_longer_than_max_len():
    q = torch.randn(5, 1, 4)
    with pytest.raises(ValueError, match="more than max_len=4"):
        ops.hstu_attention(q, q, q, torch.tensor([0, 5]), 4, impl="loop")


def test_peers_are_registered_but_never_auto():
    assert {"loop", "loop_compile"} <= set(ops.runnable("hstu_attention", "cpu"))
    assert ops.choose("hstu_attention", "cpu") == "cpu"
