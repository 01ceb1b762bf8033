"""Training step throughput and MFU of HSTU at a scale, for every attention implementation.

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
from __future__ import annotations

import argparse
import os
import statistics

from grlib.bench.common import positive_int, print_table, set_threads, thread_columns
from grlib.config import config_from_args
from grlib.config.choices import ISA_PATHS, MODEL_PRECISIONS

# torch, the model and the timing (grlib.bench.train_steps) are imported in run: `bench train --help`
# answers without them (tests/test_cli_startup.py)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=8, help="timed training steps per implementation")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (the compiled row: at least 3)")
    p.add_argument("--impls", default="all",
                   help="comma-separated hstu_attention impls (default: all that run on CPU); IMPL:recompute runs "
                        "that row with every layer recomputed in backward (model.recompute_layers), e.g. "
                        "cpu,reference:recompute where the padded model's activations would not fit in memory")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="add the torch.compile row of the plain-PyTorch model (default: on)")
    p.add_argument("--top", type=int, default=15, help="top ops to print from a profile of the auto row (0: none)")
    p.add_argument("--profile-steps", type=positive_int, default=3, help="training steps the profile of --top covers")
    p.add_argument("--precision", choices=MODEL_PRECISIONS, default="fp32",
                   help="model.precision of every row; MFU against the peaks of that dtype (default: fp32)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads (default: grlib's, see grlib.threads)")
    p.add_argument("--isa", nargs="+", choices=ISA_PATHS, default=None,
                   help="grlib._C paths to run every row on, in this one run, alternating per row (default: the "
                        "current one: GRLIB_ISA, else the widest this CPU and build have; grlib.hardware.isa); "
                        "torch's GEMM libraries keep their own code (docs/HARDWARE.md)")


RECOMPUTE = "recompute"  # --impls IMPL:recompute
# the columns the table prints (key, or (key, header)); every other one is in the rows (--wide, --json)
COLUMNS = (("attention_impl", "impl"), "isa", "compiled", ("recompute_layers", "recompute"), "auto", "step_ms",
           ("speedup_vs_reference", "speedup"), "mfu", "mfu_nominal", "mfu_with_loss", "peak_rss_mb")


def parse_impl(token: str, recompute: bool) -> tuple[str, bool]:
    """'cpu' -> ('cpu', the config's model.recompute_layers); 'reference:recompute' -> ('reference', True)."""
    impl, sep, suffix = token.strip().partition(":")
    if sep and suffix != RECOMPUTE:
        from grlib.config import ConfigError

        raise ConfigError(f"--impls {token!r}: the only suffix is ':{RECOMPUTE}' (every layer recomputed in backward)")
    return impl, recompute or bool(sep)


def run(args: argparse.Namespace) -> list[dict]:
    import numpy as np
    import torch

    from grlib import gemm_limits, hardware, ops, perf, results, threads
    from grlib.ops import gemm_choice
    from grlib.bench import train_steps as steps
    from grlib.model import build_model, parameter_count
    from grlib.model.hstu import COMPUTE_DTYPES
    from grlib.train.step import PHASES

    set_threads(args.threads)
    cfg = config_from_args(args, {"model.name": "hstu", "model.precision": args.precision})  # -o model.d_model=512
    recompute = cfg.model.recompute_layers
    impls = ([(i, recompute) for i in ops.runnable("hstu_attention", "cpu")] if args.impls == "all"
             else [parse_impl(token, recompute) for token in args.impls.split(",")])
    auto = ops.choose("hstu_attention", "cpu", "auto")
    # (attention impl, whole model under torch.compile, every layer recomputed in backward)
    variants = [(impl, False, rc) for impl, rc in impls] + ([("reference", True, recompute)] if args.compile else [])
    dtype = COMPUTE_DTYPES[cfg.model.precision]
    isas = list(dict.fromkeys(args.isa or [hardware.isa.current()]))
    nominals = {}
    for path in isas:  # an unavailable path, or bf16 on a path without it: an error before the data is made
        with hardware.isa.use(path):
            if cfg.model.precision == "bf16":
                hardware.isa.require_bf16(f"--isa {path} with model.precision=bf16" if args.isa else "model.precision=bf16")
            nominals[path] = hardware.nominal_peak(str(dtype).removeprefix("torch."), threads=torch.get_num_threads())
    cpu_columns = steps.cpu_columns()
    data, batches = steps.batches(cfg, max(args.warmup, 3) + args.steps)
    T = int(np.mean([b.item_ids.numel() for b in batches]))
    projection_before = steps.projection_rate(T, cfg.model.d_model, dtype)
    timed = {}
    with perf.measured_peak(dtype=dtype) as measured:
        for impl, compiled, rc in variants:
            for path in isas:  # the paths alternate row by row: their ratios come from the same minutes
                with hardware.isa.use(path):
                    timed[(path, impl, compiled, rc)] = steps.time_steps(
                        cfg.replace({"model.attention_impl": impl, "model.recompute_layers": rc}), data, batches,
                        max(args.warmup, 3) if compiled else args.warmup, compiled)
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
        n_warm = max(args.warmup, 3) if compiled else args.warmup
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
            **thread_columns(), "load_1m": load,
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
    print_table(rows,
                f"bench train: scale {cfg.scale}, HSTU {cfg.model.n_layers}x{cfg.model.n_heads} d={cfg.model.d_model} "
                f"({cfg.model.precision}; loss {cfg.negatives.precision}), "
                f"{count}; batch {cfg.train.batch_size} x max_len {cfg.data.max_len} ({T} tokens per step); "
                f"{args.steps} timed steps each; {threads.describe()}; load average {load:.2f}\n"
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
                f"of the same path over this row's",
                COLUMNS)
    if args.top > 0:
        print_table(steps.top_ops(cfg.replace({"model.attention_impl": auto}), data, batches, args.top,
                                    args.profile_steps),
                    f"top {args.top} ops by self CPU time, attention {auto} (torch.profiler, "
                    f"per step; wall-clock based: a busy machine inflates every op alike)")
    results.append_rows("bench_train", rows, cfg)
    return rows
