"""C7's MFU method (`bench train`): training step throughput and MFU of HSTU at a scale, for every
attention implementation.

MFU = useful FLOPs (grlib.perf, recsys-examples' HSTU formula on the real lengths) per second of
whole training steps (data, forward, loss, backward, optimizer) / a peak, two ways in every row:
`mfu` against the fp32 GEMM peak measured warm in the same run (perf.measured_peak: the best GEMM
library, before and after the steps; the higher one is used), `mfu_nominal` against the nominal
peak (grlib.hardware: cores x FLOP per cycle x clock, each source printed). The paper's 54.71%
compares with `mfu_nominal` (a device's nominal peak: NVIDIA's convention, most likely the
paper's). Each row also records the load average when it was measured (`load_1m`): on a shared
machine the step's wall time grows with the load, the on-CPU GEMM peak does not; `step_cpu_ms` /
`mfu_on_cpu` time each step as the peak's GEMMs are timed, min(wall, process CPU time / threads):
exact with one thread (`--threads 1`), with more threads a lower bound on the time wherever a
thread idles (serial parts), so an upper bound on MFU.

Rows: every attention implementation that runs on CPU (the compiled kernel `cpu`, the padded
`reference` and `fbgemm`, the non-padded per-sequence loops `loop` and `loop_compile`), and the
whole plain-PyTorch model under torch.compile (`compiled` = true: attention_impl reference, every
grlib op on its PyTorch reference through ops.registry.preferring; compile time apart in
`compile_s`, the warm-up steps' time beyond their share of the timed median). Then the top ops by
self CPU time of the `auto` row's steps (torch.profiler), so the next step is visible.
The baselines of the same run: the `reference` (padded) attention, and the model's own projection
GEMM shapes timed alone (`gemm_share_of_peak`: what the projections reach by themselves, on-CPU,
the higher of a reading before the steps and one after, as the peak). From it,
`gemm_bound_ms` / `mfu_gemm_bound` (gemm_bound): the step and its MFU if nothing but the GEMMs took
time, an upper bound on what any speed-up of the other ops can reach; `other_ms` is the rest of the
step. `mfu_with_loss` adds the sampled softmax's logit products (perf.loss_flops), which the HSTU
formula leaves out. Rows record the OpenMP wait policy and threads (grlib.threads) and go to
results/tables/bench_train.parquet.

`--precision bf16` runs the same table with model.precision = bf16 (HSTU's projections on bf16
copies of the fp32 weights: grlib.model.hstu) and divides by the bf16 peaks, measured (bf16 GEMMs,
oneDNN's AVX512-BF16 code on CPUs that have it) and nominal (grlib.hardware.nominal: the bf16 FLOP
per cycle of the CPU's units); the loss keeps negatives.precision. Every row records `precision`,
the dtypes of both peaks (`peak_dtype`, `nominal_peak_dtype`), grlib._C's path (`isa`) and the CPU:
`cpu_model`, `cpu_id` (vendor, family, model: a VM may name two generations "AMD EPYC") and
`cpu_bf16_units` (its bf16 flags, amx_bf16 / avx512_bf16, whatever the path; "none"): the report
judges C7's MFU with a CPU's bf16 rows where it has bf16 units (grlib.experiments.report).
"""

import dataclasses
import os
import statistics

from grlib.config import Config, ConfigError

RECOMPUTE = "recompute"  # --impls IMPL:recompute


@dataclasses.dataclass(frozen=True)
class Options:
    """What `bench train` measures: timed and untimed steps per row, the attention impls ("all": every
    one that runs on CPU; IMPL:recompute), the torch.compile row, the profile's top ops and its steps,
    and the grlib._C paths (None: the current one)."""

    steps: int = 8
    warmup: int = 2
    impls: str = "all"
    compile: bool = True
    top: int = 15
    profile_steps: int = 3
    isa: list[str] | None = None


@dataclasses.dataclass
class Measured:
    """The rows (table bench_train), the table's title, and the profile's top ops with their title."""

    rows: list[dict]
    title: str
    top: list[dict]
    top_title: str
    split: list[dict]
    split_title: str


def parse_impl(token: str, recompute: bool) -> tuple[str, bool]:
    """'cpu' -> ('cpu', the config's model.recompute_layers); 'reference:recompute' -> ('reference', True)."""
    impl, sep, suffix = token.strip().partition(":")
    if sep and suffix != RECOMPUTE:
        raise ConfigError(f"--impls {token!r}: the only suffix is ':{RECOMPUTE}' (every layer recomputed in backward)")
    return impl, recompute or bool(sep)


def measure(cfg: Config, opt: Options) -> Measured:
    """Every row of the table at cfg's scale and model.precision (the module docstring)."""
    import numpy as np
    import torch

    from grlib import gemm_limits, hardware, ops, perf, threads
    from grlib.experiments import mfu_steps as steps
    from grlib.model import build_model, parameter_count
    from grlib.model.hstu import COMPUTE_DTYPES
    from grlib.ops import gemm_choice
    from grlib.train.step import PHASES

    recompute = cfg.model.recompute_layers
    impls = ([(i, recompute) for i in ops.runnable("hstu_attention", "cpu")] if opt.impls == "all"
             else [parse_impl(token, recompute) for token in opt.impls.split(",")])
    auto = ops.choose("hstu_attention", "cpu", "auto")
    # (attention impl, whole model under torch.compile, every layer recomputed in backward)
    variants = [(impl, False, rc) for impl, rc in impls] + ([("reference", True, recompute)] if opt.compile else [])
    dtype = COMPUTE_DTYPES[cfg.model.precision]
    isas = list(dict.fromkeys(opt.isa or [hardware.isa.current()]))
    nominals = {}
    for path in isas:  # an unavailable path, or bf16 on a path without it: an error before the data is made
        with hardware.isa.use(path):
            if cfg.model.precision == "bf16":
                hardware.isa.require_bf16(f"--isa {path} with model.precision=bf16" if opt.isa else "model.precision=bf16")
            nominals[path] = hardware.nominal_peak(str(dtype).removeprefix("torch."), threads=torch.get_num_threads())
    cpu_columns = steps.cpu_columns()
    data, batches = steps.batches(cfg, max(opt.warmup, 3) + opt.steps)
    T = int(np.mean([b.item_ids.numel() for b in batches]))
    projection_before = steps.projection_rate(T, cfg.model.d_model, dtype)
    timed = {}
    with perf.measured_peak(dtype=dtype) as measured:
        for impl, compiled, rc in variants:
            for path in isas:  # the paths alternate row by row: their ratios come from the same minutes
                with hardware.isa.use(path):
                    timed[(path, impl, compiled, rc)] = steps.time_steps(
                        cfg.replace({"model.attention_impl": impl, "model.recompute_layers": rc}), data, batches,
                        max(opt.warmup, 3) if compiled else opt.warmup, compiled)
    peaks, peak = (measured.before, measured.after), measured.flops
    load = os.getloadavg()[0]
    # the projections' rate: the higher of a reading before the steps and one after (as the peak)
    gemm = max(projection_before, steps.projection_rate(T, cfg.model.d_model, dtype)) / peak
    count = parameter_count(build_model(cfg.model, data.n_items, cfg.data.max_len, device="meta"))
    rows, base = [], {}
    for (path, impl, compiled, rc), (recs, warmup_s, rss) in timed.items():
        nominal, row_cfg = nominals[path], cfg.replace({"model.recompute_layers": rc})
        step_s = [sum(r[f"{p}_s"] for p in PHASES if p != "data") for r in recs]
        total_s, flops, loss_flops = sum(step_s), sum(r["flops"] for r in recs), sum(r["loss_flops"] for r in recs)
        step_ms = statistics.median(step_s) * 1e3
        if (impl, compiled) == ("reference", False):
            base[(path, rc)] = step_ms  # each path's speedup is against its own reference row
        gemm_ms, mfu_bound = steps.gemm_bound(T, flops / len(recs), loss_flops / len(recs), row_cfg, gemm, peak)
        n_warm = max(opt.warmup, 3) if compiled else opt.warmup
        rows.append({
            "attention_impl": impl, "compiled": compiled, "auto": impl == auto and not compiled,
            "precision": cfg.model.precision,
            "isa": path, "cpu_model": hardware.isa.cpu_model(),  # grlib._C's path, the CPU
            **cpu_columns,  # which CPU (a VM may name Zen 4 and Zen 5 alike) and its bf16 units: the report's C7 key
            "gemm_limit": gemm_limits.describe(),  # the GEMM libraries' limits: this process's, whatever the path
            "gemm_auto": gemm_choice.record()["library"], "gemm_auto_how": gemm_choice.describe(),  # fp32 projections
            "d_model": cfg.model.d_model, "n_layers": cfg.model.n_layers,
            "n_heads": cfg.model.n_heads, "batch": cfg.train.batch_size, "max_len": cfg.data.max_len,
            "params": count.total, "tokens_per_step": T, "real_fraction": T / (cfg.train.batch_size * cfg.data.max_len),
            "flops_per_step": flops / len(recs), "step_ms": step_ms, "tokens_per_s": sum(r["tokens"] for r in recs) / total_s,
            "step_cpu_ms": statistics.median(r["on_cpu_s"] for r in recs) * 1e3,
            "compile_s": max(0.0, warmup_s - n_warm * step_ms / 1e3) if compiled else 0.0,
            **{f"{p}_share": sum(r[f"{p}_s"] for r in recs) / total_s for p in PHASES if p != "data"},
            "peak_dtype": measured.dtype, "peak_flops": peak, "peak_before": peaks[0], "peak_after": peaks[1], "gemm_share_of_peak": gemm,
            **{f"peak_{lib}": v for lib, v in measured.per_library.items()},
            "nominal_peak_dtype": nominal.dtype, "nominal_peak_flops": nominal.flops, "nominal_peak_how": nominal.how,
            "mfu": perf.mfu(flops, total_s, peak), "mfu_nominal": perf.mfu(flops, total_s, nominal.flops),
            "mfu_on_cpu": perf.mfu(flops, sum(r["on_cpu_s"] for r in recs), peak),
            **threads.policy(), "load_1m": load,
            "loss_flops_per_step": loss_flops / len(recs), "mfu_with_loss": perf.mfu(flops + loss_flops, total_s, peak),
            "mfu_with_loss_nominal": perf.mfu(flops + loss_flops, total_s, nominal.flops),
            "gemm_bound_ms": gemm_ms, "other_ms": step_ms - gemm_ms, "mfu_gemm_bound": mfu_bound,
            "recompute_layers": rc, **rss,
        })
    for row in rows:  # against the reference row of the same path and recomputation, else of the same path
        key = (row["isa"], row["recompute_layers"])
        key = key if key in base else next((k for k in base if k[0] == row["isa"]), None)
        row["speedup_vs_reference"] = base[key] / row["step_ms"] if key else float("nan")
        row["reference_recompute_layers"] = key[1] if key else None  # what that reference row recomputed
    title = (f"bench train: scale {cfg.scale}, HSTU {cfg.model.n_layers}x{cfg.model.n_heads} d={cfg.model.d_model} "
                f"({cfg.model.precision}; loss {cfg.negatives.precision}), "
                f"{count}; batch {cfg.train.batch_size} x max_len {cfg.data.max_len} ({T} tokens per step); "
                f"{opt.steps} timed steps each; {threads.describe()}; load average {load:.2f}\n"
                + ("recompute_layers: every layer recomputed in backward (model.recompute_layers); MFU counts the "
                   "model's FLOPs once, not the recomputed forward; speedup_vs_reference: against the reference row "
                   "of the same recomputation where there is one\n" if any(r["recompute_layers"] for r in rows) else "")
                + f"peak_rss_mb: the process's peak resident set while a row's model was built and its steps ran "
                f"({rows[0]['peak_rss_since']}: {'reset before each row' if rows[0]['peak_rss_since'] == 'row' else 'since the process started'})\n"
                f"mfu: against the {measured.describe()}\n"
                + "".join(f"mfu_nominal{f' ({path})' if len(isas) > 1 else ''}: against the {n.describe()}\n"
                          for path, n in nominals.items())
                + f"CPU {hardware.isa.cpu_model()}; grlib._C paths {', '.join(isas)}; torch's GEMM libraries limited by: "
                f"{gemm_limits.describe()} (grlib.gemm_limits: GRLIB_ISA when the process starts); fp32 projections "
                f"through {gemm_choice.describe()}\n"
                f"gemm_bound_ms / mfu_gemm_bound: the step if nothing but its GEMMs took time (projections at "
                f"gemm_share_of_peak, the loss's logit GEMMs at the peak); other_ms = step_ms - gemm_bound_ms\n"
                f"The paper's 54.71% MFU compares with mfu_nominal (a nominal peak, NVIDIA's convention).\n"
                f"impl: model.attention_impl (auto: the default's row); speedup: the step time of the reference row "
                f"of the same path over this row's")
    top, split = (steps.top_ops(cfg.replace({"model.attention_impl": auto}), data, batches, opt.top,
                                opt.profile_steps) if opt.top > 0 else ([], []))
    return Measured(rows, title, top, f"top {opt.top} ops by self CPU time, attention {auto} (torch.profiler, "
                                      f"per step; wall-clock based: a busy machine inflates every op alike)",
                    split, "the profiled step's self CPU time by part: gemm = "
                           f"{', '.join(sorted(steps.GEMM_OPS))}; attention = the ops named "
                           f"{' or '.join(steps.ATTENTION_OPS)}, forward and backward; other = every other op")
