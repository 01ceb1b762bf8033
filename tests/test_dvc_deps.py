"""Every dvc.yaml stage depends on each grlib file its command can run, derived from the code.

A stage's grlib files are the import closure of (a) the modules its notebook imports and (b) the
command that runs it (`python -m grlib notebook NAME`: grlib/__main__.py, the module of the
subcommand's handler (and its packages) with their module-level imports, and the handler's own
imports; not the parser's dispatch, which imports every subcommand's module without running it). Imports are read with ast and followed transitively:
- `import a.b` and `from a.b import c` anywhere in a file (inside functions too), where c counts
  as a module when a file or package of that name exists; importing a.b also runs a/__init__.py;
- a string literal that names a grlib module ("grlib.bench.kernels" for `python -m`, a registry
  of module names, importlib.import_module("grlib.x")), and an f-string that starts with
  "grlib.<package>." (every module of that package);
- a compiled extension (grlib._C) brings in its source folders, read from setup.py.
A dvc.yaml dep covers a file when it is the file or a folder above it.
"""
from __future__ import annotations

import ast
import functools
import inspect
import json
import re
import shlex
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "grlib"
MODULE_NAME = re.compile(rf"{PACKAGE}(\.[A-Za-z_]\w*)*")


def module_file(name: str) -> Path | None:
    """grlib.a.b -> grlib/a/b/__init__.py or grlib/a/b.py (None: not a source module of grlib)."""
    if not MODULE_NAME.fullmatch(name):
        return None
    base = ROOT.joinpath(*name.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def extension_sources() -> dict[str, set[str]]:
    """{"grlib._C": {"kernels/cpu"}}: each compiled extension in setup.py and the folders of its
    source patterns (sources, depends)."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse((ROOT / "setup.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")).endswith("Extension"):
            name, *rest = node.args
            patterns = {c.value for arg in [*rest, *(k.value for k in node.keywords)] for c in ast.walk(arg)
                        if isinstance(c, ast.Constant) and isinstance(c.value, str) and "/" in c.value}
            out[name.value] = {str(Path(p).parent) for p in patterns}
    return out


EXTENSIONS = extension_sources()


def _package_modules(package: str) -> set[str]:
    folder = ROOT.joinpath(*package.split("."))
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for p in folder.rglob("*.py")}


def imported(tree: ast.AST, current: str, is_package: bool) -> set[str]:
    """The grlib modules (and extensions) that the code in `tree` (of module `current`) imports."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package that holds `current`
                parts = current.split(".")[: len(current.split(".")) - node.level + is_package]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            names.add(base)
            names |= {f"{base}.{a.name}" for a in node.names
                      if module_file(f"{base}.{a.name}") or f"{base}.{a.name}" in EXTENSIONS}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if module_file(node.value) or node.value in EXTENSIONS:
                names.add(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            prefix = str(node.values[0].value)
            if prefix.startswith(PACKAGE + ".") and prefix.endswith(".") and module_file(prefix[:-1]):
                names |= _package_modules(prefix[:-1])
    out = set()
    for name in names:
        parts = name.split(".")
        if parts[0] == PACKAGE:
            out |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}  # the packages run first
    return out


def closure(start: dict[str, str], shallow: frozenset[str] = frozenset()) -> dict[str, str]:
    """{module: how it is reached} for `start` ({module: why}) and everything it imports; a module in
    `shallow` counts itself only (its imports that matter are in `start`)."""
    seen: dict[str, str] = {}
    todo = list(start.items())
    while todo:
        name, via = todo.pop()
        if name in seen:
            continue
        seen[name] = via
        path = module_file(name)
        if path is not None and name not in shallow:
            tree = ast.parse(path.read_text(), str(path))
            todo += [(m, f"{via} -> {m}") for m in sorted(imported(tree, name, path.name == "__init__.py"))]
    return seen


def import_time(tree: ast.Module) -> ast.Module:
    """The statements of a module that run when it is imported (function bodies left out)."""
    def runs(node: ast.stmt) -> bool:
        if isinstance(node, ast.ClassDef):
            node.body = [s for s in node.body if runs(s)] or [ast.Pass()]
        return not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    return ast.Module(body=[s for s in tree.body if runs(s)], type_ignores=[])


def command_modules(cmd: str, scale: str) -> dict[str, str]:
    """The modules `python -m grlib <subcommand> ...` runs: grlib/__main__.py; the subcommand's
    handler module and its packages, at import time; the handler's own imports. The dispatch in
    between (building the parser, which imports every subcommand's module) runs no stage code."""
    argv = shlex.split(cmd.replace("${scale}", scale))
    assert argv[:3] == ["python", "-m", PACKAGE], f"not a `python -m {PACKAGE}` command: {cmd}"
    from grlib.cli import build_parser

    handler = build_parser().parse_args(argv[3:]).func
    name = f"{handler.__module__}.{handler.__name__}"
    parts = handler.__module__.split(".")
    entry = {f"{PACKAGE}.__main__": "python -m grlib",
             **{".".join(parts[:i]): f"the handler {name}" for i in range(1, len(parts) + 1)}}
    start = dict(entry)
    for module in entry:
        path = module_file(module)
        if module != f"{PACKAGE}.__main__":
            for m in imported(import_time(ast.parse(path.read_text())), module, path.name == "__init__.py"):
                start.setdefault(m, f"{module} (import time) -> {m}")
    handler_file = module_file(handler.__module__)
    for m in imported(ast.parse(textwrap.dedent(inspect.getsource(handler))), handler.__module__,
                      handler_file.name == "__init__.py"):
        start.setdefault(m, f"{name} -> {m}")
    return closure(start, frozenset(entry))


def notebook_modules(path: Path) -> dict[str, str]:
    cells = json.loads(path.read_text())["cells"]
    lines = [line for c in cells if c["cell_type"] == "code" for line in "".join(c["source"]).splitlines()
             if not line.lstrip().startswith(("%", "!"))]  # IPython magics and shell lines
    return closure({m: f"{path.name} -> {m}" for m in imported(ast.parse("\n".join(lines)), "__main__", False)})


def stage_files(stage: dict, scale: str) -> dict[str, str]:
    """{file or source folder: how it is reached} for everything the stage's command can run."""
    argv = shlex.split(stage["cmd"])
    modules = command_modules(stage["cmd"], scale)
    files = {}
    if "notebook" in argv:
        notebook = ROOT / "notebooks" / f"{argv[argv.index('notebook') + 1]}.ipynb"
        files[str(notebook.relative_to(ROOT))] = "the stage's notebook"
        modules = {**modules, **notebook_modules(notebook)}
    for name, via in modules.items():
        path = module_file(name)
        if path is not None:
            files.setdefault(str(path.relative_to(ROOT)), via)
        for folder in EXTENSIONS.get(name, ()):
            files.setdefault(folder, f"{via} (compiled from {folder})")
    return files


DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
SCALE = yaml.safe_load((ROOT / "params.yaml").read_text())["scale"]


@functools.cache
def _stage_files(name: str) -> dict[str, str]:
    return stage_files(DVC[name], SCALE)


def _deps(stage: dict) -> list[str]:
    return [d if isinstance(d, str) else next(iter(d)) for d in stage.get("deps", [])]


def _covers(dep: str, path: str) -> bool:
    return path == dep or path.startswith(dep.rstrip("/") + "/")


@pytest.mark.parametrize("name", sorted(DVC))
def test_stage_depends_on_every_file_it_runs(name):
    deps = _deps(DVC[name])
    missing = {f: via for f, via in _stage_files(name).items() if not any(_covers(d, f) for d in deps)}
    assert not missing, f"dvc.yaml stage {name!r} lacks deps:\n" + "\n".join(
        f"  {f}    ({via})" for f, via in sorted(missing.items()))


@pytest.mark.parametrize("name", sorted(DVC))
def test_stage_code_deps_exist_and_are_run(name):
    """A grlib or kernel-source dep that no longer exists, or that the stage never runs, is stale."""
    files = _stage_files(name)
    code_roots = (PACKAGE, *{folder for folders in EXTENSIONS.values() for folder in folders})
    code_deps = [d for d in _deps(DVC[name]) if any(_covers(root, d) for root in code_roots)]
    gone = [d for d in code_deps if not (ROOT / d).exists()]
    unused = [d for d in code_deps if d not in gone and not any(_covers(d, f) for f in files)]
    assert not gone and not unused, (f"dvc.yaml stage {name!r}: deps that do not exist {gone}, "
                                     f"deps the stage never runs {unused} (remove them)")


@pytest.mark.parametrize("name", sorted(DVC))
def test_stage_lists_the_dataset_settings_its_grid_reads(name):
    """A grid that reads params.yaml's `datasets` section (grlib.config.ablations.DATASET_SETTINGS:
    each dataset's own settings) makes it a param of its stage, so that changing a dataset's settings
    reruns the stage; a stage whose grid does not read it does not list it."""
    from grlib.config.ablations import DATASET_SETTINGS

    params = [p for p in DVC[name].get("params", []) if isinstance(p, str)]
    reads = any(p == f"ablations.{a}" for p in params for a in DATASET_SETTINGS)
    assert ("datasets" in params) == reads, (f"dvc.yaml stage {name!r}: params {params}; "
                                             f"{'add' if reads else 'remove'} `datasets`")


def test_the_import_rules():
    """Imports inside functions, `from pkg import module`, relative imports, module names as strings
    (python -m, registries), f-string module prefixes and the compiled extension all count."""
    source = textwrap.dedent("""
        def f():
            from grlib.ops import cpu
        from . import paths
        CHILD = [sys.executable, "-m", "grlib.bench.kernels"]
        loader = lambda name: importlib.import_module(f"grlib.model.{name}")
        import grlib._C
        print("grlib.nothing", "grlib.ops is fast")
    """)
    found = imported(ast.parse(source), f"{PACKAGE}.results", False)
    assert {"grlib.ops.cpu", "grlib.paths", "grlib.bench.kernels", "grlib.model.hstu", "grlib._C"} <= found
    assert {"grlib", "grlib.ops", "grlib.bench", "grlib.model"} <= found  # packages run on the way
    assert not {m for m in found if "nothing" in m or " " in m}
    assert any(folder.startswith("kernels/") for folder in EXTENSIONS["grlib._C"])


def test_report_depends_on_every_table_a_stage_writes_that_it_reads():
    """The report reads the newest run of each table of report.READERS: each one a stage writes is a
    dep of the report, so that `dvc repro` runs the report after every stage it summarises. Tables no
    stage writes (bench_train: `bench train --record`) are not deps: a fresh scale has none, and DVC
    refuses a missing dep; the report says "not measured yet" for them."""
    from grlib.experiments.report import READERS

    def table(path: str) -> str | None:
        m = re.fullmatch(r"results/tables/(\w+)/scale=\$\{scale\}", path)
        return m.group(1) if m else None

    written = {table(next(iter(o)) if isinstance(o, dict) else o) for s in DVC.values() for o in s.get("outs", [])}
    deps = {table(d) for d in _deps(DVC["report"])}
    missing = sorted(name for name in READERS if name in written and name not in deps)
    unwritten = sorted(name for name in deps - {None} if name not in written)
    assert not missing, f"dvc.yaml stage 'report' lacks the tables it reads: {missing}"
    assert not unwritten, f"dvc.yaml stage 'report' depends on tables no stage writes: {unwritten}"
    assert {"kernels", "train", "balance", "sparse", "semi_async", "scaling", "negatives"} <= written
