"""HSTU attention kernels: reference vs fbgemm vs compiled cpu, forward and backward, two length regimes.

Also the fused LayerNorm(x) * u (grlib.ops.layer_norm_mul, op column) against its two-op reference
on the whole batch's tokens [T, d_model].

    python -m grlib bench kernels --max-len 1024 --json out.json [--scale laptop]

Lengths come from the lognormal fit to KuaiRand-27K (grlib.bench.common.kuairand_lengths):
`truncated` cuts the real lengths at max_len (nearly all full), `scaled` scales them so their
p99 is max_len (the real raggedness: ~15% of the padded tokens are real). Heads and head dim
are the scale's model; bias tables as in the model (128 position, 32 time buckets).

Each comparison batch holds kernels.batch_size(max_len) sequences (the same B * max_len**2
score elements per head at every length, so the padded reference fits); with whole_batch > 0
the compiled kernel also runs alone on a whole batch at the largest max_len (truncated
regime), where the padded implementations would need tens of GB.

Method. Every (implementation, regime, max_len) runs in a fresh child process (kernels.isolate;
the smoke scale times in-process, quickly, leaves peak memory empty and says isolated=false): it
builds the
inputs, warms the implementation on a tiny batch (one-time library buffers are not counted),
resets the kernel's peak-RSS counter (/proc/self/clear_refs), runs one forward+backward and
reports the peak resident-set growth over the RSS before it (peak_mem_mb: every allocation of
that step, torch's and the kernel's scratch alike, gradients included). The same child then
times the forward (autograd recording, as in training) and forward+backward: medians of
`repeats` runs (fewer, at least one, where they would take longer than kernels.row_seconds;
each row records how many). The whole batch is timed by one forward and by its memory run. gflops = useful FLOPs on the real lengths (attention forward
2 * H * (Dqk + Dv) * s**2 / 2 per sequence, x3.5 with backward) / forward+backward time;
frac_of_peak divides by a warm dense matmul of this machine measured in the same run.
Ratios are against `reference` in the same run and regime/max_len.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch

from grlib import progress, results
from grlib.bench.common import kuairand_lengths, median_ms, print_table
from grlib.config import KernelsAblation, KernelsConfig, load_ablation, load_config

POS_BUCKETS, TIME_BUCKETS = 128, 32  # as grlib.model.hstu
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-len", type=int, nargs="+", default=None, help="max lengths (default: kernels.max_lens)")
    p.add_argument("--regime", nargs="+", choices=["truncated", "scaled"], default=None,
                   help="length regimes (default: ablations.kernels.regimes)")
    p.add_argument("--impls", nargs="+", default=None, help="implementations (default: ablations.kernels.impls)")
    p.add_argument("--batch", type=int, default=None, help="sequences per comparison batch "
                   "(default: kernels.pair_budget // max_len**2)")
    p.add_argument("--whole-batch", type=int, default=None, help="sequences of the cpu-only run at the "
                   "largest max_len (default: kernels.whole_batch; 0 skips it)")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")


def run(args: argparse.Namespace) -> list[dict]:
    cfg = load_config(args.scale or "smoke")
    changes = {"max_lens": args.max_len, "whole_batch": args.whole_batch, "repeats": args.repeats,
               "dtype": args.dtype}
    cfg = cfg.replace({f"kernels.{k}": v for k, v in changes.items() if v is not None})
    ablation = load_ablation("kernels", {k: v for k, v in (("impls", args.impls), ("regimes", args.regime)) if v})
    return measure(cfg, ablation, table="bench_kernels", batch=args.batch, threads=args.threads)


def plan(kc: KernelsConfig, ablation: KernelsAblation, batch: int | None = None) -> list[dict]:
    """The measurements: every impl x regime x max_len, then the compiled kernel's whole batch."""
    specs = []
    for max_len in kc.max_lens:
        for regime in ablation.regimes:
            for impl in ablation.impls:
                specs.append({"op": "hstu_attention", "impl": impl, "regime": regime, "max_len": max_len,
                              "batch": batch or kc.batch_size(max_len), "whole_batch": False})
    if kc.whole_batch and "cpu" in ablation.impls:
        specs.append({"op": "hstu_attention", "impl": "cpu", "regime": "truncated", "max_len": max(kc.max_lens),
                      "batch": kc.whole_batch, "whole_batch": True, "repeats": 0})
        # the fused LayerNorm(x) * u of the same layer on that batch's tokens [T, d_model]
        for impl in ("reference", "cpu"):
            specs.append({"op": "layer_norm_mul", "impl": impl, "regime": "truncated", "max_len": max(kc.max_lens),
                          "batch": kc.whole_batch, "whole_batch": False})
    return specs


def measure(cfg, ablation: KernelsAblation, table: str, batch: int | None = None,
            threads: int | None = None) -> list[dict]:
    """Runs the plan (one child process per row), prints the table, appends the rows to `table`."""
    kc = cfg.kernels
    heads, head_dim = cfg.model.n_heads, cfg.model.d_model // cfg.model.n_heads
    peak = matmul_peak_gflops(DTYPES[kc.dtype], threads)
    rows = []
    specs = plan(kc, ablation, batch)
    for spec in progress.progress(specs, desc="bench kernels"):
        spec = {"heads": heads, "head_dim": head_dim, "dtype": kc.dtype, "repeats": kc.repeats,
                "row_seconds": kc.row_seconds, "threads": threads or torch.get_num_threads(),
                "seed": cfg.train.seed, **spec}
        row = run_child(spec) if kc.isolate else _in_process(spec)
        row["isolated"] = kc.isolate
        row["frac_of_peak"] = row["gflops"] / peak
        row["matmul_peak_gflops"] = peak
        rows.append(row)
    _add_ratios(rows)
    print_table([{k: r[k] for k in ("op", "impl", "regime", "max_len", "batch", "fill", "fwd_ms", "fwd_bwd_ms",
                                     "peak_mem_mb", "gflops", "frac_of_peak", "speedup_vs_reference",
                                     "mem_reduction_vs_reference")} for r in rows],
                f"bench kernels: H={heads} D={head_dim} {kc.dtype}, {rows[0]['threads']} threads, "
                f"matmul peak {peak:.0f} GFLOP/s")
    results.append_rows(table, rows, cfg)
    return rows


def _add_ratios(rows: list[dict]) -> None:
    base = {(r["op"], r["regime"], r["max_len"]): r for r in rows
            if r["impl"] == "reference" and not r["whole_batch"]}
    for r in rows:
        ref = base.get((r["op"], r["regime"], r["max_len"]))
        comparable = ref is not None and not r["whole_batch"]
        r["speedup_vs_reference"] = ref["fwd_bwd_ms"] / r["fwd_bwd_ms"] if comparable else float("nan")
        r["mem_reduction_vs_reference"] = (1 - r["peak_mem_mb"] / ref["peak_mem_mb"]
                                           if comparable and ref["peak_mem_mb"] > 0 else float("nan"))
        # the whole batch: what the padded reference would need, extrapolated linearly in B from
        # its measured peak at the same max_len and regime (it is not run: it would not fit)
        r["reference_estimate_mb"] = (ref["peak_mem_mb"] / ref["batch"] * r["batch"]
                                      if ref is not None and r["whole_batch"] and ref["batch"] else float("nan"))


def matmul_peak_gflops(dtype: torch.dtype, threads: int | None = None, n: int = 2048, repeats: int = 5) -> float:
    """Warm dense matmul throughput of this machine (the MFU denominator on CPU)."""
    if threads:
        torch.set_num_threads(threads)
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    ms = median_ms(lambda: a @ b, repeats=repeats, warmup=2)
    return 2 * n**3 / (ms * 1e6)


def run_child(spec: dict) -> dict:
    """One measurement in a fresh interpreter (an honest peak-RSS baseline); returns its row."""
    cmd = [sys.executable, "-m", "grlib.bench.kernels", "--child", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "GRLIB_PROGRESS": "0"})
    if proc.returncode != 0:
        raise RuntimeError(f"bench kernels: measuring {spec} failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _in_process(spec: dict) -> dict:
    """kernels.isolate = false (the smoke scale): timings in this process, quickly; peak memory is
    left empty (NaN): freed memory is reused without RSS growth here, so it cannot be read honestly."""
    threads = torch.get_num_threads()
    try:
        return child({**spec, "measure_memory": False})
    finally:
        torch.set_num_threads(threads)


# ---- the child ---------------------------------------------------------------------------------
def make_inputs(impl_batch: int, max_len: int, regime: str, heads: int, head_dim: int, dtype: torch.dtype,
                seed: int) -> dict:
    lengths = torch.from_numpy(kuairand_lengths(impl_batch, max_len, regime, seed=seed))
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    T = int(offsets[-1])
    g = torch.Generator().manual_seed(seed)

    def leaf(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).requires_grad_(True)

    gaps = torch.distributions.LogNormal(math.log(600.0), 2.0).sample((T,)).round().to(torch.int64)  # seconds
    return dict(q=leaf(T, heads, head_dim), k=leaf(T, heads, head_dim), v=leaf(T, heads, head_dim),
                offsets=offsets, max_len=max_len, pos_bias=leaf(heads, POS_BUCKETS, scale=0.1),
                time_bias=leaf(heads, TIME_BUCKETS, scale=0.1), timestamps=gaps.cumsum(0), lengths=lengths)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM (peak RSS) to the current RSS (Linux >= 4.0)
    except OSError as err:
        raise RuntimeError("bench kernels measures peak memory through /proc/self/clear_refs "
                           f"(Linux); it is not writable here: {err}") from err


def child(spec: dict) -> dict:
    from grlib import ops

    torch.set_num_threads(spec["threads"])
    dtype = DTYPES[spec["dtype"]]
    x = make_inputs(spec["batch"], spec["max_len"], spec["regime"], spec["heads"], spec["head_dim"], dtype,
                    spec["seed"])
    op = spec.get("op", "hstu_attention")
    if op == "layer_norm_mul":  # x, u [T, d_model]: the attention output and U of the same tokens
        T, d = x["q"].shape[0], x["q"].shape[1] * x["q"].shape[2]
        g = torch.Generator().manual_seed(spec["seed"])
        x.update(a=torch.randn(T, d, generator=g).to(dtype).requires_grad_(True),
                 u=torch.randn(T, d, generator=g).to(dtype).requires_grad_(True),
                 weight=torch.ones(d, requires_grad=True), bias=torch.zeros(d, requires_grad=True))
        leaves = [x["a"], x["u"], x["weight"], x["bias"]]
    else:
        leaves = [x["q"], x["k"], x["v"], x["pos_bias"], x["time_bias"]]

    def forward(inputs=x):
        if op == "layer_norm_mul":
            return ops.layer_norm_mul(inputs["a"], inputs["u"], inputs["weight"], inputs["bias"], impl=spec["impl"])
        return ops.hstu_attention(inputs["q"], inputs["k"], inputs["v"], inputs["offsets"], inputs["max_len"],
                                  pos_bias=inputs["pos_bias"], time_bias=inputs["time_bias"],
                                  timestamps=inputs["timestamps"], impl=spec["impl"])

    def step(inputs=x):
        out = forward(inputs)
        out.backward(torch.ones_like(out))

    tiny = make_inputs(2, 16, "truncated", spec["heads"], spec["head_dim"], dtype, spec["seed"])
    if op == "layer_norm_mul":
        tiny.update(a=x["a"][:32].detach().requires_grad_(True), u=x["u"][:32].detach().requires_grad_(True),
                    weight=x["weight"].detach().requires_grad_(True), bias=x["bias"].detach().requires_grad_(True))
    step(tiny)  # loads the implementation and its libraries
    gc.collect()
    measure_memory = spec.get("measure_memory", True)
    if measure_memory:
        _reset_peak()
        base = _status_kb("VmRSS")
    start = time.perf_counter()
    step()
    first_ms = (time.perf_counter() - start) * 1e3
    peak_mb = (_status_kb("VmHWM") - base) / 1024 if measure_memory else float("nan")
    for leaf in leaves:
        leaf.grad = None
    # timed runs: `repeats`, fewer (at least one) when they would take longer than row_seconds
    # (estimated from the memory run; a forward costs about 0.4 of a forward+backward). The whole
    # batch (repeats 0, no comparison) reuses the memory run as its one forward+backward sample.
    repeats = max(1, min(spec["repeats"], int(spec["row_seconds"] * 1e3 / (1.4 * first_ms))))
    fwd_ms = median_ms(forward, repeats=repeats, warmup=0)
    fwd_bwd = [first_ms] if spec["repeats"] == 0 else []
    for _ in range(repeats if spec["repeats"] else 0):
        start = time.perf_counter()
        step()
        fwd_bwd.append((time.perf_counter() - start) * 1e3)
        for leaf in leaves:
            leaf.grad = None
    fwd_bwd_ms = statistics.median(fwd_bwd)
    lengths = x["lengths"].double()
    D = spec["head_dim"]
    # useful FLOPs: the attention's matmuls; the fused LayerNorm * u is memory-bound (no figure)
    flops_fwd = float((2 * spec["heads"] * 2 * D * lengths**2 / 2).sum()) if op == "hstu_attention" else math.nan
    B, N, T = spec["batch"], spec["max_len"], int(lengths.sum())
    return {"op": op, "impl": spec["impl"], "regime": spec["regime"], "max_len": N, "batch": B, "tokens": T,
            "fill": T / (B * N), "heads": spec["heads"], "head_dim": D, "dtype": spec["dtype"],
            "threads": spec["threads"], "whole_batch": spec["whole_batch"], "repeats": repeats,
            "fwd_ms": fwd_ms, "fwd_bwd_ms": fwd_bwd_ms, "first_fwd_bwd_ms": first_ms, "peak_mem_mb": peak_mb,
            "gflops": 3.5 * flops_fwd / (fwd_bwd_ms * 1e6), "seed": spec["seed"]}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
    else:  # pragma: no cover
        sys.exit("usage: python -m grlib bench kernels ...  (--child is internal)")
