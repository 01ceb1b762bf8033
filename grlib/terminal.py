"""What a command prints on a terminal: tables within WIDTH (120) columns, and the libraries' noise
kept off it unless verbose.

format_table shows the columns a reader compares (a command names them; the rest stay in the rows,
the JSON and the result tables, listed under the table), long text cells wrapped; with `every`
(`bench ... --wide`) every column, in blocks of WIDTH that repeat the first column. library_noise
keeps Python warnings and torch dynamo / inductor logs off the terminal, native_output_filtered the
lines native code writes (the torch profiler's "USDT: ..."), unless `verbose` (`bench ... -v`).
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import tempfile
import textwrap
import warnings
from collections.abc import Iterator, Sequence

WIDTH = 120  # terminal columns every printed line fits
TEXT_MIN = 32  # a text cell narrower than this beside the other columns goes on a line of its own
TEXT_WIDTH = 60  # a text column wider than this (a check's description) is printed last, wrapped
verbose = False  # `bench ... -v` (set by grlib.bench's runner): the profiler's lines let through


def wrap(line: str, width: int = WIDTH, indent: str = "  ") -> str:
    """One line of prose within `width` characters (continuations indented)."""
    return textwrap.fill(line, width, subsequent_indent=indent, break_on_hyphens=False) if len(line) > width else line


def cell(value) -> str:
    """A value as a table shows it: floats to 4 significant digits (thousands with separators), None as -."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return f"{value:,.0f}" if abs(value) >= 10_000 else f"{value:.4g}"
    if isinstance(value, int):
        return str(value)
    return " ".join(str(value).split())


def format_table(rows: list[dict], columns: Sequence[str | tuple[str, str]] | None = None, width: int = WIDTH,
                 every: bool = False) -> str:
    """The rows as text lines of at most `width` characters. columns None: every key; a text column
    wider than TEXT_WIDTH (e.g. a check's description) goes last, wrapped within the room the others
    leave, or on its own indented lines. Columns that do not fit are named under the table (with the count of keys
    not asked for), or with `every` (--wide) go to further blocks, each repeating the first column."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    wanted = [(c, c) if isinstance(c, str) else (c[0], c[1]) for c in (columns or keys)]
    shown = [(k, h) for k, h in wanted if k in keys]
    hidden = [k for k in keys if k not in {k for k, _ in shown}]
    if not rows or not shown:
        return "(no rows)"
    cells = {k: [cell(r.get(k)) for r in rows] for k, _ in shown}
    widths = {k: max(len(h), *(len(c) for c in cells[k])) for k, h in shown}
    numeric = {k: all(isinstance(r.get(k), (int, float)) or r.get(k) is None for r in rows) for k, _ in shown}
    text = max((c for c in shown if not numeric[c[0]]), key=lambda c: widths[c[0]], default=None)
    if text is not None and widths[text[0]] > TEXT_WIDTH and len(shown) > 1:  # a description: last, wrapped
        shown = [c for c in shown if c != text]
    else:
        text = None
    blocks, dropped = _blocks(shown, widths, width, every)
    lines = []
    for i, block in enumerate(blocks):
        if i:
            lines.append("")
        lines += _block_lines(block, rows, cells, widths, numeric, text if i == len(blocks) - 1 else None, width)
    if dropped or hidden:
        names = dropped + ([f"{len(hidden)} more"] if hidden else [])
        named = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        lines.append(wrap(f"not shown: {named} (--wide prints every column; every row has them all: --json, "
                          f"the result table)", width))
    return "\n".join(lines)


def _blocks(shown: list[tuple[str, str]], widths: dict, width: int, every: bool) -> tuple[list, list[str]]:
    """Columns laid out within `width`: one block (the ones that do not fit are returned as dropped),
    or with `every` further blocks, each repeating the first column."""
    blocks, block, used, dropped = [], [], 0, []
    for col in shown:
        need = widths[col[0]] + (2 if block else 0)
        if block and used + need > width:
            if not every:
                dropped.append(col[0])
                continue
            blocks.append(block)
            block, used = [shown[0]], widths[shown[0][0]]
            need = widths[col[0]] + 2
        block.append(col)
        used += need
    blocks.append(block)
    return blocks, dropped


def _block_lines(block, rows, cells, widths, numeric, text, width: int) -> list[str]:
    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(widths[k]) if numeric[k] else v.ljust(widths[k])
                         for (k, _), v in zip(block, values)).rstrip()

    used = sum(widths[k] for k, _ in block) + 2 * len(block)
    room = width - used
    inline = text is not None and room >= TEXT_MIN
    head = line([h for _, h in block])
    out = [head + ("  " + text[1] if inline else ""), ""]
    for i in range(len(rows)):
        row = line([cells[k][i] for k, _ in block])
        if text is None:
            out.append(row)
        elif inline:
            parts = textwrap.wrap(cells[text[0]][i], room, break_on_hyphens=False) or [""]
            out.append(row.ljust(used) + parts[0])
            out += [" " * used + p for p in parts[1:]]
        else:
            out.append(row)
            out += textwrap.wrap(cells[text[0]][i], width - 4, initial_indent="    ", subsequent_indent="    ",
                                 break_on_hyphens=False)
    out[1] = "-" * max(len(x) for x in out)
    return out


# torch's loggers whose warnings (dynamo's "Graph break from `Tensor.item()`", recompilations) a bench's
# reader does not act on; TORCH_LOGS syntax: "-name" keeps a logger to errors
QUIET_TORCH_LOGS = "-dynamo,-inductor"
NOISE_PREFIXES = ("USDT:",)  # lines the torch profiler's native code writes on the process's stdout / stderr


@contextlib.contextmanager
def library_noise(verbose: bool) -> Iterator[None]:
    """Unless `verbose`: Python warnings ignored here and in child processes (PYTHONWARNINGS), torch
    dynamo / inductor logs kept to errors (TORCH_LOGS, when the user set none). Restored after."""
    if verbose:
        yield
        return
    env = {"PYTHONWARNINGS": "ignore"}
    if not os.environ.get("TORCH_LOGS"):
        env["TORCH_LOGS"] = QUIET_TORCH_LOGS
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    levels = {name: logging.getLogger(name).level for name in ("torch._dynamo", "torch._inductor")}
    for name in levels:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@contextlib.contextmanager
def native_output_filtered() -> Iterator[None]:
    """What native code writes on file descriptors 1 and 2 in the block, passed on (at its end) without
    the lines of NOISE_PREFIXES (the torch profiler's "USDT: profiler_start"); all of it with -v."""
    if verbose:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    files = {fd: tempfile.TemporaryFile() for fd in (1, 2)}
    try:
        for fd, fh in files.items():
            os.dup2(fh.fileno(), fd)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd in (1, 2):
            os.dup2(saved[fd], fd)
            os.close(saved[fd])
        for fd, fh in files.items():
            fh.seek(0)
            kept = [line for line in fh.read().decode(errors="replace").splitlines(keepends=True)
                    if not line.startswith(NOISE_PREFIXES)]
            fh.close()
            (sys.stdout if fd == 1 else sys.stderr).write("".join(kept))
        sys.stdout.flush()
