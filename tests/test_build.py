"""The compiled extension is built and loads with OpenMP."""
from __future__ import annotations

import subprocess
import sys


def test_import_compiled_extension_in_a_fresh_interpreter():
    proc = subprocess.run([sys.executable, "-c", "import grlib._C as c, torch; print(c.openmp, torch.ops.grlib.segment_sum)"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "True"
