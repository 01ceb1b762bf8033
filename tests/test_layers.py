"""grlib's layers only point down: faces -> experiments -> library -> base.

    faces        the command line (grlib.cli, python -m grlib) and the benchmarks (grlib.bench)
    experiments  one module per notebook, each owning its method (grlib.experiments)
    library      data, model, ops, negatives, train, perf, evaluate, dist, sim (and the compiled grlib._C)
    base         config, paths, io, results, manifest, plots, progress, threads, the log schema

Every import of every grlib module is read with ast (module level and inside functions, `import x`
and `from x import y`, relative ones resolved) and an import of a higher layer fails, naming the
file and line. A module no rule classifies fails too, so a new module is placed on purpose.
"""
from __future__ import annotations

import ast
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
    "grlib.data": "library",
    "grlib.model": "library",
    "grlib.ops": "library",
    "grlib.negatives": "library",
    "grlib.train": "library",
    "grlib.perf": "library",
    "grlib.hardware": "library",  # the peaks MFU divides by: measured GEMM peak, nominal peak (compiled probes)
    "grlib.evaluate": "library",
    "grlib.dist": "library",  # torch.distributed runtime, balancers, data-parallel step
    "grlib.sim": "library",  # cluster-scale models (balancing, communication)
    "grlib._C": "library",  # the compiled kernels (kernels/cpu), loaded by grlib.ops and grlib.train
    "grlib.config": "base",
    "grlib.paths": "base",
    "grlib.io": "base",
    "grlib.results": "base",
    "grlib.manifest": "base",
    "grlib.plots": "base",
    "grlib.progress": "base",
    "grlib.threads": "base",
    "grlib.jagged": "base",
    # the log schema (column names, action bits, reserved item ids, DataError): a vocabulary with no
    # grlib import, read by the config's checks and by every layer above
    "grlib.data.schema": "base",
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


KNOWN = {"grlib", "grlib.config", "grlib.data", "grlib.data.catalog", "grlib.data.schema", "grlib.experiments",
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
    ("grlib.data.catalog", False, "from grlib.data import schema\nfrom . import schema\nfrom grlib import config\n", []),
    ("grlib.config", False, "from grlib.data.schema import ACTION_BITS\n", []),
    ("grlib.ops.cpu", False, "import grlib._C\n", []),
])
def test_the_checker_finds_planted_violations(module, is_package, source, expected):
    assert violations(module, is_package, source, KNOWN, where="x.py") == expected


def test_layer_rules():
    assert layer_of("grlib") == "base" and layer_of("grlib.data.schema") == "base"
    assert layer_of("grlib.data.catalog") == "library" and layer_of("grlib.cli.train") == "faces"
    assert layer_of("grlibx") is None and layer_of("grlib.unknown") is None
