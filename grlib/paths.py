"""Where things live: the project root, data/, results/ and the shared real-data slices.

Works the same under JupyterLab (cwd = notebooks/), nbmake (cwd = the notebook's folder),
papermill and `dvc repro` (cwd = the project root), and from tests.

Environment variables (all optional):
  GRLIB_PROJECT_ROOT  the project root (else: walk up from the cwd, then from this package)
  GRLIB_DATA_DIR      where data/raw and data/processed go (default <root>/data)
  GRLIB_RESULTS_DIR   where tables, figures, metrics and executed notebooks go (default <root>/results)
  GRLIB_REAL_DATA     the folder of real data slices (default: shared/data/real next to the root)
"""
from __future__ import annotations

import os
from pathlib import Path

_MARKERS = ("params.yaml", "grlib")


def _is_root(path: Path) -> bool:
    return (path / "params.yaml").is_file() and (path / "grlib").is_dir()


def project_root() -> Path:
    """The folder that holds params.yaml and grlib/."""
    env = os.environ.get("GRLIB_PROJECT_ROOT")
    if env:
        root = Path(env).resolve()
        if not _is_root(root):
            raise FileNotFoundError(f"GRLIB_PROJECT_ROOT={env} holds no params.yaml and grlib/")
        return root
    for start in (Path.cwd().resolve(), Path(__file__).resolve().parent):
        for path in (start, *start.parents):
            if _is_root(path):
                return path
    raise FileNotFoundError(
        f"cannot find the project root (a folder with {' and '.join(_MARKERS)}) above "
        f"{Path.cwd()}; set GRLIB_PROJECT_ROOT"
    )


def _dir(env: str, default: str) -> Path:
    value = os.environ.get(env)
    return Path(value).resolve() if value else project_root() / default


def data_dir() -> Path:
    return _dir("GRLIB_DATA_DIR", "data")


def results_dir() -> Path:
    return _dir("GRLIB_RESULTS_DIR", "results")


def params_path() -> Path:
    return project_root() / "params.yaml"


def real_data_dir() -> Path | None:
    """The shared real-data slices (../shared/data/real beside the checkout), or None if absent."""
    env = os.environ.get("GRLIB_REAL_DATA")
    if env:
        return Path(env).resolve() if Path(env).is_dir() else None
    try:
        root = project_root()
    except FileNotFoundError:
        return None
    for base in (root, *root.parents[:3]):
        candidate = base / "shared" / "data" / "real"
        if candidate.is_dir():
            return candidate
    return None


def real_data_file(relative: str) -> Path | None:
    """A file of the real-data slices, e.g. 'movielens_100k/u.data', or None if absent."""
    base = real_data_dir()
    if base is None:
        return None
    path = base / relative
    return path if path.exists() else None
