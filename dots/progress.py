"""Progress bars and messages for long stages (rich), quiet when output is not a terminal.

A bar shows step, the stage's headline figure (loss, reward, accuracy) and elapsed time.
Under CI, Prefect or a pipe, where a redrawn bar would flood the log, it prints a plain line
every tenth of the way instead. Under torchrun only rank 0 speaks.
"""

from __future__ import annotations

import os
import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as _RichProgress

from .redact import scrub

console = Console(stderr=True)
QUIET = os.environ.get("RANK", "0") != "0"  # a torchrun / accelerate rank other than 0


def say(message: str) -> None:
    if not QUIET:
        print(scrub(message), flush=True)  # no URI password or secret env value reaches a log


class Progress:
    def __init__(self, title: str, total: int):
        self.title, self.total = title, total
        self.live = console.is_terminal and sys.stderr.isatty() and not QUIET
        self._bar = None
        self._next_line = 0
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
        elif step >= self._next_line or step == self.total:
            self._next_line = step + max(1, self.total // 10)
            say(f"{self.title}: step {step}/{self.total}  {info}  {time.perf_counter() - self._start:.0f}s")

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
