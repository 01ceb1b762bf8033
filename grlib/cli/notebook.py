"""`python -m grlib notebook NAME`: run one of the project's notebooks with papermill (the DVC stages
run every notebook this way).

    python -m grlib notebook 02_train --scale laptop [-p overrides '{"model.n_layers": 2}']
    out = run_notebook("02_train", scale="laptop", parameters={"overrides": '{"model.n_layers": 2}'})

Parameters are plain values (grlib.config.values): a string is read as YAML by load_plain (no tags
such as !!omap or !!python/..., no aliases, a date stays its text), any other value must be JSON-like
(None, bool, int, float, str, lists, dicts with string keys). papermill writes each value into the
notebook as Python source and writes anything else as `"<str(value)>"`, unescaped: a tuple's text
could end that string and run code in the kernel, so nothing else reaches papermill (_execute checks
again just before it calls papermill).

Before a kernel starts, the parameters are checked against the names the notebook's `parameters`
cell assigns (parsed with ast, so `cale` is not taken for `scale`), against the type of each literal
default there (check_type: `count = 3` takes an int, `ratio = 0.5` a finite number, `data = ""` a
string, `overrides = {}` a mapping, where an empty value is the empty mapping, `x = None` any plain
value) and `overrides` against the config: NotebookError, one line naming the parameter, its value
(cut to 80 characters) and what it expects. The notebook executes into a temporary file beside the
output; on success it is renamed over the output, on failure to <name>.failed.ipynb beside it, so
the last good executed notebook is kept, and NotebookFailed names the cell, its exception and that
file.

Progress (grlib.progress.log, silenced by GRLIB_PROGRESS=0): one line as each code cell starts, the
kernel's stderr (where grlib's own progress lines go) forwarded, and a last line with the time.
"""
from __future__ import annotations

import argparse
import ast
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from grlib import config, io, paths
from grlib.config import add_config_arguments, values
from grlib.progress import enabled, log


class NotebookError(ValueError):
    """An unknown notebook, a notebook without a usable parameters cell, or a bad parameter."""


class NotebookFailed(RuntimeError):
    """A cell of the notebook raised; the executed notebook was saved as `failed_path`."""

    def __init__(self, message: str, failed_path: Path):
        super().__init__(message)
        self.failed_path = failed_path


def add_parser(sub: argparse._SubParsersAction) -> None:
    nb = sub.add_parser("notebook", help="run notebooks/<name>.ipynb with papermill into results/executed/<scale>/")
    nb.add_argument("name", help="notebook name without .ipynb, e.g. 02_train")
    add_config_arguments(nb)  # -o K=V becomes the notebook's `overrides` parameter
    nb.add_argument("-p", "--param", nargs=2, action="append", metavar=("KEY", "VALUE"),
                    help="extra papermill parameter (a plain YAML value: number, true/false, string, list, "
                         "mapping; no tags)")
    nb.add_argument("--output", default=None, help="executed notebook path (default results/executed/<scale>/<name>.ipynb)")
    nb.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    params = {k: v for k, v in (args.param or [])}
    if args.override:
        if "overrides" in params:
            raise NotebookError("give overrides either as -o KEY=VALUE or as -p overrides '{...}', not both")
        params["overrides"] = config.parse_overrides(args.override)
    print(run_notebook(args.name, scale=args.scale, parameters=params, output=args.output))
    return 0


def notebook_names() -> list[str]:
    return sorted(p.stem for p in (paths.project_root() / "notebooks").glob("*.ipynb"))


def notebook_path(name: str) -> Path:
    """notebooks/<name>.ipynb (name with or without .ipynb)."""
    name = Path(name).name.removesuffix(".ipynb")
    path = paths.project_root() / "notebooks" / f"{name}.ipynb"
    if not path.exists():
        raise NotebookError(f"no notebook {name!r}; notebooks: {', '.join(notebook_names())}")
    return path


def parameters_cell(path: Path) -> ast.Module:
    """The parsed source of the notebook's one cell tagged `parameters`."""
    cells = json.loads(path.read_text())["cells"]
    tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        raise NotebookError(f"{path}: needs exactly one cell tagged 'parameters', found {len(tagged)}")
    try:
        return ast.parse("".join(tagged[0]["source"]))
    except SyntaxError as err:
        raise NotebookError(f"{path}: parameters cell, line {err.lineno}: {err.msg}") from None


def parameter_names(path: Path, tree: ast.Module | None = None) -> list[str]:
    """Names assigned at the top level of the notebook's parameters cell."""
    names: list[str] = []
    for node in (tree or parameters_cell(path)).body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            names += [n.id for n in ast.walk(target) if isinstance(n, ast.Name) and n.id not in names]
    return names


def literal_assignments(tree: ast.Module) -> dict[str, Any]:
    """The values of `name = <literal>` statements at the top level of a cell (others left out)."""
    values: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass  # not a literal: no value to compare with
    return values


def parameter_defaults(path: Path) -> dict[str, Any]:
    """The literal defaults of the notebook's parameters cell (name = <literal>)."""
    return literal_assignments(parameters_cell(path))


def run_notebook(name: str, scale: str | None = None, parameters: dict[str, Any] | None = None,
                 output: str | Path | None = None) -> Path:
    """Executes notebooks/<name>.ipynb with papermill; returns the executed notebook's path
    (default results/executed/<scale>/<name>.ipynb). String parameter values are plain YAML
    (grlib.config.values.load_plain); other values must be plain values themselves."""
    params = {key: _parse(key, value) for key, value in (parameters or {}).items()}
    path = notebook_path(name)
    cell = parameters_cell(path)
    defined = parameter_names(path, cell)
    unknown = [k for k in params if k not in defined]
    if unknown:
        raise NotebookError(f"{path}: parameters {unknown} are not defined in its parameters cell "
                            f"(it defines: {', '.join(defined)})")
    defaults = literal_assignments(cell)
    for key, value in params.items():
        if key in defaults:
            if value is None and isinstance(defaults[key], dict):
                params[key] = value = {}  # `-p overrides ""`: no overrides, as load_config reads ""
            check_type(path, key, value, defaults[key])
    if "scale" in params:
        if scale is not None and params["scale"] != scale:
            raise NotebookError(f"two scales given ({scale!r} and parameter scale={params['scale']!r}); give one")
        scale = params["scale"]
    scale = scale or config.default_scale()
    config.load_config(scale)  # fail early, with the list of valid scales
    params["scale"] = scale
    if "overrides" in params:
        config.load_config(scale, params["overrides"])  # a bad override fails here, not in a kernel
    out = Path(output) if output else paths.results_dir() / "executed" / scale / f"{path.stem}.ipynb"
    _execute(path, out, params)
    return out


# what a literal default of the parameters cell takes: (the default's types, the value's types, words)
_KINDS: tuple[tuple[tuple[type, ...], tuple[type, ...], str], ...] = (
    ((bool,), (bool,), "true or false"),
    ((int,), (int,), "an integer"),  # after bool: True is an int, and not an integer parameter's value
    ((float,), (int, float), "a finite number"),
    ((str,), (str,), "a string"),
    ((list, tuple), (list,), "a list"),
    ((dict,), (dict,), "a mapping"),
)


def check_type(path: Path, key: str, value: Any, default: Any) -> None:
    """NotebookError unless the plain `value` of parameter `key` has the type of its literal default in
    the parameters cell of `path` (a float default takes an int too; a None default, or a default of
    another kind, takes any plain value)."""
    for default_types, value_types, words in _KINDS:
        if isinstance(default, default_types):
            ok = isinstance(value, value_types) and (bool in value_types or not isinstance(value, bool))
            if ok and isinstance(value, float):
                ok = math.isfinite(value)
            if not ok:
                hint = "; quote a text that YAML would read as another type, e.g. '\"2024\"'" \
                    if isinstance(default, str) and (value is None or isinstance(value, (int, float))) else ""
                raise NotebookError(f"parameter {key}={values.shown(value)}: {path.name} expects {words} "
                                    f"(its default is {values.shown(default, 40)}){hint}")
            return


def failed_path(out: Path) -> Path:
    """Where a failed run of the notebook executed into `out` is saved."""
    return out.with_name(f"{out.stem}.failed.ipynb")


def _parse(key: str, value: Any) -> Any:
    """The plain value of parameter `key`: a string read as plain YAML, any other value checked."""
    if not isinstance(value, str):
        _check_plain(key, value)
        return value
    try:
        return values.load_plain(value)
    except values.PlainYAMLError as err:
        raise NotebookError(f"parameter {key}={values.shown(value)}: not a plain value "
                            f"({values.describe(err, text=value)})") from None
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or values.describe(err, text=value)
        raise NotebookError(f"parameter {key}={values.shown(value)}: not a valid YAML value ({problem})") from None


def _check_plain(key: str, value: Any) -> None:
    problem = values.plain_problem(value)
    if problem is not None:
        raise NotebookError(f"parameter {key}={values.shown(value)}: {problem}")


def _execute(path: Path, out: Path, params: dict[str, Any]) -> None:
    import papermill
    from papermill.exceptions import PapermillExecutionError

    for key, value in params.items():  # papermill writes what is not plain as "<str(value)>": code could run
        _check_plain(key, value)
    out.parent.mkdir(parents=True, exist_ok=True)
    # grlib's temporary naming (a killed run's file is swept by the next), mode 0666 & ~umask: papermill
    # rewrites the file in place and keeps it
    tmp = io.temp_file(out.parent, out.stem, suffix=".tmp.ipynb")
    root = os.environ.setdefault("GRLIB_PROJECT_ROOT", str(paths.project_root()))
    label, start = path.stem, time.monotonic()
    log(f"{label} ({params['scale']}): executing into {out}")
    try:
        papermill.execute_notebook(str(path), str(tmp), parameters=params, kernel_name="python3", cwd=root,
                                   progress_bar=False, engine_name=_engine(label, start),
                                   stderr_file=sys.stderr if enabled() else None,
                                   kernel_manager_class=kernel_manager_class())
    except PapermillExecutionError as err:
        failed = failed_path(out)
        os.replace(tmp, failed)
        raise NotebookFailed(_failure_message(path, out, failed, err), failed) from None
    except BaseException:
        if tmp.exists() and tmp.stat().st_size > 0:  # a partly executed notebook: keep it for a look
            os.replace(tmp, failed_path(out))
        else:
            tmp.unlink(missing_ok=True)
        raise
    _record_paths(tmp, path, out, Path(root))
    os.replace(tmp, out)
    failed_path(out).unlink(missing_ok=True)  # an earlier failure's notebook is out of date now
    log(f"{label}: done in {_clock(time.monotonic() - start)}")


def _record_paths(executed: Path, path: Path, out: Path, root: Path) -> None:
    """The executed notebook's papermill metadata names its notebook and its own final path (not the
    temporary file it ran into), relative to the project root where they lie under it: a committed
    executed notebook names no machine's checkout."""
    import nbformat

    def shown(p: Path) -> str:
        p = p.resolve()
        return str(p.relative_to(root.resolve())) if p.is_relative_to(root.resolve()) else str(p)

    nb = nbformat.read(executed, as_version=nbformat.NO_CONVERT)
    nb.metadata.setdefault("papermill", {}).update(input_path=shown(path), output_path=shown(out))
    nbformat.write(nb, executed)


def _failure_message(path: Path, out: Path, failed: Path, err: Any) -> str:
    lines = [line.strip() for line in str(err.evalue).splitlines() if line.strip()]
    what = f"{err.ename}: {lines[0]}" if lines else err.ename
    kept = f"; the last good run is kept at {out}" if out.exists() else ""
    return (f"notebook {path.stem} failed in cell {err.cell_index + 1} (In [{err.exec_count}]): {what}; "
            f"the failed notebook is saved as {failed}{kept}")


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes} min {secs:02d} s" if minutes else f"{seconds:.1f} s"


def kernel_manager_class() -> type:
    """jupyter_client's AsyncKernelManager, except that a shutdown sends the kernel no SIGINT first.

    jupyter_client interrupts the kernel before each shutdown_request. papermill shuts the kernel down
    as soon as its last request (kernel_info) is answered, and a SIGINT that lands while ipykernel is
    still leaving that request's handler is logged on the kernel's own stderr: "[IPKernelApp] ERROR |
    KeyboardInterrupt caught in kernel." That false error line broke GRLIB_PROGRESS=0's silence in 2 of
    30 runs of a 3-cell notebook with the other core busy. The kernel is idle by then (every cell has
    returned or raised); if it is not (the runner itself was interrupted), the shutdown_request and
    jupyter_client's SIGTERM and SIGKILL after shutdown_wait_time (5 s) still end it. interrupt_kernel()
    outside a shutdown is unchanged (tests/test_notebook_runner.py checks both)."""
    from jupyter_client import AsyncKernelManager

    class NoInterruptAtShutdown(AsyncKernelManager):
        async def _async_interrupt_kernel(self) -> None:  # what _async_shutdown_kernel calls
            if not self.shutting_down:
                await super()._async_interrupt_kernel()

    return NoInterruptAtShutdown


def _engine(label: str, start: float) -> str:
    """Registers a papermill engine that logs one line as each code cell starts; returns its name."""
    from papermill.engines import NBClientEngine, papermill_engines

    class CellLogEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, **kwargs):
            cells, cell_start = nb_man.nb.cells, nb_man.cell_start

            def announce(cell, cell_index=None, **kw):
                if cell.cell_type == "code" and cell_index is not None:
                    first = next((s.strip() for s in cell.source.splitlines()
                                  if s.strip() and not s.lstrip().startswith("#")), "")
                    first = first if len(first) <= 72 else first[:69] + "..."
                    log(f"{label} [{_clock(time.monotonic() - start)}]: cell {cell_index + 1}/{len(cells)}: {first}")
                return cell_start(cell, cell_index, **kw)

            nb_man.cell_start = announce
            return super().execute_managed_notebook(nb_man, kernel_name, **kwargs)

    papermill_engines.register("grlib-cell-log", CellLogEngine)
    return "grlib-cell-log"
