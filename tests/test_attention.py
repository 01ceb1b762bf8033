"""Jagged HSTU attention: every implementation against the padded reference, forward and all
gradients (q, k, v, both bias tables), on random ragged batches; float64 gradcheck and opcheck of
the compiled kernel; clear errors on bad input.

Tolerances (against the reference evaluated in float64 on the same rounded inputs, the exact
answer): float32 rtol 1e-4 / atol 1e-5 for q, k, v, out and 1e-4 / 1e-4 for the bias-table
gradients (sums over up to L^2 / 2 terms); bfloat16 rtol 2e-2 / atol 2e-2 * (1 + max |exact|),
i.e. a few bf16 ulps of the largest value, since outputs are rounded to bf16 once (the compiled
kernel and fbgemm accumulate in float32) — the reference run itself in bfloat16 rounds every
intermediate and is held to the same bound.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib import ops
from grlib.ops.attention import time_buckets

IMPLS = ["cpu", "fbgemm"]


def _tol(dtype: torch.dtype, exact: torch.Tensor, table: bool = False) -> dict:
    if dtype == torch.bfloat16:
        scale = 1.0 + float(exact.abs().max()) if exact.numel() else 1.0
        return dict(rtol=2e-2, atol=2e-2 * scale)
    return dict(rtol=1e-4, atol=1e-4 if table else 1e-5)


@st.composite
def batches(draw, max_batch: int = 5, max_length: int = 80, max_heads: int = 4, max_dim: int = 19,
            dtypes=(torch.float32, torch.bfloat16), max_buckets: int = 10):
    """A ragged batch with empty, length-1 and full (== max_len) sequences likely; random dims; time
    tables of 1 .. max_buckets buckets."""
    lengths = draw(st.lists(st.one_of(st.sampled_from([0, 1]), st.integers(0, max_length)),
                            min_size=0, max_size=max_batch))
    longest = max(lengths, default=0)
    full = draw(st.booleans())
    max_len = max(1, longest) if full else draw(st.integers(max(1, longest), max_length + 8))
    H = draw(st.integers(1, max_heads))
    D = draw(st.integers(1, max_dim))
    Dv = draw(st.sampled_from([D, draw(st.integers(1, max_dim))]))
    dtype = draw(st.sampled_from(dtypes))
    with_pos, with_time = draw(st.booleans()), draw(st.booleans())
    P, Bt = draw(st.integers(1, 12)), draw(st.integers(1, max_buckets))
    span = draw(st.sampled_from([0, 3, 1000, 2**40]))  # 0: all timestamps equal
    # sorted within each sequence (as logs are): the cpu kernel adds the time bias run by run
    # (constant-bucket runs found by bisection); else entry by entry
    monotone = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    timestamps = torch.randint(0, span + 1, (T,), generator=g) if with_time else None
    if with_time and monotone:
        timestamps = torch.cat([c.sort().values for c in timestamps.split(lengths)] or [timestamps])
    case = dict(
        q=torch.randn(T, H, D, generator=g).to(dtype), k=torch.randn(T, H, D, generator=g).to(dtype),
        v=torch.randn(T, H, Dv, generator=g).to(dtype),
        offsets=ops.offsets_from_lengths(torch.tensor(lengths, dtype=torch.int64)), max_len=max_len,
        alpha=draw(st.sampled_from([None, 0.7])),
        pos_bias=torch.randn(H, P, generator=g).to(dtype) if with_pos else None,
        time_bias=torch.randn(H, Bt, generator=g).to(dtype) if with_time else None,
        timestamps=timestamps,  # ties when the span is small
    )
    return case


def _run(case: dict, impl: str, dtype: torch.dtype | None = None, seed: int = 1):
    """Output and gradients (q, k, v, pos_bias, time_bias; None where absent) of one call."""
    cast = (lambda t: t.to(dtype)) if dtype else (lambda t: t)
    names = ["q", "k", "v", "pos_bias", "time_bias"]
    leaves = {n: (cast(case[n]).detach().requires_grad_(True) if case[n] is not None else None) for n in names}
    out = ops.hstu_attention(leaves["q"], leaves["k"], leaves["v"], case["offsets"], case["max_len"],
                             alpha=case["alpha"], pos_bias=leaves["pos_bias"], time_bias=leaves["time_bias"],
                             timestamps=case["timestamps"], impl=impl)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)
    out.backward(g)
    return [out.detach()] + [leaves[n].grad if leaves[n] is not None else None for n in names]


def _compare(case: dict, impl: str) -> None:
    dtype = case["q"].dtype
    exact = _run(case, "reference", torch.float64)
    got = _run(case, impl)
    for name, a, b in zip(["out", "dq", "dk", "dv", "dpos_bias", "dtime_bias"], got, exact):
        assert (a is None) == (b is None), name
        if a is None:
            continue
        assert a.dtype == dtype, (name, a.dtype)
        tol = _tol(dtype, b, table=name.endswith("bias"))
        torch.testing.assert_close(a.to(torch.float64), b, **tol, msg=lambda m: f"{impl} {name}: {m}")


@pytest.mark.parametrize("impl", IMPLS)
@given(case=batches())
def test_matches_reference(impl, case):
    _compare(case, impl)


@settings(max_examples=25)
@given(case=batches(max_length=40, dtypes=(torch.bfloat16,)))
def test_reference_in_bfloat16_meets_the_same_bound(case):
    """The documented bf16 tolerance is not looser than what the padded reference itself achieves."""
    _compare(case, "reference")


def _random_case(lengths: list[int], H: int, D: int, Dv: int, P: int, Bt: int, ts: tuple[int, int],
                 seed: int, sorted_ts: bool = False) -> dict:
    """A fixed ragged batch with both bias tables (max_len = the longest sequence); timestamps
    uniform in `ts`, sorted within each sequence when `sorted_ts`."""
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    case = dict(q=torch.randn(T, H, D, generator=g), k=torch.randn(T, H, D, generator=g),
                v=torch.randn(T, H, Dv, generator=g), offsets=ops.offsets_from_lengths(torch.tensor(lengths)),
                max_len=max(lengths), alpha=None, pos_bias=torch.randn(H, P, generator=g),
                time_bias=torch.randn(H, Bt, generator=g), timestamps=torch.randint(*ts, (T,), generator=g))
    if sorted_ts:
        case["timestamps"] = torch.cat([c.sort().values for c in case["timestamps"].split(lengths)])
    return case


def test_compiled_kernel_many_heads_long_sequence():
    """Several 64-token tiles (partial last tile), 8 heads, D not a multiple of 8, all biases."""
    case = _random_case([200, 0, 1, 130, 64], H=8, D=13, Dv=7, P=100, Bt=16, ts=(-10**6, 10**6), seed=0)
    _compare(case, "cpu")


@pytest.mark.parametrize("lengths,H", [([300], 1), ([5, 700], 1), ([100] * 8, 2), ([130, 64, 1, 0, 90], 3)])
def test_forward_task_forms_match_reference(lengths, H):
    """The forward's two task forms on 2 threads: a dominant sequence (one head) gives one task per
    (sequence, head, query tile), many similar sequences one task per (sequence, head); both with
    partial tiles, diagonal tiles and both biases, forward and backward against the reference."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _compare(_random_case(lengths, H=H, D=24, Dv=20, P=100, Bt=16, ts=(-10**6, 10**6), seed=3), "cpu")
    finally:
        torch.set_num_threads(threads)


def test_known_values():
    """One sequence of two tokens, one head, D = 1, worked by hand."""
    silu = lambda x: x / (1 + math.exp(-x))  # noqa: E731
    q = torch.tensor([[[1.0]], [[2.0]]])
    k = torch.tensor([[[1.0]], [[1.0]]])
    v = torch.tensor([[[1.0]], [[10.0]]])
    offsets = torch.tensor([0, 2])
    pos = torch.tensor([[0.5, -1.0]])  # rel 0 -> 0.5, rel >= 1 -> -1.0
    time = torch.tensor([[0.0, 0.25, 2.0]])  # gap 5 -> bucket floor(log2 6) = 2 -> capped at 2
    ts = torch.tensor([100, 95])
    want = torch.tensor([silu(1 + 0.5) * 1 / 4,
                         (silu(2 - 1.0 + 2.0) * 1 + silu(2 + 0.5) * 10) / 4])
    for impl in ["reference", "cpu", "fbgemm"]:
        out = ops.hstu_attention(q, k, v, offsets, 4, alpha=1.0, pos_bias=pos, time_bias=time, timestamps=ts,
                                 impl=impl)
        torch.testing.assert_close(out[:, 0, 0], want, rtol=1e-6, atol=1e-6, msg=impl)


def test_time_buckets_are_exact_at_powers_of_two():
    dt = torch.tensor([0, 1, 2, 3, -3, 4, 7, 8, 2**40 - 2, 2**40 - 1, -(2**52 - 1), 2**52 - 2])
    want = [0, 1, 1, 2, 2, 2, 3, 3, 39, 40, 52, 51]
    assert time_buckets(dt, 64).tolist() == want
    assert time_buckets(dt, 3).tolist() == [min(w, 2) for w in want]


def test_compiled_kernel_matches_reference_on_bucket_boundaries():
    """Gaps of 2**k - 1 and 2**k for large k: the kernel's integer buckets equal the reference's."""
    gaps = [0] + [2**k - 1 for k in range(1, 50, 3)] + [2**k for k in range(1, 50, 3)]
    ts = torch.tensor([0] + gaps[1:])  # every token's gap to token 0 is one of them
    T, H = ts.numel(), 2
    g = torch.Generator().manual_seed(3)
    case = dict(q=torch.randn(T, H, 4, generator=g), k=torch.randn(T, H, 4, generator=g),
                v=torch.randn(T, H, 4, generator=g), offsets=torch.tensor([0, T]), max_len=T, alpha=None,
                pos_bias=None, time_bias=torch.randn(H, 60, generator=g), timestamps=ts)
    _compare(case, "cpu")


def test_gradcheck_float64_compiled_kernel():
    import grlib.ops.cpu.attention  # noqa: F401

    g = torch.Generator().manual_seed(0)
    offsets = torch.tensor([0, 3, 3, 4, 9])  # lengths 3, 0, 1, 5
    T, H = 9, 2
    ts = torch.tensor([5, 1, 1, 7, 0, 40, 3, 3, 1000])

    def leaf(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(True)

    inputs = (leaf(T, H, 3), leaf(T, H, 3), leaf(T, H, 2), leaf(H, 3), leaf(H, 4))

    def fn(q, k, v, pos, time):
        return torch.ops.grlib.hstu_attention(q, k, v, offsets, 6, 0.8, pos, time, ts)

    assert torch.autograd.gradcheck(fn, inputs)


def _strided(t: torch.Tensor, pad: int) -> torch.Tensor:
    """The same values as a view whose rows are `pad` elements wider (a chunk of a wider tensor)."""
    T = t.shape[0]
    if T == 0:
        return t
    wide = torch.cat([t.reshape(T, -1), torch.full((T, pad), float("nan"), dtype=t.dtype)], 1)
    return wide[:, :t[0].numel()].view(t.shape)


@settings(max_examples=60)
@given(case=batches(dtypes=(torch.float32,)), mode=st.sampled_from([1, 2]), pad=st.sampled_from([0, 3, 64]))
def test_backward_forms_match_reference_on_strided_inputs(case, mode, pad):
    """Both backward forms of the compiled kernel (1: one pass per (sequence, head); 2: two passes per
    tile) against the float64 reference, with q, k, v and dO given as strided views (rows wider than
    H x D, NaN in the gaps: a value read from outside the view would show)."""
    import grlib.ops.cpu.attention  # noqa: F401
    from grlib.ops.attention import default_alpha

    exact = _run(case, "reference", torch.float64)
    g = torch.randn(exact[0].shape, generator=torch.Generator().manual_seed(1))  # the dO of _run
    alpha = case["alpha"] if case["alpha"] is not None else default_alpha(case["q"].shape[2])
    time = case["time_bias"]
    got = torch.ops.grlib.hstu_attention_backward(
        _strided(g, pad), *(_strided(case[n], pad) for n in ("q", "k", "v")), case["offsets"], case["max_len"],
        alpha, case["pos_bias"], time, case["timestamps"] if time is not None else None, mode)
    for name, a, b in zip(["dq", "dk", "dv", "dpos_bias", "dtime_bias"], got, exact[1:]):
        if b is None:
            assert a.numel() == 0, name
            continue
        assert a.is_contiguous(), name
        torch.testing.assert_close(a.double(), b, **_tol(torch.float32, b, table=name.endswith("bias")),
                                   msg=lambda m: f"mode {mode} {name}: {m}")
    out = torch.ops.grlib.hstu_attention(*(_strided(case[n], pad) for n in ("q", "k", "v")), case["offsets"],
                                         case["max_len"], alpha, case["pos_bias"], time,
                                         case["timestamps"] if time is not None else None)
    torch.testing.assert_close(out.double(), exact[0], **_tol(torch.float32, exact[0]))


@pytest.mark.parametrize("sorted_ts", [False, True])
@pytest.mark.parametrize("mode", [1, 2])
def test_backward_forms_on_long_sequences(mode, sorted_ts):
    """Several 64-token tiles per sequence (partial last tiles), 8 heads, all biases, both forms;
    timestamps in any order (bucket per entry) and sorted (several constant-bucket runs per tile row,
    rows past bucket Bt - 1 one run), forward and backward."""
    import grlib.ops.cpu.attention  # noqa: F401
    from grlib.ops.attention import default_alpha

    case = _random_case([200, 0, 1, 130, 64, 129], H=8, D=13, Dv=7, P=70, Bt=16, ts=(-10**6, 10**6), seed=2,
                        sorted_ts=sorted_ts)
    exact = _run(case, "reference", torch.float64)
    out = torch.ops.grlib.hstu_attention(case["q"], case["k"], case["v"], case["offsets"], case["max_len"],
                                         default_alpha(13), case["pos_bias"], case["time_bias"], case["timestamps"])
    torch.testing.assert_close(out.double(), exact[0], **_tol(torch.float32, exact[0]))
    g = torch.randn(exact[0].shape, generator=torch.Generator().manual_seed(1))
    got = torch.ops.grlib.hstu_attention_backward(
        g, case["q"], case["k"], case["v"], case["offsets"], case["max_len"], default_alpha(13), case["pos_bias"],
        case["time_bias"], case["timestamps"], mode)
    for name, a, b in zip(["dq", "dk", "dv", "dpos_bias", "dtime_bias"], got, exact[1:]):
        torch.testing.assert_close(a.double(), b, **_tol(torch.float32, b, table=name.endswith("bias")),
                                   msg=lambda m: f"mode {mode} {name}: {m}")


@pytest.mark.parametrize("sorted_ts", [False, True])
@pytest.mark.parametrize("mode", [1, 2])
def test_backward_is_bitwise_deterministic(mode, sorted_ts):
    """Tasks run in whatever order the workers take them; the gradients (the bias tables' sums
    included) must not depend on it: exact resume and seeded runs rely on that."""
    import grlib.ops.cpu.attention  # noqa: F401

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 100, (24,), generator=g)
    case = _random_case(lengths.tolist(), H=2, D=16, Dv=16, P=128, Bt=32, ts=(0, 10**6), seed=4, sorted_ts=sorted_ts)
    grad = torch.randn(case["q"].shape, generator=g)
    args = (grad, case["q"], case["k"], case["v"], case["offsets"], case["max_len"], 0.25, case["pos_bias"],
            case["time_bias"], case["timestamps"], mode)
    first = torch.ops.grlib.hstu_attention_backward(*args)
    for _ in range(20):
        for a, b in zip(torch.ops.grlib.hstu_attention_backward(*args), first):
            assert torch.equal(a, b)


def test_opcheck_compiled_kernel():
    """Schema, fake (meta) implementations and the autograd registration agree with the kernel."""
    import grlib.ops.cpu.attention  # noqa: F401

    g = torch.Generator().manual_seed(0)
    offsets = torch.tensor([0, 2, 2, 7])
    T, H = 7, 2
    q, k, v = (torch.randn(T, H, 5, generator=g, requires_grad=True) for _ in range(3))
    pos, time = torch.randn(H, 4, requires_grad=True), torch.randn(H, 3, requires_grad=True)
    ts = torch.randint(0, 100, (T,), generator=g)
    op = torch.ops.grlib.hstu_attention.default
    torch.library.opcheck(op, (q, k, v, offsets, 8, 0.5, pos, time, ts))
    torch.library.opcheck(op, (q, k, v, offsets, 8, 0.5, None, None, None),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    grad = torch.randn(T, H, 5, generator=g)
    torch.library.opcheck(torch.ops.grlib.hstu_attention_backward.default,
                          (grad, q.detach(), k.detach(), v.detach(), offsets, 8, 0.5, pos.detach(), None, None))


def test_result_does_not_depend_on_thread_count():
    case = _random_case([150, 3, 90, 0, 64], H=3, D=8, Dv=8, P=20, Bt=8, ts=(0, 10**5), seed=1)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _run(case, "cpu")
        torch.set_num_threads(max(2, threads))
        many = _run(case, "cpu")
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, many):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_auto_picks_compiled_kernel_on_cpu():
    assert ops.choose("hstu_attention", "cpu") == "cpu"
    assert set(ops.implementations("hstu_attention")) >= {"reference", "fbgemm", "cpu", "triton", "npu"}


def _args(**change):
    g = torch.Generator().manual_seed(0)
    args = dict(q=torch.randn(5, 2, 4, generator=g), k=torch.randn(5, 2, 4, generator=g),
                v=torch.randn(5, 2, 3, generator=g), offsets=torch.tensor([0, 2, 5]), max_len=4,
                pos_bias=torch.zeros(2, 3), time_bias=torch.zeros(2, 3), timestamps=torch.arange(5))
    args.update(change)
    return args


@pytest.mark.parametrize("impl", ["reference", "cpu", "fbgemm"])
@pytest.mark.parametrize("change,error,message", [
    (dict(k=torch.randn(5, 2, 3)), ValueError, "q and k must both be"),
    (dict(v=torch.randn(4, 2, 3)), ValueError, "v must be \\[T=5, H=2"),
    (dict(q=torch.randn(5, 8)), ValueError, "q and k must both be"),
    (dict(v=torch.randn(5, 2, 3, dtype=torch.float64)), TypeError, "share one floating dtype"),
    (dict(offsets=torch.tensor([0, 2, 5], dtype=torch.int32)), ValueError, "offsets must be a 1-D int64"),
    (dict(pos_bias=torch.zeros(3, 3)), ValueError, "pos_bias must be \\[H=2"),
    (dict(timestamps=None), ValueError, "time_bias needs timestamps"),
    (dict(timestamps=torch.arange(5.0)), TypeError, "timestamps must be int64"),
    (dict(max_len=2), ValueError, "more than max_len=2"),
    (dict(max_len=0), ValueError, "max_len must be >= 1"),
])
def test_bad_input_gets_a_clear_error(impl, change, error, message):
    args = _args(**change)
    with pytest.raises(error, match=message):
        ops.hstu_attention(**args, impl=impl)


@pytest.mark.parametrize("change,message", [
    (dict(offsets=torch.tensor([0, 3, 2, 5])), "non-decreasing"),
    (dict(offsets=torch.tensor([0, 2, 4])), "must equal the number of tokens T=5"),
    (dict(q=torch.ones(5, 2, 4, dtype=torch.int64), k=torch.ones(5, 2, 4, dtype=torch.int64),
          v=torch.ones(5, 2, 3, dtype=torch.int64)), "floating point"),
])
def test_compiled_kernel_checks_what_python_does_not(change, message):
    import grlib.ops.cpu.attention  # noqa: F401

    a = _args(**change)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.grlib.hstu_attention(a["q"], a["k"], a["v"], a["offsets"], 8, 0.5, a["pos_bias"],
                                       a["time_bias"], a["timestamps"])
