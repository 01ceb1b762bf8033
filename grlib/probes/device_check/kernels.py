"""The kernels part: Triton vs the padded reference (and fbgemm-gpu where importable), rows as
bench_kernels'."""
from __future__ import annotations

import math
import os
import statistics

from grlib.probes.device_check.base import Run, Sizes, Timer, free_memory, sync, torch_device


def fbgemm_hstu():
    """fbgemm-gpu's HSTU attention (fbgemm_gpu.experimental.hstu) where importable, else (None, why)."""
    try:
        from fbgemm_gpu.experimental.hstu import hstu_attn_varlen_func
    except Exception as err:  # ImportError, or a library that fails to load on this GPU
        return None, f"{type(err).__name__}: {err}"
    return hstu_attn_varlen_func, ""


def kernel_inputs(B: int, max_len: int, regime: str, H: int, D: int, dtype, device, seed: int = 0) -> dict:
    import torch

    from grlib.data.synthetic import kuairand_lengths

    lengths = torch.from_numpy(kuairand_lengths(B, max_len, regime, seed=seed))
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    T = int(offsets[-1])
    g = torch.Generator().manual_seed(seed)

    def leaf(*s, scale=1.0):
        return (torch.randn(*s, generator=g) * scale).to(device, dtype).requires_grad_(True)

    gaps = torch.distributions.LogNormal(math.log(600.0), 2.0).sample((T,)).round().to(torch.int64)
    return dict(q=leaf(T, H, D), k=leaf(T, H, D), v=leaf(T, H, D), offsets=offsets.to(device), max_len=max_len,
                pos_bias=(torch.randn(H, 128, generator=g) * 0.1).to(device).requires_grad_(True),
                time_bias=(torch.randn(H, 32, generator=g) * 0.1).to(device).requires_grad_(True),
                timestamps=gaps.cumsum(0).to(device), lengths=lengths)


def kernel_forward(impl: str, x: dict, fbgemm_fn=None):
    import torch

    from grlib import ops

    if impl == "fbgemm_hstu":  # fbgemm-gpu's kernel, causal (window (-1, 0)), without the bias tables (rab None)
        off = x["offsets"].to(torch.int32)
        return fbgemm_fn(x["q"], x["k"], x["v"], off, off, x["max_len"], x["max_len"], num_contexts=None,
                         num_targets=None, window_size=(-1, 0), alpha=0.7)
    return ops.hstu_attention(x["q"], x["k"], x["v"], x["offsets"], x["max_len"], alpha=0.7,
                              pos_bias=x["pos_bias"], time_bias=x["time_bias"], timestamps=x["timestamps"], impl=impl)


def time_kernel(impl: str, x: dict, sizes: Sizes, device, fbgemm_fn=None) -> dict:
    import torch

    timer = Timer(device)
    leaves = [x[n] for n in ("q", "k", "v", "pos_bias", "time_bias")]
    grad = torch.ones(x["q"].shape[0], x["q"].shape[1], x["v"].shape[2], device=device, dtype=x["v"].dtype)

    def forward():
        with torch.no_grad():
            kernel_forward(impl, x, fbgemm_fn)

    def step():
        kernel_forward(impl, x, fbgemm_fn).backward(grad)
        for leaf in leaves:
            leaf.grad = None

    first = timer(step)  # compiles the kernels (Triton) on the first call
    for _ in range(sizes.warmup):
        step()
    peak = math.nan
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        step()
        sync(device)
        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    fwd = [timer(forward) for _ in range(sizes.repeats)]
    fwd_bwd = [timer(step) for _ in range(sizes.repeats)]
    return {"fwd_ms": statistics.median(fwd), "fwd_bwd_ms": statistics.median(fwd_bwd), "first_fwd_bwd_ms": first,
            "peak_mem_mb": peak, "repeats": sizes.repeats}


def kernels(run: Run) -> str:
    import torch

    from grlib import hardware

    sizes, device = run.sizes, torch_device(run)
    fn, why = fbgemm_hstu() if device.type == "cuda" else (None, "the interpreter runs no fbgemm-gpu kernel")
    impls = ["reference", "triton"] + (["fbgemm_hstu"] if fn is not None else [])
    print(f"  fbgemm-gpu HSTU attention: {'timed' if fn is not None else 'not timed: ' + why}", flush=True)
    nominal = {d: nominal_flops(hardware, d, device) for d in sizes.kernel_dtypes}
    done = []
    try:
        for dname in sizes.kernel_dtypes:
            for max_len in sizes.max_lens:
                for regime in sizes.regimes:
                    B = max(1, sizes.pair_budget // max_len**2)
                    x = kernel_inputs(B, max_len, regime, sizes.heads, sizes.head_dim, getattr(torch, dname), device)
                    lengths = x["lengths"].double()
                    flops_fwd = float((2 * sizes.heads * 2 * sizes.head_dim * lengths**2 / 2).sum())
                    group = []
                    for impl in impls:
                        if impl == "fbgemm_hstu" and dname == "float32":  # its kernels take fp16 / bf16 only
                            continue
                        t, why = None, ""
                        try:
                            t = time_kernel(impl, x, sizes, device, fn)
                        except torch.OutOfMemoryError as err:  # the padded reference at a large batch
                            why = f"out of memory ({err})"
                        except Exception as err:  # fbgemm-gpu's API differs between its versions: its row only
                            if impl != "fbgemm_hstu":
                                raise
                            why = f"failed ({type(err).__name__}: {err})"
                        if t is None:  # freed here, not inside `except` (its traceback holds the tensors)
                            print(f"  {impl} {dname} {regime} {max_len}: no row, {why}".splitlines()[0], flush=True)
                            free_memory()
                            continue
                        row = {"table": "bench_kernels", "op": "hstu_attention", "impl": impl,
                               "isa": "interpret" if run.interpret else "cuda", "regime": regime, "max_len": max_len,
                               "batch": B, "tokens": int(lengths.sum()), "fill": float(lengths.sum()) / (B * max_len),
                               "heads": sizes.heads, "head_dim": sizes.head_dim, "dtype": dname,
                               "threads": torch.get_num_threads(), "whole_batch": False, **t,
                               "gflops": 3.5 * flops_fwd / (t["fwd_bwd_ms"] * 1e6), "fwd_bwd_cpu_ms": math.nan,
                               "gflops_on_cpu": math.nan, "seed": 0, "isolated": False, "gemm_limit": "none",
                               "load_1m": os.getloadavg()[0], "cpu_model": run.versions.get("cpu", ""),
                               "device": run.device, "timing": "CUDA events" if device.type == "cuda" else "wall clock",
                               "with_bias": impl != "fbgemm_hstu",
                               "nominal_peak_gflops": nominal[dname][0] / 1e9, "nominal_peak_how": nominal[dname][1],
                               "frac_of_nominal": 3.5 * flops_fwd / (t["fwd_bwd_ms"] / 1e3) / nominal[dname][0]}
                        group.append(row)
                        print(f"  {dname:8s} {regime:9s} max_len {max_len:5d} B {B:3d} {impl:11s} "
                              f"fwd {t['fwd_ms']:9.3f} ms  "
                              f"fwd+bwd {t['fwd_bwd_ms']:9.3f} ms  peak {t['peak_mem_mb']:9.1f} MiB", flush=True)
                    ref = next((r for r in group if r["impl"] == "reference"), None)
                    for r in group:
                        r["speedup_vs_reference"] = ref["fwd_bwd_ms"] / r["fwd_bwd_ms"] if ref else math.nan
                        r["mem_reduction_vs_reference"] = (1 - r["peak_mem_mb"] / ref["peak_mem_mb"]
                                                           if ref and ref["peak_mem_mb"] > 0 else math.nan)
                        r["reference_estimate_mb"] = math.nan
                    done += group
                    del x
                    free_memory()
    finally:
        run.rows += done  # what was measured before a timeout too
    return f"{len(done)} rows"


def nominal_flops(hardware, dname: str, device) -> tuple[float, str]:
    """(FLOP/s, how) of the device's nominal peak in dname; NaN with the reason where none is known."""
    if device.type == "cpu":
        return math.nan, "the interpreter: no nominal peak (not a GPU run)"
    try:
        peak = hardware.nominal_peak(dname, device=device)
    except ValueError as err:
        return math.nan, str(err)
    return peak.flops, peak.how
