"""Running the project's notebooks with papermill (used by the CLI and the DVC stages)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from grlib import config, paths


def notebook_path(name: str) -> Path:
    path = paths.project_root() / "notebooks" / f"{name}.ipynb"
    if not path.exists():
        names = sorted(p.stem for p in (paths.project_root() / "notebooks").glob("*.ipynb"))
        raise FileNotFoundError(f"no notebook {name!r}; notebooks: {', '.join(names)}")
    return path


def run_notebook(name: str, scale: str | None = None, parameters: dict[str, Any] | None = None,
                 output: str | Path | None = None) -> Path:
    """Executes notebooks/<name>.ipynb with papermill; returns the executed notebook's path."""
    import papermill

    scale = scale or config.default_scale()
    config.load_config(scale)  # fail early, with the list of valid scales
    params = {"scale": scale}
    for key, value in (parameters or {}).items():
        params[key] = yaml.safe_load(value) if isinstance(value, str) else value
    out = Path(output) if output else paths.results_dir() / "executed" / scale / f"{name}.ipynb"
    out.parent.mkdir(parents=True, exist_ok=True)
    _check_parameters(notebook_path(name), params)
    env_root = os.environ.setdefault("GRLIB_PROJECT_ROOT", str(paths.project_root()))
    papermill.execute_notebook(str(notebook_path(name)), str(out), parameters=params,
                               kernel_name="python3", cwd=env_root, progress_bar=False)
    return out


def _check_parameters(path: Path, params: dict[str, Any]) -> None:
    """Refuses a notebook that could not receive `params` (papermill itself only warns, and the
    notebook would silently run its smoke defaults)."""
    cells = json.loads(path.read_text())["cells"]
    tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        raise ValueError(f"{path}: needs exactly one cell tagged 'parameters', found {len(tagged)}")
    source = "".join(tagged[0]["source"])
    unknown = [k for k in params if f"{k} =" not in source]
    if unknown:
        raise ValueError(f"{path}: parameters {unknown} are not defined in its parameters cell")
