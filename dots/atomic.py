"""Atomic file writes: write a temporary file beside the target, fsync it, rename it over
the target, fsync the folder. A kill at any point leaves either the old file or the new
one, never a torn one (checkpoints, caches, result files all go through here). A killed
write leaves at most its own temporary file (`.<name>.<pid>.tmp`), which no reader opens
and the next write of the same file removes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .faults import fault_point


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _drop_orphans(path: Path) -> None:
    """Remove temporary files that killed writers of `path` left behind."""
    prefix = f".{path.name}."
    for old in path.parent.iterdir():
        pid = old.name[len(prefix):-len(".tmp")]
        if old.name.startswith(prefix) and old.name.endswith(".tmp") and pid.isdigit() and not _alive(int(pid)):
            old.unlink(missing_ok=True)


def check_writable_folder(folder: Path) -> None:
    """Make `folder` and prove a file can be written in it (OSError when not). Commands that write
    a result after minutes of work (`dots bench --out`, `dots evaluate --out`) check first, so a
    bad path is refused before the work rather than after it."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".write-check-{os.getpid()}"
    probe.write_text("")
    probe.unlink()


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces `path` durably."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _drop_orphans(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        fault_point(f"write:{path.name}", torn=tmp)  # a kill here: the target keeps its old content
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
