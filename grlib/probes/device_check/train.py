"""The train part: bf16 training steps of the paper preset timed with CUDA events, rows as bench_train's."""
from __future__ import annotations

import math
import os
import statistics

from grlib.probes.device_check.base import TRAIN_SCALE, Run, Timer, free_memory, sync, torch_device
from grlib.probes.device_check.kernels import nominal_flops


def train_batch(B: int, max_len: int, n_items: int, seed: int):
    """B sequences of KuaiRand-27K-like lengths cut at max_len: random items, actions, increasing
    timestamps; each token's target is the next item of its sequence (0 after the last)."""
    import numpy as np
    import torch

    from grlib.data.synthetic import kuairand_lengths
    from grlib.jagged import JaggedBatch
    from grlib.schema import FIRST_ITEM_ID, N_ACTION_CODES

    lengths = kuairand_lengths(B, max_len, "truncated", seed=seed)
    rng = np.random.default_rng(seed)
    T = int(lengths.sum())
    items = rng.integers(FIRST_ITEM_ID, n_items, T)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    targets = np.concatenate([items[1:], [0]])
    targets[offsets[1:] - 1] = 0  # no target after a sequence's last token
    ts = np.cumsum(np.round(rng.lognormal(math.log(600.0), 2.0, T)).astype(np.int64))
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))  # noqa: E731
    return JaggedBatch(item_ids=t(items), actions=t(rng.integers(0, N_ACTION_CODES, T)), timestamps=t(ts),
                       offsets=t(offsets), max_len=max_len, targets=t(targets))


def train_config(run: Run, impl: str, batch: int, recompute: bool):
    """The paper preset in bf16 (fp32 under an interpreter whose bf16 tl.dot is wrong: Run.no_bf16)."""
    from grlib.config import load_config

    precision = "fp32" if run.no_bf16 else "bf16"
    return load_config(TRAIN_SCALE, {"model.name": "hstu", "model.precision": precision, "model.attention_impl": impl,
                                     "model.recompute_layers": recompute, "train.batch_size": batch,
                                     **run.sizes.train_overrides})


def time_training(run: Run, impl: str, batch: int, recompute: bool, steps: int, warmup: int) -> dict:
    """Median step time (CUDA events around TrainStep) and FLOPs of `steps` steps after `warmup`."""
    import contextlib

    import torch

    from grlib import perf
    from grlib.model import build_model
    from grlib.negatives import build_negative_path
    from grlib.ops import registry
    from grlib.train.optim import Optimizers
    from grlib.train.step import TrainStep

    cfg, device = train_config(run, impl, batch, recompute), torch_device(run)
    timer = Timer(device)
    # the interpreter: the attention stays on Triton (named), every other op on its PyTorch reference
    scope = registry.preferring("reference") if device.type == "cpu" else contextlib.nullcontext()
    with scope:
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model, run.sizes.n_items, cfg.data.max_len, device=device)
        model.train()
        path = build_negative_path(cfg.negatives, run.sizes.n_items, seed=cfg.train.seed)
        step = TrainStep(model, path, Optimizers(model, cfg.train))
        times, flops, tokens, losses = [], [], [], []
        for i in range(warmup + steps):
            cpu_batch = train_batch(batch, cfg.data.max_len, run.sizes.n_items, seed=i)
            path.prepare(cpu_batch)  # the negatives, drawn ahead as async_sampling does (not timed)
            gpu_batch = cpu_batch.to(device)
            sync(device)
            out = {}
            ms = timer(lambda: out.setdefault("r", step(iter([gpu_batch]))))
            losses.append(out["r"].loss)
            if i >= warmup:
                times.append(ms)
                flops.append(perf.batch_flops(cpu_batch.offsets, cfg.model))
                tokens.append(cpu_batch.num_tokens)
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else math.nan
        from grlib.model import parameter_count

        count = parameter_count(model)
    if not all(math.isfinite(v) for v in losses):
        raise FloatingPointError(f"{impl}: a training loss is not finite: {losses}")
    return {"cfg": cfg, "times": times, "flops": flops, "tokens": tokens, "losses": losses, "peak_gb": peak,
            "params": count.total}


def train(run: Run) -> str:
    """The Triton model at the largest batch of sizes.batches that fits, then the padded reference
    (layers recomputed) at that batch, or the largest smaller one that fits."""
    import torch

    device = torch_device(run)
    sizes = run.sizes
    rows, fitted, notes = [], None, []
    try:
        for impl, recompute in (("triton", False), ("reference", True)):
            done = False
            for batch in (sizes.batches if fitted is None else [b for b in sizes.batches if b <= fitted]):
                t = None
                try:
                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats(device)
                    t = time_training(run, impl, batch, recompute, sizes.steps, sizes.train_warmup)
                except torch.OutOfMemoryError:
                    pass
                if t is None:  # freed here, not inside `except` (its traceback holds the model)
                    print(f"  {impl}: batch {batch} does not fit", flush=True)
                    free_memory()
                    continue
                fitted, done = fitted or batch, True
                rows.append(_train_row(run, impl, batch, recompute, t))
                r = rows[-1]
                print(f"  {impl:9s} batch {batch:2d}{' (layers recomputed)' if recompute else ''}: "
                      f"step {r['step_ms']:.1f} ms "
                      f"(median of {sizes.steps}), {r['tokens_per_step']} tokens, peak memory {t['peak_gb']:.1f} GiB, "
                      f"losses {', '.join(f'{v:.3f}' for v in t['losses'])}", flush=True)
                free_memory()
                break
            if fitted is None:
                raise RuntimeError(f"no batch of {sizes.batches} fits with the {impl} attention")
            if not done:
                notes.append(f"the {impl} attention fits no batch up to {fitted}: no baseline row")
        notes += _same_loss(run, rows)
    finally:
        run.rows += rows
    return "; ".join([f"{len(rows)} rows, batch {fitted}"] + notes)


LOSS_TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}  # relative, first step: the same model, data and dropout


def _same_loss(run: Run, rows: list[dict]) -> list[str]:
    """The first step's loss of the Triton model against the padded reference's at the same batch
    (same initialisation, data and dropout words): a check; AssertionError when they differ."""
    tri = next((r for r in rows if r["attention_impl"] == "triton"), None)
    ref = next((r for r in rows if r["attention_impl"] == "reference" and tri and r["batch"] == tri["batch"]), None)
    if ref is None:
        return ["no reference row at the Triton row's batch: first losses not compared"]
    a, b = tri["first_loss"], ref["first_loss"]
    tol = LOSS_TOLERANCE[tri["precision"]]
    ok = abs(a - b) <= tol * abs(b)
    run.checks.append({"case": "train", "dtype": tri["precision"], "tensor": "first loss", "triton": a, "reference": b,
                       "err_triton": abs(a - b) / abs(b), "tolerance": tol, "ok": ok})
    print(f"  first step's loss: triton {a:.5f}, reference {b:.5f} (relative difference {abs(a - b) / abs(b):.1e}, "
          f"tolerance {tol:g}) {'ok' if ok else 'MISMATCH'}", flush=True)
    if not ok:
        raise AssertionError(f"the Triton model's first loss {a} differs from the padded reference's {b}")
    return [f"first losses agree within {tol:g}"]


def _train_row(run: Run, impl: str, batch: int, recompute: bool, t: dict) -> dict:
    import torch

    from grlib import hardware, ops

    cfg, device = t["cfg"], torch_device(run)
    step_s = statistics.median(t["times"]) / 1e3
    flops = statistics.mean(t["flops"])
    nominal, how = nominal_flops(hardware, "bfloat16", device)
    return {"table": "bench_train", "params_hash": cfg.params_hash(), "attention_impl": impl, "compiled": False,
            "auto": ops.choose("hstu_attention", device) == impl, "precision": cfg.model.precision,
            "isa": "interpret" if run.interpret else "cuda", "cpu_model": run.versions.get("cpu", ""),
            "device": run.device, "gemm_limit": "none", "d_model": cfg.model.d_model, "n_layers": cfg.model.n_layers,
            "n_heads": cfg.model.n_heads, "batch": batch, "max_len": cfg.data.max_len, "params": t["params"],
            "tokens_per_step": int(statistics.mean(t["tokens"])),
            "real_fraction": statistics.mean(t["tokens"]) / (batch * cfg.data.max_len), "flops_per_step": flops,
            "step_ms": step_s * 1e3, "steps": len(t["times"]),
            "tokens_per_s": sum(t["tokens"]) / (sum(t["times"]) / 1e3), "peak_dtype": "bfloat16",
            "nominal_peak_dtype": "bfloat16", "nominal_peak_flops": nominal, "nominal_peak_how": how,
            "precision_note": run.no_bf16,
            "mfu_nominal": flops / step_s / nominal if nominal == nominal else math.nan,
            "recompute_layers": recompute, "peak_gpu_mem_gb": t["peak_gb"], "threads": torch.get_num_threads(),
            "timing": "CUDA events" if device.type == "cuda" else "wall clock", "first_loss": t["losses"][0],
            "final_loss": t["losses"][-1],
            "load_1m": os.getloadavg()[0], "step_s_all": [v / 1e3 for v in t["times"]]}
