"""grlib's layers only point down: faces -> experiments -> library -> base.

    faces        the command line (grlib.cli, python -m grlib) and the benchmarks (grlib.bench)
    experiments  one module per notebook, each owning its method (grlib.experiments)
    library      data, model, ops, negatives, train, perf, evaluate, dist, sim (and the compiled grlib._C)
    base         config, paths, io, results, manifest, plots, progress, threads, gemm_limits, the log schema

Every import of every grlib module is read with ast (module level and inside functions, `import x`
and `from x import y`, relative ones resolved) and an import of a higher layer fails, naming the
file and line. A module no rule classifies fails too, so a new module is placed on purpose.

The same imports make two graphs that must have no cycle: packages (grlib.data, grlib.train, ...;
a top-level module such as grlib.evaluate is its own package), and the modules inside one package
(a submodule's import of its own package's __init__, the facade that re-exports it, is left out).
A cycle fails naming its packages or modules and every import line that closes it.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "grlib"
LAYERS = ("base", "library", "experiments", "faces")  # lowest first: a module imports its layer or lower

# module or package -> layer; the longest matching name wins ("grlib" itself matches only the package root)
RULES = {
    "grlib": "base",  # the package root: sets up the process, imports nothing of grlib above base
    "grlib.__main__": "faces",
    "grlib.cli": "faces",
    "grlib.bench": "faces",
    "grlib.experiments": "experiments",
    # programs a measurement runs in a fresh process or on a bare GPU machine (the device check): they
    # import what they measure and no more (no altair, which the package grlib.experiments loads)
    "grlib.probes": "experiments",
    "grlib.data": "library",
    "grlib.model": "library",
    "grlib.ops": "library",
    "grlib.negatives": "library",
    "grlib.train": "library",
    "grlib.perf": "library",
    "grlib.hardware": "library",  # the peaks MFU divides by: measured GEMM peak, nominal peak (compiled probes)
    "grlib.evaluate": "library",
    "grlib.distributed": "library",  # torch.distributed runtime, balancers, data-parallel step
    "grlib.fit": "library",  # one training run on 1 or N ranks: assembly, fit, evaluate (above train and dist)
    "grlib.sim": "library",  # cluster-scale models (balancing, communication)
    "grlib._C": "library",  # the compiled kernels (kernels/cpu), loaded by grlib.hardware.isa (for grlib.ops.cpu)
    "grlib.config": "base",
    "grlib.schedules": "base",  # the schedule registry: names, traits, model costs; its classes named, imported when built
    "grlib.gemm_limits": "base",  # GRLIB_ISA's limits on the GEMM libraries, set at import like threads
    "grlib.paths": "base",
    "grlib.io": "base",
    "grlib.results": "base",
    "grlib.manifest": "base",
    "grlib.plots": "base",
    "grlib.progress": "base",
    "grlib.threads": "base",
    "grlib.memory": "base",
    "grlib.jagged": "base",
    "grlib.terminal": "base",  # tables within 120 columns, library noise kept off the terminal
    # the log schema (column names, action bits, reserved item ids, DataError): a vocabulary with no
    # grlib import, read by the config's checks and by every layer above
    "grlib.schema": "base",
}


def layer_of(module: str, rules: dict[str, str] = RULES) -> str | None:
    """The layer of a module name by the longest matching rule, or None when no rule matches."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in rules and (name != "grlib" or module == "grlib"):
            return rules[name]
    return None


def module_name(path: Path, package: Path = PACKAGE) -> tuple[str, bool]:
    """(dotted module name, is a package's __init__) of a .py file under `package`."""
    rel = path.relative_to(package.parent).with_suffix("")
    parts = list(rel.parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def imported_modules(module: str, is_package: bool, source: str, known: set[str]) -> list[tuple[int, str]]:
    """(line, grlib module) for every import in `source`, anywhere in the file. `from a import b`
    names a.b when a.b is a known module (a submodule), else a (b is an attribute of a)."""
    here = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((node.lineno, sub if sub in known else base))
    return [(line, name) for line, name in found if name == "grlib" or name.startswith("grlib.")]


def violations(module: str, is_package: bool, source: str, known: set[str], where: str = "",
               rules: dict[str, str] = RULES) -> list[str]:
    """One message per import of a higher layer, or of a module no rule classifies."""
    mine = layer_of(module, rules)
    if mine is None:
        return [f"{where or module}: module {module} is in no layer (add it to RULES in tests/test_layers.py)"]
    out = []
    for line, target in imported_modules(module, is_package, source, known):
        theirs = layer_of(target, rules)
        if theirs is None:
            out.append(f"{where}:{line}: imports {target}, which is in no layer")
        elif LAYERS.index(theirs) > LAYERS.index(mine):
            out.append(f"{where}:{line}: {module} ({mine}) imports {target} ({theirs})")
    return out


def grlib_modules(package: Path = PACKAGE) -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in sorted(package.rglob("*.py")):
        name, is_package = module_name(path, package)
        out[name] = (path, is_package)
    return out


def test_every_grlib_import_points_down_and_every_module_has_a_layer():
    modules = grlib_modules()
    known = set(modules)
    assert len(known) > 40 and "grlib.cli" in known  # the walk found the package
    problems = []
    for name, (path, is_package) in modules.items():
        where = str(path.relative_to(PACKAGE.parent))
        problems += violations(name, is_package, path.read_text(), known, where)
    assert not problems, "imports that point up (or unclassified modules):\n" + "\n".join(problems)


KNOWN = {"grlib", "grlib.config", "grlib.data", "grlib.data.catalog", "grlib.schema", "grlib.experiments",
         "grlib.experiments.data_stage", "grlib.bench", "grlib.bench.common", "grlib.ops", "grlib.ops.cpu"}


@pytest.mark.parametrize("module,is_package,source,expected", [
    # planted violations: each must be found, at its line
    ("grlib.data.catalog", False, "import json\nfrom grlib.experiments import data_stage\n",
     ["x.py:2: grlib.data.catalog (library) imports grlib.experiments.data_stage (experiments)"]),
    ("grlib.data.catalog", False, "def f():\n    import grlib.bench.common\n",
     ["x.py:2: grlib.data.catalog (library) imports grlib.bench.common (faces)"]),
    ("grlib.data.catalog", False, "def f():\n    if True:\n        from ..experiments.data_stage import run\n",
     ["x.py:3: grlib.data.catalog (library) imports grlib.experiments.data_stage (experiments)"]),
    ("grlib.data", True, "from .catalog import x\nfrom ..bench import common\n",
     ["x.py:2: grlib.data (library) imports grlib.bench.common (faces)"]),
    ("grlib.config", False, "from grlib.data.catalog import load_dataset\n",
     ["x.py:1: grlib.config (base) imports grlib.data.catalog (library)"]),
    ("grlib.config", False, "from grlib import experiments\n",
     ["x.py:1: grlib.config (base) imports grlib.experiments (experiments)"]),
    ("grlib.experiments.data_stage", False, "from grlib.bench.common import print_table\n",
     ["x.py:1: grlib.experiments.data_stage (experiments) imports grlib.bench.common (faces)"]),
    ("grlib.wizard", False, "import os\n",
     ["x.py: module grlib.wizard is in no layer (add it to RULES in tests/test_layers.py)"]),
    ("grlib.data.catalog", False, "from grlib.wizard import spell\n", ["x.py:1: imports grlib.wizard, which is in no layer"]),
    # downward and sideways imports pass
    ("grlib.bench.common", False, "from grlib.experiments import data_stage\nfrom grlib import ops\nimport numpy\n", []),
    ("grlib.data.catalog", False, "from grlib import schema\nfrom .. import schema\nfrom grlib import config\n", []),
    ("grlib.config", False, "from grlib.schema import ACTION_BITS\n", []),
    ("grlib.ops.cpu", False, "import grlib._C\n", []),
])
def test_the_checker_finds_planted_violations(module, is_package, source, expected):
    assert violations(module, is_package, source, KNOWN, where="x.py") == expected


def test_layer_rules():
    assert layer_of("grlib") == "base" and layer_of("grlib.schema") == "base"
    assert layer_of("grlib.data.catalog") == "library" and layer_of("grlib.cli.train") == "faces"
    assert layer_of("grlibx") is None and layer_of("grlib.unknown") is None


# Import edges allowed to close a cycle: none. An edge here would be left out of its graph; strict: an
# edge that closes no cycle fails, so a fixed one leaves the set.
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()

Edges = dict[tuple[str, str], list[str]]  # (importer, imported) -> "file:line: imports target" lines


def package_of(module: str) -> str:
    """grlib.X for every module grlib.X.* (grlib.X itself when it is a top-level module)."""
    return ".".join(module.split(".")[:2])


def import_edges(modules: dict[str, tuple[Path, bool]], known: set[str], package: Path = PACKAGE) -> tuple[Edges, Edges]:
    """(package edges, module edges inside one package) of every import between two grlib modules.
    The package root (`grlib`, which sets up the process) is no node of either graph."""
    packages: Edges = {}
    inside: Edges = {}
    for name, (path, is_package) in modules.items():
        if name == "grlib":
            continue
        where = str(path.relative_to(package.parent))
        for line, target in imported_modules(name, is_package, path.read_text(), known):
            if target == "grlib" or target == name:
                continue
            evidence = f"{where}:{line}: imports {target}"
            mine, theirs = package_of(name), package_of(target)
            if mine != theirs:
                lines = packages.setdefault((mine, theirs), [])
            elif target != mine:  # a submodule reaching its package's facade is no module edge
                lines = inside.setdefault((name, target), [])
            else:
                continue
            if evidence not in lines:  # `from a import x, y` is one line
                lines.append(evidence)
    return packages, inside


def cycles(edges: Edges) -> list[list[str]]:
    """The nodes of each cycle (strongly connected components of two or more nodes), each sorted."""
    succ: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        succ.setdefault(a, []).append(b)
        succ.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * len(succ) + 100))
    try:
        for v in succ:
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def cycle_report(edges: Edges, allowed: set[tuple[str, str]] = frozenset()) -> list[str]:
    """One message per cycle of `edges` without the `allowed` ones, naming its nodes and the import
    lines between them; and one per allowed edge that closes no cycle of the full graph (stale)."""
    kept = {e: v for e, v in edges.items() if e not in allowed}
    out = []
    for nodes in cycles(kept):
        lines = [f"    {a} -> {b}: " + "; ".join(kept[(a, b)]) for a, b in sorted(kept) if a in nodes and b in nodes]
        out.append("import cycle " + " <-> ".join(nodes) + ":\n" + "\n".join(lines))
    in_cycles = [set(nodes) for nodes in cycles(edges)]
    for a, b in sorted(allowed):
        if not any({a, b} <= nodes for nodes in in_cycles):
            out.append(f"known cycle edge {a} -> {b} closes no cycle now: remove it from KNOWN_CYCLE_EDGES")
    return out


def test_no_import_cycle_between_packages_nor_inside_one():
    modules = grlib_modules()
    packages, inside = import_edges(modules, set(modules))
    assert ("grlib.data", "grlib.schema") in packages and len(inside) > 20  # the graphs were built
    allowed = set(KNOWN_CYCLE_EDGES)
    problems = cycle_report(packages, allowed & set(packages)) + cycle_report(inside, allowed & set(inside))
    problems += [f"known cycle edge {a} -> {b} is no import now: remove it from KNOWN_CYCLE_EDGES"
                 for a, b in sorted(allowed - set(packages) - set(inside))]
    assert not problems, "\n".join(problems)


def _plant(tmp_path: Path, files: dict[str, str]) -> dict[str, tuple[Path, bool]]:
    root = tmp_path / "grlib"
    for rel, source in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(source)
    return grlib_modules(root)


def test_a_planted_package_cycle_fails_naming_packages_and_lines(tmp_path):
    modules = _plant(tmp_path, {
        "__init__.py": "from grlib import threads\n",
        "threads.py": "",
        "data/__init__.py": "",
        "data/catalog.py": "import json\nfrom grlib.model import build\n",
        "model/__init__.py": "from grlib.model.build import build\n",
        "model/build.py": "def build():\n    from grlib.train import step\n",  # a lazy import counts too
        "train/__init__.py": "",
        "train/step.py": "from ..data.catalog import load\n",
        "evaluate.py": "from grlib.data import catalog\n",  # points into the cycle, is not part of it
    })
    packages, inside = import_edges(modules, set(modules), tmp_path / "grlib")
    assert cycles(packages) == [["grlib.data", "grlib.model", "grlib.train"]] and cycles(inside) == []
    assert cycle_report(packages) == [
        "import cycle grlib.data <-> grlib.model <-> grlib.train:\n"
        "    grlib.data -> grlib.model: grlib/data/catalog.py:2: imports grlib.model.build\n"
        "    grlib.model -> grlib.train: grlib/model/build.py:2: imports grlib.train.step\n"
        "    grlib.train -> grlib.data: grlib/train/step.py:1: imports grlib.data.catalog"]
    # an allowed edge breaks the cycle; an allowed edge outside every cycle is reported as stale
    assert cycle_report(packages, {("grlib.model", "grlib.train")}) == []
    assert cycle_report(packages, {("grlib.evaluate", "grlib.data")}) == [
        cycle_report(packages)[0],
        "known cycle edge grlib.evaluate -> grlib.data closes no cycle now: remove it from KNOWN_CYCLE_EDGES"]


def test_a_planted_module_cycle_inside_a_package_fails_but_a_facade_import_does_not(tmp_path):
    modules = _plant(tmp_path, {
        "__init__.py": "",
        "ops/__init__.py": "from grlib.ops.matmul import linear\n",
        "ops/matmul.py": "def linear():\n    from grlib.ops import transpose\n",  # the facade: no cycle
        "ops/attention.py": "from grlib.ops.fused import norm\n",
        "ops/fused.py": "def norm():\n    from . import attention\n",
    })
    packages, inside = import_edges(modules, set(modules), tmp_path / "grlib")
    assert packages == {} and cycles(inside) == [["grlib.ops.attention", "grlib.ops.fused"]]
    assert cycle_report(inside) == [
        "import cycle grlib.ops.attention <-> grlib.ops.fused:\n"
        "    grlib.ops.attention -> grlib.ops.fused: grlib/ops/attention.py:1: imports grlib.ops.fused\n"
        "    grlib.ops.fused -> grlib.ops.attention: grlib/ops/fused.py:2: imports grlib.ops.attention"]
