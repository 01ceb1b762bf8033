"""Checkpoints for exact resume: everything the next step depends on, written atomically.

A checkpoint holds the model and optimizer states, the schedule, the position in the data
(epoch, batch index, the data-order RNG state at the start of that epoch), the torch RNG state
(dropout), the negative path's sampler state as of the next batch to train (also with async
sampling, whose worker has drawn ahead: see NegativePath.state_dict), the best model so far
(model selection), the history of losses and what the run was (settings, model class and
parameter shapes). Resuming restores all of it, so the next step's loss equals that of an
uninterrupted run; resuming with other settings or another model is refused (CheckpointMismatch,
naming what differs), and an unreadable file is named (CheckpointError).
"""
from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from grlib.io import atomic_write

FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read: corrupt, truncated, or not a grlib checkpoint."""


class CheckpointMismatch(CheckpointError):
    """A checkpoint written by another run (other settings, another model)."""


def save(path: Path, state: dict[str, Any]) -> None:
    """torch.save into a temporary file of the same folder, fsync, then rename over `path`
    (grlib.io.atomic_write: the file appears whole or not at all, with the caller's umask)."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            torch.save({"format": FORMAT, **state}, fh)

    atomic_write(Path(path), write)


def load(path: Path) -> dict[str, Any]:
    """The state saved in `path`; CheckpointError naming the file if it cannot be read."""
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError, KeyError,
            AttributeError, ImportError, IndexError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0].split(". ")[0]
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({reason}); delete it to start "
                              f"afresh, or resume from another checkpoint folder") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a grlib training checkpoint (format {FORMAT})")
    return state


def path_state(path: Any) -> dict[str, Any]:
    """The negative path's sampler state as of the next batch to train."""
    return {"state_dict": path.state_dict()}


def load_path_state(path: Any, state: dict[str, Any]) -> None:
    if "state_dict" in state:
        path.load_state_dict(state["state_dict"])
        return
    # written before NegativePath.state_dict existed: the generator attributes' states (sync runs)
    path.load_state_dict({name: value for name, (kind, value) in state["generators"].items()})


def differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """'name: saved there, current here' for each differing entry of two (nested) dicts."""
    out = []
    for key in sorted(set(saved) | set(current), key=str):
        a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}={a!r} in the checkpoint, {b!r} here")
    return out


def model_signature(model: torch.nn.Module) -> dict[str, Any]:
    """The model's class and parameter shapes (what load_state_dict needs to agree)."""
    return {"class": type(model).__name__,
            "shapes": {k: list(v.shape) for k, v in model.state_dict().items()}}


def model_differences(saved: dict[str, Any], model: torch.nn.Module) -> list[str]:
    here = model_signature(model)
    if saved["class"] != here["class"]:
        return [f"model {saved['class']} in the checkpoint, {here['class']} here"]
    out = []
    for key in sorted(set(saved["shapes"]) | set(here["shapes"])):
        a, b = saved["shapes"].get(key), here["shapes"].get(key)
        if a != b:
            out.append(f"model parameter {key}: " + ("absent" if a is None else f"shape {a}") + " in the checkpoint, "
                       + ("absent" if b is None else f"shape {b}") + " here")
    return out


def refuse(path: Path, what: list[str]) -> None:
    """Raises CheckpointMismatch listing `what` differs (nothing when empty)."""
    if what:
        more = f" (and {len(what) - 3} more)" if len(what) > 3 else ""
        raise CheckpointMismatch(f"{path} was written by another run: {'; '.join(what[:3])}{more}; resume with "
                                 f"the same settings, or start in another checkpoint folder")
