"""One writer per workspace: a Prefect flow, a `dots` command that writes the repository (`dots
train`, `dots all`, ...) or a bench holds an exclusive lock on its folder for as long as it writes
there, and a second one waits for the first to finish. The processes a holder starts (a flow's DVC
stages, which run `dots train` and the like) inherit its hold through DOTS_WORKSPACE_HELD.

Why: the deployments of one repository overlap (the nightly compare's cron and a data-triggered
pipeline), and every flow writes params.yaml (its overrides, put back when it ends), dvc.lock and
the same run folders. Unserialized, the second flow's first DVC stage failed on DVC's repo lock,
between stages one flow's stages read the other's overrides, and two flows with overrides could
leave the first one's overrides in the user's params.yaml for good (the second took them for the
user's file and put them back). A `dots train` run by hand beside a flow trained into the run folder
and checkpoint the flow's own stage was writing; two benches in one workspace did the same.

The lock is an OS file lock (flock) on `<folder>/.dots.lock`: it dies with its process, so a
killed run never leaves a stale lock behind. Prefect's global concurrency limits would need a
limit made on a server first, and do not span the ephemeral servers that `make run` and `make
bench` start one per process. The file holds who has the lock (what, pid, host, since), which the
waiting run prints.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .processes import pid_alive, process_started
from .progress import say

LOCK_NAME = ".dots.lock"
_CANNOT_WRITE = (errno.EACCES, errno.EPERM, errno.EROFS)
# the folders this process (or the holder that started it) holds, and the holders' pids, for its child
# processes: a flow's DVC stages run `dots train` and the like, which would otherwise wait on their own
# flow's lock; as JSON, {"/repo": [1234, <its start time>]}
HELD_ENV = "DOTS_WORKSPACE_HELD"
_held: dict[Path, int] = {}  # folder -> depth: a flow calling a flow in one process does not wait on itself


class HolderGone(RuntimeError):
    """This process was started under a hold (a flow's stage) whose holder has died."""


def inherited_holders() -> dict[Path, tuple[int, float | None]]:
    """The folders the run that started this process holds, and that run's pid and start time."""
    try:
        held = json.loads(os.environ.get(HELD_ENV) or "{}")
        return {Path(folder): (int(who[0]), who[1]) if isinstance(who, list) else (int(who), None)
                for folder, who in held.items()}
    except (ValueError, TypeError, AttributeError, IndexError):  # not ours (set by hand): hold nothing
        return {}


def _publish() -> None:
    held = {str(folder): list(who) for folder, who in inherited_holders().items()}
    me = [os.getpid(), process_started(os.getpid())]
    held.update({str(folder): me for folder in _held})
    os.environ[HELD_ENV] = json.dumps(held, sort_keys=True)


def _work_under_inherited_hold(folder: Path, holder: tuple[int, float | None], what: str) -> None:
    """A holder's stage (`dots train` under a flow's `dvc repro`) lives no longer than what started
    it: the kernel stops it when its parent dies (the flow's dvc, itself stopped with the flow,
    `dots.parent_death`), and a holder already gone stops it now. Else a flow SIGKILLed mid-stage
    left its stage writing the repository beside the next flow, which the lock had let in."""
    holder_pid, started = holder
    if holder_pid != os.getpid() and not pid_alive(holder_pid, started):
        raise HolderGone(f"{what}: the run that started it (pid {holder_pid}) held {folder} and has ended; "
                         "not writing there without it. Start the run again")
    from .parent_death import die_with_parent  # noqa: PLC0415

    die_with_parent(os.getppid())


def holder(folder: str | Path) -> dict | None:
    """Who holds the workspace's lock, as its holder wrote it (None when free or unreadable)."""
    try:
        return json.loads((Path(folder) / LOCK_NAME).read_text() or "null")
    except (OSError, ValueError):
        return None


class WorkspaceBusy(RuntimeError):
    """Another run holds the workspace, and this one was asked not to wait (a DVC stage's command)."""


def describe(who: dict | None) -> str:
    if not who:
        return "another run (it has not said which yet)"
    return (f"{who.get('what', 'another run')} (pid {who.get('pid')} on {who.get('host')}, "
            f"since {who.get('since')})")


def _how_to_stop() -> str:
    """The waiting line's last words. A deployment's run (a Prefect worker started it and set
    PREFECT__FLOW_RUN_ID) has no terminal of its own, and Ctrl-C where its worker runs would stop
    the worker: it is cancelled by its id. Ctrl-C where a terminal runs this; else no key to name."""
    flow_run = os.environ.get("PREFECT__FLOW_RUN_ID")
    if flow_run:
        return f"`prefect flow-run cancel {flow_run}` stops this one only"
    stdin = sys.stdin
    if stdin is not None and not stdin.closed and stdin.isatty():
        return "Ctrl-C stops this one only"
    return "stopping this run leaves the other alone"


@contextmanager
def exclusive(folder: str | Path, what: str, report: Callable[[str], None] = say,
              wait: bool = True) -> Iterator[None]:
    """Hold `folder`'s lock for the body, waiting (and saying for whom) while another run holds it.
    Ctrl-C while waiting stops this run and leaves the other one alone. With `wait=False` a held
    folder raises WorkspaceBusy at once, naming the holder."""
    folder = Path(folder).resolve()
    inherited = inherited_holders()
    if folder in _held or folder in inherited:  # held by this process, or by the run that started it
        if folder not in _held:
            _work_under_inherited_hold(folder, inherited[folder], what)
        _held[folder] = _held.get(folder, 0) + 1
        try:
            yield
        finally:
            _held[folder] -= 1
            if not _held[folder]:
                del _held[folder]
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        if exc.errno not in _CANNOT_WRITE:
            raise
        # a read-only checkout whose command writes its paths.root elsewhere: run as before the lock
        report(f"{what}: cannot hold {folder} ({exc.strerror}); this run is not serialized with others there")
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                raise WorkspaceBusy(f"{what}: {describe(holder(folder))} is writing {folder}") from None
            report(f"{what}: waiting for {describe(holder(folder))} to finish with {folder} "
                   f"(one run writes a workspace at a time; {_how_to_stop()})")
            start = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            report(f"{what}: {folder} is free after {time.monotonic() - start:.0f} s; going on")
        me = {"what": what, "pid": os.getpid(), "host": socket.gethostname(),
              "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        _held[folder] = 1
        before = os.environ.get(HELD_ENV)
        _publish()
        try:
            yield
        finally:
            del _held[folder]
            if before is None:
                os.environ.pop(HELD_ENV, None)
            else:
                os.environ[HELD_ENV] = before
            os.ftruncate(fd, 0)  # still locked: the next holder never reads a finished run as its holder
    finally:
        os.close(fd)  # releases the lock
