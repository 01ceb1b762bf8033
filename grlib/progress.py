"""Progress bars: shown on a terminal, quiet in notebooks, under papermill, nbmake and CI logs.

GRLIB_PROGRESS=1 forces them on, GRLIB_PROGRESS=0 off.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def enabled() -> bool:
    forced = os.environ.get("GRLIB_PROGRESS")
    if forced in ("0", "1"):
        return forced == "1"
    return sys.stderr.isatty()


def progress(iterable: Iterable[T], desc: str = "", total: int | None = None, **kw) -> Iterator[T]:
    return iter(tqdm(iterable, desc=desc, total=total, disable=not enabled(), dynamic_ncols=True,
                     leave=False, **kw))


def bar(total: int, desc: str = "", **kw) -> tqdm:
    """A manual bar (bar.update(n)); use as a context manager."""
    return tqdm(total=total, desc=desc, disable=not enabled(), dynamic_ncols=True, leave=False, **kw)
