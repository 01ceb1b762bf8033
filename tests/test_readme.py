"""Every README command works as written.

Each line of a ```bash block is a command. Every `python -m grlib ...` command must parse with the
CLI's own parser (so no README command names a flag or choice that does not exist) and every
`make X` must name a Makefile target. The smoke-scale ones (`--scale smoke`, `-p scale smoke`, or
marked `# smoke` in the README) are run, exactly as written, in a scratch folder whose
`notebooks/` points at the project's, with outputs redirected by GRLIB_DATA_DIR /
GRLIB_RESULTS_DIR (set by conftest).
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from grlib import paths

ROOT = paths.project_root()


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            if line.strip():
                out.append(line.rstrip())
    return out


def _strip_comment(line: str) -> tuple[str, str]:
    """(command, trailing comment): a comment starts at ' # ' (no README command quotes one)."""
    code, sep, comment = line.partition(" # ")
    return code.strip(), comment.strip() if sep else ""


COMMANDS = [_strip_comment(c) for c in _commands()]
GRLIB = [c for c, _ in COMMANDS if c.startswith("python -m grlib ")]


def _is_smoke(code: str, comment: str) -> bool:
    return bool(re.search(r"--scale smoke|-p scale smoke", code)) or comment.startswith("smoke")


SMOKE = [c for c, comment in COMMANDS if _is_smoke(c, comment)]


def test_readme_has_commands():
    assert len(GRLIB) >= 8 and len(SMOKE) >= 3, (GRLIB, SMOKE)


@pytest.mark.parametrize("command", GRLIB)
def test_grlib_command_parses(command):
    from grlib.cli import build_parser

    argv = shlex.split(command)[3:]
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse's way of refusing
        pytest.fail(f"README command does not parse ({exc.code}): {command}")


def test_make_targets_exist():
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    used = {shlex.split(c)[1] for c, _ in COMMANDS if c.startswith("make ")}
    assert used and used <= targets, used - targets


@pytest.mark.slow
@pytest.mark.parametrize("command", SMOKE)
def test_smoke_command_runs_as_written(command, tmp_path):
    (tmp_path / "notebooks").symlink_to(ROOT / "notebooks", target_is_directory=True)
    env = {**os.environ, "GRLIB_PROJECT_ROOT": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"


WRITES = ("--out", "--json", "--checkpoint-dir", "--losses", "--output")  # flags whose value is a path written


def _written_paths(command: str) -> list[str]:
    """The paths a README command writes: the value of each flag in WRITES, papermill's output notebook."""
    out = []
    for part in command.split("&&"):
        args = shlex.split(part)
        out += [args[i + 1] for i, a in enumerate(args[:-1]) if a in WRITES]
        if args[:1] == ["papermill"]:
            out.append(args[2])
    return out


def test_readme_examples_write_under_ignored_folders():
    """A newcomer who runs a README example leaves `git status` clean: every path it writes is git-ignored."""
    written = {p for c, _ in COMMANDS for p in _written_paths(c)}
    assert len(written) >= 5, written
    proc = subprocess.run(["git", "check-ignore", "--no-index", "--verbose", "--non-matching", *sorted(written)],
                          cwd=ROOT, capture_output=True, text=True)
    if proc.returncode == 128:
        pytest.skip(f"git check-ignore unavailable here: {proc.stderr.strip()}")
    tracked = [line.split("\t")[-1] for line in proc.stdout.splitlines() if line.startswith("::")]
    assert not tracked, f"README examples write where git does not ignore: {tracked}"


def test_written_paths_are_found():
    assert _written_paths("mkdir -p a && papermill nb.ipynb results/x.ipynb -p scale smoke") == ["results/x.ipynb"]
    assert _written_paths("python -m grlib train --json o.json --checkpoint-dir ck") == ["o.json", "ck"]
