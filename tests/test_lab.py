"""JupyterLab starts headless on 127.0.0.1, serves the notebooks, and stops; notebook charts render
without internet (PNG drawn in the kernel); tqdm's notebook bars have their widgets."""
from __future__ import annotations

import ast
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, resp.read()


@pytest.mark.slow
def test_jupyterlab_serves_the_notebooks(tmp_path):
    port = _free_port()
    args = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            "--IdentityProvider.token=", "--ServerApp.password=", f"--ServerApp.root_dir={ROOT}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--allow-root")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
        deadline = time.time() + 90  # only ends a wait for the server that would hang: no duration is asserted
        while True:
            try:
                status, body = _get(f"http://127.0.0.1:{port}/api/contents/notebooks")
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    out = proc.stdout.read().decode() if proc.poll() is not None else ""
                    pytest.fail(f"JupyterLab did not start on port {port}: {out[-2000:]}")
                time.sleep(0.5)  # polling for the server
        assert status == 200
        names = {item["name"] for item in json.loads(body)["content"]}
        expected = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
        assert expected and expected <= names
        status, page = _get(f"http://127.0.0.1:{port}/lab")
        assert status == 200 and b"JupyterLab" in page
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode is not None


OFFLINE_CHECK = """
import altair as alt
import polars as pl
assert alt.renderers.active == "default", alt.renderers.active   # altair's CDN-loading HTML
import grlib.experiments
assert alt.renderers.active == "png", alt.renderers.active
chart = alt.Chart(pl.DataFrame({"x": [1, 2], "y": [3, 4]})).mark_line().encode(x="x", y="y")
bundle, meta = chart._repr_mimebundle_()
assert list(bundle) == ["image/png"] and bundle["image/png"][:8] == b"\\x89PNG\\r\\n\\x1a\\n", bundle.keys()
width = int.from_bytes(bundle["image/png"][16:20], "big")
assert meta["image/png"]["width"] * 2 == width, (meta, width)   # twice the pixels, shown at chart size
alt.renderers.enable("svg")                                      # a renderer the user chose is kept
from grlib.plots import use_offline_renderer
assert use_offline_renderer() == "svg"
print("ok")
"""


def test_notebook_charts_render_without_a_cdn():
    proc = subprocess.run([sys.executable, "-c", OFFLINE_CHECK], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_every_chart_module_enables_the_offline_renderer():
    """A grlib module that imports altair calls grlib.plots.use_offline_renderer, or its package does."""
    def calls_it(path: Path) -> bool:
        return any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == "use_offline_renderer"
                   for n in ast.walk(ast.parse(path.read_text())))

    def imports_altair(path: Path) -> bool:
        return any(isinstance(n, ast.Import) and any(a.name.split(".")[0] == "altair" for a in n.names)
                   or isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "altair"
                   for n in ast.walk(ast.parse(path.read_text())))

    chart_modules = [p for p in sorted((ROOT / "grlib").rglob("*.py")) if imports_altair(p) and p.name != "plots.py"]
    assert chart_modules
    package = ROOT / "grlib"
    lacking = [str(p.relative_to(ROOT)) for p in chart_modules
               if not any(calls_it(init) for d in [p.parent, *p.parent.parents] if d.is_relative_to(package)
                          for init in [d / "__init__.py"] if init.is_file()) and not calls_it(p)]
    assert not lacking, f"charts built without the offline renderer (CDN-loading HTML in notebooks): {lacking}"


def test_tqdm_notebook_bars_have_their_widgets():
    """tqdm.auto in a notebook draws an ipywidgets bar; without ipywidgets it falls back to text
    with a warning, and without the JupyterLab widget manager the bar is not drawn."""
    from jupyter_core.paths import jupyter_path
    from tqdm import notebook

    assert notebook.IProgress is not None, "ipywidgets is not installed (pyproject.toml pins it)"
    managers = [Path(p) / "@jupyter-widgets" / "jupyterlab-manager" for p in jupyter_path("labextensions")]
    assert any(m.is_dir() for m in managers), f"no JupyterLab widget manager in {managers}"
