"""Atomic file writes: write a temporary file beside the target, fsync it, rename it over
the target, fsync the folder. A kill at any point leaves either the old file or the new
one, never a torn one (checkpoints, caches, result files all go through here). A killed
write leaves at most its own temporary file (`.<name>.<pid>.tmp`), which no reader opens
and the next write of the same file removes.

A write the disk cannot hold raises `DiskFull`, naming the file and the free space, with the
old file kept: torch.save said only "[enforce fail at inline_container.cc:672] . unexpected pos
1705216 vs 1705104" when a checkpoint filled the disk (tried on a 14.8 MB tmpfs)."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .faults import fault_point
from .processes import pid_alive

FULL_BELOW = 1 << 20  # bytes free after a failed write under which the disk is what failed
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # the errors a full disk or quota gives


class DiskFull(OSError):
    """A write abandoned because its disk (or quota) is full; the file it replaced is unchanged."""


def free_bytes(folder: Path) -> int:
    return shutil.disk_usage(folder).free


def out_of_space(exc: BaseException, folder: Path) -> bool:
    """Whether a failed write ran out of space: the OS said so, or a library that hides the OS's
    error (torch.save's zip writer raises RuntimeError) failed with under FULL_BELOW bytes left."""
    if isinstance(exc, OSError) and exc.errno in NO_SPACE:
        return True
    try:
        return free_bytes(folder) < FULL_BELOW
    except OSError:
        return False


def disk_full(path: Path, doing: str, written: int, kept: str, left: str = "", then: str = "") -> DiskFull:
    """The one-line error of a write to `path` its disk could not hold (an atomic file here, the
    exported model folder in dots.export): what was written, what is left, what was kept."""
    return DiskFull(errno.ENOSPC, f"{path}: its disk filled while {doing} ({written / 2**20:.1f} MiB "
                    f"written, {free_bytes(path.parent) / 2**20:.1f} MiB left{left}): {kept}. Free space (or "
                    f"point paths.root elsewhere) and run the same command again{then}")


def _drop_orphans(path: Path) -> None:
    """Remove temporary files that killed writers of `path` left behind."""
    prefix = f".{path.name}."
    for old in path.parent.iterdir():
        pid = old.name[len(prefix):-len(".tmp")]
        if (old.name.startswith(prefix) and old.name.endswith(".tmp") and pid.isdigit()
                and not pid_alive(int(pid))):
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
    except (OSError, RuntimeError) as exc:
        if not isinstance(exc, DiskFull) and out_of_space(exc, path.parent):
            kept = "nothing was written in its place"
            if path.exists():
                kept = f"the previous {path.name} is kept"
            raise disk_full(path, "writing it", tmp.stat().st_size if tmp.exists() else 0, kept) from exc
        raise
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
