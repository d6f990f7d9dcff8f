"""Child processes that die with the process that spawned them.

Why: the bench trains each seed in a spawned process of its own (`dots.bench.run_seed`). Ctrl-C
reaches the whole process group, but a SIGTERM or SIGKILL sent to the bench process alone (a
`kill <pid>`, a Prefect cancellation, a scheduler's time limit) killed only the parent, and its
seed processes trained on as orphans: minutes of both cores spent on runs nobody reads, slowing
whatever ran next, and writing run folders under a bench the user believed stopped. Linux's
`PR_SET_PDEATHSIG` has the kernel signal a child when its parent dies, however the parent died.
What a killed seed loses is what an interrupted bench already loses: its runs since their last
checkpoint (every write is atomic, `dots.atomic`), resumed by the next bench.

The same holds for a flow's DVC stages (`popen_dying_with_this_thread`): a flow SIGKILLed (the OOM
killer, `kill -9`, a worker's hard stop) left its `dvc repro` and the stage's `dots train` running,
writing the repository beside the next flow, which its lock (`dots.workspace_lock`) had let in.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing
import os
import signal
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies; exit at once if the
    parent (`parent_pid`) is already gone, since the request only covers a death still to come.
    Returns False where the platform has no such request (not Linux): the process then outlives
    a killed parent, as before.

    The kernel ties the request to the parent *thread* that forked this process: the caller
    must spawn it from a thread that lives as long as the child is wanted (a ProcessPoolExecutor
    spawns from the thread that calls `submit`, which `run_seed` keeps waiting on the result)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}")
    if os.getppid() != parent_pid:  # the parent died before the request was in place
        os._exit(128 + int(sig))
    return True


def pool_dying_with_this_process(max_workers: int = 1) -> ProcessPoolExecutor:
    """A spawned (not forked: a forked torch or Prefect process can hang on locks its parent held)
    process pool whose workers die when this process dies (`die_with_parent`)."""
    return ProcessPoolExecutor(max_workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=die_with_parent, initargs=(os.getpid(),))


def popen_dying_with_this_thread(argv: list[str], **kwargs) -> subprocess.Popen:
    """subprocess.Popen(argv, **kwargs), whose process the kernel sends SIGTERM when the calling
    thread (or this process) dies. The request is made in the child before it execs `argv`, by this
    module run as a program, not by `preexec_fn`, which is unsafe in a process with threads (a
    Prefect flow's). The calling thread must wait for the process (`dots.versioning.dvc` does)."""
    if not sys.platform.startswith("linux"):
        return subprocess.Popen(argv, **kwargs)
    return subprocess.Popen([sys.executable, "-m", __name__, str(os.getpid()), *argv], **kwargs)


if __name__ == "__main__":  # python -m dots.parent_death PARENT_PID PROGRAM [ARGS...]
    die_with_parent(int(sys.argv[1]))
    os.execvp(sys.argv[2], sys.argv[2:])
