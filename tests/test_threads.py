"""grlib.threads: the OpenMP wait policy set before torch loads, the user's settings winning, the
thread bound by affinity and cgroup quota. libgomp reads its settings once, when it loads, so each
policy case runs in a fresh interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grlib import threads

REPORT = "import json, os, grlib; from grlib import threads; " \
         "print(json.dumps({**threads.policy(), 'env': os.environ.get('OMP_WAIT_POLICY'), " \
         "'inherited': threads.inherited_policy()}))"


SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS", threads.POLICY_ENV,
            threads.THREADS_ENV)


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter, with none of the thread settings of this one and `env` added."""
    base = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                          timeout=120)


def _report(**env: str) -> dict:
    proc = _python(REPORT, **env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_grlib_sets_passive_before_torch_loads_and_children_inherit_it():
    out = _report()
    assert out["wait_policy"] == out["inherited"] == out["env"] == "PASSIVE"  # the environment children inherit


def test_the_users_own_settings_win():
    out = _report(OMP_WAIT_POLICY="active")
    assert out["wait_policy"] == "ACTIVE" and out["env"] == "active"
    out = _report(GRLIB_WAIT_POLICY="default")  # libgomp's own spin-then-sleep: nothing set
    assert out["wait_policy"] == "default" and out["env"] is None
    assert _report(GRLIB_THREADS="1")["threads"] == 1
    assert _report(GOMP_SPINCOUNT="1000")["wait_policy"] == "PASSIVE+GOMP_SPINCOUNT=1000"  # named, not hidden


@pytest.mark.parametrize("env, message", [({"GRLIB_WAIT_POLICY": "lazy"}, "GRLIB_WAIT_POLICY='lazy': expected one of"),
                                          ({"GRLIB_THREADS": "0"}, "GRLIB_THREADS='0': expected a positive integer")])
def test_bad_settings_are_named(env, message):
    proc = _python("import grlib", **env)
    assert proc.returncode != 0 and message in proc.stderr.strip().splitlines()[-1]


def test_torch_imported_first_is_reported_not_hidden():
    proc = _python("import torch\n" + REPORT.replace("; ", "\n"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["wait_policy"] == "default" and out["inherited"] == "PASSIVE"  # too late here, set for children
    assert "RuntimeWarning" in proc.stderr and "import grlib before torch" in proc.stderr


# After a parallel region, idle OpenMP workers sleep (PASSIVE) or keep spinning (ACTIVE): the CPU
# the process burns while its main thread sleeps shows which policy libgomp actually runs with.
IDLE_CPU = """
import time, grlib, torch
a = torch.randn(1024, 1024)
for _ in range(3):
    a @ a
cpu = time.process_time()
time.sleep(1.0)  # the idle window: the CPU seconds burned in it are measured, not its length
print(time.process_time() - cpu)
"""


def test_libgomp_runs_with_the_policy_grlib_set():
    passive = _python(IDLE_CPU, GRLIB_THREADS="2")
    active = _python(IDLE_CPU, GRLIB_THREADS="2", GRLIB_WAIT_POLICY="active")
    assert passive.returncode == 0 and active.returncode == 0, passive.stderr + active.stderr
    # a spinning worker gets a good share of a core over 1 s even on a busy machine; a sleeping one none
    assert float(passive.stdout) < 0.1 < float(active.stdout)


def _cgroup(tmp_path: Path, proc_line: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    proc = tmp_path / "proc_cgroup"
    proc.write_text(proc_line)
    return root, proc


def test_cgroup_quota_v2_tightest_of_the_cgroup_and_its_ancestors(tmp_path):
    root, proc = _cgroup(tmp_path, "0::/a/b\n", {"a/cpu.max": "150000 100000\n", "a/b/cpu.max": "max 100000\n"})
    assert threads.cgroup_cpu_limit(root, proc) == 1.5
    root, proc = _cgroup(tmp_path / "none", "0::/\n", {"cpu.max": "max 100000\n"})
    assert threads.cgroup_cpu_limit(root, proc) is None
    assert threads.cgroup_cpu_limit(root, tmp_path / "absent") is None


def test_cgroup_quota_v1(tmp_path):
    root, proc = _cgroup(tmp_path, "4:memory:/x\n1:cpu,cpuacct:/job\n",
                         {"cpu/job/cpu.cfs_quota_us": "50000\n", "cpu/job/cpu.cfs_period_us": "100000\n"})
    assert threads.cgroup_cpu_limit(root, proc) == 0.5
    root, proc = _cgroup(tmp_path / "u", "1:cpu:/\n",
                         {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert threads.cgroup_cpu_limit(root, proc) is None


def test_threads_bounded_by_the_cores_available(monkeypatch):
    before = torch.get_num_threads()
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", threads.THREADS_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "cgroup_cpu_limit", lambda: 1.5)
    assert threads.cores_available() == min(2, len(os.sched_getaffinity(0)))  # a 1.5-CPU quota: 2 threads at most
    monkeypatch.setattr(threads, "cgroup_cpu_limit", lambda: 0.5)
    assert threads.cores_available() == 1
    try:
        torch.set_num_threads(4)
        threads.apply_thread_count()
        assert torch.get_num_threads() == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's count is left as torch read it
        torch.set_num_threads(3)
        threads.apply_thread_count()
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
