"""`--help` of every command, and `config`, import no more than that command needs: no torch, no
altair, no grlib.experiments, and no bench module but the one named (grlib.bench imports a bench's module when
the command line names it, and the module its stage inside `run`).

The modules a command imported are read from its process's sys.modules at exit (-X importtime's log
misses what importlib.import_module loads, as grlib.bench does), and a forbidden one is reported with
the import chain that log shows. One `python -X importtime` process imports grlib (which every
command imports first; it loads no torch) and forks a child per command, which runs `python -m grlib ARGS`
(runpy): 17 fresh interpreters would add a minute to `make test`. Two commands also run in a fresh
interpreter each, and must import the same grlib modules as their forked run. Nothing here times
anything: how long a `--help` takes is measured by hand (`python -X importtime -m grlib --help`,
beside `python -c "import torch"`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grlib.bench import BENCHES

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [
    ["--help"], ["config"], ["config", "--help"], ["notebook", "--help"], ["train", "--help"],
    ["data", "--help"], ["data", "download", "--help"], ["data", "prepare", "--help"], ["bench", "--help"],
    ["claims", "--help"], ["clean", "--help"],
    *(["bench", name, "--help"] for name in BENCHES),
]
FRESH = [["--help"], ["bench", "train", "--help"]]

# argv[1]: a JSON list of commands. Forks one child per command that runs `python -m grlib *command`
# with stdout and stderr (the importtime log) in files, then prints one JSON line per command:
# {"args", "status", "modules" (the child's sys.modules at exit), "stderr"}.
DRIVER = r"""
import json, os, runpy, sys, tempfile
import grlib  # noqa: F401  (what every command imports first)

for args in json.loads(sys.argv[1]):
    out = tempfile.TemporaryFile("w+")
    err = tempfile.TemporaryFile("w+")
    result = tempfile.TemporaryFile("w+")
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
        status = 0
        try:
            sys.argv = ["grlib", *args]
            runpy.run_module("grlib", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            import traceback; traceback.print_exc(); status = 1
        sys.stdout.flush(); sys.stderr.flush()
        json.dump({"status": status, "modules": sorted(sys.modules)}, result); result.flush()
        os._exit(0)
    os.waitpid(pid, 0)
    for f in (err, result):
        f.seek(0)
    row = json.loads(result.read() or '{"status": "crashed", "modules": []}')
    print(json.dumps({"args": args, **row, "stderr": err.read()}), flush=True)
"""

# `python -m grlib *argv[1:]` in this interpreter, then the JSON list of sys.modules on the last line
FRESH_RUN = r"""
import atexit, json, runpy, sys
atexit.register(lambda: print("\n" + json.dumps(sorted(sys.modules)), flush=True))
sys.argv = ["grlib", *sys.argv[1:]]
runpy.run_module("grlib", run_name="__main__", alter_sys=True)
"""


def forbidden(modules: list[str], bench: str | None) -> list[str]:
    """The modules that a command running `bench` (None: no bench) must not import."""
    allowed = {BENCHES[bench]} if bench else set()
    return [m for m in modules if m.split(".")[0] in ("altair", "torch") or m == "grlib.experiments"
            or m.startswith("grlib.experiments.") or (m in BENCHES.values() and m not in allowed)]


def chain(importtime: str, module: str) -> str:
    """`module <- its importer <- ...` as -X importtime logged its first import."""
    names = [line.split("|")[-1] for line in importtime.splitlines() if line.startswith("import time:")]
    for i, name in enumerate(names):
        if name.strip() == module:
            depth, parents = len(name) - len(name.lstrip()), [module]
            for above in names[i + 1:]:  # a module's line comes after those of the modules it imported
                d = len(above) - len(above.lstrip())
                if d < depth:
                    parents.append(above.strip())
                    depth = d
            return " <- ".join(parents)
    return f"{module} (not in -X importtime's log: loaded by importlib)"


def bench_of(args: list[str]) -> str | None:
    return args[1] if len(args) > 1 and args[0] == "bench" and args[1] in BENCHES else None


def problems(args: list[str], status, modules: list[str], importtime: str) -> list[str]:
    command = "python -m grlib " + " ".join(args)
    if status != 0:
        return [f"{command} exited {status}:\n{importtime[-2000:]}"]
    bench = bench_of(args)
    if "grlib.cli" not in modules or (bench and BENCHES[bench] not in modules):
        return [f"{command} did not import grlib.cli and the bench it names"]
    return [f"{command} imports {chain(importtime, m)}" for m in forbidden(modules, bench)
            if not m.startswith(("altair.", "torch."))]  # their own submodules add nothing to `altair`, `torch`


def _env() -> dict[str, str]:
    return dict(os.environ, COLUMNS="100", GRLIB_PROGRESS="0")


@pytest.fixture(scope="module")
def forked() -> dict[str, dict]:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", DRIVER, json.dumps(COMMANDS)], cwd=ROOT,
                          env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {" ".join(r["args"]): r for r in rows}


def test_no_command_help_imports_altair_an_experiment_or_another_bench(forked):
    assert sorted(forked) == sorted(" ".join(c) for c in COMMANDS)
    found = [p for r in forked.values() for p in problems(r["args"], r["status"], r["modules"], r["stderr"])]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("args", FRESH, ids=" ".join)
def test_a_fresh_interpreter_imports_the_same_grlib_modules_as_the_forked_run(args, forked):
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", FRESH_RUN, *args], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=300)
    modules = json.loads(proc.stdout.strip().splitlines()[-1])
    assert problems(args, proc.returncode, modules, proc.stderr) == []

    def ours(names):
        return sorted(m for m in names if m.split(".")[0] in ("grlib", "altair"))

    assert ours(modules) == ours(forked[" ".join(args)]["modules"])


def test_the_checks_catch_planted_imports():
    assert forbidden(["grlib", "grlib.bench", "grlib.bench.common", "grlib.bench.train"], "train") == []
    assert forbidden(["grlib.bench.train", "grlib.bench.ops", "altair", "altair.vegalite",
                      "grlib.experiments", "grlib.experiments.measure"], "train") == [
        "grlib.bench.ops", "altair", "altair.vegalite", "grlib.experiments", "grlib.experiments.measure"]
    assert forbidden(["grlib.bench.train"], None) == ["grlib.bench.train"]
    assert forbidden(["grlib.bench.train", "torch", "torch.nn", "torchrec"], "train") == ["torch", "torch.nn"]
    log = ("import time: self [us] | cumulative | imported package\n"
           "import time:       10 |         10 |       altair.utils\n"
           "import time:       10 |         20 |     altair\n"
           "import time:       10 |         30 |   grlib.plots\n"
           "import time:       10 |         40 | grlib.experiments\n")
    assert chain(log, "altair") == "altair <- grlib.plots <- grlib.experiments"
    assert chain(log, "grlib.bench.ops").endswith("loaded by importlib)")
    assert problems(["bench", "ops", "--help"], 0, ["grlib.cli", "grlib.bench.ops", "altair", "altair.utils"], log) == [
        "python -m grlib bench ops --help imports altair <- grlib.plots <- grlib.experiments"]
    assert problems(["--help"], 2, [], "error: x") == ["python -m grlib --help exited 2:\nerror: x"]


def test_the_log_schema_loads_polars_only_when_its_dtypes_are_read():
    code = """
import sys
from grlib.schema import ACTION_BITS, FIRST_ITEM_ID, LOG_COLUMNS, DataError
assert "polars" not in sys.modules, "grlib.schema imported polars"
from grlib.schema import LOG_SCHEMA
import polars as pl
assert tuple(LOG_SCHEMA) == LOG_COLUMNS and LOG_SCHEMA["user_id"] is pl.Int64 and LOG_SCHEMA["is_click"] is pl.Int8
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
