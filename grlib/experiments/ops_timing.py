"""Jagged conversion and reduction ops, and HSTU's fused projection, timed per implementation (`bench ops`).

Lengths follow KuaiRand-27K scaled so p99 = max_len; each op's forward + backward, the median of
`repeats` (grlib.experiments.measure.median_ms), for every registered implementation, with the
ratio against `reference` measured in the same run. The projection is a linear layer
[T, dim] x [4 dim, dim]^T through torch's BLAS (`reference`: MKL in torch's x86 wheels) and oneDNN,
where `auto` marks the library measured faster on this machine (grlib.ops.gemm_choice: once per
machine, then kept); each row names the CPU model and grlib._C's path.
"""
from __future__ import annotations

import torch

from grlib import hardware, ops
from grlib.experiments.measure import kuairand_lengths, median_ms
from grlib.ops import gemm_choice


def _cases(values: torch.Tensor, offsets: torch.Tensor, max_len: int):
    d = values.shape[1]
    weight = torch.randn(4 * d, d, requires_grad=True)  # HSTU's fused projection [4d, d]
    bias = torch.randn(4 * d, requires_grad=True)
    return {
        "jagged_to_padded": lambda impl: ops.jagged_to_padded(values, offsets, max_len, impl=impl),
        "segment_sum": lambda impl: ops.segment_sum(values, offsets, impl=impl),
        "linear [T, d] x [4d, d]^T": lambda impl: ops.linear(values, weight, bias, impl=impl),
    }


def measure(batch: int, max_len: int, dim: int, repeats: int) -> tuple[list[dict], str]:
    """The rows (table bench_ops) and the table's title."""
    lengths = torch.from_numpy(kuairand_lengths(batch, max_len, "scaled"))
    offsets = ops.offsets_from_lengths(lengths)
    values = torch.randn(int(lengths.sum()), dim, requires_grad=True)
    rows = []
    for op, fn in _cases(values, offsets, max_len).items():
        base, name = None, op.split()[0]
        auto = gemm_choice.cpu_linear_impl() if name == "linear" else ops.choose(name, "cpu")
        for impl in ops.implementations(name):
            def step(fn=fn, impl=impl):
                out = fn(impl)
                out.backward(torch.ones_like(out))
                values.grad = None
            ms = median_ms(step, repeats=repeats)
            base = ms if impl == "reference" else base
            rows.append({"op": op, "impl": impl, "auto": impl == auto, "batch": batch, "max_len": max_len,
                         "dim": dim, "tokens": int(lengths.sum()), "fwd_bwd_ms": ms,
                         "speedup_vs_reference": base / ms if base else float("nan")})
    for r in rows:
        r.update(cpu_model=hardware.isa.cpu_model(), isa=hardware.isa.current())
    title = (f"bench ops: B={batch} max_len={max_len} D={dim} on {hardware.isa.cpu_model()} "
             f"(auto: what impl='auto' runs here; linear: {gemm_choice.describe()}) "
             f"(tokens {int(lengths.sum())}, {int(lengths.sum()) / (batch * max_len):.0%} of padded)")
    return rows, title
