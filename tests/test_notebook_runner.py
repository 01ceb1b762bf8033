"""The notebook runner (`python -m grlib notebook`, grlib.cli.notebook) and papermill parameters:
a failed run keeps the last good executed notebook and saves the failed one beside it; errors are
one line, exit 2; progress lines when stderr is not a terminal; parameters matched by whole name;
overrides given as text (papermill -p) are parsed as a mapping."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grlib.cli import notebook as notebooks
from grlib.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _notebook(cells: list[str], params: str) -> dict:
    def code(i, src, tags=()):
        return {"cell_type": "code", "id": f"c{i}", "metadata": {"tags": list(tags)}, "source": src,
                "outputs": [], "execution_count": None}
    return {"cells": [code(0, params, ["parameters"]), *(code(i + 1, s) for i, s in enumerate(cells))],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


PARAMS = 'scale = "smoke"\nfail = False\nnote, other = "a", "b"\n'
CELLS = ['import sys\nprint("kernel-progress-line", file=sys.stderr)',
         'if fail:\n    raise ValueError("boom: a bad thing\\nsecond line")',
         'print("finished", note)']


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project root of its own holding notebooks/x.ipynb."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "grlib").mkdir()
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    (tmp_path / "notebooks" / "x.ipynb").write_text(json.dumps(_notebook(CELLS, PARAMS)))
    monkeypatch.setenv("GRLIB_PROJECT_ROOT", str(tmp_path))
    return tmp_path


def test_parameters_are_matched_by_whole_name(project):
    path = project / "notebooks" / "x.ipynb"
    assert notebooks.parameter_names(path) == ["scale", "fail", "note", "other"]
    with pytest.raises(notebooks.NotebookError, match=r"parameters \['cale'\] are not defined .*defines: scale, fail"):
        notebooks.run_notebook("x", "smoke", {"cale": "laptop"}, output=project / "out.ipynb")
    with pytest.raises(notebooks.NotebookError, match=r"\['ail'\]"):
        notebooks.run_notebook("x", "smoke", {"ail": "true"}, output=project / "out.ipynb")
    assert notebooks.parameter_names(ROOT / "notebooks" / "02_train.ipynb") == ["scale", "overrides",
                                                                                "ablation_overrides", "data"]


def test_a_bool_parameter_takes_only_true_or_false(project):
    """`fail = False` in the parameters cell: `-p fail maybe` would be a truthy string in the kernel."""
    path = project / "notebooks" / "x.ipynb"
    assert notebooks.parameter_defaults(path) == {"scale": "smoke", "fail": False}  # the tuple target is skipped
    for value in ("maybe", "1", "[]"):
        with pytest.raises(notebooks.NotebookError, match=rf"^parameter fail=.*: x.ipynb expects true or false"):
            notebooks.run_notebook("x", "smoke", {"fail": value}, output=project / "out.ipynb")
    assert not (project / "out.ipynb").exists()
    assert notebooks.run_notebook("x", "smoke", {"fail": "false"}, output=project / "out.ipynb").exists()


def test_failed_run_keeps_the_last_good_notebook_and_saves_the_failed_one(project, capsys):
    out = project / "executed" / "x.ipynb"
    assert notebooks.run_notebook("x", "smoke", output=out) == out
    good = out.read_bytes()
    assert "finished a" in good.decode()
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # the caller's umask, not mkstemp's 0600
    recorded = json.loads(good)["metadata"]["papermill"]  # the final path, relative to the project root
    assert (recorded["input_path"], recorded["output_path"]) == ("notebooks/x.ipynb", "executed/x.ipynb")

    with pytest.raises(notebooks.NotebookFailed) as err:
        notebooks.run_notebook("x", "smoke", {"fail": "true"}, output=out)
    failed = project / "executed" / "x.failed.ipynb"
    assert out.read_bytes() == good  # the last good run is untouched
    assert err.value.failed_path == failed and "boom: a bad thing" in failed.read_text()
    msg = str(err.value)
    # cell 4 of the executed notebook: parameters, injected parameters, the stderr cell, the raising cell
    assert msg.startswith("notebook x failed in cell 4 (In [4]): ValueError: boom: a bad thing;"), msg
    assert str(failed) in msg and f"last good run is kept at {out}" in msg and "\n" not in msg
    assert sorted(p.name for p in out.parent.iterdir()) == ["x.failed.ipynb", "x.ipynb"]  # no temporary left

    # the same through the CLI: one line, exit 2
    capsys.readouterr()
    assert main(["notebook", "x", "--scale", "smoke", "-p", "fail", "true", "--output", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("error: notebook x failed in cell 4") and "Traceback" not in "".join(lines)

    # a good run again replaces the output and removes the out-of-date failed notebook
    notebooks.run_notebook("x", "smoke", output=out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["x.ipynb"]


def test_failed_first_run_leaves_no_output(project):
    out = project / "executed" / "x.ipynb"
    with pytest.raises(notebooks.NotebookFailed, match="failed notebook is saved as") as err:
        notebooks.run_notebook("x", "smoke", {"fail": True}, output=out)
    assert "last good run" not in str(err.value)
    assert sorted(p.name for p in out.parent.iterdir()) == ["x.failed.ipynb"]


@pytest.mark.parametrize("argv,message", [
    (["notebook", "nope"], "error: no notebook 'nope'; notebooks: x"),
    (["notebook", "x", "-p", "cale", "laptop"], "error: "),
    (["notebook", "x", "-p", "note", "{bad"], "error: parameter note='{bad': not a valid YAML value"),
    (["notebook", "x", "--scale", "huge"], "error: unknown scale 'huge'; valid scales: smoke, laptop"),
    (["notebook", "x", "--scale", "smoke", "-p", "scale", "laptop"], "error: two scales given"),
])
def test_runner_mistakes_are_one_line_exit_2(project, capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


def test_bad_overrides_fail_before_a_kernel_starts(capsys):
    assert main(["notebook", "02_train", "--scale", "smoke", "-p", "overrides", '{"model.n_layer": 2}']) == 2
    assert capsys.readouterr().err.startswith("error: unknown parameter 'model.n_layer'; valid model parameters")


def test_cli_shows_progress_when_stderr_is_not_a_terminal(project, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GRLIB_PROGRESS"}
    proc = subprocess.run([sys.executable, "-m", "grlib", "notebook", "x", "--scale", "smoke",
                           "--output", str(tmp_path / "o" / "x.ipynb")],
                          env={**env, "GRLIB_PROJECT_ROOT": str(project)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "x (smoke): executing into" in err
    assert "cell 4/5: if fail:" in err and "cell 5/5: print(\"finished\", note)" in err  # one line per code cell
    assert "kernel-progress-line" in err  # the kernel's stderr (grlib.progress lines) is forwarded
    assert "x: done in" in err
    assert proc.stdout.strip() == str(tmp_path / "o" / "x.ipynb")
    quiet = subprocess.run([sys.executable, "-m", "grlib", "notebook", "x", "--scale", "smoke",
                            "--output", str(tmp_path / "o" / "x.ipynb")],
                           env={**env, "GRLIB_PROJECT_ROOT": str(project), "GRLIB_PROGRESS": "0"},
                           capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def test_kernel_shutdown_sends_no_interrupt_but_interrupts_still_work():
    """The runner's kernel manager: jupyter_client's shutdown would SIGINT the kernel first, which
    races ipykernel's last handler into a false "KeyboardInterrupt caught in kernel" line on stderr
    (the quiet run above saw it in CI). Signals are recorded at the provisioner, on a real kernel."""
    import asyncio
    import signal

    async def run() -> tuple[list[int], list[int]]:
        km = notebooks.kernel_manager_class()(kernel_name="python3")
        await km.start_kernel()
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=120)  # a SIGINT during the kernel's imports would kill it
        sent: list[int] = []
        send = km.provisioner.send_signal

        async def record(signum: int) -> None:
            sent.append(signum)
            await send(signum)

        km.provisioner.send_signal = record
        await km.interrupt_kernel()  # a plain interrupt still signals
        before = list(sent)
        await km.shutdown_kernel()
        kc.stop_channels()
        assert not await km.is_alive()
        return before, sent[len(before):]

    before, during_shutdown = asyncio.run(run())
    assert before == [signal.SIGINT]
    assert signal.SIGINT not in during_shutdown, during_shutdown


def test_papermill_p_overrides_text_reaches_load_config(tmp_path):
    """The README form `papermill NB OUT -p scale smoke -p overrides '{"model.n_layers": 2}'`: papermill
    passes the value as a string, which load_config / load_ablation parse as a mapping."""
    src = ('from grlib.config import load_ablation, load_config\n'
           'cfg = load_config(scale, overrides)\n'
           'ab = load_ablation("train", ablation_overrides)\n'
           'print("n_layers", cfg.model.n_layers, "seeds", ab.seeds)')
    nb = _notebook([src], 'scale = "smoke"\noverrides = {}\nablation_overrides = {}\n')
    (tmp_path / "nb.ipynb").write_text(json.dumps(nb))
    proc = subprocess.run([sys.executable, "-m", "papermill", str(tmp_path / "nb.ipynb"), str(tmp_path / "out.ipynb"),
                           "-p", "scale", "smoke", "-p", "overrides", '{"model.n_layers": 2}',
                           "-p", "ablation_overrides", "seeds: [4, 5]", "--cwd", str(ROOT)],
                          env={**os.environ, "GRLIB_PROJECT_ROOT": str(ROOT)}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads((tmp_path / "out.ipynb").read_text())
    injected = next(c for c in out["cells"] if "injected-parameters" in c["metadata"].get("tags", []))
    assert 'overrides = "{\\"model.n_layers\\": 2}"' in "".join(injected["source"])  # a string, as in the issue
    text = "".join("".join(o.get("text", "")) for c in out["cells"] for o in c.get("outputs", []))
    assert "n_layers 2 seeds [4, 5]" in text


def _umask() -> int:
    from grlib.io import umask

    return umask()
