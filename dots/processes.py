"""Which process is which, and what it has used, read from the kernel: a process's start time
(with its pid, what names it, since pids are reused), this process's pid namespace, whether a
process is alive, its CPU time.

Several places record "this process" to judge later whether it is gone (the workspace lock, the
params record a flow restores, the `dots.owner` tag of a training run, an atomic write's temporary
file), and the math-verify pool bounds each answer by its worker's CPU time: they all read
``/proc`` through here, with psutil (a DVC dependency) where there is no ``/proc``."""

from __future__ import annotations

import os
from pathlib import Path


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (so ``[0]`` is field 3, the state),
    or None where the process is gone or there is no ``/proc``. The name is cut at its last ``)``:
    it may hold spaces and parentheses."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().decode(errors="replace").rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system, every thread) process `pid` has used, to a clock tick; None where
    it is gone or there is no ``/proc`` (macOS)."""
    fields = proc_stat(pid)
    try:
        return None if fields is None else (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    except (IndexError, ValueError):
        return None


def process_started(pid: int) -> float | None:
    """When process `pid` started, as an opaque number (None when it is gone): with its pid, what
    names a process, since a pid is reused once its process has ended. On Linux the kernel's start
    time in clock ticks since boot (/proc/<pid>/stat): exact, where psutil's wall-clock start time
    moves with the boot time it is computed from (by seconds on a VM, so a live flow's stage once
    took its flow for dead); elsewhere psutil's, to the second."""
    fields = proc_stat(pid)
    if fields is not None and len(fields) > 19 and fields[19].isdigit():
        return float(fields[19])
    if fields is None and Path("/proc/self/stat").exists():
        return None  # Linux, and the process is gone
    import psutil  # noqa: PLC0415  (a DVC dependency)

    try:
        return float(int(psutil.Process(pid).create_time()))
    except psutil.Error:
        return None


def pid_namespace() -> str:
    """This process's pid namespace ("pid:[4026531836]" on Linux, "-" where it cannot be read): a pid
    names a process only within it."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "-"


def pid_alive(pid: int, started: float | None = None) -> bool:
    """Whether process `pid` exists (another user's included) and, given `started`
    (`process_started` when it was recorded), is that same process and not a later one with its pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if started is None:
        return True
    now = process_started(pid)
    return now == started
