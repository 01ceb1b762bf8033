"""The sparse stage (claim C3): its grid's checks, the id arithmetic behind its counters and
de-duplication factors, its verdicts from the claims registry, and `bench a2a` end to end at the
quick grid (counters on 4 gloo ranks as 2 x 2, and the model; gloo timing, memory and the notebook
run in notebooks/05_sparse_parallelism under nbmake)."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from grlib import results
from grlib.config import ConfigError, load_ablation
from grlib.distributed.sharded_embedding import row_blocks
from grlib.experiments import claims, sparse_measured, sparse_stage
from grlib.experiments.claims import Figure
from grlib.sim.alltoall import traffic


def test_the_grid_refuses_bad_values():
    with pytest.raises(ConfigError, match="ablations.sparse.gloo_ranks.*not one of"):
        load_ablation("sparse", {"gloo_ranks": [3]})
    with pytest.raises(ConfigError, match="ablations.sparse.gloo_sizes.*2 distinct"):
        load_ablation("sparse", {"gloo_sizes": [4096, 4096]})
    with pytest.raises(ConfigError, match="ablations.sparse.lookup_users"):
        load_ablation("sparse", {"lookup_users": 0})
    ab = load_ablation("sparse")
    with pytest.raises(ConfigError, match=r"ablations.sparse.presets: 'tpu-4' is not one of \('gpu-8', 'npu-16'\)"):
        dataclasses.replace(ab, presets=["tpu-4"])  # the grid itself refuses it (grlib.config.choices.PRESETS)
    with pytest.raises(ValueError, match=r"ranks: \[24\] are not whole nodes of npu-16"):
        sparse_stage.check(dataclasses.replace(ab, ranks=[16, 24]))
    with pytest.raises(ValueError, match="unknown parts"):
        sparse_stage.check(ab, ("model", "latency"))


def test_quick_grid_keeps_the_acceptance_cells():
    ab = sparse_stage.quick(load_ablation("sparse"))
    assert set(sparse_stage.ACCEPT_RANKS) <= set(ab.ranks) and sparse_stage.PRESET in ab.presets
    assert 2 in ab.gloo_ranks and len(ab.gloo_sizes) >= 2


@given(n_items=st.integers(1, 300), draws=st.lists(st.integers(1, 5000), min_size=1, max_size=4),
       exponent=st.floats(0.0, 2.0), chunk=st.integers(1, 64))
def test_zipf_distinct_is_the_expected_distinct_fraction(n_items, draws, exponent, chunk):
    p = np.arange(1, n_items + 1, dtype=np.float64) ** -exponent
    p /= p.sum()
    exact = [float((1 - (1 - p) ** n).sum() / n) for n in draws]
    got = sparse_stage.zipf_distinct(n_items, [float(n) for n in draws], exponent, chunk=chunk)
    np.testing.assert_allclose(got, exact, rtol=1e-9)
    assert all(0 < g <= 1 + 1e-12 for g in got)
    assert sparse_stage.zipf_distinct(n_items, [1.0], exponent, chunk) == pytest.approx([1.0])  # one draw: distinct


ragged = st.lists(st.lists(st.integers(0, 49), max_size=30), min_size=4, max_size=4)  # 4 ranks' ids, empty included


@given(ids=ragged, n_items=st.integers(50, 80))
def test_inter_ids_counts_what_crosses_nodes(ids, n_items):
    arrays = [np.asarray(x, dtype=np.int64) for x in ids]
    got = sparse_measured.inter_ids(arrays, n_items, local_world=2)
    starts = [b[0] for b in row_blocks(n_items, 4)]
    node = lambda i: (int(np.searchsorted(starts, i, side="right")) - 1) // 2  # noqa: E731  the owner's node
    expect = {"none": sum(node(i) != r // 2 for r, x in enumerate(ids) for i in x),
              "rank": sum(node(i) != r // 2 for r, x in enumerate(ids) for i in set(x)),
              "node": sum(node(i) != n for n in (0, 1) for i in set(ids[2 * n]) | set(ids[2 * n + 1]))}
    assert got == expect and got["none"] >= got["rank"] >= got["node"]


def _rows(cut: float, cut_dedup: float, gloo_errors: tuple[float, ...], hier_inter: int) -> pl.DataFrame:
    model = {"part": "model", "cluster": "gpu-8", "devices_per_node": 8, "bytes_per_peer": 1.5 * 2**20,
             "dedup_rank": 0.5, "dedup": 0.2}
    rows = [{**model, "ranks": P, "nodes": P // 8, "dedup_source": src, "cut": cut, "cut_node_vs_rank": cd}
            for P in (16, 64, 512, 1536) for src, cd in (("twin", cut_dedup), ("zipf-kuairand", 0.3))]
    rows += [{"part": "gloo", "ranks": 2, "nodes": 1, "bytes_per_peer": 65536.0 * (k + 1), "error": e, "alpha_s": 1e-4,
              "beta_s_per_byte": 5e-10, "load_before": 0.5, "load_after": 3.0, "cpus": 2}
             for k, e in enumerate(gloo_errors)]
    implied = {("flat", "none"): 800, ("flat", "rank"): 400, ("hierarchical", "rank"): 400,
               ("hierarchical", "node"): 200}
    counted = {**implied, ("hierarchical", "rank"): hier_inter}
    rows += [{"part": "counters", "ranks": 4, "nodes": 2, "rank": r, "mode": m, "dedup_by": d, "ids": 25,
              "inter_bytes": counted[(m, d)] // 4, "inter_bytes_expected_total": b, "rows_equal": True}
             for (m, d), b in implied.items() for r in range(4)]
    return pl.DataFrame(rows, infer_schema_length=None)


@pytest.mark.parametrize("cut,cut_dedup,errors,hier,met", [
    (0.8, 0.9, (0.1, -0.2), 400, (True, True, True, True)),
    (0.5, 0.7, (0.1, -0.3), 404, (False, False, False, False)),
])
def test_acceptance_reads_its_bounds_from_the_registry(cut, cut_dedup, errors, hier, met):
    checks = sparse_stage.acceptance(_rows(cut, cut_dedup, errors, hier)).to_dicts()
    a2a = [c for c in checks if c["target"] == "C3.all_to_all"]
    assert len(a2a) == 2 * len(sparse_stage.ACCEPT_RANKS)  # same ids; node vs rank de-duplication; 16 ranks left out
    assert [c["value"] for c in a2a] == [-cut, -cut_dedup] * 3
    assert [c["met"] for c in a2a] == [met[0], met[1]] * 3
    assert "iid Zipf ids over KuaiRand-27K's videos" in a2a[1]["check"] and "-30.0%" in a2a[1]["check"]
    by = {c["target"]: c for c in checks if c["target"] != "C3.all_to_all"}
    assert by["C3.gloo_fit"]["value"] == pytest.approx(max(abs(e) for e in errors))
    assert by["C3.gloo_fit"]["met"] is met[2]
    assert "1-minute load 3.0 on 2 CPUs" in by["C3.gloo_fit"]["check"]
    assert by["C3.inter_bytes"]["value"] == pytest.approx(abs(hier - 400) / 400)
    assert by["C3.inter_bytes"]["met"] is met[3]
    assert "equals the ids' " + ("yes" if hier == 400 else "NO") in by["C3.inter_bytes"]["check"]
    assert by["C3.dedup"]["value"] == pytest.approx(200 / hier) and by["C3.dedup"]["met"] is None
    for c in checks:
        if c["met"] is not None:
            assert claims.target(c["target"]).met(c["value"]) is c["met"]


def test_acceptance_follows_a_changed_registry(monkeypatch):
    t = claims.target("C3.all_to_all")
    looser = dataclasses.replace(t, bounds=(dataclasses.replace(t.bounds[0], limit=Figure(-40, "%")),))
    monkeypatch.setitem(claims.TARGETS, t.key, looser)
    checks = sparse_stage.acceptance(_rows(0.5, 0.7, (0.1,), 400)).to_dicts()
    assert [c["met"] for c in checks if c["target"] == t.key] == [True, True] * 3
    assert sparse_stage.acceptance(pl.DataFrame()).height == 0  # no rows: no checks


def test_memory_and_gloo_rows():
    shards = {P: [{"shard_bytes": (stop - start) * 8 * 4} for start, stop in row_blocks(101, P)] for P in (1, 2, 4)}
    rows = sparse_measured.memory_rows(shards, 101, 8, 1000, 16, [3, 1000])
    measured = [r for r in rows if r["obtained"] == "measured"]
    assert all(r["shard_bytes_total"] == 101 * 8 * 4 and r["shard_bytes"] == r["block_bytes"] for r in measured)
    computed = {r["ranks"]: r for r in rows if r["obtained"] == "computed"}
    assert sorted(computed) == [1, 3, 1000] and computed[3]["shard_bytes"] == 334 * 16 * 4
    assert computed[1000]["with_adam_bytes"] == 3 * 16 * 4 and computed[1]["even_bytes"] == 1000 * 16 * 4
    sizes = [65536, 262144, 1048576]
    timed = lambda P, a, b: {"load_before": 1.0, "load_after": 2.0, "rows": [  # noqa: E731  exact alpha + beta * m
        {"ranks": P, "nodes": P // 2, "local_world": 2, "bytes_per_peer": m, "seconds": (P - 1) * (a + b * m)}
        for m in sizes]}
    rows = sparse_measured.gloo_rows({2: timed(2, 1e-4, 1e-9), 4: timed(4, 2e-4, 1e-9)})
    assert max(abs(r["error"]) for r in rows) < 1e-9 and rows[0]["alpha_s"] == pytest.approx(1e-4)
    four = [r for r in rows if r["ranks"] == 4]
    assert all(r["error_from_2"] < 0 for r in four)  # the 2-rank fit (smaller alpha) predicts 4 ranks too fast


def test_bench_a2a_quick_writes_rows_and_checks(tmp_path, isolated_outputs, capsys):
    from grlib.cli import main

    out = tmp_path / "rows.json"
    argv = ["bench", "a2a", "--scale", "smoke", "--quick", "--parts", "counters", "model", "--json", str(out)]
    assert main(argv) == 0
    rows = json.loads(out.read_text())
    assert {r["part"] for r in rows} == {"counters", "model"}
    assert all(r["obtained"] == ("measured" if r["part"] == "counters" else "modelled") for r in rows)
    counters = pl.DataFrame([r for r in rows if r["part"] == "counters"])
    assert counters["rows_equal"].all() and counters.height == 4 * len(sparse_measured.VARIANTS)
    totals = counters.group_by("mode", "dedup_by").agg(pl.col("inter_bytes").sum(),
                                                       pl.col("inter_bytes_expected_total").first())
    assert (totals["inter_bytes"] == totals["inter_bytes_expected_total"]).all()  # counted = what the ids imply
    for r in counters.iter_rows(named=True):  # 2 trips (ids out, rows back), one message per peer pair each
        assert r["inter_messages"] == 2 * traffic(2, 4, 0, r["mode"])["inter_messages"]
    model = pl.DataFrame([r for r in rows if r["part"] == "model"])
    for col in ("intra_alpha_s", "intra_beta_s_per_byte", "inter_alpha_s", "inter_beta_s_per_byte", "devices_per_node",
                "bytes_per_peer", "dedup", "dedup_rank", "tokens_per_rank", "d_model", "source", "dedup_how"):
        assert model[col].null_count() == 0, col  # every modelled row carries every parameter
    assert model.filter(pl.col("dedup_source") == "twin")["ids_users_per_rank"].min() >= 1
    assert (model["dedup"] <= model["dedup_rank"]).all() and model["bytes_per_peer"].min() > 0
    assert not math.isnan(model.filter(pl.col("ranks") == 1536)["regime_high"][0])
    sparse_stage.chart(model).to_dict()  # the chart builds from the modelled rows alone
    text = capsys.readouterr().out
    assert "acceptance checks (claim C3)" in text and "C3.all_to_all" in text and "C3.inter_bytes" in text
    assert results.read_table("sparse", "smoke").height == 0  # ad-hoc: not in the committed tables
