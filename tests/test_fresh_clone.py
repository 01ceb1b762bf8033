"""A fresh clone of the project is up to date: `git clone` of this checkout's HEAD into a temporary
folder, then `dvc status` there reports every stage up to date (so `make reproduce` in a clone reruns
nothing), and the executed notebooks of the committed scale are there, valid notebooks with their
outputs, to open in JupyterLab straight away. Every DVC output is `cache: false` (kept in git): a
clone has no DVC cache to fetch from."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _dvc_available() -> bool:
    return subprocess.run([sys.executable, "-c", "import dvc"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    if not (ROOT / ".git").exists():
        pytest.skip("needs the project's git checkout (it clones its HEAD)")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    if not _dvc_available():
        pytest.skip("dvc is not installed in this environment (pip install -e '.[cpu]')")
    dst = tmp_path_factory.mktemp("fresh") / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(dst)], check=True, timeout=300)
    return dst


def _stage_outputs(repo: Path) -> tuple[str, dict]:
    scale = yaml.safe_load((repo / "params.yaml").read_text())["scale"]
    stages = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]
    return scale, stages


def test_every_dvc_output_is_kept_in_git():
    """No output goes to DVC's cache only (a clone could not fetch it: the project has no DVC remote)."""
    _, stages = _stage_outputs(ROOT)
    cached = [f"{name}: {out}" for name, stage in stages.items()
              for out in [*stage.get("outs", []), *stage.get("metrics", [])]
              if not isinstance(out, dict) or next(iter(out.values())).get("cache", True)]
    assert not cached, f"outputs without cache: false in dvc.yaml: {cached}"


def test_dvc_status_of_a_fresh_clone_is_clean(clone):
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    proc = subprocess.run([sys.executable, "-m", "dvc", "status", "--json"], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    status = json.loads(proc.stdout)
    assert status == {}, ("a fresh clone of HEAD is not up to date (`dvc repro` at the committed scale, then "
                          f"commit its outputs and dvc.lock):\n{json.dumps(status, indent=1)[:4000]}")


def test_the_clone_holds_the_executed_notebooks_and_synthetic_data_only(clone):
    import nbformat

    scale, stages = _stage_outputs(clone)
    for name, stage in stages.items():
        paths = [out if isinstance(out, str) else next(iter(out)) for out in stage["outs"]]
        executed = [p.replace("${scale}", scale) for p in paths if p.startswith("results/executed/")]
        assert len(executed) == 1, (name, executed)
        path = clone / executed[0]
        assert path.is_file(), f"{executed[0]}: not in the clone"
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        assert any(cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), f"{executed[0]}: no outputs"
    # the committed prepared data is the synthetic twin, never a real dataset (those stay out of git)
    stats = json.loads((clone / "data" / "processed" / scale / "stats.json").read_text())
    assert stats["dataset"] == "synthetic", f"data/processed/{scale} holds {stats['dataset']}: real data is never committed"
