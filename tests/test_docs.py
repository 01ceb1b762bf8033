"""The docs tell the truth about the project.

- README.md's claims table agrees with the claims registry (grlib/experiments/claims.py): one row per
  claim, its status (built: every target measured or modelled; not built: none; partly built), how
  ours is obtained (measured / modelled), and the checks met as results/summary/<scale>.md counts them
  for params.yaml's scale. No sentence calls a built claim "not built" or "not measured yet".
- Every module path (grlib/..., kernels/..., tests/..., notebooks/..., docs/...), every dotted name
  (grlib.x.y, down to a function or a class's method) and every bare source file name (`fused.py`)
  that README.md or a page under docs/ names exists.

Each check is a function over text, so the tests below also plant a wrong status and a wrong path
and see the check refuse them.
"""
from __future__ import annotations

import ast
import os
import re
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
import yaml

from grlib import paths
from grlib.experiments import claims

ROOT = paths.project_root()
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


# ---- claims: README vs registry vs summary ---------------------------------------------------------

def registry_status(targets=None) -> dict[str, tuple[str, str]]:
    """claim id -> (status, how): status built | partly built | not built; how: "measured",
    "modelled" or "measured, modelled" (the kinds of its targets that are not "not measured yet")."""
    targets = claims.TARGETS if targets is None else targets
    out = {}
    for cid in claims.CLAIMS:
        kinds = [t.method.kind for t in targets.values() if t.claim == cid]
        done = sorted({k for k in kinds if k != "not measured yet"})
        status = ("not built" if not done else "built" if len(done) and "not measured yet" not in kinds
                  else "partly built")
        out[cid] = (status, ", ".join(done) or "—")
    return out


def readme_claims(text: str) -> dict[str, dict[str, str]]:
    """The rows of README's claims table (the table whose header has `claim` and `status`)."""
    for table in re.findall(r"((?:^\|.*\|\n)+)", text, flags=re.M):
        lines = table.strip().splitlines()
        header = [c.strip() for c in lines[0].strip("|").split("|")]
        if header[:1] == ["claim"] and "status" in header:
            rows = {}
            for line in lines[2:]:
                cells = [c.strip() for c in line.strip("|").split("|")]
                rows[cells[0].split()[0]] = dict(zip(header, cells))
            return rows
    raise AssertionError("README.md has no claims table (a table whose header starts with `claim` and has `status`)")


def summary_counts(summary: str) -> dict[str, tuple[int, int]]:
    """claim id -> (checks met, checks with a threshold) in a results/summary/<scale>.md claims table."""
    met: Counter = Counter()
    judged: Counter = Counter()
    for line in summary.splitlines():
        m = re.match(r"^\| ([CW]\d) ", line)
        if m:
            verdict = line.rstrip().rstrip("|").rsplit("|", 1)[-1].strip()
            judged[m.group(1)] += verdict in ("met", "not met")
            met[m.group(1)] += verdict == "met"
    return {c: (met[c], judged[c]) for c in judged}


def claims_mismatches(text: str, status: dict[str, tuple[str, str]], counts: dict[str, tuple[int, int]],
                      counts_column: str) -> list[str]:
    """Every way README's claims table or prose disagrees with the registry and the summary."""
    rows = readme_claims(text)
    bad = [f"{c}: in the registry, not in README's claims table" for c in status if c not in rows]
    bad += [f"{c}: in README's claims table, not in the registry" for c in rows if c not in status]
    for cid, (want, how) in status.items():
        row = rows.get(cid)
        if row is None:
            continue
        if row["status"] != want:
            bad.append(f"{cid}: README says {row['status']!r}, the registry makes it {want!r}")
        if row.get("how ours is obtained") != how:
            bad.append(f"{cid}: README says obtained {row.get('how ours is obtained')!r}, the registry {how!r}")
        got = counts.get(cid, (0, 0))
        if row.get(counts_column) != f"{got[0]} of {got[1]}":
            bad.append(f"{cid}: README says {row.get(counts_column)!r} checks met, the summary {got[0]} of {got[1]}")
    built = {c for c, (s, _) in status.items() if s == "built"}
    prose = "\n".join(line for line in text.splitlines() if not line.startswith("|"))  # tables checked above
    for sentence in re.split(r"(?<=[.;:])\s+", prose.replace("\n", " ")):
        if re.search(r"not built|not measured yet", sentence):
            named = set(re.findall(r"\b([CW]\d)\b", sentence)) & built
            if named:
                bad.append(f"README calls built claim(s) {sorted(named)} not built: {sentence[:160]!r}")
    return bad


def _scale() -> str:
    return yaml.safe_load((ROOT / "params.yaml").read_text())["scale"]


def _counts_column() -> str:
    return f"checks met ({_scale()})"


def test_readme_claims_agree_with_registry_and_summary():
    summary = ROOT / "results" / "summary" / f"{_scale()}.md"
    assert summary.exists(), f"{summary.relative_to(ROOT)} missing: run `make reproduce` (the report stage)"
    bad = claims_mismatches(README.read_text(), registry_status(), summary_counts(summary.read_text()),
                            _counts_column())
    assert not bad, "\n".join(bad)


def test_claims_check_refuses_a_planted_status():
    """A registry where one claim's targets are all "not measured yet" no longer matches README."""
    text = README.read_text()
    summary = summary_counts((ROOT / "results" / "summary" / f"{_scale()}.md").read_text())
    from dataclasses import replace
    planted = {k: (replace(t, method=claims.Method("not measured yet", "planted")) if t.claim == "C4" else t)
               for k, t in claims.TARGETS.items()}
    bad = claims_mismatches(text, registry_status(planted), summary, _counts_column())
    assert any(b.startswith("C4: README says 'built'") for b in bad), bad
    # and the prose check: a sentence calling a built claim "not built"
    bad = claims_mismatches(text + "\nSemi-asynchronous training (C4) is not built yet.\n", registry_status(),
                            summary, _counts_column())
    assert any("C4" in b and "not built" in b for b in bad), bad


# ---- module paths and dotted names -------------------------------------------------------------------

PATH = re.compile(r"(?<![\w/.~-])((?:grlib|kernels|tests|notebooks|docs)/[\w./*-]*[\w*])")
DOTTED = re.compile(r"(?<![\w/.])(grlib(?:\.[A-Za-z_]\w*)+)")
BARE = re.compile(r"`([\w-]+\.(?:py|cpp|h|ipynb))`")


@cache
def _files() -> tuple[str, ...]:
    """The project's files (relative), outside build output, data, results and hidden folders."""
    out = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "data", "results", "__pycache__")]
        out += [str((Path(folder) / f).relative_to(ROOT)) for f in files]
    return tuple(out)


def _path_exists(path: str) -> bool:
    path = path.rstrip("/.")
    if "*" in path:
        return any(True for _ in ROOT.glob(path))
    return any((ROOT / p).exists() for p in (path, path + ".ipynb", path + ".py"))


def _top_names(module: Path) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names[n.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                names[(a.asname or a.name).split(".")[0]] = node
    return names


def _class_attrs(node: ast.ClassDef) -> set[str]:
    out = set()
    for n in node.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out.add(n.target.id)
        elif isinstance(n, ast.Assign):
            out |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    return out


def _dotted_exists(name: str) -> bool:
    """grlib.a.b[.f[.m]]: the longest prefix that is a module or package, then a top-level name of it,
    then (for a class) one of its attributes."""
    parts = name.split(".")
    if parts[:2] == ["grlib", "_C"] and len(parts) == 3:  # a function of the compiled extension (pybind11)
        return any(f'm.def("{parts[2]}"' in p.read_text() for p in (ROOT / "kernels" / "cpu").glob("*.cpp"))
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if i == len(parts) and (module.exists() or any(base.parent.glob(base.name + ".*.so"))):
            return True
        if module.exists():
            rest = parts[i:]
            names = _top_names(module)
            if rest[0] not in names:
                sub = base / rest[0]
                return (base.is_dir() and (sub.with_suffix(".py").exists() or sub.is_dir())) or False
            if len(rest) == 1:
                return True
            node = names[rest[0]]
            return len(rest) == 2 and isinstance(node, ast.ClassDef) and rest[1] in _class_attrs(node)
    return False


def missing_names(text: str) -> list[str]:
    """The paths, dotted names and bare source file names in `text` that do not exist."""
    bad = [f"path {p}" for p in sorted(set(PATH.findall(text))) if not _path_exists(p)]
    bad += [f"module name {d}" for d in sorted(set(DOTTED.findall(text))) if not _dotted_exists(d)]
    files = _files()
    bad += [f"file {b}" for b in sorted(set(BARE.findall(text)))
            if not any(f == b or f.endswith("/" + b) for f in files)]
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_modules_exist(page):
    bad = missing_names(page.read_text())
    assert not bad, f"{page.relative_to(ROOT)} names what does not exist:\n" + "\n".join(bad)


def test_name_check_refuses_planted_names():
    planted = ("See `grlib/train/no_such.py`, grlib.ops.registry.no_such_function, grlib.nosuch, "
               "grlib.negatives.path.NegativePath.wrap, kernels/cpu/missing.cpp, notebooks/99_none, grlib._C.no_op and `gone.py`.")
    assert missing_names(planted) == ["path grlib/train/no_such.py", "path kernels/cpu/missing.cpp",
                                      "path notebooks/99_none", "module name grlib._C.no_op", "module name grlib.negatives.path.NegativePath.wrap",
                                      "module name grlib.nosuch", "module name grlib.ops.registry.no_such_function",
                                      "file gone.py"]
    fine = ("grlib/train/prefetch.py, grlib.ops.registry.PREFERENCE, grlib.negatives.path.NegativePath.sample, "
            "grlib._C, grlib._C.isa, kernels/cpu/hstu_*, notebooks/02_train, `fused.py`, grlib.experiments.claims")
    assert missing_names(fine) == []


# ---- README size, and the measurements page names when and where ------------------------------------

def test_readme_fits_a_newcomer():
    size = len(README.read_bytes())
    assert size <= 15_000, f"README.md is {size} bytes; history and figures belong in docs/MEASUREMENTS.md"


MEASUREMENTS = ROOT / "docs" / "MEASUREMENTS.md"


def undated_rows(text: str) -> list[str]:
    """Rows of the measurements page's tables that lack a date (YYYY-MM-DD, or `any` / `tests` for a
    figure any run reproduces) or a CPU that the page's Machines table names (or `any`, `not recorded`)."""
    tables = re.findall(r"((?:^\|.*\|\n)+)", text, flags=re.M)
    machines = {line.strip("|").split("|")[0].strip() for t in tables if t.startswith("| tag |")
                for line in t.strip().splitlines()[2:]}
    bad = []
    for table in tables:
        lines = table.strip().splitlines()
        header = [c.strip() for c in lines[0].strip("|").split("|")]
        if header[:1] == ["tag"]:
            continue
        if "CPU" not in header:
            bad.append(f"table without a CPU column: {lines[0]}")
            continue
        cpu = header.index("CPU")
        for line in lines[2:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            when_ok = bool(re.search(r"\b20\d\d-\d\d-\d\d\b", cells[0])) or cells[0].split()[0] in ("any", "tests")
            where_ok = (cells[cpu].split(" (")[0] in machines | {"any"} or cells[cpu].startswith("not recorded"))
            if not (when_ok and where_ok):
                bad.append(line[:120])
    return bad


def test_every_measurement_says_when_and_on_which_cpu():
    text = MEASUREMENTS.read_text()
    assert "| tag | CPU |" in text, "docs/MEASUREMENTS.md lost its Machines table"
    assert not undated_rows(text), "\n".join(undated_rows(text))


def test_measurement_check_refuses_a_row_without_date_or_cpu():
    text = MEASUREMENTS.read_text()
    head = text[:text.index("## Set-up")]
    planted = head + "| date, commit | CPU | command | figure |\n|---|---|---|---|\n| 5c199c7 | Zen 5 | x | 1 s |\n" \
        "| 2026-12-01 | a big machine | x | 1 s |\n"
    assert undated_rows(planted) == ["| 5c199c7 | Zen 5 | x | 1 s |", "| 2026-12-01 | a big machine | x | 1 s |"]
