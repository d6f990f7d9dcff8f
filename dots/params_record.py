"""While a run's overrides are in params.yaml, the user's own file waits beside it
(`.dots.params-user.yaml`) with a record of the run that wrote them (`.dots.params-overridden.json`:
its pid, when, which overrides, the overridden file's hash).

Why, twice over:
- a run killed outright (SIGKILL, the OOM killer, a lost machine) never reaches the `finally` that
  puts the file back, and the next run took the overridden file for the user's and put *that* back,
  for good (seen: `train.steps: 333` left in the user's params.yaml). Whoever next takes the
  repository puts the user's file back first (`restore_if_killed`);
- a command that does not hold the repository (a bench, `dots plan`), started while a flow's
  overrides were in params.yaml, read the flow's variant for the user's params: a bench beside a
  nightly variant would bench the variant. It reads the user's file instead (`users_params`).
The flow itself and the stages it starts read the overridden file, as DVC does.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from .atomic import atomic_path
from .processes import pid_alive, process_started

RECORD = ".dots.params-overridden.json"
USERS = ".dots.params-user.yaml"
PARAMS = "params.yaml"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write(repo: str | Path, overrides: list[str], original: bytes | None, applied: bytes) -> None:
    """Before `applied` replaces the user's params.yaml (`original`; None: there was none)."""
    repo = Path(repo)
    if original is not None:
        with atomic_path(repo / USERS) as tmp:
            tmp.write_bytes(original)
    record = {"pid": os.getpid(), "started": process_started(os.getpid()),
              "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "overrides": overrides,
              "had_params": original is not None, "applied_sha256": sha256(applied)}
    with atomic_path(repo / RECORD) as tmp:
        tmp.write_text(json.dumps(record))


def clear(repo: str | Path) -> None:
    """Once the user's file is back (the run's own `finally`)."""
    (Path(repo) / RECORD).unlink(missing_ok=True)
    (Path(repo) / USERS).unlink(missing_ok=True)


def _read(repo: Path, report: Callable[[str], None] | None) -> dict | None:
    try:
        return json.loads((repo / RECORD).read_text())
    except FileNotFoundError:
        return None
    except ValueError:  # written atomically, so not ours
        if report is not None:
            report(f"{repo / RECORD}: not a record dots wrote; removed, params.yaml left as it is")
            clear(repo)
        return None


def _running(record: dict) -> bool:
    """The run that wrote the record is still running (its pid, and that pid's start time: a pid
    reused by a later process after the run was killed is not the run)."""
    return pid_alive(int(record["pid"]), record.get("started"))


def _describe(record: dict) -> str:
    return (f"a run (pid {record['pid']}, since {record['since']}) with overrides "
            f"{' '.join(record['overrides'])}")


def restore_if_killed(repo: str | Path, report: Callable[[str], None]) -> None:
    """Put the user's params.yaml back if a run that overrode it died without doing so (its record
    is there, its process gone). A file edited since is kept, the user's left beside it."""
    repo = Path(repo)
    record = _read(repo, report)
    if record is None or _running(record):  # its overrides stand until it ends
        return
    path = repo / PARAMS
    now = path.read_bytes() if path.exists() else None
    original = (repo / USERS).read_bytes() if record["had_params"] else None
    if now is not None and sha256(now) == record["applied_sha256"]:
        if original is None:
            path.unlink()
        else:
            with atomic_path(path) as tmp:
                tmp.write_bytes(original)
        report(f"params.yaml: {_describe(record)} was stopped before it put the file back; put back as it "
               "was before that run")
    elif now != original:
        keep = path.with_name("params.yaml.before-overrides")
        if original is not None:
            shutil.copyfile(repo / USERS, keep)
        report(f"params.yaml: {_describe(record)} was stopped before it put the file back, and the file was "
               f"edited since; left as it is (the file before that run's overrides: {keep})")
    clear(repo)


def users_params(path: str | Path, report: Callable[[str], None]) -> str | None:
    """The file to read for `path` (a params.yaml) in a process that does not write under the run
    whose overrides are in it: the user's own file (None: they had none, every default), else `path`."""
    from .workspace_lock import inherited_holders  # noqa: PLC0415

    path = Path(path)
    if path.name != PARAMS:
        return str(path)
    record = _read(path.parent, None)
    if record is None or not _running(record):
        return str(path)
    holders = {os.getpid(), *(pid for pid, _ in inherited_holders().values())}
    if int(record["pid"]) in holders:  # the run itself, or a stage it started
        return str(path)
    if not path.exists() or sha256(path.read_bytes()) != record["applied_sha256"]:
        return str(path)  # edited during the run: the user's edit is what they mean
    report(f"{path}: holds the overrides of {_describe(record)}, which is running; reading your own "
           f"file ({USERS}) instead")
    return str(path.parent / USERS) if record["had_params"] else None
