"""bench train's profile split (grlib.experiments.mfu_steps): op_kind's parts, and op_label's claim
that a custom op's autograd.Function node holds its forward kernel's time, checked on a real profile."""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from grlib import ops
from grlib.experiments.mfu_steps import op_kind, op_label


def test_parts_of_a_step():
    assert op_kind("mkldnn::_linear_pointwise") == op_kind("aten::mm") == op_kind("aten::addmm") == "gemm"
    assert op_kind("grlib::hstu_uvqk_attention_backward") == "attention"
    assert op_kind("GeneratedBackwardFor_grlib_hstu_uvqk_attention_default") == "attention"
    assert op_kind("aten::copy_") == op_kind("grlib::layer_norm_mul_dropout_backward") == "other"
    assert op_label("GeneratedBackwardFor_grlib_hstu_uvqk_attention_default") == \
        "grlib::hstu_uvqk_attention forward (its autograd.Function)"
    assert op_label("GeneratedBackwardFor_grlib_hstu_uvqk_attention_defaultBackward") == \
        "GeneratedBackwardFor_grlib_hstu_uvqk_attention_defaultBackward"  # the backward node: its own name
    assert op_label("aten::mm") == "aten::mm"


def test_the_autograd_function_node_holds_the_forward_kernel():
    """The op's own event is only the dispatch: nearly all of the forward's time is the Function
    node's self time (what op_label renames)."""
    g = torch.Generator().manual_seed(0)
    T, H, dh = 2048, 2, 64
    z = (torch.randn(T, 4 * H * dh, generator=g) * 0.5).requires_grad_(True)
    offsets = torch.tensor([0, 1024, T])
    ops.uvqk_attention(z, H, offsets, 1024, impl="cpu")  # loads the kernels
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ops.uvqk_attention(z, H, offsets, 1024, impl="cpu")
    ev = {e.key: e for e in prof.key_averages()}
    op, node = ev["grlib::hstu_uvqk_attention"], ev["GeneratedBackwardFor_grlib_hstu_uvqk_attention_default"]
    assert node.self_cpu_time_total > 0.8 * op.cpu_time_total, (node.self_cpu_time_total, op.cpu_time_total)
    assert op.self_cpu_time_total < 0.2 * op.cpu_time_total
