"""Fault injection for the reliability suite (tests/test_faults.py).

`fault_point(name)` marks a place where a real run can die: mid rollout, mid update, mid
file write. It does nothing unless the environment asks for it:

    DOTS_FAULT=rollout:3                the 3rd time `rollout` is reached, SIGKILL this process
    DOTS_FAULT=write:checkpoint.pt:1    the 1st atomic write of checkpoint.pt is cut off half-way
    DOTS_FAULT_TRACE=/tmp/trace.txt     append every point reached (its name) to a file

A kill is a real SIGKILL of the own process: no `finally`, no atexit, no flush, exactly what
an out-of-memory killer or a preempted node does. A point given a `torn` file truncates it
to half its size first, so a killed write leaves a half-written temporary file behind.
With neither variable set a point costs one comparison.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

_SPEC = os.environ.get("DOTS_FAULT") or None
_TRACE = os.environ.get("DOTS_FAULT_TRACE") or None
_TARGET: tuple[str, int] | None = None
if _SPEC:
    _name, _, _n = _SPEC.rpartition(":")
    if not _name or not _n.isdigit() or int(_n) < 1:
        raise SystemExit(f"DOTS_FAULT={_SPEC!r}: expected NAME:N with N >= 1, e.g. rollout:3")
    _TARGET = (_name, int(_n))
_ACTIVE = _TARGET is not None or _TRACE is not None
_hits: dict[str, int] = {}


def fault_point(name: str, torn: Path | None = None) -> None:
    """A place where the process may be killed (see the module docstring)."""
    if not _ACTIVE:
        return
    if _TRACE is not None:
        with open(_TRACE, "a") as f:
            f.write(name + "\n")
    if _TARGET is None or name != _TARGET[0]:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] != _TARGET[1]:
        return
    if torn is not None and torn.exists():
        with open(torn, "r+b") as f:
            f.truncate(f.seek(0, os.SEEK_END) // 2)
    sys.stdout.flush()
    sys.stderr.write(f"dots fault: SIGKILL at {name} (hit {_hits[name]})\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
