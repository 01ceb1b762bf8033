"""Project-root discovery from any working folder, and output-folder overrides."""
from __future__ import annotations

from pathlib import Path

import pytest

from grlib import paths

ROOT = Path(__file__).resolve().parents[1]


def test_root_found_from_notebooks_folder(monkeypatch):
    monkeypatch.delenv("GRLIB_PROJECT_ROOT", raising=False)
    monkeypatch.chdir(ROOT / "notebooks")
    assert paths.project_root() == ROOT


def test_env_overrides(monkeypatch, tmp_path):
    monkeypatch.setenv("GRLIB_RESULTS_DIR", str(tmp_path / "r"))
    monkeypatch.setenv("GRLIB_DATA_DIR", str(tmp_path / "d"))
    assert paths.results_dir() == tmp_path / "r"
    assert paths.data_dir() == tmp_path / "d"
    monkeypatch.setenv("GRLIB_PROJECT_ROOT", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="holds no params.yaml"):
        paths.project_root()


def test_real_data_helper(monkeypatch, tmp_path):
    monkeypatch.setenv("GRLIB_REAL_DATA", str(tmp_path / "absent"))
    assert paths.real_data_dir() is None
    assert paths.real_data_file("movielens_100k/u.data") is None
    (tmp_path / "movielens_100k").mkdir()
    (tmp_path / "movielens_100k" / "u.data").write_text("1\t2\t3\t4\n")
    monkeypatch.setenv("GRLIB_REAL_DATA", str(tmp_path))
    assert paths.real_data_file("movielens_100k/u.data") == tmp_path / "movielens_100k" / "u.data"


def test_no_machine_paths_in_the_repository():
    """Nothing tracked names a machine-specific folder (the checkout must work anywhere)."""
    import re
    import subprocess

    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not files:
        pytest.skip("not a git checkout: no tracked files to scan")
    bad = re.compile(r"(?<![\w.])/(tmp|work|opt|farm|root|home)/")
    hits = []
    for name in files:
        path = ROOT / name
        if path.suffix in (".parquet", ".png") or not path.is_file():
            continue
        for i, line in enumerate(path.read_text(errors="ignore").splitlines(), 1):
            if bad.search(line):
                hits.append(f"{name}:{i}: {line.strip()[:80]}")
    assert not hits, "\n".join(hits)
