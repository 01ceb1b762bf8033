"""grlib: jagged HSTU kernels, training and negatives (see README.md and docs/ARCHITECTURE.md).

The OpenMP wait policy is set here, before torch (and with it libgomp) loads, and torch's thread
count when it loads (grlib.threads). Importing grlib does not import torch.
"""
from grlib import threads

threads.configure_environment()
threads.when_torch_loads()
