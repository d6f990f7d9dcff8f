"""Progress bars and messages for long stages (rich), plain lines when output is not a terminal.

A bar shows step, the stage's headline figure (loss, reward, accuracy) and elapsed time.
Under CI, Prefect, DVC or a pipe, where a redrawn bar would flood the log, it prints a plain
progress line instead: every tenth of the way, at least every `EVERY_S` seconds, and at the end.
Progress lines have one stable form, `<title>: <done>/<total> <unit> (<pct>%)  <figures>  <secs>s`,
which `parse` reads back (the Prefect tasks turn them into progress artifacts; this library
does not import Prefect). Under torchrun only rank 0 speaks.
"""

from __future__ import annotations

import os
import re
import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as _RichProgress

from .redact import scrub

console = Console(stderr=True)
QUIET = os.environ.get("RANK", "0") != "0"  # a torchrun / accelerate rank other than 0
EVERY_S = 30.0  # a long stage prints a progress line at least this often, however slow its tenths

LINE = re.compile(r"^(?P<title>[^:\n]+): (?P<done>\d+)/(?P<total>\d+) (?P<unit>\w+) \((?P<pct>\d+)%\)")


def say(message: str) -> None:
    if not QUIET:
        print(scrub(message), flush=True)  # no URI password or secret env value reaches a log


def line(title: str, done: int, total: int, unit: str = "steps", info: str = "", seconds: float | None = None) -> str:
    """The one form of a progress line (`parse` reads it back)."""
    pct = 100.0 * done / total if total else 100.0
    text = f"{title}: {done}/{total} {unit} ({pct:.0f}%)"
    if info:
        text += f"  {info}"
    if seconds is not None:
        text += f"  {seconds:.0f}s"
    return text


def parse(text: str) -> tuple[str, int, int] | None:
    """(title, done, total) of a progress line, or None for any other line."""
    m = LINE.match(text.strip())
    return (m["title"], int(m["done"]), int(m["total"])) if m else None


class _Lines:
    """When to print a progress line: each tenth of the way, every EVERY_S seconds, the end."""

    def __init__(self, total: int, quiet_s: float = 0.0):
        self.total, self.quiet_s = total, quiet_s
        self.start = self.last = time.perf_counter()
        self.next_step = 0
        self.printed = False

    def due(self, done: int) -> bool:
        now = time.perf_counter()
        if now - self.start < self.quiet_s and done < self.total:
            return False  # a short loop says nothing until it has run quiet_s seconds
        if done >= self.total:
            return self.printed or now - self.start >= self.quiet_s
        return done >= self.next_step or now - self.last >= EVERY_S

    def mark(self, done: int) -> None:
        self.last, self.printed = time.perf_counter(), True
        self.next_step = done + max(1, self.total // 10)


class Progress:
    def __init__(self, title: str, total: int, unit: str = "steps"):
        self.title, self.total, self.unit = title, total, unit
        self.live = console.is_terminal and sys.stderr.isatty() and not QUIET
        self._bar = None
        self._lines = _Lines(total)
        self._start = time.perf_counter()

    def __enter__(self) -> "Progress":
        if self.live:
            self._bar = _RichProgress(TextColumn(f"[bold]{self.title}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.title, total=self.total, info="")
        return self

    def update(self, step: int, **figures) -> None:
        info = "  ".join(f"{k} {v:.3f}" for k, v in figures.items() if v is not None)
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info)
        elif self._lines.due(step):
            self._lines.mark(step)
            say(line(self.title, step, self.total, self.unit, info, time.perf_counter() - self._start))

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


_loops: dict[str, tuple[_Lines, int]] = {}


def report(title: str, done: int, total: int, unit: str = "questions", quiet_s: float = 5.0) -> None:
    """Progress of an inner loop (labelling, a held-out evaluation) without a bar object: the
    same progress lines as `Progress`, but only once the loop has run `quiet_s` seconds, so
    the many short evaluations of a small run stay silent. A `done` lower than the last one
    starts a new loop under the same title."""
    state = _loops.get(title)
    if state is None or done < state[1]:
        state = (_Lines(total, quiet_s), done)
    lines = state[0]
    _loops[title] = (lines, done)
    if lines.due(done):
        lines.mark(done)
        say(line(title, done, total, unit, seconds=time.perf_counter() - lines.start))
    if done >= total:
        _loops.pop(title, None)
