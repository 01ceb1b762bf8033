"""grlib.ops.linear: the oneDNN implementation against torch's F.linear, forward and every gradient,
on random shapes (empty and one-row inputs included), float32 and bfloat16; bad input names the
parameter; FlopCounterMode counts its GEMMs."""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from grlib import ops
from grlib.hardware import isa

# bf16 through oneDNN where the CPU has bf16 GEMMs (else refused: tests/test_isa.py)
ONEDNN_DTYPES = [torch.float32] + ([torch.bfloat16] if isa.bf16_missing() is None else [])

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch was built without oneDNN")


def _run(x, w, b, impl, dtype, rounded_to):
    """Output and gradients in `dtype`, from inputs and output gradient rounded to `rounded_to` first
    (the float64 answer is taken on the same rounded values)."""
    cast = lambda t: t.to(rounded_to).to(dtype)  # noqa: E731
    leaves = [cast(t).detach().requires_grad_(True) if t is not None else None for t in (x, w, b)]
    y = ops.linear(*leaves, impl=impl)
    y.backward(cast(torch.randn(y.shape, generator=torch.Generator().manual_seed(1))))
    return [y.detach()] + [t.grad if t is not None else None for t in leaves]


@given(lead=st.lists(st.sampled_from([0, 1, 3, 17, 64]), min_size=1, max_size=2), n_in=st.integers(1, 70),
       n_out=st.integers(1, 70), bias=st.booleans(), dtype=st.sampled_from(ONEDNN_DTYPES),
       seed=st.integers(0, 2**31 - 1))
def test_onednn_matches_reference(lead, n_in, n_out, bias, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(*lead, n_in, generator=g), torch.randn(n_out, n_in, generator=g)
    b = torch.randn(n_out, generator=g) if bias else None
    exact = _run(x, w, b, "reference", torch.float64, dtype)
    got = _run(x, w, b, "onednn", dtype, dtype)
    # float32: a sum of n_in (or rows) products, rounded; bfloat16: inputs and output rounded to bf16
    for name, a, e in zip(["y", "dx", "dw", "db"], got, exact):
        assert (a is None) == (e is None), name
        if a is None:
            continue
        assert a.dtype == dtype and a.shape == e.shape, name
        scale = 1.0 + float(e.abs().max()) if e.numel() else 1.0
        tol = dict(rtol=1e-4, atol=1e-5 * scale) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2 * scale)
        torch.testing.assert_close(a.to(torch.float64), e, **tol, msg=lambda m: f"{name}: {m}")


@pytest.fixture
def fresh_choice(monkeypatch, tmp_path):
    """grlib.ops.gemm_choice with an empty cache folder of its own and nothing remembered."""
    from grlib.ops import gemm_choice

    monkeypatch.setenv("GRLIB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GRLIB_GEMM", raising=False)
    gemm_choice.record.cache_clear()
    yield gemm_choice
    gemm_choice.record.cache_clear()


@pytest.mark.parametrize("times, impl", [({"blas": 5.0, "onednn": 9.0}, "reference"),
                                         ({"blas": 9.0, "onednn": 5.0}, "onednn")])
def test_auto_takes_the_library_measured_faster_and_keeps_it(monkeypatch, fresh_choice, times, impl):
    calls = []
    monkeypatch.setattr(fresh_choice, "time_libraries", lambda: calls.append(1) or dict(times))
    assert fresh_choice.cpu_linear_impl() == impl and calls == [1]
    (kept,) = (fresh_choice.cache_dir()).glob("gemm-choice-*.json")
    assert "measured" in fresh_choice.describe() and str(kept) in fresh_choice.describe()
    # a later process reads the record: no second measurement, the same choice
    fresh_choice.record.cache_clear()
    assert fresh_choice.cpu_linear_impl() == impl and calls == [1]
    calls_linear = []
    for name in ("reference", "onednn"):
        real = ops.registry.resolve("linear", "cpu", name)
        monkeypatch.setitem(ops.registry._LOADED, ("linear", name),
                            lambda *a, name=name, real=real: calls_linear.append(name) or real(*a))
    ops.linear(torch.randn(3, 4), torch.randn(2, 4))
    assert calls_linear == [impl]  # float32 follows the choice
    assert ops.choose("linear", "cpu") == "onednn"  # the registry's own order is unchanged


def test_the_first_record_wins_and_the_key_follows_the_gemm_limits(monkeypatch, fresh_choice):
    monkeypatch.setattr(fresh_choice, "time_libraries", lambda: {"blas": 9.0, "onednn": 5.0})
    path = fresh_choice._record_path(fresh_choice.machine_key())
    # another process recorded blas while this one measured: its record stands, in both processes
    kept = fresh_choice._write_once(path, {"library": "blas", "ms": {"blas": 1.0, "onednn": 2.0}})
    assert kept["library"] == "blas"
    assert fresh_choice._write_once(path, {"library": "onednn"})["library"] == "blas"
    assert fresh_choice.cpu_linear_impl() == "reference"
    assert not list(path.parent.glob(".*.tmp"))  # no temporary file left behind
    other = "SSE41" if os.environ.get("ONEDNN_MAX_CPU_ISA") != "SSE41" else "AVX2"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", other)  # other limits: another machine key, measured anew
    assert fresh_choice._record_path(fresh_choice.machine_key()) != path


@pytest.mark.parametrize("forced, impl", [("onednn", "onednn"), ("blas", "reference"), (" BLAS ", "reference")])
def test_grlib_gemm_forces_a_library_without_measuring(monkeypatch, fresh_choice, forced, impl):
    monkeypatch.setattr(fresh_choice, "time_libraries", lambda: pytest.fail("measured despite GRLIB_GEMM"))
    monkeypatch.setenv("GRLIB_GEMM", forced)
    assert fresh_choice.cpu_linear_impl() == impl
    assert "forced by GRLIB_GEMM" in fresh_choice.describe()


def test_the_measurement_times_both_libraries(fresh_choice):
    with torch.no_grad():  # the first float32 linear may be an evaluation's: the timing runs autograd anyway
        ms = fresh_choice.time_libraries(shape=(64, 32, 48), repeats=1)
    assert set(ms) == {"blas", "onednn"} and all(t > 0 for t in ms.values())


def test_a_bad_grlib_gemm_is_named(monkeypatch, fresh_choice):
    from grlib.config import ConfigError

    monkeypatch.setenv("GRLIB_GEMM", "mkl")
    with pytest.raises(ConfigError, match="GRLIB_GEMM='mkl': must be one of onednn, blas"):
        fresh_choice.cpu_linear_impl()


def test_the_model_uses_grlib_linear():
    from grlib.config import ModelConfig
    from grlib.model import build_model

    model = build_model(ModelConfig(name="hstu", n_layers=1, n_heads=2, d_model=8), 30, 8)
    layer = model.layers[0]
    assert isinstance(layer.uvqk, torch.nn.Linear) and set(dict(layer.uvqk.named_parameters())) == {"weight", "bias"}
    x = torch.randn(5, 8)
    torch.testing.assert_close(layer.uvqk(x), torch.nn.functional.linear(x, layer.uvqk.weight, layer.uvqk.bias))


def test_flop_counter_counts_the_onednn_gemms():
    x, w = torch.randn(6, 4, requires_grad=True), torch.randn(5, 4, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        ops.linear(x, w, impl="onednn").sum().backward()
    assert counter.get_total_flops() == 3 * 2 * 6 * 4 * 5  # forward, dx, dw


def test_bad_input_names_the_parameter():
    with pytest.raises(ValueError, match="agree on `in`"):
        ops.linear(torch.randn(3, 4), torch.randn(5, 6))
    with pytest.raises(ValueError, match=r"bias must be \[out=5\]"):
        ops.linear(torch.randn(3, 4), torch.randn(5, 4), torch.randn(4))
    with pytest.raises(TypeError, match="share one dtype"):
        ops.linear(torch.randn(3, 4), torch.randn(5, 4, dtype=torch.float64))


@given(m=st.integers(0, 40), n=st.integers(0, 40), k=st.integers(0, 40), transposed=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_matmul_nt_matches_reference_on_views(m, n, k, transposed, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(k, m, generator=g).T if transposed else torch.randn(m, k, generator=g)  # a strided view or not
    b = torch.randn(n, k, generator=g)
    exact = a.double() @ b.double().T
    got = ops.matmul_nt(a, b, impl="onednn")
    assert got.shape == (m, n)
    scale = 1.0 + (float(exact.abs().max()) if exact.numel() else 0.0)
    torch.testing.assert_close(got.double(), exact, rtol=1e-4, atol=1e-5 * scale)


def test_matmul_nt_refuses_autograd():
    a = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(ValueError, match="no autograd"):
        ops.matmul_nt(a, torch.randn(5, 4))
    with torch.no_grad():
        assert ops.matmul_nt(a, torch.randn(5, 4)).shape == (3, 5)
    with pytest.raises(ValueError, match="agree on K"):
        ops.matmul_nt(torch.randn(3, 4), torch.randn(5, 3))


@settings(max_examples=150, deadline=None)
@given(m=st.sampled_from([0, 1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 130]),
       n=st.sampled_from([0, 1, 7, 16, 31, 32, 33, 63, 64, 65, 256]),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]), strided=st.booleans(),
       ones_row=st.booleans(), widen=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_transpose_copy_kernel_equals_reference(m, n, dtype, strided, ones_row, widen, seed):
    """The compiled transposing copy (scalar blocks of 16, bands of 64 rows, edges; on the avx512 path
    16 x 16 register blocks of 4-byte and 32 x 32 blocks of 2-byte entries, odd row lengths by the
    scalar blocks) equals x.t().contiguous() bitwise, for contiguous and strided inputs, empty and
    one-row ones included; with ones_row, one more row of ones (the reference concatenates it); bf16
    widened to float32 (dtype) as it is moved: the same values."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, m, generator=g).to(dtype).T if strided else torch.randn(m, n, generator=g).to(dtype)
    to = torch.float32 if widen and dtype == torch.bfloat16 else None
    got = ops.transpose_copy(x, impl="cpu", ones_row=ones_row, dtype=to)
    assert got.is_contiguous() and got.shape == (n + ones_row, m) and got.dtype == (to or dtype)
    want = ops.transpose_copy(x, impl="reference", ones_row=ones_row, dtype=to)
    assert torch.equal(got, want)
    assert torch.equal(want[:n], x.t().to(to or dtype)) and (not ones_row or bool((want[n] == 1).all()))


def test_transpose_copy_opcheck_and_errors():
    import grlib.ops.cpu.matmul  # noqa: F401  (the fake impl)

    torch.library.opcheck(torch.ops.grlib.transpose_copy.default, (torch.randn(37, 19),))
    torch.library.opcheck(torch.ops.grlib.transpose_copy.default, (torch.randn(37, 19), True))
    torch.library.opcheck(torch.ops.grlib.transpose_copy.default,
                          (torch.randn(37, 19).bfloat16(), True, torch.float32))
    with pytest.raises(ValueError, match=r"transpose_copy: x must be 2-D \[M, N\], got \(3, 4, 5\)"):
        ops.transpose_copy(torch.randn(3, 4, 5))
    for impl in ("cpu", "reference"):
        with pytest.raises(TypeError, match="transpose_copy: dtype must be x's or, for bfloat16 x, float32; "
                                            "got torch.float32 -> torch.bfloat16"):
            ops.transpose_copy(torch.randn(3, 4), impl=impl, dtype=torch.bfloat16)


def test_linear_weight_gradient_through_the_kernel_equals_the_strided_copy():
    """The onednn linear's dW = dy^T x: against the float64 product (an independent answer, float32's
    tolerance for sums of 517 products), and bitwise equal to oneDNN's product of aten's copy of the
    strided view x^T: the compiled transpose_copy feeds oneDNN the same values in the same layout."""
    from grlib.ops.matmul import _gemm_nt

    g = torch.Generator().manual_seed(3)
    x, w, dy = torch.randn(517, 96, generator=g), torch.randn(160, 96, generator=g), torch.randn(517, 160, generator=g)
    xg = x.clone().requires_grad_(True)
    wg = w.clone().requires_grad_(True)
    ops.linear(xg, wg, impl="onednn").backward(dy)
    exact = dy.double().T @ x.double()  # [160, 96]
    torch.testing.assert_close(wg.grad.double(), exact, rtol=1e-4, atol=1e-5 * (1.0 + float(exact.abs().max())))
    assert torch.equal(wg.grad, _gemm_nt(x.t(), dy.t()).t().contiguous())


@pytest.mark.skipif(isa.bf16_missing() is not None, reason=f"no bf16 GEMMs here: {isa.bf16_missing()}")
@settings(max_examples=30, deadline=None)
@given(n=st.sampled_from([0, 1, 5, 64, 77]), n_in=st.integers(1, 70), n_out=st.integers(1, 70), bias=st.booleans(),
       impl=st.sampled_from(["onednn", "reference"]), seed=st.integers(0, 2**31 - 1))
def test_mixed_precision_linear_equals_the_casts_outside(n, n_in, n_out, bias, impl, seed):
    """linear(x, w, b, dtype=bf16) with float32 weight and bias (model.precision bf16's projections)
    gives bitwise the output and gradients of linear(x.to(bf16), w.to(bf16), b.to(bf16)) with the
    casts' backward (autograd's ToCopyBackward): the float32 weight gradient written by the widening
    transpose is the bf16 one widened, the bias gradient too; x's gradient comes back in x's dtype."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, n_in, generator=g).bfloat16()
    w, b = torch.randn(n_out, n_in, generator=g), torch.randn(n_out, generator=g) if bias else None
    dy = torch.randn(n, n_out, generator=g).bfloat16()
    outs = []
    for inside in (True, False):
        leaves = [t.clone().requires_grad_(True) if t is not None else None for t in (x, w, b)]
        xl, wl, bl = leaves
        if inside:
            y = ops.linear(xl, wl, bl, impl=impl, dtype=torch.bfloat16)
        else:
            y = ops.linear(xl, wl.to(torch.bfloat16), None if bl is None else bl.to(torch.bfloat16), impl=impl)
        y.backward(dy)
        outs.append([y] + [t.grad if t is not None else None for t in leaves])
    for name, a, e in zip(["y", "dx", "dw", "db"], *outs):
        if e is None:
            assert a is None, name
            continue
        assert a.dtype == e.dtype and torch.equal(a, e), name
    assert outs[0][2].dtype == torch.float32 and outs[0][1].dtype == torch.bfloat16


def test_mixed_precision_linear_names_bad_dtypes():
    with pytest.raises(TypeError, match="linear: x, weight and bias must share one dtype \\(or pass dtype=\\)"):
        ops.linear(torch.randn(3, 4).bfloat16(), torch.randn(5, 4))
    with pytest.raises(TypeError, match="linear: dtype must be a floating point dtype, got torch.int32"):
        ops.linear(torch.randn(3, 4), torch.randn(5, 4), dtype=torch.int32)
    with pytest.raises(TypeError, match="linear: with dtype=torch.bfloat16, x, weight and bias must be floating point"):
        ops.linear(torch.ones(3, 4, dtype=torch.int64), torch.randn(5, 4), dtype=torch.bfloat16)
