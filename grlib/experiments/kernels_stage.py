"""Stage `kernels` (notebooks/01_kernels, and `python -m grlib bench kernels`): jagged HSTU attention
implementations (reference vs fbgemm vs compiled cpu, forward and backward, two length regimes)
against padding, and the fused LayerNorm(x) * u (grlib.ops.layer_norm_mul, op column) against its
two-op reference on the whole batch's tokens [T, d_model].

`run` measures at the scale's sizes, appends the rows to the table `kernels`, writes
results/metrics/<scale>/kernels.json; `save_figures` writes the figures (results/figures/<scale>/).

Lengths come from the lognormal fit to KuaiRand-27K (grlib.experiments.measure.kuairand_lengths):
`truncated` cuts the real lengths at max_len (nearly all full), `scaled` scales them so their
p99 is max_len (the real raggedness: ~15% of the padded tokens are real). Heads and head dim
are the scale's model; bias tables as in the model (128 position, 32 time buckets).

Each comparison batch holds kernels.batch_size(max_len) sequences (the same B * max_len**2
score elements per head at every length, so the padded reference fits); with whole_batch > 0
the compiled kernel also runs alone on a whole batch at the largest max_len (truncated
regime), where the padded implementations would need tens of GB.

Method. Every (implementation, regime, max_len) runs in a fresh child process (kernels.isolate;
the smoke scale times in-process, quickly, leaves peak memory empty and says isolated=false): it
builds the inputs, warms the implementation on a tiny batch (one-time library buffers are not
counted), resets the kernel's peak-RSS counter (/proc/self/clear_refs), runs one forward+backward
and reports the peak resident-set growth over the RSS before it (peak_mem_mb: every allocation of
that step, torch's and the kernel's scratch alike, gradients included). The same child then
times the forward (autograd recording, as in training) and forward+backward: medians of
`repeats` runs (fewer, at least one, where they would take longer than kernels.row_seconds;
each row records how many). The whole batch is timed by one forward and by its memory run.
gflops = useful FLOPs on the real lengths (attention forward
2 * H * (Dqk + Dv) * s**2 / 2 per sequence, x3.5 with backward) / forward+backward time;
frac_of_peak divides by the GEMM peak of this machine measured in the same run (grlib.hardware:
warm square GEMMs, on-CPU time, the best of torch.mm's BLAS and oneDNN; the higher of a reading
before the rows and one after, both recorded), frac_of_nominal by its
nominal peak (grlib.hardware: cores x FLOP per cycle x clock); both in the kernels' dtype.
fwd_bwd_cpu_ms / gflops_on_cpu / frac_of_peak_on_cpu time each forward+backward as the peak's
GEMMs are timed, min(wall, process CPU time / threads): exact with one thread, and on a machine
that other jobs share the rate the kernel gets while it runs; with more threads a lower bound on
the time wherever a thread idles (serial parts), so an upper bound on the rate.
Ratios are against `reference` in the same run and regime/max_len.
"""
from __future__ import annotations

import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time

import altair as alt
import polars as pl
import torch

from grlib import gemm_limits, hardware, plots, progress, results
from grlib.config import Config, KernelsAblation, KernelsConfig
from grlib.hardware import isa
from grlib.experiments import claims
from grlib.experiments.measure import kuairand_lengths, median_ms

POS_BUCKETS, TIME_BUCKETS = 128, 32  # as grlib.model.hstu
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def run(cfg: Config, ablation: KernelsAblation, threads: int | None = None) -> pl.DataFrame:
    rows = measure(cfg, ablation, table="kernels", threads=threads)
    df = pl.DataFrame(rows).with_columns(pl.lit(cfg.scale).alias("scale"))  # the figures' scale
    results.write_metrics("kernels", metrics(df, cfg.scale), scale=cfg.scale)
    return df


def comparison(df: pl.DataFrame) -> pl.DataFrame:
    """The same-batch attention comparison rows, one per (regime, max_len, impl)."""
    return (df.filter(~pl.col("whole_batch") & (pl.col("op") == "hstu_attention"))
            .select("regime", "max_len", "impl", "batch", "tokens", "fill", "fwd_ms", "fwd_bwd_ms",
                    "peak_mem_mb", "gflops", "frac_of_peak", "speedup_vs_reference", "mem_reduction_vs_reference")
            .sort("regime", "max_len", "impl"))


def whole_batch(df: pl.DataFrame) -> pl.DataFrame:
    """The compiled kernel alone on a whole batch at the largest max_len (no padded run: it would not fit)."""
    return (df.filter(pl.col("whole_batch"))
            .select("impl", "regime", "max_len", "batch", "tokens", "fwd_ms", "fwd_bwd_ms", "peak_mem_mb",
                    "reference_estimate_mb", "gflops", "frac_of_peak"))


def fused(df: pl.DataFrame) -> pl.DataFrame:
    """The fused LayerNorm(x) * u against torch's LayerNorm then multiply, same tokens."""
    return (df.filter(pl.col("op") == "layer_norm_mul")
            .select("op", "impl", "tokens", "fwd_ms", "fwd_bwd_ms", "peak_mem_mb", "speedup_vs_reference",
                    "mem_reduction_vs_reference"))


def acceptance(df: pl.DataFrame) -> pl.DataFrame:
    """The checks of claim C1 on this run: cpu vs reference (scaled, max_len 1024) and vs fbgemm."""
    cmp = comparison(df)
    checks = []
    speed, memory, fbgemm = (claims.target(f"C1.{k}") for k in ("speedup", "memory", "vs_fbgemm"))
    at = cmp.filter((pl.col("regime") == "scaled") & (pl.col("max_len") == 1024) & (pl.col("impl") == "cpu"))
    if at.height:
        r = at.row(0, named=True)
        checks.append({"target": speed.key, "check": f"scaled, max_len 1024: cpu fwd+bwd {speed.threshold}",
                       "value": r["speedup_vs_reference"], "met": speed.met(r["speedup_vs_reference"])})
        checks.append({"target": memory.key, "check": f"scaled, max_len 1024: cpu {memory.threshold}",
                       "value": r["mem_reduction_vs_reference"], "met": memory.met(r["mem_reduction_vs_reference"])})
    wide = cmp.pivot(on="impl", index=["regime", "max_len"], values="fwd_bwd_ms")
    if {"cpu", "fbgemm"} <= set(wide.columns):
        for r in wide.iter_rows(named=True):
            ratio = r["fbgemm"] / r["cpu"]
            checks.append({"target": fbgemm.key, "check": f"{r['regime']}, max_len {r['max_len']}: fwd+bwd "
                           f"{fbgemm.threshold}", "value": ratio, "met": fbgemm.met(ratio)})
    return pl.DataFrame(checks, schema={"target": pl.String, "check": pl.String, "value": pl.Float64,
                                        "met": pl.Boolean})


def metrics(df: pl.DataFrame, scale: str) -> dict:
    out: dict = {"scale": scale}
    for r in comparison(df).filter(pl.col("impl") != "reference").iter_rows(named=True):
        key = f"{r['impl']}_{r['regime']}_{r['max_len']}"
        out[key] = {"speedup_vs_reference": _num(r["speedup_vs_reference"]),
                    "mem_reduction_vs_reference": _num(r["mem_reduction_vs_reference"])}
    for r in fused(df).filter(pl.col("impl") == "cpu").iter_rows(named=True):
        out["layer_norm_mul_cpu"] = {"speedup_vs_reference": _num(r["speedup_vs_reference"]),
                                     "mem_reduction_vs_reference": _num(r["mem_reduction_vs_reference"])}
    for r in whole_batch(df).iter_rows(named=True):
        out[f"whole_batch_{r['max_len']}"] = {"batch": r["batch"], "peak_mem_mb": _num(r["peak_mem_mb"]),
                                              "reference_estimate_mb": _num(r["reference_estimate_mb"])}
    return out


def _num(x: float) -> float | None:
    return None if x is None or math.isnan(x) else round(float(x), 4)


# what each implementation and length regime of the charts is (their captions); the ops are grlib.ops'
IMPLEMENTATIONS = {
    "reference": "padded PyTorch (pad to max_len, dense einsum, mask, unpad): the baseline, 1x",
    "fbgemm": "fbgemm's jagged<->padded conversions around the same dense math (the library baseline)",
    "cpu": "grlib's fused jagged kernel (grlib._C, kernels/cpu): no padding, causal half only",
    "loop": "one dense attention per sequence, no padding (eager PyTorch)",
    "loop_compile": "the same per-sequence attention compiled by torch.compile",
    "triton": "the Triton jagged kernel (CUDA)",
    "npu": "torch-npu / fbgemm-ascend (Ascend NPU)",
    "onednn": "oneDNN's matmul (GEMM ops only)",
}
REGIMES = {
    "truncated": "KuaiRand-27K-like lengths cut at max_len (nearly every sequence full)",
    "scaled": "the same lengths scaled so their p99 is max_len (~15% of the padded tokens real)",
}


def caption(impls: list[str], regimes: list[str]) -> list[str]:
    """The lines that say what each implementation and regime of a chart is (subtitle lines)."""
    return ([f"{name}: {IMPLEMENTATIONS.get(name, '(see grlib.ops)')}" for name in impls]
            + [f"lengths {name}: {REGIMES.get(name, '(see kernels_stage)')}" for name in regimes])


def _captioned(chart: alt.TopLevelMixin, title: str, data: pl.DataFrame, impls: list[str] | None = None):
    impls = impls or [i for i in IMPLEMENTATIONS if i in set(data["impl"])] + sorted(set(data["impl"]) - set(IMPLEMENTATIONS))
    present = set(data["regime"]) if data.height else set()
    regimes = [r for r in REGIMES if r in present] + sorted(present - set(REGIMES))
    return chart.properties(title=alt.TitleParams(text=title, subtitle=caption(impls, regimes), anchor="start",
                                                  subtitleFontSize=11))


def latency_memory_chart(df: pl.DataFrame) -> alt.VConcatChart:
    """Forward+backward latency and peak memory vs max_len per implementation (log scales)."""
    data = comparison(df)
    base = alt.Chart(data).mark_line(point=True).encode(
        x=alt.X("max_len:O", title="max_len"), color=alt.Color("impl:N", title="implementation"))
    latency = base.encode(y=alt.Y("fwd_bwd_ms:Q", scale=alt.Scale(type="log"), title="fwd+bwd ms (median)"))
    memory = base.encode(y=alt.Y("peak_mem_mb:Q", scale=alt.Scale(type="log"), title="peak memory MB"))
    return _captioned(alt.vconcat(
        latency.properties(width=220, height=160).facet(column=alt.Column("regime:N", title="lengths")),
        memory.properties(width=220, height=160).facet(column=alt.Column("regime:N", title="lengths")),
    ), "Jagged HSTU attention: latency and memory (same batch per max_len)", data)


def ratio_chart(df: pl.DataFrame) -> alt.VConcatChart:
    """Speedup and memory reduction vs the padded reference, with the paper's 2.2x and 70% as rules."""
    data = comparison(df).filter(pl.col("impl") != "reference")

    def panel(field: str, title: str, claim: float, fmt: str, log: bool) -> alt.FacetChart:
        scale = alt.Scale(type="log") if log else alt.Scale()
        line = alt.Chart().mark_line(point=True).encode(
            x=alt.X("max_len:O"), y=alt.Y(f"{field}:Q", title=title, scale=scale, axis=alt.Axis(format=fmt)),
            color=alt.Color("impl:N", title="implementation"))
        one = {"groupby": [], "aggregate": [{"op": "count", "as": "n"}]}  # one mark per facet
        rule = alt.Chart().transform_aggregate(**one).mark_rule(strokeDash=[4, 3], color="black").encode(
            y=alt.datum(claim, scale=scale) if log else alt.datum(claim))
        text = alt.Chart().transform_aggregate(**one).mark_text(align="left", dx=2, dy=-6, fontSize=10).encode(
            x=alt.value(0), y=alt.datum(claim), text=alt.value(f"paper: {claim:{fmt}}"))
        return (alt.layer(line, rule, text, data=data).properties(width=220, height=160)
                .facet(column=alt.Column("regime:N", title="lengths")))

    speed, memory = claims.target("C1.speedup").paper, claims.target("C1.memory").paper
    chart = alt.vconcat(panel("speedup_vs_reference", "fwd+bwd speedup vs reference (log)", speed.number, ".1f",
                              log=True),
                        panel("mem_reduction_vs_reference", "peak-memory reduction", memory.number, ".0%",
                              log=False))
    impls = ["reference"] + [i for i in IMPLEMENTATIONS if i in set(data["impl"])]
    return _captioned(chart, f"Against padding (TurboGR C1: {speed} lower latency, {memory} less memory; "
                             "dashed: the paper's figure)", data, impls)


def save_figures(df: pl.DataFrame, scale: str | None = None) -> list:
    """Both charts under results/figures/<scale>/ (default: the one scale of `df`, as `run` returns it)."""
    if scale is None:
        scales = df["scale"].unique().to_list() if "scale" in df.columns else []
        if len(scales) != 1:
            raise ValueError(f"kernels_stage.save_figures: pass scale=...; the rows carry scales {scales}")
        scale = scales[0]
    return (plots.save_chart(latency_memory_chart(df), "kernels_latency_memory", scale)
            + plots.save_chart(ratio_chart(df), "kernels_vs_reference", scale))


# ---- the method: the plan, one measurement per child process, the ratios ---------------------
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
            threads: int | None = None, isas: list[str] | None = None, dtypes: list[str] | None = None) -> list[dict]:
    """Runs the plan (one child process per row) on each of grlib._C's instruction-set paths `isas`
    (grlib.hardware.isa; default: the current one) in each of `dtypes` (default: kernels.dtype; the
    dtypes of a spec run one after the other), appends the rows to `table` and returns them. Each row
    records its path (`isa`), dtype, the CPU model and the nominal and measured GEMM peaks in its dtype
    (at the path's vector width and units); with several dtypes, speedup_vs_float32 is the float32 row's
    fwd_bwd_ms over this row's (the same op, implementation, regime, length and path)."""
    kc = cfg.kernels
    heads, head_dim = cfg.model.n_heads, cfg.model.d_model // cfg.model.n_heads
    isas = isas or [isa.current()]
    dtypes = list(dict.fromkeys(dtypes or [kc.dtype]))
    for path in isas:
        with isa.use(path):  # an unavailable path: a ConfigError before any row
            if "bfloat16" in dtypes:
                isa.require_bf16(f"bench kernels: the {path} path")
    before = {dt: matmul_peak_gflops(DTYPES[dt], threads) for dt in dtypes}
    nominals = {}
    for path in isas:
        with isa.use(path):
            for dt in dtypes:
                nominals[path, dt] = hardware.nominal_peak(dt, threads=threads or torch.get_num_threads())
    rows = []
    specs = [{**spec, "isa": path, "dtype": dt} for path in isas for spec in plan(kc, ablation, batch) for dt in dtypes]
    for spec in progress.progress(specs, desc="bench kernels"):
        spec = {"heads": heads, "head_dim": head_dim, "repeats": kc.repeats,
                "row_seconds": kc.row_seconds, "threads": threads or torch.get_num_threads(),
                "seed": cfg.train.seed, **spec}
        with isa.use(spec["isa"]):  # the child inherits GRLIB_ISA
            row = run_child(spec) if kc.isolate else _in_process(spec)
        row["isolated"] = kc.isolate
        # the GEMM libraries' limits the row ran under: its child's (its path's, run_child), else this process's
        row["gemm_limit"] = gemm_limits.describe(gemm_limits.limited_environ(spec["isa"]) if kc.isolate else None)
        row["load_1m"] = os.getloadavg()[0]  # the machine's load as the row was measured
        row["cpu_model"] = isa.cpu_model()
        rows.append(row)
    # the higher of two readings, before and after the rows (as bench train): one reading taken
    # while other jobs held a core would lower the peak and raise every fraction
    after = {dt: matmul_peak_gflops(DTYPES[dt], threads) for dt in dtypes}
    for row in rows:
        dt = row["dtype"]
        peak = max(before[dt], after[dt])
        row["frac_of_peak"] = row["gflops"] / peak
        row["frac_of_peak_on_cpu"] = row["gflops_on_cpu"] / peak
        row["matmul_peak_gflops"] = peak
        row["matmul_peak_before_gflops"], row["matmul_peak_after_gflops"] = before[dt], after[dt]
        nominal = nominals[row["isa"], dt]
        row["frac_of_nominal"] = row["gflops"] * 1e9 / nominal.flops
        row["nominal_peak_gflops"] = nominal.flops / 1e9
        row["nominal_peak_how"] = nominal.how
    _add_ratios(rows, several_dtypes=len(dtypes) > 1)
    results.append_rows(table, rows, cfg)
    return rows


def _add_ratios(rows: list[dict], several_dtypes: bool = False) -> None:
    base = {(r["op"], r["regime"], r["max_len"], r.get("isa"), r["dtype"]): r for r in rows
            if r["impl"] == "reference" and not r["whole_batch"]}
    fp32 = {(r["op"], r["impl"], r["regime"], r["max_len"], r.get("isa"), r["whole_batch"]): r for r in rows
            if r["dtype"] == "float32"}
    for r in rows:
        ref = base.get((r["op"], r["regime"], r["max_len"], r.get("isa"), r["dtype"]))  # the same path's and dtype's
        comparable = ref is not None and not r["whole_batch"]
        r["speedup_vs_reference"] = ref["fwd_bwd_ms"] / r["fwd_bwd_ms"] if comparable else float("nan")
        r["mem_reduction_vs_reference"] = (1 - r["peak_mem_mb"] / ref["peak_mem_mb"]
                                           if comparable and ref["peak_mem_mb"] > 0 else float("nan"))
        # the whole batch: what the padded reference would need, extrapolated linearly in B from
        # its measured peak at the same max_len and regime (it is not run: it would not fit)
        r["reference_estimate_mb"] = (ref["peak_mem_mb"] / ref["batch"] * r["batch"]
                                      if ref is not None and r["whole_batch"] and ref["batch"] else float("nan"))
        if several_dtypes:
            same = fp32.get((r["op"], r["impl"], r["regime"], r["max_len"], r.get("isa"), r["whole_batch"]))
            r["speedup_vs_float32"] = same["fwd_bwd_ms"] / r["fwd_bwd_ms"] if same is not None else float("nan")


def matmul_peak_gflops(dtype: torch.dtype, threads: int | None = None) -> float:
    """This machine's GEMM peak in `dtype` (GFLOP/s; hardware.measure_peak_flops: on-CPU time, best library)."""
    if threads:
        torch.set_num_threads(threads)
    return hardware.measure_peak_flops(dtype=dtype)["peak_flops"] / 1e9


def run_child(spec: dict) -> dict:
    """One measurement in a fresh interpreter (an honest peak-RSS baseline); returns its row."""
    cmd = [sys.executable, "-m", "grlib.experiments.kernels_stage", "--child", json.dumps(spec)]
    env = gemm_limits.limited_environ(spec.get("isa"), {**os.environ, "GRLIB_PROGRESS": "0"})  # its path's GEMMs
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
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
    start, cpu = time.perf_counter(), time.process_time()
    step()
    first_ms = (time.perf_counter() - start) * 1e3
    first_cpu_ms = min(first_ms, (time.process_time() - cpu) * 1e3 / spec["threads"])
    peak_mb = (_status_kb("VmHWM") - base) / 1024 if measure_memory else float("nan")
    for leaf in leaves:
        leaf.grad = None
    # timed runs: `repeats`, fewer (at least one) when they would take longer than row_seconds
    # (estimated from the memory run; a forward costs about 0.4 of a forward+backward). The whole
    # batch (repeats 0, no comparison) reuses the memory run as its one forward+backward sample.
    repeats = max(1, min(spec["repeats"], int(spec["row_seconds"] * 1e3 / (1.4 * first_ms))))
    fwd_ms = median_ms(forward, repeats=repeats, warmup=0)
    fwd_bwd, on_cpu = ([first_ms], [first_cpu_ms]) if spec["repeats"] == 0 else ([], [])
    for _ in range(repeats if spec["repeats"] else 0):
        start, cpu = time.perf_counter(), time.process_time()
        step()
        fwd_bwd.append((time.perf_counter() - start) * 1e3)
        on_cpu.append(min(fwd_bwd[-1], (time.process_time() - cpu) * 1e3 / spec["threads"]))
        for leaf in leaves:
            leaf.grad = None
    fwd_bwd_ms, fwd_bwd_cpu_ms = statistics.median(fwd_bwd), statistics.median(on_cpu)
    lengths = x["lengths"].double()
    D = spec["head_dim"]
    # useful FLOPs: the attention's matmuls; the fused LayerNorm * u is memory-bound (no figure)
    flops_fwd = float((2 * spec["heads"] * 2 * D * lengths**2 / 2).sum()) if op == "hstu_attention" else math.nan
    B, N, T = spec["batch"], spec["max_len"], int(lengths.sum())
    return {"op": op, "impl": spec["impl"], "isa": isa.current(), "regime": spec["regime"], "max_len": N, "batch": B, "tokens": T,
            "fill": T / (B * N), "heads": spec["heads"], "head_dim": D, "dtype": spec["dtype"],
            "threads": spec["threads"], "whole_batch": spec["whole_batch"], "repeats": repeats,
            "fwd_ms": fwd_ms, "fwd_bwd_ms": fwd_bwd_ms, "first_fwd_bwd_ms": first_ms, "peak_mem_mb": peak_mb,
            "gflops": 3.5 * flops_fwd / (fwd_bwd_ms * 1e6), "fwd_bwd_cpu_ms": fwd_bwd_cpu_ms,
            "gflops_on_cpu": 3.5 * flops_fwd / (fwd_bwd_cpu_ms * 1e6), "seed": spec["seed"]}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
    else:  # pragma: no cover
        sys.exit("usage: python -m grlib bench kernels ... or python -m grlib notebook 01_kernels "
                 "(--child is internal)")
