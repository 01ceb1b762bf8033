"""The correctness part (grlib.ops.triton.attention forward and every gradient against the padded
reference) and the bf16 GEMM peak part."""
from __future__ import annotations

import math
import statistics

from grlib.probes.device_check.base import Case, Run, Timer, torch_device


# the error floor per compute dtype, relative to the exact tensor's largest value (the package's docstring)
FLOORS = {"float32": 1e-5, "tf32": 5e-3, "bfloat16": 2e-2}


def case_inputs(case: Case, device, seed: int) -> dict:
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, case.max_len + 1, case.batch)
    lengths[:3] = [0, 1, case.max_len]
    rng.shuffle(lengths)
    g = torch.Generator().manual_seed(seed)
    T, H = int(lengths.sum()), case.heads
    rand = lambda *s, scale=1.0: (torch.randn(*s, generator=g, dtype=torch.float64) * scale).to(device)  # noqa: E731
    return dict(q=rand(T, H, case.dqk), k=rand(T, H, case.dqk), v=rand(T, H, case.dv),
                pos_bias=rand(H, 16, scale=0.5) if case.bias else None,
                time_bias=rand(H, 8, scale=0.5) if case.bias else None,
                timestamps=torch.randint(0, 400, (T,), generator=g).cumsum(0).to(device) if case.bias else None,
                offsets=torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)])).to(device),
                max_len=case.max_len, grad=rand(T, H, case.dv), lengths=lengths.tolist())


def attention_run(x: dict, impl: str, dtype, tf32: bool = False) -> list:
    """[out, dq, dk, dv, dpos, dtime] of one forward and backward (q, k, v in `dtype`, the bias tables
    in float32, or float64 for the exact run)."""
    import torch

    from grlib import ops

    table = torch.float64 if dtype == torch.float64 else torch.float32
    leaves = {n: x[n].detach().to(dtype).requires_grad_(True) for n in ("q", "k", "v")}
    leaves.update({n: x[n].detach().to(table).requires_grad_(True)
                   for n in ("pos_bias", "time_bias") if x[n] is not None})
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        out = ops.hstu_attention(leaves["q"], leaves["k"], leaves["v"], x["offsets"], x["max_len"], alpha=0.7,
                                 pos_bias=leaves.get("pos_bias"), time_bias=leaves.get("time_bias"),
                                 timestamps=x["timestamps"], impl=impl)
        out.backward(x["grad"].to(out.dtype))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return [out.detach()] + [leaves[n].grad for n in ("q", "k", "v", "pos_bias", "time_bias") if n in leaves]


def interpreter_bf16_dot() -> str:
    """'' when Triton's interpreter multiplies bf16 tiles right (tl.dot of two 16 x 16 bf16 tiles
    against torch in fp32), else what it got: Triton 3.9's interpreter gets them wrong (errors near
    1e10; the same tiles cast to fp32 first are right), so bf16 is checked on CUDA only."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def dot(x_ptr, y_ptr, o_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        x = tl.load(x_ptr + i[:, None] * N + i[None, :])
        y = tl.load(y_ptr + i[:, None] * N + i[None, :])
        tl.store(o_ptr + i[:, None] * N + i[None, :], tl.dot(x, y, out_dtype=tl.float32))

    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(16, 16, generator=g).to(torch.bfloat16) for _ in range(2))
    out = torch.empty(16, 16)
    dot[(1,)](x, y, out, 16)
    err = float((out - x.float() @ y.float()).abs().max())
    return "" if err < 1e-2 else (f"Triton {triton.__version__}'s interpreter computes tl.dot of bf16 tiles "
                                  f"wrongly (16 x 16 probe: error {err:.1e}): bf16 is checked on CUDA only")


def correctness(run: Run) -> str:
    import torch

    device = torch_device(run)
    names = ["out", "dq", "dk", "dv", "dpos", "dtime"]
    failed = []
    run.no_bf16 = interpreter_bf16_dot() if run.interpret else ""
    if run.no_bf16:
        print(f"  {run.no_bf16}", flush=True)
    for i, case in enumerate(run.sizes.cases):
        x = case_inputs(case, device, seed=i)
        exact = attention_run(x, "reference", torch.float64)
        for dname in ("float32",) + (() if run.no_bf16 else ("bfloat16",)):
            dtype = getattr(torch, dname)
            tf32 = device.type == "cuda" and dtype == torch.float32  # tl.dot's fp32 inputs run as TF32 on CUDA
            low = attention_run(x, "reference", dtype, tf32=tf32)
            got = attention_run(x, "triton", dtype)
            floor = FLOORS["tf32" if tf32 else dname]
            for name, e, r, t in zip(names, exact, low, got):
                scale = max(float(e.abs().max()) if e.numel() else 0.0, 1e-30)
                err_ref = float((r.double() - e).abs().max()) / scale if e.numel() else 0.0
                err = float((t.double() - e).abs().max()) / scale if e.numel() else 0.0
                tol = max(4 * err_ref, floor)
                ok = math.isfinite(err) and err <= tol
                check = {"case": case.name, "lengths": x["lengths"], "heads": case.heads, "dqk": case.dqk,
                         "dv": case.dv, "dtype": dname + (" (TF32 dot)" if tf32 else ""), "tensor": name,
                         "err_triton": err, "err_reference": err_ref, "tolerance": tol, "ok": ok}
                run.checks.append(check)
                print(f"  {case.name:9s} {check['dtype']:20s} {name:5s} triton {err:.2e}  reference {err_ref:.2e}  "
                      f"tolerance {tol:.2e}  {'ok' if ok else 'MISMATCH'}", flush=True)
                if not ok:
                    failed.append(f"{case.name} {dname} {name}")
    if failed:
        raise AssertionError(f"Triton attention differs from the padded reference: {', '.join(failed)}")
    return (f"{len(run.checks)} tensors match (max error relative to the exact tensor's largest value)"
            + (f"; {run.no_bf16}" if run.no_bf16 else ""))


def gemm_peak(run: Run) -> str:
    """The best bf16 square GEMM rate (median of repeats, best size); appended to run.gemm."""
    import torch

    device, timer = torch_device(run), Timer(torch_device(run))
    best = {}
    for n in run.sizes.gemm_sizes:
        a, b = (torch.randn(n, n, device=device).to(torch.bfloat16) for _ in range(2))
        if device.type == "cpu":  # the interpreter's stand-in: a CPU without bf16 GEMMs computes in fp32
            a, b = a.float(), b.float()
        for _ in range(2):
            torch.mm(a, b)
        times = [timer(lambda: torch.mm(a, b)) for _ in range(5)]
        best[n] = 2 * n**3 / (statistics.median(times) / 1e3)
        print(f"  {n} x {n} x {n}: {best[n] / 1e12:.1f} TFLOP/s (median of 5)", flush=True)
    run.gemm.append(max(best.values()))
    where = " (fp32 on CPU)" if device.type == "cpu" else ""
    return f"bf16 GEMM peak {max(best.values()) / 1e12:.1f} TFLOP/s{where}"
