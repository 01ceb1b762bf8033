"""Checkpoints for exact resume: everything the next step depends on, written atomically.

A checkpoint holds the model and optimizer states, the schedule, the position in the data
(epoch, batch index, the data-order RNG state at the start of that epoch), the torch RNG state
(dropout), the negative path's sampler state, the best model so far (model selection) and the
history of losses. Resuming restores all of it, so the next step's loss equals that of an
uninterrupted run.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = 1


def save(path: Path, state: dict[str, Any]) -> None:
    """torch.save into a temporary file of the same folder, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save({"format": FORMAT, **state}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path) -> dict[str, Any]:
    state = torch.load(Path(path), map_location="cpu", weights_only=False)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path}: not a grlib training checkpoint (format {FORMAT})")
    return state


def path_state(path: Any) -> dict[str, Any]:
    """The sampler state of a negative path: its own state_dict() when it has one, else the states
    of the torch / numpy generators it holds as attributes."""
    if hasattr(path, "state_dict"):
        return {"state_dict": path.state_dict()}
    if getattr(getattr(path, "cfg", None), "async_sampling", False):
        # A background worker has drawn ahead: the live generator state is not the next step's.
        raise NotImplementedError("exact resume with negatives.async_sampling=true needs the negative path's own "
                                  "state_dict() (the state as of the next batch to train); set it false to checkpoint")
    gens = {}
    for name, value in vars(path).items():
        if isinstance(value, torch.Generator):
            gens[name] = ("torch", value.get_state())
        elif isinstance(value, np.random.Generator):
            gens[name] = ("numpy", value.bit_generator.state)
    return {"generators": gens}


def load_path_state(path: Any, state: dict[str, Any]) -> None:
    if "state_dict" in state:
        path.load_state_dict(state["state_dict"])
        return
    for name, (kind, value) in state["generators"].items():
        gen = getattr(path, name)
        if kind == "torch":
            gen.set_state(value)
        else:
            gen.bit_generator.state = value
