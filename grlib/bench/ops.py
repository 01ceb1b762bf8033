"""Jagged conversion and reduction ops: reference vs fbgemm vs compiled cpu, forward+backward.

Lengths follow KuaiRand-27K scaled so p99 = max_len. Ratios are against `reference` measured in
the same run; rows go to results/tables/bench_ops.parquet. Also HSTU's fused projection, a linear
layer [T, dim] x [4 dim, dim]^T forward + backward, through torch's BLAS (`reference`: MKL in
torch's x86 wheels) and oneDNN, where `auto` marks the library measured faster on this machine
(grlib.ops.gemm_choice: once per machine, then kept); each row names the CPU model.
"""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from grlib import results
from grlib.bench.common import print_table
from grlib.config import config_from_args

if TYPE_CHECKING:  # torch and grlib.ops are imported in run: `bench ops --help` answers without them
    import torch


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=256, help="sequences per batch")
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=7)


def _cases(values: torch.Tensor, offsets: torch.Tensor, max_len: int):
    import torch

    from grlib import ops

    d = values.shape[1]
    weight = torch.randn(4 * d, d, requires_grad=True)  # HSTU's fused projection [4d, d]
    bias = torch.randn(4 * d, requires_grad=True)
    return {
        "jagged_to_padded": lambda impl: ops.jagged_to_padded(values, offsets, max_len, impl=impl),
        "segment_sum": lambda impl: ops.segment_sum(values, offsets, impl=impl),
        "linear [T, d] x [4d, d]^T": lambda impl: ops.linear(values, weight, bias, impl=impl),
    }


def run(args: argparse.Namespace) -> list[dict]:
    import torch

    from grlib import hardware, ops
    from grlib.experiments.measure import kuairand_lengths, median_ms
    from grlib.ops import gemm_choice

    cfg = config_from_args(args)
    lengths = torch.from_numpy(kuairand_lengths(args.batch, args.max_len, "scaled"))
    offsets = ops.offsets_from_lengths(lengths)
    values = torch.randn(int(lengths.sum()), args.dim, requires_grad=True)
    rows = []
    for op, fn in _cases(values, offsets, args.max_len).items():
        base, name = None, op.split()[0]
        auto = gemm_choice.cpu_linear_impl() if name == "linear" else ops.choose(name, "cpu")
        for impl in ops.implementations(name):
            def step(fn=fn, impl=impl):
                out = fn(impl)
                out.backward(torch.ones_like(out))
                values.grad = None
            ms = median_ms(step, repeats=args.repeats)
            base = ms if impl == "reference" else base
            rows.append({"op": op, "impl": impl, "auto": impl == auto, "batch": args.batch, "max_len": args.max_len,
                         "dim": args.dim, "tokens": int(lengths.sum()), "fwd_bwd_ms": ms,
                         "speedup_vs_reference": base / ms if base else float("nan")})
    for r in rows:
        r.update(cpu_model=hardware.isa.cpu_model(), isa=hardware.isa.current())
    print_table(rows, f"bench ops: B={args.batch} max_len={args.max_len} D={args.dim} on {hardware.isa.cpu_model()} "
                      f"(auto: what impl='auto' runs here; linear: {gemm_choice.describe()}) "
                      f"(tokens {int(lengths.sum())}, {int(lengths.sum()) / (args.batch * args.max_len):.0%} of padded)")
    results.append_rows("bench_ops", rows, cfg)
    return rows
