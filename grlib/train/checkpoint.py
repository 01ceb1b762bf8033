"""Checkpoints for exact resume: everything the next step depends on, written atomically, read as data.

A checkpoint holds the model and optimizer states, the schedule, the position in the data
(epoch, batch index, the data-order RNG state at the start of that epoch), the torch RNG state
(dropout), the negative path's sampler state as of the next batch to train (also with async
sampling, whose worker has drawn ahead: see NegativePath.state_dict), the best model so far
(model selection), the history of losses and what the run was (settings, model class and
parameter shapes). Resuming restores all of it, so the next step's loss equals that of an
uninterrupted run; resuming with other settings or another model is refused (CheckpointMismatch,
naming what differs), and an unreadable file is named (CheckpointError).

A checkpoint folder may come from elsewhere (a shared folder, a downloaded run), so a checkpoint is
read as data only: torch's weights-only unpickler, which builds dicts, lists, tuples, numbers,
strings, None, OrderedDict and tensors and calls nothing else. What grlib writes is only that (a
numpy RNG state is a dict of str and int), so no allow-list is needed. A file that asks for any
other global (os.system, builtins.exec, a class) is refused before that global is even looked up,
in one line naming the file and the global (CheckpointRefused); nothing in the file runs. A static
scan of the pickle first (pickletools: nothing built) names a global torch's message leaves out and
refuses a global whose name is absurdly long (torch's message for it costs time quadratic in its
length). `vet` makes the same check without reading any tensor: a launcher runs it on its ranks'
files (vet_rank_files) before starting them, so a planted rank file is refused in one line too.
"""
from __future__ import annotations

import contextlib
import pickle
import pickletools
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from grlib.io import atomic_write

FORMAT = 1
_ECHO = 200  # characters of a reason quoted from the unpickler at most


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read: corrupt, truncated, or not a grlib checkpoint."""


class CheckpointMismatch(CheckpointError):
    """A checkpoint written by another run (other settings, another model)."""


class CheckpointRefused(CheckpointError):
    """A file that is not data: its pickle asks for a global (a function or class) that a checkpoint
    never holds. Nothing in it was run."""


def save(path: Path, state: dict[str, Any]) -> None:
    """torch.save into a temporary file of the same folder, fsync, then rename over `path`
    (grlib.io.atomic_write: the file appears whole or not at all, with the caller's umask)."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            torch.save({"format": FORMAT, **state}, fh)

    atomic_write(Path(path), write)


def load(path: Path) -> dict[str, Any]:
    """The state saved in `path`, read as data (weights_only: no code in the file runs);
    CheckpointRefused naming the file and the global if it asks for one, CheckpointError naming the
    file if it cannot be read."""
    path = Path(path)
    try:
        foreign = _scan(path)  # static: names a refused global; refuses an absurdly long one first
    except _LongName as err:
        raise CheckpointRefused(_refused_line(path, str(err))) from None
    try:
        with warnings.catch_warnings():  # torch's format warnings (pickle protocol 5, TorchScript): errors say it
            warnings.simplefilter("ignore", UserWarning)
            # weights_only given explicitly: TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD cannot turn it off
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise _refusal(path, str(err), foreign) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, KeyError, AttributeError, ImportError,
            IndexError) as err:
        raise _corrupt(path, str(err) or type(err).__name__) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a grlib training checkpoint (format {FORMAT})")
    return state


def vet(path: Path) -> None:
    """Refuses `path` (CheckpointRefused, the line `load` gives) if its pickle asks for a global
    that `load` would refuse, reading its pickle statically (torch's get_unsafe_globals_in_checkpoint):
    no code runs and no tensor is read. A file that scan cannot read (the legacy format, a corrupt
    file) is loaded instead, which refuses or names it the same way."""
    path = Path(path)
    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001  (not a zip checkpoint, or opcodes the scan skips: load decides)
        load(path)
        return
    if unsafe:
        raise CheckpointRefused(_refused_line(path, ", ".join(sorted(unsafe)[:3])))


def vet_rank_files(folder: str | Path, world: int) -> None:
    """vet on each rank's checkpoint last.rank<r>-of-<world>.pt present in `folder`."""
    for rank in range(world):
        path = Path(folder) / f"last.rank{rank}-of-{world}.pt"
        if path.exists():
            vet(path)


def _refused_line(path: Path, name: str) -> str:
    return (f"{path}: refused: it asks for {_first_line(name)}, which is code, not data (a checkpoint is read as "
            f"tensors, numbers, strings, lists and dicts only, and nothing in it ran); delete it, or resume from a "
            f"checkpoint that grlib wrote")


def _refusal(path: Path, message: str, foreign: str | None) -> CheckpointError:
    """The error for a file the weights-only unpickler stopped: CheckpointRefused naming the global
    it refused (from its message or, failing that, `foreign`: the scan's first global outside torch),
    else the unpickler's reason as a corrupt file (junk bytes, an opcode no checkpoint uses)."""
    found = re.search(r"GLOBAL (\S+)", message)
    # torch names builtins without their module (GLOBAL builtins.exec -> "exec"): put it back
    name = (found.group(1) if "." in found.group(1) else f"builtins.{found.group(1)}") if found else foreign
    if name is not None:
        return CheckpointRefused(_refused_line(path, name))
    # torch wraps the unpickler's words: "Weights only load failed. <advice>\n\n<reason>\n\nCheck the documentation..."
    return _corrupt(path, message.split("\n\nCheck the documentation")[0].strip().split("\n\n")[-1])


def _corrupt(path: Path, reason: str) -> CheckpointError:
    return CheckpointError(f"{path}: corrupt or truncated checkpoint ({_first_line(reason).split('. ')[0]}); "
                           f"delete it to start afresh, or resume from another checkpoint folder")


def _first_line(text: str) -> str:
    """The first non-empty line of `text` (words from a file: maybe hostile), at most _ECHO
    characters, control characters escaped."""
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    line = line.encode("unicode_escape").decode("ascii") if not line.isprintable() else line
    return line if len(line) <= _ECHO else line[:_ECHO] + "..."


_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING", "SHORT_BINSTRING"}
_LONGEST_NAME = 1000  # bytes of a global's module or name line at most (torch's are under 100)
_SCAN_BUDGET = 64 << 20  # bytes the scan reads at most (a zip's data.pkl is KBs; a legacy file's pickles come first)


class _LongName(Exception):
    """A GLOBAL or INST line longer than _LONGEST_NAME (the exception's text: its first bytes)."""


class _Bounded:
    """A binary stream for pickletools.genops over `fh`: at most _SCAN_BUDGET bytes in all, and a
    GLOBAL or INST line of at most _LONGEST_NAME bytes (_LongName past it); past the budget, or a
    line without its newline, it ends the scan (EOFError)."""

    def __init__(self, fh: Any) -> None:
        self.fh, self.left = fh, _SCAN_BUDGET
        self.opcode, self.module = b"", b""  # the last 1-byte read; the module line of a GLOBAL being read

    def read(self, n: int = -1) -> bytes:
        if n < 0 or n > self.left:
            raise EOFError
        data = self.fh.read(n)
        self.left -= len(data)
        if n == 1:
            self.opcode, self.module = data, b""  # (an opcode, or a 1-byte operand: GLOBAL's lines follow its opcode)
        return data

    def readline(self) -> bytes:
        line = self.fh.readline(min(_LONGEST_NAME + 1, self.left))
        self.left -= len(line)
        if not line.endswith(b"\n"):
            if self.opcode in (pickle.GLOBAL, pickle.INST) and len(line) > _LONGEST_NAME:
                name = (self.module + b"." if self.module else b"") + line
                raise _LongName(name[:_ECHO + 1].decode("utf-8", "replace"))
            raise EOFError
        self.module = line[:-1]
        return line


def _scan(path: Path) -> str | None:
    """The first global outside torch and collections that the file's pickles ask for (GLOBAL, or
    STACK_GLOBAL after its two strings), or None; read with pickletools, a disassembler: nothing is
    built, imported or called. A torch zip file's pickle is its data.pkl; a legacy file is pickles
    back to back, then raw bytes (the scan ends at the first thing that is not a pickle).
    _LongName for a global's line longer than _LONGEST_NAME (load refuses it before torch reads
    it: torch's error message for a refused global costs time quadratic in its length)."""
    try:
        with contextlib.ExitStack() as stack:
            if zipfile.is_zipfile(path):
                zf = stack.enter_context(zipfile.ZipFile(path))
                name = next((n for n in zf.namelist() if n == "data.pkl" or n.endswith("/data.pkl")), None)
                if name is None:
                    return None
                fh = stack.enter_context(zf.open(name))
            else:
                fh = stack.enter_context(open(path, "rb"))
            stream = _Bounded(fh)
            while True:  # one pickle after another, until the bytes are not one
                strings: list[str] = []
                for op, arg, _ in pickletools.genops(stream):
                    if op.name in _STRING_OPS:
                        strings.append(str(arg))
                    elif op.name in ("GLOBAL", "INST") and _foreign(str(arg).split(" ", 1)[0]):
                        return str(arg).replace(" ", ".", 1)
                    elif op.name == "STACK_GLOBAL" and len(strings) >= 2 and _foreign(strings[-2]):
                        return f"{strings[-2]}.{strings[-1]}"
    except _LongName:
        raise
    except Exception:  # noqa: BLE001  (the end of the pickles: EOF, raw bytes, a garbled file)
        return None


def _foreign(module: str) -> bool:
    return not (module == "torch" or module.startswith("torch.") or module in ("collections", "_codecs"))


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
