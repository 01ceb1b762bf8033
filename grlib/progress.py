"""Progress on long work: a bar on a terminal, periodic one-line logs everywhere else.

    for spec in progress(specs, desc="bench kernels"): ...
    with bar(total, desc="train") as b:
        b.update(1); b.set_postfix(loss="3.21", refresh=False)
    log("02_train: cell 3/14 ...")             # one line, unless progress is silenced
    with run_of(3, 18, "sasrec, seed 1"): ...  # bars and lines inside read "run 3 of 18 (sasrec, seed 1): train ..."

Where stderr is a terminal: tqdm bars. Elsewhere (a pipe, a CI log, nohup, a notebook kernel
under papermill or JupyterLab): a line on stderr at most every GRLIB_PROGRESS_INTERVAL seconds
(default 30), and a last one when the work ends if it logged before, e.g.

    train: 96/240 (40%) in 02:00, 1.26s/it, 03:00 left, loss=3.210
    train: 240/240 (100%) in 05:02, 1.26s/it, finished, loss=2.874

Work shorter than the interval prints nothing (quiet CI logs and executed notebooks).
GRLIB_PROGRESS=0 silences both kinds, 1 forces bars, log forces log lines.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from tqdm import tqdm

T = TypeVar("T")

DEFAULT_INTERVAL_S = 30.0
_MODES = {"0": "off", "1": "bar", "log": "log"}
# the seconds the log lines measure; a test swaps in a fake clock (tests/test_progress.py), so that the
# lines it expects do not depend on how fast the machine ran the loop
clock: Callable[[], float] = time.monotonic


class ProgressSettingError(ValueError):
    """A bad GRLIB_PROGRESS or GRLIB_PROGRESS_INTERVAL value."""


def mode() -> str:
    """'bar' (tqdm), 'log' (periodic lines) or 'off', from GRLIB_PROGRESS and whether stderr is a tty."""
    forced = os.environ.get("GRLIB_PROGRESS", "")
    if forced == "":
        return "bar" if sys.stderr.isatty() else "log"
    if forced not in _MODES:
        raise ProgressSettingError(f"GRLIB_PROGRESS={forced!r}: expected 0 (silent), 1 (bars) or log (log lines)")
    return _MODES[forced]


def enabled() -> bool:
    return mode() != "off"


def interval() -> float:
    """Seconds between two log lines (GRLIB_PROGRESS_INTERVAL, default 30)."""
    raw = os.environ.get("GRLIB_PROGRESS_INTERVAL", "")
    if raw == "":
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        raise ProgressSettingError(f"GRLIB_PROGRESS_INTERVAL={raw!r}: expected a number of seconds >= 0")
    return value


def log(message: str) -> None:
    """One progress line on stderr (silent under GRLIB_PROGRESS=0)."""
    if enabled():
        print(message, file=sys.stderr, flush=True)


class LogProgress:
    """The log-line counterpart of a tqdm bar: update(n), set_postfix(...), close(), `with`."""

    _FORMAT = "{desc}: {n_fmt}/{total_fmt} ({percentage:.0f}%) in {elapsed}, {rate_fmt}"
    _FORMAT_NO_TOTAL = "{desc}: {n_fmt} in {elapsed}, {rate_fmt}"

    def __init__(self, total: int | None = None, desc: str = "", initial: int = 0, unit: str = "it",
                 unit_scale: bool = False, every: float | None = None, **_tqdm_only: Any):
        self.total, self.desc, self.initial, self.n = total, desc or "progress", initial, initial
        self.unit, self.unit_scale = unit, unit_scale
        self.every = interval() if every is None else every
        self.start = self.last = clock()
        self.postfix = ""
        self.lines = 0  # lines logged so far
        self.closed = False

    def line(self, now: float | None = None, end: bool = False) -> str:
        elapsed = (clock() if now is None else now) - self.start
        known = bool(self.total)
        text = tqdm.format_meter(self.n, self.total if known else None, elapsed, prefix=self.desc, unit=self.unit,
                                 unit_scale=self.unit_scale, initial=self.initial,
                                 bar_format=self._FORMAT if known else self._FORMAT_NO_TOTAL)
        text = " ".join(text.split())
        rate = (self.n - self.initial) / elapsed if elapsed > 0 else 0.0
        if end:
            text += ", finished" if not known or self.n >= self.total else ", stopped"
        elif known and rate > 0 and self.n < self.total:
            text += f", {tqdm.format_interval((self.total - self.n) / rate)} left"
        return text + (f", {self.postfix}" if self.postfix else "")

    def _emit(self, now: float, end: bool = False) -> None:
        log(self.line(now, end))
        self.last, self.lines = now, self.lines + 1

    def update(self, n: int = 1) -> None:
        self.n += n
        now = clock()
        if now - self.last >= self.every:
            self._emit(now)

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        now = clock()
        if self.lines or now - self.start >= self.every:
            self._emit(now, end=True)

    def __enter__(self) -> "LogProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_run = ""  # "run i of n (what): " inside run_of: the prefix of every bar and log line


@contextlib.contextmanager
def run_of(i: int, n: int, what: str = "") -> Iterator[None]:
    """Bars and progress lines in the block name the run: "run i of n (what): <desc>" (a grid of
    runs: the train stage's, bench negatives' seeds)."""
    global _run
    before, _run = _run, f"run {i} of {n}{f' ({what})' if what else ''}: "
    try:
        yield
    finally:
        _run = before


def bar(total: int, desc: str = "", **kw: Any) -> tqdm | LogProgress:
    """A manual progress counter (update(n), set_postfix); use as a context manager."""
    how, desc = mode(), _run + desc
    if how == "log":
        return LogProgress(total, desc, **kw)
    return tqdm(total=total, desc=desc, disable=how == "off", dynamic_ncols=True, leave=False, **kw)


def progress(iterable: Iterable[T], desc: str = "", total: int | None = None, **kw: Any) -> Iterator[T]:
    """Yields the items of `iterable`, reporting progress as `bar` does."""
    how, desc = mode(), _run + desc
    if how != "log":
        return iter(tqdm(iterable, desc=desc, total=total, disable=how == "off", dynamic_ncols=True,
                         leave=False, **kw))
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    return _logged(iterable, LogProgress(total, desc, **kw))


def _logged(iterable: Iterable[T], counter: LogProgress) -> Iterator[T]:
    with counter:
        for item in iterable:
            yield item
            counter.update(1)
