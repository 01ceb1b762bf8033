"""grlib: jagged HSTU kernels, training and negatives (see README.md and docs/ARCHITECTURE.md).

The OpenMP wait policy is set here, before torch (and with it libgomp) loads: grlib.threads.
"""
from grlib import threads

threads.configure_environment()

import torch  # noqa: E402  (after the OpenMP environment is set)

threads.apply_thread_count()

del torch
