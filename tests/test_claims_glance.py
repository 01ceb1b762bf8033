"""`python -m grlib claims` (grlib.cli.claims): the claims at a glance that `make reproduce` ends with,
read from the summary the report stage writes: one line per claim within 120 columns, the verdict
counts of every check, where the full table is; a missing or foreign summary is one error line."""
from __future__ import annotations

import collections
from pathlib import Path

import polars as pl
import pytest

import grlib
from grlib.cli import claims as glance
from grlib.cli import main
from grlib.experiments import report
from grlib.schema import DataError


def _summary(rows: list[dict]) -> str:
    """A summary file as report.run writes it (its claims table from report.claims_markdown)."""
    table = pl.DataFrame(rows, schema={c: pl.String for c in report.COLUMNS if c in rows[0]})
    return (f"# Summary (t)\n\n## Claims: the paper's figures and ours (newest run of each stage)\n\n"
            f"{report.claims_markdown(table, with_scale=False)}\n\n## Model quality\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")


def _row(claim, check, paper, ours, verdict):
    return {"claim": claim, "check": check, "paper": paper, "ours": ours, "obtained": "measured: x run 1",
            "verdict": verdict}


ROWS = [
    _row("C1 fused jagged operators remove padding", "speedup vs reference >= 2.2x", "2.2x", "89.3x", "met"),
    _row("C1 fused jagged operators remove padding", "fbgemm / cpu > 1x", "(workbench target)", "5.1x", "met"),
    _row("C3 hierarchical sparse parallelism " + "very long title " * 5, "two-stage vs flat " * 20, "-75.9%",
         "4.26% " * 30, "not met"),
    _row("C3 hierarchical sparse parallelism " + "very long title " * 5, "random split", "47%", "50.3%",
         "(no threshold)"),
    _row("W1 model quality (workbench target)", "hstu vs popularity >= 1.5x", "(workbench target)", "2.75x", "met"),
    _row("C7 end to end: MFU and scaling", "MFU >= 54.71%", "54.71%", "—", "not measured yet"),
]
CONTEXT = _row("C7 end to end: MFU and scaling", "fp32 MFU", "54.71%", "35.7%", "fp32: context")


def test_the_parser_reads_the_reports_columns():
    assert list(report.SHOWN.values()) == glance.COLUMNS


def test_glance_one_line_per_claim_within_120_columns(tmp_path):
    path = tmp_path / "t.md"
    path.write_text(_summary(ROWS))
    checks = glance.read_checks(path)
    assert [c.verdict for c in checks] == [r["verdict"] for r in ROWS]
    lines = glance.glance(checks, "t", path)
    assert max(map(len, lines)) <= glance.WIDTH
    by_claim = {line.split()[0]: line for line in lines if line[:2] in ("C1", "C3", "C7", "W1")}
    assert list(by_claim) == ["C1", "C3", "W1", "C7"]
    # C1: the paper figure its verdict compares to, ours, 2 met
    assert "2.2x" in by_claim["C1"] and "89.3x" in by_claim["C1"] and "5.1x" not in by_claim["C1"]
    assert by_claim["C1"].split()[-3:] == ["2", "0", "0"]
    assert by_claim["C3"].split()[-3:] == ["0", "1", "1"] and "…" in by_claim["C3"]  # cut, not wrapped
    assert by_claim["C7"].split()[-3:] == ["0", "0", "1"]  # not measured yet: other
    assert "2.75x" in by_claim["W1"]  # a workbench target: its own checks
    assert "(no check with a verdict)" in by_claim["C7"]
    assert "6 checks: 3 met, 1 not met; other (no verdict): 1 (no threshold), 1 not measured yet" in lines
    assert any(line.startswith("Every check with its threshold") for line in lines)
    per_check = glance.check_lines(checks)
    assert len(per_check) == len(ROWS) and max(map(len, per_check)) <= glance.WIDTH


def test_verdicts_beyond_met_count_as_other_by_name(tmp_path):
    """A verdict the report adds later (C7's "fp32: context") is counted under other, by its words."""
    path = tmp_path / "t.md"
    path.write_text(_summary([*ROWS, CONTEXT]))
    lines = glance.glance(glance.read_checks(path), "t", path)
    c7 = next(line for line in lines if line.startswith("C7"))
    assert c7.split()[-3:] == ["0", "0", "2"]
    assert "7 checks: 3 met, 1 not met; other (no verdict): 1 (no threshold), 1 not measured yet, 1 fp32: context" in lines


def test_the_committed_summary_at_a_glance():
    """The summary in the project (the laptop scale's, committed): every claim on one line, the
    counts those of its table, nothing wider than 120."""
    path = Path(grlib.__file__).resolve().parents[1] / "results" / "summary" / "laptop.md"  # not conftest's folder
    if not path.is_file():
        pytest.skip(f"{path}: no committed laptop summary in this checkout")
    checks = glance.read_checks(path)
    lines = glance.glance(checks, "laptop", path)
    assert max(map(len, lines)) <= glance.WIDTH
    ids = list(dict.fromkeys(c.claim_id for c in checks))
    assert ids and [line.split()[0] for line in lines if line.split() and line.split()[0] in ids] == ids
    counts = collections.Counter(c.verdict for c in checks)
    assert f"{len(checks)} checks: {counts['met']} met, {counts['not met']} not met" in "\n".join(lines)
    claim_lines = [line.split() for line in lines if line.split() and line.split()[0] in ids]
    assert sum(int(w[-1]) + int(w[-2]) + int(w[-3]) for w in claim_lines) == len(checks)


def test_cli_claims(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRLIB_RESULTS_DIR", str(tmp_path))
    (tmp_path / "summary").mkdir()
    (tmp_path / "summary" / "t.md").write_text(_summary(ROWS))
    assert main(["claims", "--scale", "t"]) == 0
    out = capsys.readouterr().out
    assert "Claims at a glance, scale t" in out and max(map(len, out.splitlines())) <= 120
    assert main(["claims", "--scale", "t", "--checks"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(ROWS)

    assert main(["claims", "--scale", "absent"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "absent.md: no summary at this scale" in err[0]
    assert main(["claims", "--scale", "a/b"]) == 2
    assert "--scale" in capsys.readouterr().err


def test_a_file_that_is_no_summary_is_refused(tmp_path):
    path = tmp_path / "x.md"
    path.write_text("# notes\n\n## Claims\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    with pytest.raises(DataError, match="x.md: the claims table's header"):
        glance.read_checks(path)
    path.write_text("# notes\n")
    with pytest.raises(DataError, match="no '## Claims' section"):
        glance.read_checks(path)
