"""A bench's seed processes die with the bench process (`dots.parent_death`): before, a `kill` of
the bench left them training on as orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

# The bench's shape in miniature: a process whose pool worker is busy (here: asleep) while the
# calling thread waits on the result, as `dots.bench.run_seed` does.
PARENT = """
import os, sys, time
from dots.parent_death import pool_dying_with_this_process
with pool_dying_with_this_process() as pool:
    print(pool.submit(os.getpid).result(), flush=True)
    pool.submit(time.sleep, 120).result()
"""


def _alive(pid: int) -> bool:
    """Running, not a zombie (an orphan's exit is reaped by whoever adopted it, maybe never here)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


@contextmanager
def parent_and_child(script: str) -> Iterator[tuple[subprocess.Popen, int]]:
    """Run `script`, whose first line out is the pid of the child it started; neither outlives the test."""
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(parent.stdout.readline())
        assert _alive(child) and child != parent.pid
        yield parent, child
    finally:
        parent.kill()
        parent.wait()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_pool_worker_dies_when_its_parent_is_killed(sig):
    with parent_and_child(PARENT) as (parent, child):
        parent.send_signal(sig)
        assert parent.wait(timeout=30) == -sig
        assert gone_within(child, 30), "the pool worker outlived the process that spawned it"


def test_a_child_whose_parent_is_already_gone_exits_at_once():
    """The request covers deaths still to come; a parent that died first is caught by pid."""
    gone = subprocess.run([sys.executable, "-c", "import os\nfrom dots.parent_death import die_with_parent\n"
                           "die_with_parent(os.getppid() + 1_000_000)\nprint('still here')"],
                          capture_output=True, text=True, timeout=60)
    assert gone.returncode == 128 + signal.SIGTERM and "still here" not in gone.stdout
    kept = subprocess.run([sys.executable, "-c", "import os\nfrom dots.parent_death import die_with_parent\n"
                           "print(die_with_parent(os.getppid()))"], capture_output=True, text=True, timeout=60)
    assert kept.returncode == 0 and kept.stdout.strip() == "True"


# a flow's shape: a Prefect task thread runs `dvc` (versioning.dvc) and waits for it
RUNNER = """
import sys, threading
from dots.parent_death import popen_dying_with_this_thread
def task():
    proc = popen_dying_with_this_thread(
        [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(120)"])
    proc.wait()
worker = threading.Thread(target=task)
worker.start()
worker.join()
"""


def test_a_process_started_from_a_flows_task_thread_dies_when_the_flow_is_killed():
    """A flow SIGKILLed mid-stage left its `dvc repro` (and the stage under it) running."""
    with parent_and_child(RUNNER) as (parent, child):
        assert Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[1] == b"-c"  # the program itself ran
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        assert gone_within(child, 30), "the process outlived the flow that started it"
