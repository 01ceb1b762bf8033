"""Bench tables fit a 120-column terminal (grlib.bench.common.print_table, laid out by grlib.terminal):
the columns a reader compares, the others named under the table and kept in the rows; --wide prints
every column in blocks; long descriptions wrapped; no library warnings or profiler lines unless -v. The line-length
check of `bench kernels`, `bench data` and `bench pipeline` rides on their own tests
(test_attention_bench, test_data_cli, test_scaling_stage); `bench train`'s is here."""
from __future__ import annotations

import json

import pytest

from grlib.cli import main
from grlib.terminal import WIDTH, format_table


def widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


ROWS = [{"impl": "reference", "step_ms": 12.345678, "speedup_vs_reference": 1.0, "peak_rss_mb": 1234.5,
         **{f"figure_{i}_with_a_long_name": i * 1.5 for i in range(8)}, "big": 123456.7, "note": None},
        {"impl": "cpu", "step_ms": 2.3, "speedup_vs_reference": 5.37, "peak_rss_mb": float("nan"),
         **{f"figure_{i}_with_a_long_name": i * 2.5 for i in range(8)}, "big": 1.0, "note": "x"}]


def test_the_reader_columns_fit_and_the_rest_are_named():
    text = format_table(ROWS, ["impl", "step_ms", ("speedup_vs_reference", "speedup"), "peak_rss_mb"])
    lines = text.splitlines()
    assert lines[0].split() == ["impl", "step_ms", "speedup", "peak_rss_mb"]
    assert lines[2].split() == ["reference", "12.35", "1", "1234"] and lines[3].split() == ["cpu", "2.3", "5.37", "nan"]
    assert "not shown: 10 more (--wide prints every column" in text
    everything = format_table(ROWS)  # no choice: as many as fit (in order), the others named
    assert widest(everything) <= WIDTH and "not shown: figure_2_with_a_long_name, " in everything
    assert "figure_7_with_a_long_name and note (--wide" in everything and "big" in everything.splitlines()[0]


def test_wide_prints_every_column_in_blocks_within_the_width():
    text = format_table(ROWS, every=True)
    assert widest(text) <= WIDTH and "not shown" not in text
    headers = [line.split() for line in text.splitlines() if line.startswith("impl")]
    assert len(headers) >= 2 and all(h[0] == "impl" for h in headers)  # each block repeats the first column
    assert sorted(k for h in headers for k in h[1:]) == sorted(k for k in ROWS[0] if k != "impl")
    assert "123,457" in text and "-" in text.split()  # thousands with separators, None as -


def test_a_long_description_is_wrapped_not_cut():
    check = "sync: 2 gloo ranks, compute / wall (rank 0 48.6%, rank 1 54.3%), 43 ms per step; " * 4
    text = format_table([{"target": "C5.measured", "check": check, "value": 0.51, "met": True}])
    assert widest(text) <= WIDTH and text.splitlines()[0].split() == ["target", "value", "met", "check"]
    assert " ".join(text.split()).count("43 ms per step") == 4 and "yes" in text


@pytest.mark.slow
def test_bench_train_fits_120_columns_without_library_noise(isolated_outputs, capfd):
    """The compiled row (torch dynamo's graph-break warnings) and the --top profile (the profiler's
    USDT lines on the native stderr) run; neither reaches the terminal without -v."""
    out = isolated_outputs / "rows.json"
    assert main(["bench", "train", "--scale", "smoke", "--impls", "cpu", "--steps", "1", "--warmup", "1", "--top", "3",
                 "--profile-steps", "1", "--json", str(out)]) == 0
    got = capfd.readouterr()
    assert widest(got.out) <= WIDTH, [line for line in got.out.splitlines() if len(line) > WIDTH]
    for noise in ("Graph break", "UserWarning", "USDT"):
        assert noise not in got.out and noise not in got.err, noise
    rows = json.loads(out.read_text())
    assert [r["compiled"] for r in rows] == [False, True]
    header = next(line for line in got.out.splitlines() if line.startswith("impl "))
    assert header.split() == ["impl", "isa", "compiled", "recompute", "auto", "step_ms", "speedup", "mfu",
                              "mfu_nominal", "mfu_with_loss", "peak_rss_mb"]
    assert len(rows[0]) > 40 and "more (--wide prints every column" in got.out  # the rest: in the rows
    lines = got.out.splitlines()  # the profile's split: every op in one of three parts, the shares summing to 1
    split = lines[next(i for i, line in enumerate(lines) if line.split() == ["part", "self_ms_per_step", "share"]):]
    shares = {line.split()[0]: float(line.split()[2]) for line in split[2:5]}
    assert set(shares) == {"gemm", "attention", "other"} and abs(sum(shares.values()) - 1) < 1e-3, shares
    assert shares["attention"] > 0 and shares["gemm"] > 0


@pytest.mark.parametrize("flag", ["--wide", "-v"])
def test_every_bench_takes_wide_and_verbose(flag):
    from grlib.cli import build_parser

    args = build_parser().parse_args(["bench", "data", flag])
    assert args.wide is (flag == "--wide") and args.verbose is (flag == "-v")
