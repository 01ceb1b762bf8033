"""The measuring parts of C7's MFU method (grlib.experiments.mfu, run by `bench train`): the batches,
the trainer's schedule around a fresh model (plain or under torch.compile), timed steps, the
projection GEMMs' rate alone, the GEMM-only bound and the profile's top ops."""
from __future__ import annotations

import statistics
import time
from contextlib import closing

import numpy as np
import torch
from torch import nn

from grlib import hardware, ops, perf
from grlib.data.catalog import load_dataset
from grlib.fit import assemble
from grlib.model import build_model
from grlib.ops import registry
from grlib.probes.rss import peak_rss_mb, reset_peak_rss
from grlib.terminal import native_output_filtered
from grlib.train.step import PHASES


def cpu_columns() -> dict[str, str]:
    """The CPU of a row: `cpu_id` ("GenuineIntel family 0x6 model 0x8f", /proc/cpuinfo) and
    `cpu_bf16_units`, the CPU's bf16 flags (grlib.hardware.isa.BF16_FLAGS, whatever GRLIB_ISA
    forces: what the CPU could run in bf16) or "none"."""
    info, flags = hardware.cpu_info(), hardware.isa.cpu_flags()
    return {"cpu_id": f"{info.vendor} family {info.family:#x} model {info.model:#x}",
            "cpu_bf16_units": " ".join(f for f in hardware.isa.BF16_FLAGS if f in flags) or "none"}


def batches(cfg, n: int):
    """The scale's data and its first n training batches (the epoch restarted with another seed if short)."""
    data = load_dataset(cfg, "scale").data
    it = data.train_batches(cfg.train.batch_size, cfg.data.max_len, np.random.default_rng(cfg.train.seed))
    out = []
    while len(out) < n:
        batch = next(it, None)
        if batch is None:
            it = data.train_batches(cfg.train.batch_size, cfg.data.max_len, np.random.default_rng(len(out)))
            continue
        out.append(batch)
    return data, out


class PlainCompiled(nn.Module):
    """The model under torch.compile, every grlib op on its PyTorch reference (traced inside
    ops.registry.preferring("reference")); `embed` is the model's item table, as TrainStep expects."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.inner, self.compiled = model, torch.compile(model, dynamic=True)

    @property
    def embed(self) -> nn.Module:
        return self.inner.embed

    def forward(self, batch):
        with registry.preferring("reference"):
            return self.compiled(batch)


def build_schedule(cfg, data, compiled: bool = False):
    """The trainer's schedule (grlib.fit.assemble: negative path, optimizers, step) around a fresh model."""
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, data.n_items, cfg.data.max_len)
    model.train()
    model = PlainCompiled(model) if compiled else model
    return assemble(model, data, cfg)


def time_steps(cfg, data, batches, warmup: int, compiled: bool = False) -> tuple[list[dict], float, dict]:
    """Per timed step: tokens, FLOPs, phase seconds, on-CPU seconds; the warm-up steps' wall seconds;
    and the peak resident set while the model was built and its steps ran ({"peak_rss_mb",
    "peak_rss_since": "row" when the peak was reset before this row, else "process"})."""
    since = "row" if reset_peak_rss() else "process"
    schedule, threads_now = build_schedule(cfg, data, compiled), torch.get_num_threads()
    records, warmup_s = [], 0.0
    with closing(schedule.run(batches)) as steps:
        wall, cpu = time.perf_counter(), time.process_time()
        for i, out in enumerate(steps):
            wall, cpu, dw, dc = time.perf_counter(), time.process_time(), time.perf_counter() - wall, \
                time.process_time() - cpu
            if i < warmup:
                warmup_s += dw
                continue
            P = int((out.batch.targets > 0).sum())
            records.append({"tokens": out.batch.item_ids.numel(), "on_cpu_s": min(dw, dc / threads_now),
                            "flops": perf.batch_flops(out.batch.offsets, cfg.model),
                            "loss_flops": perf.loss_flops(P, cfg.negatives.n_negatives, cfg.model.d_model),
                            **{f"{p}_s": out.seconds[p] for p in PHASES if p != "data"}})
    return records, warmup_s, {"peak_rss_mb": peak_rss_mb(), "peak_rss_since": since}


def projection_rate(T: int, d: int, dtype: torch.dtype = torch.float32, repeats: int = 5) -> float:
    """FLOP/s of the layer's projection GEMMs at this batch's shape ([T, d] x [d, 4d], [T, d] x [d, d]),
    through the model's grlib.ops.linear in `dtype`: the median on-CPU time (min(wall, process CPU
    time / threads)) of warm repeats, as perf.measured_peak times its GEMMs."""
    x, w1, w2 = (torch.randn(*s, dtype=dtype) for s in ((T, d), (4 * d, d), (d, d)))
    threads_now, times = torch.get_num_threads(), []
    for i in range(repeats + 2):
        wall, cpu = time.perf_counter(), time.process_time()
        ops.linear(x, w1), ops.linear(x, w2)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if i >= 2:
            times.append(min(wall, cpu / threads_now))
    return 2 * T * d * 5 * d / statistics.median(times)


def gemm_bound(T: int, flops: float, loss_flops: float, cfg, gemm_share: float, peak: float) -> tuple[float, float]:
    """(ms, MFU) of a step of T tokens (flops, loss_flops per step) if nothing but its GEMMs took time:
    HSTU's projections (2 T d 5d per layer, x3 with backward, x4 when model.recompute_layers runs the
    forward again in backward) at the rate their shapes reach alone in this run (gemm_share x peak),
    the loss's logit GEMMs (perf.loss_flops) at the peak itself. An upper bound on the step's MFU
    (which counts the model's FLOPs once): every other op (attention, LayerNorm, dropout, SiLU,
    embeddings, softmax, optimizer) is priced at zero."""
    d, passes = cfg.model.d_model, 4 if cfg.model.recompute_layers else 3
    seconds = passes * cfg.model.n_layers * 2 * T * 5 * d * d / (gemm_share * peak) + loss_flops / peak
    return seconds * 1e3, perf.mfu(flops, seconds, peak)


# The parts of a step the profile's split names (op_kind): the GEMMs (projections and the loss's
# logits, through oneDNN or BLAS), the fused attention (forward and backward), and the rest.
GEMM_OPS = frozenset({"mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})
ATTENTION_OPS = ("hstu_attention", "hstu_uvqk_attention")
_FUNCTION = "GeneratedBackwardFor_"  # torch.library.register_autograd's autograd.Function, by op


def op_label(key: str) -> str:
    """The profile's name of an op, except a custom op's autograd.Function forward: that wrapper
    redispatches to the CPU kernel without an event of its own, so its self time is the op's forward
    kernel (measured: grlib::hstu_uvqk_attention 0.1 ms self, its GeneratedBackwardFor_ node 207 ms
    for one forward), and it is named for that."""
    if key.startswith(_FUNCTION) and not key.endswith("Backward"):
        op = key[len(_FUNCTION):].removesuffix("_default").replace("_", "::", 1)
        return f"{op} forward (its autograd.Function)"
    return key


def op_kind(key: str) -> str:
    """gemm, attention or other (the split of bench train's profile)."""
    if key in GEMM_OPS:
        return "gemm"
    return "attention" if any(name in key for name in ATTENTION_OPS) else "other"


def top_ops(cfg, data, batches, n: int, steps: int = 3) -> tuple[list[dict], list[dict]]:
    """(the n ops with the most self CPU time over `steps` profiled training steps, the split of every
    op's self time into gemm / attention / other) from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    step = build_schedule(cfg, data).step
    it = iter(batches)
    step(it)  # warm
    with native_output_filtered(), profile(activities=[ProfilerActivity.CPU]) as prof:  # no "USDT: ..." lines
        for _ in range(steps):
            step(it)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    top = [{"op": op_label(e.key)[:60], "kind": op_kind(e.key), "self_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
            "share": e.self_cpu_time_total / total, "calls_per_step": e.count / steps} for e in events[:n]]
    parts = {kind: sum(e.self_cpu_time_total for e in events if op_kind(e.key) == kind)
             for kind in ("gemm", "attention", "other")}
    split = [{"part": kind, "self_ms_per_step": us / 1e3 / steps, "share": us / total} for kind, us in parts.items()]
    return top, split
