"""Extras install coherent sets: fbgemm comes from exactly one extra per machine kind, and an
environment with two fbgemm wheels (CPU and CUDA overwrite each other's files) is refused."""
from __future__ import annotations

import importlib.metadata
import re
import tomllib

import pytest

from grlib import paths
from grlib.ops import fbgemm


def _name(req: str) -> str:
    return re.split(r"[=<>!~\[; ]", req, maxsplit=1)[0].lower()


@pytest.fixture(scope="module")
def project() -> dict:
    return tomllib.loads((paths.project_root() / "pyproject.toml").read_text())["project"]


def test_base_dependencies_name_no_accelerator_wheel(project):
    base = {_name(r) for r in project["dependencies"]}
    assert not base & {"fbgemm-gpu-cpu", "fbgemm-gpu", "fbgemm-ascend", "torch-npu", "triton"}, base


@pytest.mark.parametrize("extra, wanted", [("cpu", "fbgemm-gpu-cpu"), ("cuda", "fbgemm-gpu"), ("npu", "fbgemm-ascend")])
def test_each_machine_extra_brings_exactly_one_fbgemm(project, extra, wanted):
    names = {_name(r) for r in project["optional-dependencies"][extra]}
    fbgemms = {n for n in names if n.startswith("fbgemm")}
    assert fbgemms == {wanted}


def test_makefile_installs_the_cpu_extra():
    text = (paths.project_root() / "Makefile").read_text()
    installs = re.findall(r"install .*-e '\.\[([a-z,]+)\]'", text)
    assert installs and all("cpu" in extras.split(",") for extras in installs), installs


def test_this_environment_has_one_fbgemm():
    assert len(fbgemm.installed_fbgemm()) == 1, fbgemm.installed_fbgemm()


def test_mixed_fbgemm_wheels_are_refused(monkeypatch):
    versions = {"fbgemm-gpu-cpu": "1.8.0", "fbgemm-gpu": "1.8.0"}

    def fake_version(name):
        if name in versions:
            return versions[name]
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", fake_version)
    fbgemm.check_fbgemm.cache_clear()
    try:
        with pytest.raises(ImportError, match="mixed fbgemm installs: fbgemm-gpu-cpu==1.8.0, fbgemm-gpu==1.8.0"):
            fbgemm.check_fbgemm()
        versions.clear()
        fbgemm.check_fbgemm.cache_clear()
        with pytest.raises(ImportError, match=r"needs fbgemm: pip install -e '\.\[cpu\]'"):
            fbgemm.check_fbgemm()
    finally:
        fbgemm.check_fbgemm.cache_clear()
