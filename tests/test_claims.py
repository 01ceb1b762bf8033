"""The claims registry (grlib.experiments.claims) and the report over it: every claim at every
scale in the tables, and every verdict's threshold read from the registry."""
from __future__ import annotations

import dataclasses
import importlib
import math

import polars as pl
import pytest

from grlib import results
from grlib.config import NegativesAblation, load_ablation, load_config
from grlib.experiments import claims, kernels_stage, report
from grlib.experiments.claims import Bound, Figure
from grlib.experiments import negatives_stage as ablation
from grlib.experiments.negatives_stage import Variant

PAPER = {"C1.speedup": Figure(2.2, "x"), "C1.memory": Figure(70, "%"), "C2.before": Figure(47, "%"),
         "C2.after": Figure(2.4, "%"), "C3.all_to_all": Figure(-75.9, "%"), "C5.utilisation": Figure(94, "%"),
         "C7.mfu": Figure(54.71, "%"), "C7.scaling": Figure(0.97, "ratio")}  # the paper's figures (DESIGN table)
NOT_YET: tuple[str, ...] = ()  # claims with no measured or modelled figure yet


def test_registry_covers_c1_to_c7_once_with_units():
    ids = list(claims.CLAIMS)
    assert [i for i in ids if i.startswith("C")] == [f"C{i}" for i in range(1, 8)]
    assert all(i.startswith("W") for i in ids if not i.startswith("C"))  # the workbench's own targets
    with pytest.raises(ValueError, match="'C1' registered twice"):
        claims.index((claims.CLAIMS["C1"], claims.CLAIMS["C1"]), "id")
    for cid in ids:
        assert claims.targets_of(cid), f"{cid} has no target"
    assert {t.claim for t in claims.TARGETS.values()} == set(ids)
    assert {k: t.paper for k, t in claims.TARGETS.items() if isinstance(t.paper, Figure)} == PAPER
    for t in claims.TARGETS.values():
        assert t.paper is None or isinstance(t.paper, (Figure, str))
        for b in t.bounds:
            assert b.limit.unit in ("x", "%", "ratio") and b.op in (">=", "<=", ">", "<")
        if t.method.kind == "not measured yet":
            assert t.table is None and t.check is None
        else:  # a table and an importable function compute ours
            module, _, name = t.check.rpartition(".")
            assert t.table and callable(getattr(importlib.import_module(module), name))
    assert all(t.method.kind == "not measured yet" for c in NOT_YET for t in claims.targets_of(c))
    assert {t.method.kind for t in claims.targets_of("C7")} == {"measured", "modelled"}  # MFU and 1 -> 2; scaling


def test_figures_and_bounds_compare_percent_as_fractions():
    assert (Figure(70, "%").number, str(Figure(70, "%")), Figure.of(0.973, "%").short()) == (0.7, "70%", "97.3%")
    assert str(Figure(2.2, "x")) == "2.2x" and Figure.of(116.3, "x").short() == "116x"
    assert str(Figure(0.97, "ratio")) == "0.97" and str(Figure(-75.9, "%")) == "-75.9%"
    b = Bound("memory", "<=", Figure(55, "%"))
    assert b.holds(0.55) and not b.holds(0.56) and not b.holds(math.nan) and str(b) == "memory <= 55%"
    assert claims.target("C1.speedup").met(2.2) and not claims.target("C1.speedup").met(2.19)
    with pytest.raises(ValueError, match="2 bounds"):
        claims.target("C6.half").met(0.5)
    with pytest.raises(KeyError, match="unknown claim target 'C9.x'"):
        claims.target("C9.x")


# ---------------------------------------------------------------------------------------------
# synthetic result rows

def _kernel_rows(speedup: float, mem_reduction: float) -> list[dict]:
    base = {"op": "hstu_attention", "whole_batch": False, "regime": "scaled", "max_len": 1024, "batch": 8,
            "tokens": 100, "fill": 0.1, "fwd_ms": 1.0, "peak_mem_mb": 1.0, "gflops": 1.0, "frac_of_peak": 0.1}
    return [dict(base, impl="reference", fwd_bwd_ms=10.0, speedup_vs_reference=1.0, mem_reduction_vs_reference=0.0),
            dict(base, impl="cpu", fwd_bwd_ms=10.0 / speedup, speedup_vs_reference=speedup,
                 mem_reduction_vs_reference=mem_reduction),
            dict(base, impl="fbgemm", fwd_bwd_ms=12.0, speedup_vs_reference=10 / 12, mem_reduction_vs_reference=0.1)]


def _neg(variant: Variant, step_ms: float, mb: float, ndcg: float, negatives_ratio: float = 1.0) -> dict:
    return {"dataset": "synthetic", "variant": variant.name, "sharing": variant.sharing,
            "n_negatives": variant.n_negatives, "precision": variant.precision, "sampling": variant.sampling,
            "sampler": variant.sampler, "baseline": variant.baseline, "quality_seeds": "0", "step_ms": step_ms,
            "neg_path_mb": mb, "ndcg@10": ndcg, "step_ratio": step_ms / 100, "negatives_ratio": negatives_ratio}


def _negative_rows(ab: NegativesAblation) -> list[dict]:
    R, S, A, smp = ab.baseline_negatives, ab.precision_shared_size, ab.async_shared_size, ab.async_sampler
    rows = [_neg(Variant("per-token", R, baseline=True), 100, 80, 0.1),
            _neg(Variant("shared", 512), 90, 10, 0.1, negatives_ratio=4.0),
            _neg(Variant("shared", S), 110, 12, 0.1, negatives_ratio=16.0),
            _neg(Variant("per-token", R, ab.half_formats[0]), 95, 43, 0.1005),
            _neg(Variant("shared", S, ab.half_formats[0]), 100, 6, 0.1)]
    for sharing, r in (("per-token", R), ("shared", A)):
        rows += [_neg(Variant(sharing, r, sampler=smp, sampling=m), ms, 80, math.nan)
                 for m, ms in (("sync", 104), ("presampled", 100), ("async", 103))]
    return rows


def _balance_rows(before: float, after: float, sliced_random: float, sliced_lpt: float) -> list[dict]:
    fit = {"c0": 1e-5, "a": 2e-5, "b": 2e-8, "r2": 0.998}
    cell = {"part": "simulated", "ranks": 64, "users_per_rank": 32, "max_len": 16384}
    return [{"part": "calibrate", "length": 16, "seconds_per_sequence": 1e-4, "residual": 0.01, **fit},
            {**cell, "method": "random", "imbalance_model_median": before, "imbalance_noisy_median": before, **fit},
            {**cell, "method": "kk", "imbalance_model_median": after, "imbalance_noisy_median": 0.05, **fit},
            {**cell, "method": "lpt", "imbalance_model_median": 2 * after, "imbalance_noisy_median": 0.05, **fit},
            {"part": "time-sliced", "method": "random", "ranks": 8, "imbalance_measured": sliced_random, **fit},
            {"part": "time-sliced", "method": "lpt", "ranks": 8, "imbalance_measured": sliced_lpt, **fit}]


def _sparse_rows(cut: float, cut_dedup: float, gloo_error: float, hier_inter: int) -> list[dict]:
    model = {"part": "model", "cluster": "gpu-8", "devices_per_node": 8, "bytes_per_peer": 2.0**20, "dedup_rank": 0.5,
             "dedup": 0.2, "tokens_per_rank": 123_890.0, "d_model": 1536, "users_per_rank": 32, "max_len": 4096}
    rows = [{**model, "ranks": P, "nodes": P // 8, "dedup_source": source, "cut": cut, "cut_node_vs_rank": cd}
            for P in (64, 512, 1536) for source, cd in (("twin", cut_dedup), ("zipf-kuairand", cut_dedup / 2))]
    rows += [{"part": "gloo", "ranks": 2, "nodes": 1, "bytes_per_peer": float(m), "error": e, "alpha_s": 1e-4,
              "beta_s_per_byte": 5e-10, "load_before": 1.0, "load_after": 1.5, "cpus": 2}
             for m, e in ((65536, gloo_error), (4 * 2**20, -gloo_error / 2))]
    counted = {("flat", "none"): 1000, ("flat", "rank"): 600, ("hierarchical", "rank"): hier_inter,
               ("hierarchical", "node"): 480}
    rows += [{"part": "counters", "ranks": 4, "nodes": 2, "rank": r, "mode": mode, "dedup_by": dedup, "ids": 10,
              "inter_bytes": b // 4, "inter_bytes_expected_total": b, "rows_equal": True}
             for (mode, dedup), b in counted.items() for r in range(4)]
    return rows


NO_BF16 = {"cpu_model": "AMD EPYC", "cpu_id": "AuthenticAMD family 0x19 model 0x1", "cpu_bf16_units": "none"}  # Zen 3
AMX = {"cpu_model": "Intel(R) Xeon(R) Processor", "cpu_id": "GenuineIntel family 0x6 model 0xa7",
       "cpu_bf16_units": "avx512_bf16 amx_bf16"}
ZEN4 = {"cpu_model": "AMD EPYC", "cpu_id": "AuthenticAMD family 0x19 model 0x11", "cpu_bf16_units": "avx512_bf16"}


def _bench_train_rows(layers: int, mfu: float, nominal: float | None = None, cpu: dict | None = NO_BF16) -> list[dict]:
    """Rows of one bench train run on `cpu` (its columns; None: rows from before them); with `nominal`,
    also the MFU over a nominal peak 1.2x the measured one."""
    shape = {"d_model": 256, "n_layers": layers, "n_heads": 2, "batch": 64, "max_len": 128, "params": 2_014_848,
             "peak_flops": 3.6e11, **(cpu or {})}
    if nominal is not None:
        shape["nominal_peak_flops"] = 4.32e11
    extra = (lambda m: {"mfu_nominal": m / 1.2, "gemm_bound_ms": 120.0, "mfu_gemm_bound": 0.694}) \
        if nominal is not None else (lambda m: {})
    return [dict(shape, attention_impl="reference", auto=False, step_ms=400.0, mfu=0.189, **extra(0.189)),
            dict(shape, attention_impl="cpu", auto=True, step_ms=250.0, mfu=mfu, **extra(mfu))]


def _train_rows(hstu: float, pop: float) -> list[dict]:
    row = {"dataset": "synthetic", "test_hr@10": 0.3, "test_mrr": 0.1, "params": 10, "tokens_per_s": 1.0}
    return [dict(row, model=m, seed=s, **{"test_ndcg@10": v}) for m, v in (("hstu", hstu), ("popularity", pop))
            for s in (0, 1)]


# ---------------------------------------------------------------------------------------------
# the report over two scales


def test_report_shows_every_claim_at_every_scale(isolated_outputs):
    smoke, laptop = load_config("smoke"), load_config("laptop")
    results.append_rows("kernels", _kernel_rows(3.0, 0.9), smoke)
    results.append_rows("negatives", _negative_rows(load_ablation("negatives")), smoke)
    results.append_rows("train", _train_rows(0.2, 0.1), smoke)
    results.append_rows("balance", _balance_rows(0.47, 0.0004, 0.60, 0.10), smoke)
    results.append_rows("sparse", _sparse_rows(0.2, 0.8, 0.1, 600), smoke)
    results.append_rows("bench_train", _bench_train_rows(2, 0.333, nominal=True), laptop)
    results.append_rows("bench_train", _bench_train_rows(1, 0.258, cpu=None), laptop)  # a row before the CPU columns
    assert report.scales() == ["smoke", "laptop"]

    table = report.claims_all()
    for scale in ("smoke", "laptop"):
        at = table.filter(pl.col("scale") == scale)
        assert set(at["target"]) == set(claims.TARGETS)  # none silently absent
        not_yet = at.filter(pl.col("claim").str.slice(0, 2).is_in(NOT_YET))
        assert not_yet.height == sum(len(claims.targets_of(c)) for c in NOT_YET)
        assert set(not_yet["verdict"]) <= {"not measured yet"} and not_yet["met"].is_null().all()
        scaling = at.filter(pl.col("target") == "C7.scaling").row(0, named=True)
        assert (scaling["paper"], scaling["verdict"]) == ("0.97", "not measured yet")
    assert table["target"].to_list()[:2] == ["C1.speedup", "C1.speedup"]  # grouped by target, scales side by side

    smoke_rows = table.filter(pl.col("scale") == "smoke")
    speed = smoke_rows.filter(pl.col("target") == "C1.speedup").row(0, named=True)
    assert (speed["paper"], speed["ours"], speed["verdict"]) == ("2.2x", "3x", "met")
    assert speed["obtained"].startswith("measured: kernels run ")
    assert smoke_rows.filter(pl.col("target") == "C1.vs_fbgemm")["ours"].to_list() == ["3.6x"]
    c6 = {r["target"]: r for r in smoke_rows.filter(pl.col("claim").str.starts_with("C6")).iter_rows(named=True)}
    assert c6["C6.sharing"]["ours"] == "16.0x negatives, 1.10x step" and c6["C6.sharing"]["verdict"] == "met"
    assert smoke_rows.filter(pl.col("target") == "W1.quality")["ours"].to_list() == ["2.00x (0.2000, 2 seeds)"]
    c2 = {r["target"]: r for r in smoke_rows.filter(pl.col("claim").str.starts_with("C2")).iter_rows(named=True)}
    assert (c2["C2.before"]["ours"], c2["C2.before"]["verdict"]) == ("47%", "(no threshold)")
    assert (c2["C2.after"]["ours"], c2["C2.after"]["verdict"]) == ("0.04%", "met")
    assert c2["C2.after"]["obtained"].startswith("modelled: balance run ") and "kk" in c2["C2.after"]["check"]
    assert (c2["C2.measured"]["ours"], c2["C2.measured"]["verdict"]) == ("0.167", "met")
    assert c2["C2.measured"]["obtained"].startswith("measured: balance run ")
    c3 = smoke_rows.filter(pl.col("claim").str.starts_with("C3"))
    a2a = c3.filter(pl.col("target") == "C3.all_to_all")
    assert a2a["ours"].to_list() == ["-20%", "-80%"] * 3 and a2a["verdict"].to_list() == ["not met", "met"] * 3
    assert set(a2a["paper"]) == {"-75.9%"} and all(o.startswith("modelled: sparse run ") for o in a2a["obtained"])
    assert "1536 ranks = 192 nodes x 8" in a2a["check"][-1] and "123,890 tokens x d 1536" in a2a["obtained"][0]
    c3 = {r["target"]: r for r in c3.filter(pl.col("target") != "C3.all_to_all").iter_rows(named=True)}
    assert (c3["C3.gloo_fit"]["ours"], c3["C3.gloo_fit"]["verdict"]) == ("10%", "met")
    assert c3["C3.gloo_fit"]["obtained"].startswith("measured: sparse run ")
    assert "load 1.5 on 2 CPUs" in c3["C3.gloo_fit"]["check"]
    assert (c3["C3.inter_bytes"]["ours"], c3["C3.inter_bytes"]["verdict"]) == ("0%", "met")
    assert (c3["C3.dedup"]["ours"], c3["C3.dedup"]["verdict"]) == ("0.8", "(no threshold)")
    no_mfu = smoke_rows.filter(pl.col("target") == "C7.mfu").row(0, named=True)
    assert no_mfu["verdict"] == "not measured yet" and "no bench_train rows at smoke" in no_mfu["obtained"]

    lap = table.filter(pl.col("scale") == "laptop")
    assert lap.filter(pl.col("target") == "C2.after")["obtained"].to_list() == [
        "not measured yet: no balance rows at laptop"]
    assert lap.filter(pl.col("target") == "C3.all_to_all")["obtained"].to_list() == [
        "not measured yet: no sparse rows at laptop"]
    assert lap.filter(pl.col("target") == "C1.speedup")["obtained"].to_list() == [
        "not measured yet: no kernels rows at laptop"]
    mfu = lap.filter(pl.col("target") == "C7.mfu")
    # the laptop preset (2 layers) first; the verdict reads the nominal peak's MFU (the paper's convention),
    # the measured GEMM peak's beside it; a row without a nominal peak says so and reads the measured one;
    # fp32 judges on a CPU without bf16 units; a row that records no CPU (nor its bf16 units) judges nothing
    assert mfu["ours"].to_list() == ["27.8% (fp32)", "25.8% (fp32)"]
    assert mfu["verdict"].to_list() == ["not met", report.UNITS_UNKNOWN] and set(mfu["paper"]) == {"54.71%"}
    assert mfu["met"].to_list() == [False, None]
    assert "judged in fp32: this CPU has no bf16 units" in mfu["obtained"][0]
    assert "(preset)" in mfu["check"][0] and "(preset)" not in mfu["check"][1]
    assert ("250.0 ms/step; of the nominal fp32 peak 432 GFLOP/s; 33.3% of the fp32 GEMM peak measured in the run "
            "(360 GFLOP/s); padded reference 15.8%; GEMMs alone 120 ms of the step: 69.4% of the measured peak "
            "if nothing else took time") in mfu["obtained"][0]
    assert "(360 GFLOP/s; the row records no nominal peak); padded reference 18.9%" in mfu["obtained"][1]
    assert "GEMMs alone" not in mfu["obtained"][1]  # rows from before the bound

    md = report.render_all()
    assert "| scale | claim |" in md and "| laptop | C7 end to end" in md and "| smoke | C2 " in md

    laptop_md = report.summary_path("laptop")
    laptop_md.parent.mkdir(parents=True, exist_ok=True)
    laptop_md.write_text("# Summary (laptop)\n")
    out = report.run("smoke")
    text = out["markdown"].read_text()
    assert out["markdown"] == report.summary_path("smoke") and laptop_md.read_text() == "# Summary (laptop)\n"
    for t in claims.TARGETS.values():  # every claim in the scale's summary, with its paper figure
        assert f"| {t.claim} {claims.CLAIMS[t.claim].title} |" in text and f"| {t.paper_text} |" in text
    assert text.count("| not measured yet |") >= len(NOT_YET) + 2  # + C7 scaling, C7 MFU (no smoke rows)
    assert report.MFU_NOTE in text  # how C7's MFU verdict reads the precisions


# ---------------------------------------------------------------------------------------------
# the thresholds of kernels_stage, the negatives ablation and the report come from the registry


def _with_bound(monkeypatch, key: str, name: str, limit: Figure) -> None:
    t = claims.target(key)
    bounds = tuple(dataclasses.replace(b, limit=limit) if b.name == name else b for b in t.bounds)
    monkeypatch.setitem(claims.TARGETS, key, dataclasses.replace(t, bounds=bounds))


def test_kernels_acceptance_reads_the_registry(monkeypatch):
    df = pl.DataFrame(_kernel_rows(3.0, 0.72))
    met = lambda: dict(zip(kernels_stage.acceptance(df)["target"], kernels_stage.acceptance(df)["met"]))  # noqa: E731
    assert met() == {"C1.speedup": True, "C1.memory": True, "C1.vs_fbgemm": True}
    _with_bound(monkeypatch, "C1.speedup", "speedup vs reference", Figure(3.5, "x"))
    _with_bound(monkeypatch, "C1.memory", "peak-memory reduction vs reference", Figure(75, "%"))
    _with_bound(monkeypatch, "C1.vs_fbgemm", "fbgemm time / cpu time", Figure(4, "x"))
    assert met() == {"C1.speedup": False, "C1.memory": False, "C1.vs_fbgemm": False}
    assert "speedup vs reference >= 3.5x" in kernels_stage.acceptance(df)["check"][0]


def test_negatives_acceptance_reads_the_registry(monkeypatch):
    ab = load_ablation("negatives")
    rows = _negative_rows(ab)
    verdicts = lambda: {(c["target"], c["row"]): c["met"] for c in ablation.acceptance(rows, ab)}  # noqa: E731
    S, smp = ab.precision_shared_size, ab.async_sampler
    half = Variant("per-token", ab.baseline_negatives, ab.half_formats[0]).name
    before = verdicts()
    assert before[("C6.sharing", f"shared R={S} fp32 sync")] and before[("C6.half", half)]
    assert before[("C6.async", f"per-token R={ab.baseline_negatives} fp32 async {smp}")]
    _with_bound(monkeypatch, "C6.sharing", "negatives vs per-token", Figure(4, "x"))  # now the 512 pool qualifies
    _with_bound(monkeypatch, "C6.half", "memory vs fp32", Figure(50, "%"))  # 43 / 80 = 53.75%
    _with_bound(monkeypatch, "C6.async", "step time vs pre-sampled", Figure(1.02, "x"))  # 103 / 100
    after = verdicts()
    assert after[("C6.sharing", "shared R=512 fp32 sync")] and ("C6.sharing", f"shared R={S} fp32 sync") not in after
    assert not after[("C6.half", half)]
    assert not after[("C6.async", f"per-token R={ab.baseline_negatives} fp32 async {smp}")]


def test_report_verdicts_read_the_registry(isolated_outputs, monkeypatch):
    cfg = load_config("smoke")
    results.append_rows("train", _train_rows(0.2, 0.1), cfg)
    results.append_rows("bench_train", _bench_train_rows(2, 0.333), cfg)
    verdict = lambda key: report.claims("smoke").filter(pl.col("target") == key)["met"].to_list()  # noqa: E731
    assert verdict("W1.quality") == [True] and verdict("C7.mfu") == [False]
    _with_bound(monkeypatch, "W1.quality", "NDCG@10 vs popularity", Figure(2.5, "x"))
    _with_bound(monkeypatch, "C7.mfu", "MFU", Figure(30, "%"))
    assert verdict("W1.quality") == [False] and verdict("C7.mfu") == [True]


def _bf16_rows(mfu: float, cpu: dict) -> list[dict]:
    return [dict(r, precision="bf16", peak_flops=8.4e11, nominal_peak_flops=9.2e11)
            for r in _bench_train_rows(2, mfu, nominal=True, cpu=cpu)]


def test_c7_mfu_judges_in_bf16_where_the_cpu_has_bf16_units(isolated_outputs):
    """C7's MFU is the paper's half-precision figure: on a CPU with bf16 units its bf16 row judges
    (against the bf16 nominal peak, the measured bf16 GEMM peak beside it) and its fp32 rows are
    context, even above 54.71%; such a CPU without a bf16 row reads "not measured in bf16"; a CPU
    without bf16 units judges in fp32; each CPU's rows stand apart, the newest CPU first."""
    cfg = load_config("laptop")
    results.append_rows("bench_train", _bench_train_rows(2, 0.9, nominal=True, cpu=ZEN4), cfg)  # 75% nominal, fp32
    results.append_rows("bench_train", _bench_train_rows(2, 0.9, nominal=True, cpu=AMX), cfg)
    results.append_rows("bench_train", _bf16_rows(0.21, AMX), cfg)  # 17.5% of the bf16 nominal
    results.append_rows("bench_train", _bench_train_rows(2, 0.9, nominal=True), cfg)  # Zen 3: fp32 only
    mfu = report.claims("laptop").filter(pl.col("target") == "C7.mfu")
    cpu = pl.col("check").str.extract(r"(family 0x[0-9a-f]+ model 0x[0-9a-f]+)", 1)
    per_cpu = {c: list(zip(g["ours"], g["verdict"], g["met"]))  # each CPU's rows together, in order
               for (c,), g in mfu.with_columns(cpu.alias("cpu")).group_by("cpu", maintain_order=True)}
    assert per_cpu == {
        "family 0x19 model 0x1": [("75% (fp32)", "met", True)],  # Zen 3: no bf16 units, fp32 judges
        "family 0x6 model 0xa7": [("17.5% (bf16)", "not met", False), ("75% (fp32)", report.BF16_CONTEXT, None)],
        "family 0x19 model 0x11": [("—", report.NOT_IN_BF16, None), ("75% (fp32)", report.BF16_CONTEXT, None)]}
    order = ["family 0x19 model 0x1", "family 0x6 model 0xa7", "family 0x19 model 0x11"]  # Zen 3, the Xeon, Zen 4
    mfu = mfu.sort(cpu.replace_strict(order, range(3)), maintain_order=True)
    checks, obtained = mfu["check"].to_list(), mfu["obtained"].to_list()
    assert checks[0].startswith("fp32 · HSTU 2x2 d=256") and "family 0x19 model 0x1), bf16 units: none" in checks[0]
    assert checks[1].startswith("bf16 · HSTU 2x2 d=256") and "(preset)" in checks[1]
    assert "Intel(R) Xeon(R) Processor (family 0x6 model 0xa7), bf16 units: avx512_bf16 amx_bf16" in checks[1]
    assert "of the nominal bf16 peak 920 GFLOP/s; 21% of the bf16 GEMM peak measured in the run (840 GFLOP/s)" \
        in obtained[1]
    assert "this CPU has bf16 units, so its bf16 rows judge" in obtained[2]
    assert checks[3].startswith("bf16 · AMD EPYC (family 0x19 model 0x11), bf16 units: avx512_bf16")
    assert obtained[3].startswith("not measured in bf16: no `bench train --precision bf16` row of this CPU")
    assert "its bf16 row would judge (none yet)" in obtained[4]


def test_c7_mfu_names_the_device_of_an_imported_device_check_row(isolated_outputs):
    """A device check's bench_train rows (python -m grlib import-rows) ran on a GPU: the row names the
    device, not the CPU of the machine that hosted it."""
    cfg = load_config("laptop")
    gpu = dict(AMX, device="NVIDIA H100 80GB HBM3", cpu_model="AMD EPYC 9654", cpu_bf16_units=None)
    results.append_rows("bench_train", [dict(r, isa="cuda") for r in _bf16_rows(0.5, gpu)], cfg)
    checks = report.claims("laptop").filter(pl.col("target") == "C7.mfu")["check"].to_list()
    assert checks and all("NVIDIA H100 80GB HBM3" in c and "EPYC" not in c for c in checks), checks


def test_c7_mfu_reads_the_cpu_of_older_rows_from_their_nominal_peak(isolated_outputs):
    """Rows from before cpu_id / cpu_bf16_units: the CPU and its bf16 flag from nominal_peak_how (a
    path below avx512 leaves the flags out: its "no bf16 instructions" says nothing), grouped with the
    same CPU's newer rows; a row that records no CPU stands only where no known CPU's row has its key."""
    cfg = load_config("laptop")
    how = ("2 cores x 64 FLOP/cycle (avx512f ...; bf16: {}) [probe: 64.0 FLOP/cycle] x 2.27 GHz; "
           "CPU 'Intel(R) Xeon(R) Processor' family 0x6 model 0xa7; grlib._C path {}")
    old = [dict(r, nominal_peak_how=how.format("amx_bf16: 1024 bf16 FLOP per cycle per core (Intel AMX)", "avx512"))
           for r in _bench_train_rows(2, 0.5, nominal=True, cpu=None)]
    avx2 = [dict(r, isa="avx2", nominal_peak_how=how.format("no bf16 instructions: bf16 computes in fp32", "avx2"))
            for r in _bench_train_rows(1, 0.5, nominal=True, cpu=None)]
    results.append_rows("bench_train", _bench_train_rows(2, 0.4, nominal=True, cpu=None), cfg)  # no CPU: superseded
    results.append_rows("bench_train", old + avx2, cfg)
    results.append_rows("bench_train", _bf16_rows(0.3, AMX), cfg)  # a new row of the same CPU
    mfu = report.claims("laptop").filter(pl.col("target") == "C7.mfu")
    assert list(zip(mfu["ours"], mfu["verdict"])) == [("25% (bf16)", "not met"), ("41.7% (fp32)", report.BF16_CONTEXT),
                                                      ("41.7% (fp32)", report.BF16_CONTEXT)]
    assert all("Intel(R) Xeon(R) Processor (family 0x6 model 0xa7)" in c for c in mfu["check"])
    assert "the avx2 path" in mfu["check"][2]
    # the same CPU's rows alone, without the bf16 row: the flag still comes from the avx512 row's peak
    units = report._with_cpu(pl.DataFrame(old + avx2).with_columns(pl.lit("fp32").alias("precision")))["bf16_units"]
    assert units.to_list() == ["amx_bf16"] * 4
    alone = report._with_cpu(pl.DataFrame(avx2).with_columns(pl.lit("fp32").alias("precision")))["bf16_units"]
    assert alone.to_list() == [None, None]


def _scaling_rows(error: float) -> list[dict]:
    sim = {"part": "simulated", "regime": "truncated", "ranks": 1536, "max_len": 4096, "users_per_rank": 32,
           "device": "h100-bf16", "peak_tflops": 989.4, "efficiency": 0.8, "preset": "gpu-8", "intra_gb_s": 450.0,
           "inter_gb_s": 50.0, "items": "hierarchical", "exposed_comm_ms": 70.0, "step_ms": 340.0}
    return [{"part": "sim-validation", "schedule": "semisync", "predicted_step_ms": 100 * (1 + error),
             "measured_step_ms": 100.0, "error": error, "abs_error": abs(error), "predicted_step_ms_raw": 90.0,
             "measured_step_ms_raw": 150.0, "error_raw": -0.4, "rq_wait_ms": 50.0},
            {**sim, "config": "turbogr", "utilisation": 0.80, "linearity": 0.81, "balance": "kk", "schedule": "semisync",
             "staleness": 1},
            {**sim, "config": "baseline", "utilisation": 0.70, "linearity": 0.69, "balance": "random", "schedule": "sync",
             "staleness": 0},
            {"part": "measured-schedule", "schedule": "semisync", "utilisation": 0.8, "utilisation_rank0": 0.8,
             "utilisation_rank1": 0.8, "step_ms": 300.0, "utilisation_dedicated": 0.85, "step_ms_dedicated": 150.0},
            {"part": "measured-scaling", "processes": 2, "schedule": "semisync", "efficiency": 0.5,
             "tokens_per_s_per_rank": 1000.0, "efficiency_dedicated": 0.85}]


def test_report_reads_the_scaling_stage(isolated_outputs):
    results.append_rows("scaling", _scaling_rows(-0.05), load_config("smoke"))
    rows = {(r["target"], r["check"].split(" ")[0]): r for r in report.claims("smoke").iter_rows(named=True)}
    valid = rows[("C5.validation", "semisync:")]
    assert (valid["ours"], valid["verdict"]) == ("5%", "met") and valid["obtained"].startswith("modelled: scaling run ")
    c5 = rows[("C5.utilisation", "turbogr")]
    assert (c5["ours"], c5["verdict"], c5["paper"]) == ("80%", "not met", "94%") and "counts" in c5["check"]
    assert rows[("C5.utilisation", "baseline")]["verdict"] == "(no threshold)"
    assert (rows[("C7.scaling", "turbogr")]["ours"], rows[("C7.scaling", "turbogr")]["paper"]) == ("0.81", "0.97")
    assert rows[("C7.measured", "semisync:")]["obtained"].startswith("measured: scaling run ")
    assert rows[("C5.measured", "semisync:")]["verdict"] == "not met"
