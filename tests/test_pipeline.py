"""`dvc repro` at the smoke scale in a temporary copy of the repository: every stage runs,
tables / figures / executed notebooks appear, a second repro runs nothing, and changing one
ablation parameter reruns only the stages that use it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import yaml

from grlib import paths

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".venv", ".git", "build", "data", "results", ".dvc", ".hypothesis", ".pytest_cache", "__pycache__"}


def _copy_repo(dst: Path) -> None:
    for item in ROOT.iterdir():
        if item.name in SKIP or item.name.endswith(".egg-info"):
            continue
        if item.is_dir():
            shutil.copytree(item, dst / item.name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(item, dst / item.name)
    for name in ("data", "results"):  # the tracked READMEs only, no outputs
        (dst / name).mkdir()
        shutil.copy2(ROOT / name / "README.md", dst / name / "README.md")


def _run(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _quick_grids(ablations: dict) -> dict:
    """The stages that DVC runs with `-p quick false` get their notebook's quick grid in the copy's
    params.yaml: this test checks the pipeline (every stage runs, writes its outputs, reruns only
    what a parameter change touches), not the grids, which their own tests and notebooks run."""
    import dataclasses

    from grlib.config import load_ablation
    from grlib.experiments import balance_stage, negatives_stage, scaling_stage, semi_async_stage, sparse_stage

    out = {}
    for name, stage in (("balance", balance_stage), ("sparse", sparse_stage), ("semi_async", semi_async_stage),
                        ("scaling", scaling_stage), ("negatives", negatives_stage)):
        grid = dataclasses.asdict(stage.quick(load_ablation(name)))
        if name == "scaling":  # the fit of the compute model takes each step's median round: 3 rounds, not
            grid.update(rounds=3, solo_steps=4)  # one, so that a smoke step of a few ms read as 0 CPU s is not it
        out[name] = {k: v for k, v in grid.items() if k in ablations[name]}  # params.yaml's keys only
    return out


@pytest.mark.slow
def test_dvc_repro_smoke_in_a_copy(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _copy_repo(repo)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["scale"] = "smoke"
    params["ablations"].update(_quick_grids(params["ablations"]))
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRLIB_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["GRLIB_PROJECT_ROOT"] = str(repo)
    real = paths.real_data_dir()  # the copy has no ../shared beside it: point it at the real slices, if any
    if real is not None:
        env["GRLIB_REAL_DATA"] = str(real)
    dvc = [sys.executable, "-m", "dvc"]
    _run(["git", "init", "-q"], repo, env)
    _run(dvc + ["init", "-q"], repo, env)
    _run(dvc + ["config", "core.analytics", "false"], repo, env)

    first = _run(dvc + ["repro"], repo, env).stdout
    stages = [s for s in yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]]
    for stage in stages:
        assert f"Running stage '{stage}'" in first
    results = repo / "results"
    train_parts = results / "tables" / "train" / "scale=smoke"
    assert list(train_parts.glob("*.parquet"))
    assert (results / "figures" / "smoke" / "train_quality.svg").read_text().lstrip().startswith("<svg")
    assert (results / "figures" / "smoke" / "train_quality.png").read_bytes()[:4] == b"\x89PNG"
    assert (results / "executed" / "smoke" / "02_train.ipynb").exists()
    summary = (results / "summary" / "smoke.md").read_text()  # the report reads every stage's table
    assert "measured: kernels run" in summary and "measured: negatives run" in summary and "| C2 " in summary
    train = pl.concat([pl.read_parquet(p) for p in sorted(train_parts.glob("*.parquet"))], how="diagonal_relaxed")
    grid = params["ablations"]["train"]
    per_seed = len(grid["models"]) * train["dataset"].n_unique()  # ml-100k is skipped where absent
    n_seeds = len(grid["seeds"])
    assert set(train["scale"]) == {"smoke"} and train.height == per_seed * len(grid["seeds"])

    start = time.perf_counter()
    second = _run(dvc + ["repro"], repo, env).stdout
    assert "Running stage" not in second
    assert time.perf_counter() - start < 30

    params["ablations"]["train"]["seeds"] = [*grid["seeds"], max(grid["seeds"]) + 1]
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    third = _run(dvc + ["repro"], repo, env).stdout
    assert "Running stage 'train'" in third and "Running stage 'report'" in third
    assert "Running stage 'data'" not in third
    train = pl.concat([pl.read_parquet(p) for p in sorted(train_parts.glob("*.parquet"))], how="diagonal_relaxed")
    assert train.height == per_seed * (2 * n_seeds + 1)  # appended, not replaced
