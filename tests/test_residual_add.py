"""grlib.ops.residual_add (x float32 + h in bf16, float16 or float32, one pass): the compiled kernel
equals torch's x + h bitwise (both add in float32 and round once), forward and backward (dx the
incoming gradient, dh the same rounded to h's dtype), on random shapes incl. empty and length-1;
opcheck; argument errors; the HSTU layer uses it."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib import ops
from grlib.hardware import isa


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(0, 37), min_size=1, max_size=3),
       h_dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]), strided=st.booleans(),
       seed=st.integers(0, 2**31))
def test_residual_add_kernel_equals_reference(shape, h_dtype, strided, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 100
    h = torch.randn(*shape, 2, generator=g).to(h_dtype)
    h = h[..., 0] if strided else h[..., 0].contiguous()
    grad = torch.randn(*shape, generator=g)
    outs = []
    for impl in ("reference", "cpu"):
        leaves = [x.clone().requires_grad_(True), h.clone().requires_grad_(True)]
        y = ops.residual_add(*leaves, impl=impl)
        y.backward(grad)
        outs.append((y.detach(), leaves[0].grad, leaves[1].grad))
    for name, a, r in zip(["y", "dx", "dh"], *outs):
        assert a.dtype == r.dtype and a.shape == r.shape, name
        torch.testing.assert_close(a, r, rtol=0, atol=0, msg=lambda m: f"{name}: {m}")


def test_residual_add_opcheck_errors_and_dispatch():
    import grlib.ops.cpu.fused  # noqa: F401  (fake impl and autograd of the compiled op)

    assert ops.choose("residual_add", "cpu") == "cpu"
    for shape in ((5, 3), (0, 4), (1,)):
        torch.library.opcheck(torch.ops.grlib.residual_add.default,
                              (torch.randn(shape, requires_grad=True), torch.randn(shape).bfloat16().requires_grad_()))
    with pytest.raises(TypeError, match="x must be float32"):
        ops.residual_add(torch.randn(3).double(), torch.randn(3))
    with pytest.raises(ValueError, match=r"h must have x's shape \(3,\)"):
        ops.residual_add(torch.randn(3), torch.randn(4))
    with pytest.raises(RuntimeError, match="h must be bfloat16, float16 or float32"):  # the kernel checks it too
        torch.ops.grlib.residual_add(torch.randn(3), torch.randn(3).double())


@pytest.mark.skipif(isa.bf16_missing() is not None,
                    reason=f"a bf16 HSTU layer needs bf16 GEMMs: {isa.bf16_missing()}")
def test_the_hstu_layer_adds_its_projection_through_residual_add(monkeypatch):
    """In bf16 the layer's output is x + its bf16 projection, summed by residual_add in float32."""
    from grlib.jagged import JaggedBatch
    from grlib.model.hstu import HSTULayer

    calls = []
    real = ops.residual_add
    monkeypatch.setattr(ops, "residual_add", lambda x, h, **kw: calls.append((x.dtype, h.dtype)) or real(x, h, **kw))
    layer = HSTULayer(32, 2, 0.0, "auto", "bf16")
    T = 7
    batch = JaggedBatch(item_ids=torch.ones(T, dtype=torch.int64), actions=torch.zeros(T, dtype=torch.int64),
                        timestamps=torch.arange(T) * 10, offsets=torch.tensor([0, 3, 7]), max_len=4,
                        targets=torch.zeros(T, dtype=torch.int64))
    out = layer(torch.randn(T, 32), batch)
    assert out.dtype == torch.float32 and calls == [(torch.float32, torch.bfloat16)]
