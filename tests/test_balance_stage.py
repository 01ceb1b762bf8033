"""The balance stage (claim C2): its grid's checks, its verdicts from the claims registry, and
`bench balance` end to end at the quick grid (calibration, simulation; the time-sliced and
2-process parts run in notebooks/03_load_balancing under nbmake)."""
from __future__ import annotations

import dataclasses
import json

import polars as pl
import pytest

from grlib import results
from grlib.config import ConfigError, load_ablation, load_config
from grlib.experiments import balance_stage, claims


def test_the_grid_refuses_bad_values():
    with pytest.raises(ConfigError, match="ablations.balance.methods.*random"):
        load_ablation("balance", {"methods": ["kk"]})
    with pytest.raises(ConfigError, match="ablations.balance.pair_method"):
        load_ablation("balance", {"pair_method": "best"})
    with pytest.raises(ConfigError, match="calibration_points"):
        load_ablation("balance", {"calibration_points": 2})


def test_calibration_lengths_span_16_to_the_maximum():
    ab = load_ablation("balance")
    lengths = balance_stage.calibration_lengths(ab)
    assert lengths[0] == 16 and lengths[-1] == ab.calibration_max and len(lengths) >= 12


def _rows(before: float, after: float, noisy: float, sliced: tuple[float, float]) -> pl.DataFrame:
    cell = {"part": "simulated", "ranks": 64, "users_per_rank": 32, "max_len": 16384}
    return pl.DataFrame([
        {**cell, "method": "random", "imbalance_model_median": before, "imbalance_noisy_median": before},
        {**cell, "method": "lpt", "imbalance_model_median": after, "imbalance_noisy_median": noisy},
        {**cell, "method": "kk", "imbalance_model_median": after * 3, "imbalance_noisy_median": noisy},
        {"part": "time-sliced", "method": "random", "ranks": 8, "imbalance_measured": sliced[0]},
        {"part": "time-sliced", "method": "kk", "ranks": 8, "imbalance_measured": sliced[1]},
    ], infer_schema_length=None)


@pytest.mark.parametrize("after,sliced,met", [(0.001, (0.6, 0.1), (True, True)), (0.05, (0.6, 0.3), (False, False))])
def test_acceptance_reads_its_bounds_from_the_registry(after, sliced, met):
    checks = {r["target"]: r for r in balance_stage.acceptance(_rows(0.47, after, 0.06, sliced)).iter_rows(named=True)}
    assert checks["C2.before"]["value"] == 0.47 and checks["C2.before"]["met"] is None
    assert checks["C2.after"]["value"] == after and "lpt" in checks["C2.after"]["check"]  # the best balancer
    assert "6.00%" in checks["C2.after"]["check"]  # the noisy figure beside it
    assert checks["C2.measured"]["value"] == pytest.approx(sliced[1] / sliced[0])
    assert (checks["C2.after"]["met"], checks["C2.measured"]["met"]) == met
    assert claims.target("C2.after").met(after) is met[0]


def test_bench_balance_quick_writes_rows_and_checks(tmp_path, isolated_outputs, capsys):
    from grlib.cli import main

    out = tmp_path / "rows.json"
    assert main(["bench", "balance", "--scale", "smoke", "--quick", "--parts", "calibrate", "simulated",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    parts = {r["part"] for r in rows}
    assert parts == {"calibrate", "simulated"}
    cal = [r for r in rows if r["part"] == "calibrate"]
    assert len(cal) == len(balance_stage.calibration_lengths(balance_stage.quick(load_ablation("balance"))))
    assert all(r["obtained"] == ("measured" if r["part"] == "calibrate" else "modelled") for r in rows)
    sim = pl.DataFrame([r for r in rows if r["part"] == "simulated"])
    for (ranks, users, max_len), cell in sim.group_by(["ranks", "users_per_rank", "max_len"]):
        before = cell.filter(pl.col("method") == "random")["imbalance_model_median"][0]
        assert cell.filter(pl.col("method") != "random")["imbalance_model_median"].max() <= before
    text = capsys.readouterr().out
    assert "acceptance checks (claim C2)" in text and "C2.after" in text
    assert results.read_table("balance", "smoke").height == 0  # ad-hoc: not in the committed tables


def test_quick_grid_keeps_the_acceptance_cell():
    ab = balance_stage.quick(load_ablation("balance"))
    assert balance_stage.CELL["ranks"] in ab.ranks and balance_stage.CELL["users_per_rank"] in ab.users_per_rank
    assert balance_stage.CELL["max_len"] in ab.max_lens
    assert dataclasses.replace(ab).pair_steps >= 1 and load_config("smoke").scale == "smoke"
