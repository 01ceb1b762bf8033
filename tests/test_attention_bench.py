"""`bench kernels` and the kernels stage: the plan, the ratios, one child measurement, the CLI's
JSON keys and the config checks (the subprocess path itself runs in notebooks/01_kernels)."""
from __future__ import annotations

import json
import math

import pytest

from grlib.experiments import kernels_stage
from grlib.config import ConfigError, KernelsConfig, load_ablation, load_config

ISSUE_KEYS = {"impl", "regime", "max_len", "fwd_ms", "fwd_bwd_ms", "peak_mem_mb", "gflops",
              "speedup_vs_reference", "mem_reduction_vs_reference"}


def test_batch_sizes_keep_the_padded_work_constant():
    kc = KernelsConfig(max_lens=[256, 1024, 4096], pair_budget=2**23)
    assert [kc.batch_size(n) for n in kc.max_lens] == [128, 8, 1]


def test_plan_covers_every_impl_regime_and_length_then_the_whole_batch():
    kc = KernelsConfig(max_lens=[64, 128], pair_budget=2**14, whole_batch=5)
    specs = kernels_stage.plan(kc, load_ablation("kernels"))
    assert len(specs) == 2 * 2 * 5 + 1 + 2  # reference, fbgemm, cpu and the two per-sequence loops
    assert specs[-3] == {"op": "hstu_attention", "impl": "cpu", "regime": "truncated", "max_len": 128, "batch": 5,
                         "whole_batch": True, "repeats": 0}
    assert [(s["op"], s["impl"]) for s in specs[-2:]] == [("layer_norm_mul", "reference"), ("layer_norm_mul", "cpu")]
    assert {s["batch"] for s in specs[:-3]} == {4, 1}


def test_ratios_are_against_the_reference_of_the_same_regime_and_length():
    rows = [dict(op="hstu_attention", impl=i, regime=r, max_len=64, batch=4, whole_batch=False, fwd_bwd_ms=ms,
                 peak_mem_mb=mb, dtype="float32")
            for i, r, ms, mb in [("reference", "scaled", 10.0, 100.0), ("cpu", "scaled", 2.0, 10.0),
                                 ("reference", "truncated", 20.0, 200.0), ("cpu", "truncated", 5.0, 100.0)]]
    rows.append(dict(op="hstu_attention", impl="cpu", regime="scaled", max_len=64, batch=40, whole_batch=True,
                     fwd_bwd_ms=1.0, peak_mem_mb=50.0, dtype="float32"))
    kernels_stage._add_ratios(rows)
    assert [r["speedup_vs_reference"] for r in rows[:4]] == [1.0, 5.0, 1.0, 4.0]
    assert [r["mem_reduction_vs_reference"] for r in rows[:4]] == [0.0, 0.9, 0.0, 0.5]
    assert math.isnan(rows[4]["speedup_vs_reference"]) and rows[4]["reference_estimate_mb"] == 1000.0
    assert "speedup_vs_float32" not in rows[0]  # one dtype: no column comparing dtypes


def test_bfloat16_rows_compare_with_the_bfloat16_reference_and_their_float32_row():
    rows = [dict(op="hstu_attention", impl=i, regime="scaled", max_len=64, batch=4, whole_batch=False,
                 fwd_bwd_ms=ms, peak_mem_mb=mb, dtype=dt)
            for i, dt, ms, mb in [("reference", "float32", 10.0, 100.0), ("cpu", "float32", 2.0, 10.0),
                                  ("reference", "bfloat16", 8.0, 50.0), ("cpu", "bfloat16", 1.0, 10.0)]]
    kernels_stage._add_ratios(rows, several_dtypes=True)
    assert [r["speedup_vs_reference"] for r in rows] == [1.0, 5.0, 1.0, 8.0]  # bf16 cpu vs the bf16 reference
    assert [r["mem_reduction_vs_reference"] for r in rows] == [0.0, 0.9, 0.0, 0.8]
    assert [r["speedup_vs_float32"] for r in rows] == [1.0, 1.0, 1.25, 2.0]


@pytest.mark.parametrize("op", ["hstu_attention", "layer_norm_mul"])
def test_one_child_measurement_in_process(op):
    spec = dict(op=op, impl="cpu", regime="scaled", max_len=64, batch=6, whole_batch=False, heads=2, head_dim=8,
                dtype="float32", repeats=2, row_seconds=5.0, threads=1, seed=0)
    row = kernels_stage.child(spec)
    assert row["tokens"] == int(kernels_stage.make_inputs(6, 64, "scaled", 2, 8, kernels_stage.DTYPES["float32"], 0)["lengths"].sum())
    assert row["fwd_ms"] > 0 and row["fwd_bwd_ms"] > 0 and row["peak_mem_mb"] >= 0 and row["op"] == op
    assert row["gflops"] > 0 if op == "hstu_attention" else math.isnan(row["gflops"])
    assert 1 <= row["repeats"] <= 2


def test_cli_writes_the_issue_keys(tmp_path, monkeypatch, isolated_outputs, capsys):
    from grlib.cli import main

    monkeypatch.setattr(kernels_stage, "run_child", kernels_stage.child)  # in-process: the subprocess runs in the notebook
    readings = iter([80.0, 100.0])  # before the rows, after them: the higher one counts
    monkeypatch.setattr(kernels_stage, "matmul_peak_gflops", lambda dtype, threads=None: next(readings))
    out = tmp_path / "rows.json"
    assert main(["bench", "kernels", "--scale", "smoke", "--max-len", "32", "--regime", "scaled", "--impls", "reference", "cpu",
                 "--whole-batch", "0", "--repeats", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["impl"] for r in rows] == ["reference", "cpu"]
    for r in rows:
        assert ISSUE_KEYS <= set(r)
    assert rows[0]["speedup_vs_reference"] == 1.0
    for r in rows:  # against the measured peak (patched: 80 then 100 GFLOP/s) and the nominal one
        assert (r["matmul_peak_before_gflops"], r["matmul_peak_after_gflops"]) == (80.0, 100.0)
        assert r["frac_of_peak"] == pytest.approx(r["gflops"] / 100.0)
        assert r["frac_of_nominal"] == pytest.approx(r["gflops"] / r["nominal_peak_gflops"])
    assert (isolated_outputs / "results" / "adhoc" / "tables" / "bench_kernels" / "scale=smoke").is_dir()  # no --record
    printed = capsys.readouterr().out  # a 120-column terminal holds the table (tests/test_bench_tables.py)
    assert max(len(line) for line in printed.splitlines()) <= 120 and "speedup" in printed


@pytest.mark.parametrize("change,field", [
    ({"kernels.max_lens": []}, "kernels.max_lens"),
    ({"kernels.dtype": "float16"}, "kernels.dtype"),
    ({"kernels.row_seconds": 0}, "kernels.row_seconds"),
])
def test_bad_kernels_config_names_the_field(change, field):
    with pytest.raises(ConfigError, match=field):
        load_config("smoke", change)


def test_ablation_must_include_the_reference():
    with pytest.raises(ConfigError, match="must include 'reference'"):
        load_ablation("kernels", {"impls": ["cpu"]})
    with pytest.raises(ConfigError, match=r"ablations\.kernels\.impls: 'cuda' is not one of"):
        load_ablation("kernels", {"impls": ["reference", "cuda"]})
