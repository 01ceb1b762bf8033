"""Outputs are separated by what produced them (issue 12): concurrent appends never lose a row,
ad-hoc runs stay out of the committed tables, every output of a scale lives under that scale, files
follow the umask (that a smoke `dvc repro` leaves the laptop outputs, `dvc status` and `git status`
as they were: tests/test_pipeline.py)."""
from __future__ import annotations

import multiprocessing
import os
import stat
from pathlib import Path

import altair as alt
import polars as pl
import pytest

from grlib import manifest, plots, results
from grlib.config import load_config
from grlib.experiments import report

WORKERS, APPENDS = 4, 50


def _append_many(worker: int, barrier) -> None:
    cfg = load_config("smoke")
    barrier.wait()  # every process has imported grlib: the appends overlap
    for i in range(APPENDS):
        results.append_rows("race", [{"worker": worker, "i": i}], cfg)


@pytest.mark.slow  # four spawned processes import torch (~20 s on 2 busy cores)
def test_concurrent_appends_keep_every_row(isolated_outputs):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS + 1)
    procs = [ctx.Process(target=_append_many, args=(w, barrier)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    barrier.wait(timeout=120)
    seen = []
    while any(p.is_alive() for p in procs):  # a reader during the writes never sees half a part
        seen.append(results.read_table("race").height)
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    table = results.read_table("race")
    assert table.height == WORKERS * APPENDS
    assert sorted(table.select("worker", "i").rows()) == [(w, i) for w in range(WORKERS) for i in range(APPENDS)]
    assert len(results.parts("race", "smoke")) == WORKERS * APPENDS
    assert seen == sorted(seen)  # rows only ever appear
    for w in range(WORKERS):  # each writer's rows in its own order
        assert table.filter(pl.col("worker") == w)["i"].to_list() == list(range(APPENDS))


def test_adhoc_rows_stay_out_of_the_committed_tables(isolated_outputs):
    cfg = load_config("smoke")
    with results.adhoc() as sink:
        results.append_rows("t", [{"a": 1}], cfg)
        assert results.read_table("t")["a"].to_list() == [1]  # the ad-hoc run reads its own tables
        with results.adhoc(False) as inner:
            results.append_rows("t", [{"a": 2}], cfg)
    assert results.read_table("t")["a"].to_list() == [2]
    assert results.read_table("t", adhoc=True)["a"].to_list() == [1]
    adhoc_dir = isolated_outputs / "results" / "adhoc" / "tables" / "t" / "scale=smoke"
    assert [p.parent for p in sink.written] == [adhoc_dir] and "ad-hoc" in sink.note()
    assert inner.written[0].parent == isolated_outputs / "results" / "tables" / "t" / "scale=smoke"
    assert "recorded in" in inner.note()


def test_bench_writes_adhoc_unless_recorded(isolated_outputs, capsys):
    from grlib.cli import main

    small = ["bench", "ops", "--scale", "smoke", "--batch", "4", "--max-len", "8", "--dim", "4", "--repeats", "1"]
    assert main(small) == 0
    out = capsys.readouterr().out
    assert "ad-hoc" in out and str(Path("adhoc", "tables", "bench_ops", "scale=smoke")) in out
    assert results.read_table("bench_ops").height == 0
    ad_hoc = results.read_table("bench_ops", adhoc=True).height
    assert ad_hoc > 0
    assert main([*small, "--record"]) == 0
    assert "recorded in" in capsys.readouterr().out
    assert results.read_table("bench_ops").height == ad_hoc


def test_figures_metrics_and_summary_live_under_their_scale(isolated_outputs):
    out = isolated_outputs / "results"
    chart = alt.Chart(pl.DataFrame({"x": [1, 2]})).mark_point().encode(x="x:Q").properties(title="T")
    svg, png = plots.save_chart(chart, "demo", "laptop")
    assert (svg, png) == (out / "figures" / "laptop" / "demo.svg", out / "figures" / "laptop" / "demo.png")
    assert f"scale laptop · commit {manifest.git_revision()}" in svg.read_text()
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="scale"):
        plots.save_chart(chart, "demo", "../x")

    laptop = report.summary_path("laptop")
    laptop.parent.mkdir(parents=True)
    laptop.write_text("# Summary (laptop)\n")
    smoke = load_config("smoke")
    row = {"dataset": "synthetic", "model": "hstu", "seed": 0, "test_ndcg@10": 0.2, "test_hr@10": 0.3,
           "test_mrr": 0.1, "params": 10, "tokens_per_s": 1.0}
    results.append_rows("train", [row, {**row, "model": "popularity", "test_ndcg@10": 0.1}], smoke)
    res = report.run("smoke")
    assert res["markdown"] == out / "summary" / "smoke.md" and "# Summary (smoke)" in res["markdown"].read_text()
    assert [p.parent for p in res["figures"]] == [out / "figures" / "smoke"] * 2
    assert laptop.read_text() == "# Summary (laptop)\n"  # another scale's summary untouched
    assert sorted(p.name for p in (out / "figures").iterdir()) == ["laptop", "smoke"]


def test_outputs_follow_the_umask(isolated_outputs):
    old = os.umask(0o027)
    try:
        cfg = load_config("smoke")
        results.append_rows("t", [{"a": 1}], cfg)
        written = [*results.parts("t"), results.write_metrics("m", {"a": 1}, scale="smoke"),
                   *plots.save_chart(alt.Chart(pl.DataFrame({"x": [1]})).mark_point(), "u", "smoke")]
    finally:
        os.umask(old)
    for path in written:
        assert stat.S_IMODE(path.stat().st_mode) == 0o640, path
    for folder in (results.scale_dir("t", "smoke"), written[1].parent, written[2].parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o750, folder


def test_single_file_tables_migrate_losslessly(isolated_outputs):
    laptop, smoke = load_config("laptop"), load_config("smoke")
    rows = []  # three appends in one second (run ids not in file-name order), another scale, a new column
    for run_id, cfg, extra in (("ccc", laptop, {}), ("aaa", laptop, {}), ("bbb", smoke, {"b": "x"})):
        rows += [{"run_id": run_id, "git_rev": "r", "params_hash": cfg.params_hash(), "scale": cfg.scale,
                  "seed": 0, "hardware": "{}", "timestamp": "2026-01-01T00:00:00+00:00", "a": i, **extra}
                 for i in range(2)]
    old = pl.DataFrame(rows, infer_schema_length=None)
    legacy = isolated_outputs / "results" / "tables" / "t.parquet"
    legacy.parent.mkdir(parents=True)
    old.write_parquet(legacy)
    with pytest.raises(ValueError, match="single-file table"):
        results.read_table("t")  # never read as empty while its rows sit in the old file
    written = results.migrate_single_file("t")
    assert len(written) == 3 and not legacy.exists()
    assert results.read_table("t").equals(old)
    assert results.read_table("t", "smoke")["run_id"].to_list() == ["bbb", "bbb"]
    results.append_rows("t", [{"a": 9}], laptop)
    assert results.read_table("t")["a"].to_list()[-1] == 9


def test_kernels_figures_need_one_scale(isolated_outputs):
    from grlib.experiments import kernels_stage

    with pytest.raises(ValueError, match="pass scale="):
        kernels_stage.save_figures(pl.DataFrame({"scale": ["smoke", "laptop"]}))
