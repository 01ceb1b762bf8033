"""`python -m grlib train` on real MovieLens-100K and on the smoke twin; `bench train` at smoke."""
from __future__ import annotations

import json
import re

import polars as pl
import pytest

from grlib import perf
from grlib.cli import main
from grlib.hardware import isa


def test_train_cli_popularity_and_hstu_on_ml100k(real_data, isolated_outputs, capsys):
    out = isolated_outputs / "pop.json"
    assert main(["train", "--scale", "smoke", "--dataset", "ml-100k", "--model", "popularity", "--json", str(out)]) == 0
    pop = json.loads(out.read_text())
    assert pop["dataset"] == "ml-100k" and pop["mask_history"] and pop["test_users"] == 943
    out = isolated_outputs / "hstu.json"
    assert main(["train", "--scale", "smoke", "--dataset", "ml-100k", "--model", "hstu", "--max-steps", "3",
                 "--json", str(out)]) == 0
    hstu = json.loads(out.read_text())
    for key in ("ndcg@10", "hr@10", "mrr", "params", "tokens_per_s", "mfu"):
        assert key in hstu
    assert hstu["steps"] == 3 and hstu["params"] > 0 and 0 < hstu["mfu"] < 1
    assert "model=hstu" in capsys.readouterr().out


def test_train_cli_bad_override_names_the_field(isolated_outputs, capsys):
    assert main(["train", "--scale", "smoke", "-o", "model.d_model=30", "-o", "model.n_heads=4"]) == 2
    assert "model.d_model: 30 is not divisible" in capsys.readouterr().err


def test_bench_train_smoke(isolated_outputs, capsys):
    out = isolated_outputs / "bench.json"
    assert main(["bench", "train", "--scale", "smoke", "--steps", "2", "--warmup", "1", "--impls",
                 "reference,cpu,loop", "--top", "4", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["attention_impl"], r["compiled"]) for r in rows] == [("reference", False), ("cpu", False),
                                                                     ("loop", False), ("reference", True)]
    assert sum(r["auto"] for r in rows) == 1 and rows[-1]["compile_s"] > 0  # compile time reported apart
    assert "top 4 ops by self CPU time" in capsys.readouterr().out
    for r in rows:
        for key in ("mfu", "tokens_per_s", "step_ms", "flops_per_step", "peak_flops"):
            assert r[key] > 0, key
        assert r["peak_flops"] >= max(r["peak_before"], r["peak_after"])
        # the loss's logit products (2 P R d, x3) are reported apart from the HSTU-formula MFU
        assert r["loss_flops_per_step"] > 0
        assert r["mfu_with_loss"] == pytest.approx(r["mfu"] * (1 + r["loss_flops_per_step"] / r["flops_per_step"]))
        # MFU two ways: against the GEMM peak measured in the run and against the nominal peak
        assert r["nominal_peak_flops"] > 0 and "FLOP/cycle" in r["nominal_peak_how"]
        assert r["mfu_nominal"] == pytest.approx(r["mfu"] * r["peak_flops"] / r["nominal_peak_flops"])
        assert r["peak_flops"] == max(r[f"peak_{lib}"] for lib in perf.gemm_libraries())
        assert r["load_1m"] >= 0 and r["step_cpu_ms"] > 0 and r["mfu_on_cpu"] > 0
        # the GEMM-only bound: projections (2 T d 5d, x3) at the measured projection rate, the loss at the peak
        d, T, peak = r["d_model"], r["tokens_per_step"], r["peak_flops"]
        gemm_s = 30 * r["n_layers"] * T * d * d / (r["gemm_share_of_peak"] * peak) + r["loss_flops_per_step"] / peak
        assert r["gemm_bound_ms"] == pytest.approx(gemm_s * 1e3)
        assert r["mfu_gemm_bound"] == pytest.approx(r["flops_per_step"] / gemm_s / peak)
        assert r["mfu_gemm_bound"] > 0  # (not above mfu always: the projection rate is timed once, on a shared machine)
        assert r["other_ms"] == pytest.approx(r["step_ms"] - r["gemm_bound_ms"])
        assert (r["precision"], r["peak_dtype"], r["nominal_peak_dtype"]) == ("fp32", "float32", "float32")
        # the CPU, and its bf16 units whatever the path: the report's key for C7 (bf16 judges where they exist)
        assert re.fullmatch(r"\S+ family 0x[0-9a-f]+ model 0x[0-9a-f]+", r["cpu_id"]), r["cpu_id"]
        assert r["cpu_bf16_units"] == "none" or set(r["cpu_bf16_units"].split()) <= set(isa.BF16_FLAGS)


def test_bench_train_runs_each_isa_path_in_one_run(isolated_outputs, capsys):
    """--isa: every row on each path, alternating; each path's speedup against its own reference
    row, its nominal peak at its own vector width; an unavailable path or bf16 on a path without it
    is one error line before any row."""
    paths = [p for p in ("avx2", "generic") if p in isa.available()]
    out = isolated_outputs / "bench.json"
    assert main(["bench", "train", "--scale", "smoke", "--steps", "1", "--warmup", "1", "--impls", "reference,cpu",
                 "--no-compile", "--top", "0", "--isa", *paths, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["attention_impl"], r["isa"]) for r in rows] == [(i, p) for i in ("reference", "cpu") for p in paths]
    printed = capsys.readouterr().out
    assert f"grlib._C paths {', '.join(paths)}" in printed
    for r in rows:
        ref = next(x for x in rows if x["isa"] == r["isa"] and x["attention_impl"] == "reference")
        assert r["speedup_vs_reference"] == pytest.approx(ref["step_ms"] / r["step_ms"])
        assert f"grlib._C path {r['isa']}" in r["nominal_peak_how"]
    if len(paths) == 2:  # 32- against 16-byte vectors: twice the FLOP per cycle (the clock read twice, close together)
        nominal = {r["isa"]: r["nominal_peak_flops"] for r in rows}
        assert nominal["avx2"] > 1.5 * nominal["generic"], nominal
    missing = next((p for p in isa.ISAS if p not in isa.available()), None)
    if missing is not None:
        assert main(["bench", "train", "--scale", "smoke", "--isa", missing, "--top", "0", "--no-compile"]) == 2
        assert f"GRLIB_ISA={missing}: the {missing} path is not available" in capsys.readouterr().err
    assert main(["bench", "train", "--scale", "smoke", "--isa", paths[-1], "--precision", "bf16", "--top", "0",
                 "--no-compile"]) == 2
    err = capsys.readouterr().err
    assert f"--isa {paths[-1]} with model.precision=bf16: bf16 is not available on this CPU" in err


def test_bench_train_recompute_per_row(isolated_outputs, capsys):
    """IMPL:recompute: that row recomputes every layer in backward (4 GEMM passes in its bound), and a
    row's speedup is against the reference row of the same recomputation where the run has one."""
    out = isolated_outputs / "bench.json"
    assert main(["bench", "train", "--scale", "smoke", "--steps", "1", "--warmup", "1", "--impls",
                 "cpu,cpu:recompute,reference:recompute", "--no-compile", "--top", "0", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["attention_impl"], r["recompute_layers"]) for r in rows] == [("cpu", False), ("cpu", True),
                                                                            ("reference", True)]
    ref = rows[-1]["step_ms"]
    for r in rows:
        assert r["reference_recompute_layers"] is True
        assert r["speedup_vs_reference"] == pytest.approx(ref / r["step_ms"])
        d, T, peak = r["d_model"], r["tokens_per_step"], r["peak_flops"]
        passes = 4 if r["recompute_layers"] else 3
        gemm_s = passes * 10 * r["n_layers"] * T * d * d / (r["gemm_share_of_peak"] * peak) + r["loss_flops_per_step"] / peak
        assert r["gemm_bound_ms"] == pytest.approx(gemm_s * 1e3)
    assert "recompute_layers: every layer recomputed in backward" in capsys.readouterr().out
    assert main(["bench", "train", "--scale", "smoke", "--impls", "cpu:fast", "--top", "0", "--no-compile"]) == 2
    assert "--impls 'cpu:fast': the only suffix is ':recompute'" in capsys.readouterr().err


@pytest.mark.skipif(isa.bf16_missing() is not None,
                    reason="no bf16 GEMMs on this CPU (or GRLIB_ISA below avx512): tests/test_isa.py checks the refusal")
def test_bench_train_bf16_divides_by_the_bf16_peaks(isolated_outputs, capsys):
    """A recorded bf16 row carries what the report keys C7 by (precision, both peaks' dtype, path,
    CPU and its bf16 units), and the report judges C7 with it: its verdict, not context."""
    from grlib.experiments import report

    out = isolated_outputs / "bench.json"
    assert main(["bench", "train", "--scale", "smoke", "--steps", "2", "--warmup", "1", "--impls", "cpu",
                 "--no-compile", "--top", "0", "--precision", "bf16", "--record", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert (row["precision"], row["peak_dtype"], row["nominal_peak_dtype"]) == ("bf16", "bfloat16", "bfloat16")
    assert "HSTU 1x1 d=64 (bf16; loss fp32)" in capsys.readouterr().out
    assert row["mfu_nominal"] == pytest.approx(row["mfu"] * row["peak_flops"] / row["nominal_peak_flops"])
    assert row["nominal_peak_flops"] > 0 and row["mfu"] > 0
    assert set(row["cpu_bf16_units"].split()) & set(isa.BF16_FLAGS)  # bf16 ran: the CPU has bf16 units
    (c7,) = report.claims("smoke").filter(pl.col("target") == "C7.mfu").iter_rows(named=True)
    assert c7["check"].startswith("bf16 · HSTU 1x1 d=64") and c7["ours"].endswith("(bf16)")
    assert c7["verdict"] in ("met", "not met") and "of the nominal bf16 peak" in c7["obtained"]


def test_params_only_reports_the_paper_preset(capsys):
    assert main(["train", "--scale", "paper", "--params-only"]) == 0
    out = capsys.readouterr().out
    assert "paper" in out and "189,441,024" in out  # ~0.2B dense parameters, nothing allocated
