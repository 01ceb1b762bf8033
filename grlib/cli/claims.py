"""`python -m grlib claims`: the paper's claims at a glance, read from the report stage's summary.

    python -m grlib claims [--scale laptop]          one line per claim, within 120 columns
    python -m grlib claims --checks                  one line per check of every claim

Reads results/summary/<scale>.md (written by the `report` stage, notebooks/99_report; committed at
the laptop scale), so it runs in a fresh clone in a fraction of a second and changes nothing. A
claim's line gives the paper's figures, ours where the check compares to a paper figure, and how
many of its checks are met, not met, or have no verdict (other: no threshold, not measured yet...); the summary file holds each
check's threshold and how ours was obtained, `dvc metrics show` every stage's metrics. `make
reproduce` ends with this view.
"""
from __future__ import annotations

import argparse
import textwrap
from dataclasses import dataclass
from pathlib import Path

from grlib.schema import DataError

WIDTH = 120
COLUMNS = ["claim", "check", "paper", "ours", "how obtained", "verdict"]  # report.claims_markdown's header
HEADING = "## Claims"
NO_PAPER = "(workbench target)"
MET, NOT_MET = "met", "not met"  # a check's verdict; any other words (report: "(no threshold)", "not measured
# yet", "fp32: context", ...) say why a check has no verdict, and count as "other"


@dataclass(frozen=True)
class Check:
    claim: str    # "C1 fused jagged operators remove padding"
    check: str
    paper: str    # "2.2x", a sentence, or "(workbench target)"
    ours: str
    how: str
    verdict: str  # met | not met | why there is none ("(no threshold)", "not measured yet", ...)

    @property
    def claim_id(self) -> str:
        return self.claim.split(" ", 1)[0]


def summary_path(scale: str) -> Path:
    from grlib import paths, results

    try:
        name = results.check_scale(scale)
    except ValueError as err:
        raise DataError(f"--scale: {err}") from None
    return paths.results_dir() / "summary" / f"{name}.md"


def read_checks(path: Path) -> list[Check]:
    """The rows of the claims table in a summary file (the first table after '## Claims')."""
    if not path.is_file():
        raise DataError(f"{path}: no summary at this scale; the report stage writes it (make reproduce, or "
                        f"python -m grlib notebook 99_report --scale {path.stem})")
    lines = path.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(HEADING)), None)
    if start is None:
        raise DataError(f"{path}: no '{HEADING}' section (not a summary the report stage wrote)")
    rows = []
    for line in lines[start + 1:]:
        if rows and not line.startswith("|"):
            break  # the end of the table
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    if not rows or rows[0] != COLUMNS:
        raise DataError(f"{path}: the claims table's header is {rows[0] if rows else 'missing'}, expected {COLUMNS}")
    bad = [r for r in rows[2:] if len(r) != len(COLUMNS)]
    if bad:
        raise DataError(f"{path}: a claims row has {len(bad[0])} cells, expected {len(COLUMNS)}: {bad[0][:2]}")
    return [Check(*r) for r in rows[2:]]


def cut(text: str, width: int) -> str:
    """`text` in at most `width` characters (an ellipsis where cut)."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _distinct(values: list[str]) -> list[str]:
    return list(dict.fromkeys(values))


# claim, paper, ours, met, not met, other: 119 characters with the separators
_W = {"claim": 34, "paper": 18, "ours": 42, "met": 3, "not met": 7, "other": 5}


def _line(cells: list[str]) -> str:
    (claim, paper, ours), counts = cells[:3], cells[3:]
    widths = list(_W.values())
    text = [cut(claim, widths[0]).ljust(widths[0]), cut(paper, widths[1]).ljust(widths[1]),
            cut(ours, widths[2]).ljust(widths[2])]
    text += [c.rjust(w) for c, w in zip(counts, widths[3:])]
    return "  ".join(text).rstrip()


def glance(checks: list[Check], scale: str, path: Path) -> list[str]:
    """One line per claim, the totals and where the rest is; every line within WIDTH characters. A
    claim's paper figures and ours are those of its checks with a verdict that compare to a paper
    figure (a workbench target: all its checks with a verdict), in the summary's order; "other"
    counts its checks without a met / not met verdict."""
    out = [cut(f"Claims at a glance, scale {scale}: the paper's figures and ours (newest run of each stage)", WIDTH),
           "", _line(list(_W))]
    for claim in _distinct([c.claim for c in checks]):
        rows = [c for c in checks if c.claim == claim]
        judged = [c for c in rows if c.verdict in (MET, NOT_MET)]
        vs_paper = [c for c in judged if c.paper != NO_PAPER] or judged  # a workbench target: its own checks
        paper = ", ".join(_distinct([c.paper for c in vs_paper])) or NO_PAPER
        ours = "; ".join(_distinct([c.ours for c in vs_paper])) or "(no check with a verdict)"
        met, not_met = (sum(c.verdict == v for c in rows) for v in (MET, NOT_MET))
        out.append(_line([claim, paper, ours, str(met), str(not_met), str(len(rows) - met - not_met)]))
    count = {v: sum(c.verdict == v for c in checks) for v in _distinct([MET, NOT_MET, *(c.verdict for c in checks)])}
    others = ", ".join(f"{n} {v}" for v, n in count.items() if v not in (MET, NOT_MET))
    totals = f"{len(checks)} checks: {count[MET]} met, {count[NOT_MET]} not met" + (
        f"; other (no verdict): {others}" if others else "")
    out += ["", *textwrap.wrap(totals, WIDTH, subsequent_indent="  "),
            cut(f"Every check with its threshold and how ours was obtained: {path}", WIDTH),
            cut(f"One line per check: python -m grlib claims --scale {scale} --checks; "
                "every stage's metrics: dvc metrics show", WIDTH)]
    return out


def check_lines(checks: list[Check]) -> list[str]:
    """One line per check: claim id, verdict, ours vs the paper's figure, the check (cut to WIDTH)."""
    out = []
    for c in checks:
        paper = "" if c.paper == NO_PAPER else f" (paper {c.paper})"
        out.append(cut(f"{c.claim_id:<3} {c.verdict:<16} {c.ours}{paper}: {c.check}", WIDTH))
    return out


def _claims(args: argparse.Namespace) -> int:
    from grlib.config import default_scale

    scale = args.scale or default_scale()
    path = summary_path(scale)
    checks = read_checks(path)
    try:  # the path as the user would type it in the project
        from grlib import paths

        path = path.relative_to(paths.project_root())
    except ValueError:
        pass
    print("\n".join(check_lines(checks) if args.checks else glance(checks, scale, path)))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("claims", help="the paper's claims at a glance: paper, ours, verdict counts (from the summary)")
    p.add_argument("--scale", default=None, help="scale of the summary (default: params.yaml's scale)")
    p.add_argument("--checks", action="store_true", help="one line per check instead of one per claim")
    p.set_defaults(func=_claims)
