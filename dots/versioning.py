"""DVC as the pipeline's one lineage.

Prefect tasks do not call the stages' Python directly: they run the DVC stage
(`dvc repro -s <stage>`), so a Prefect run and a `dvc repro` write the same artifacts and
the same dvc.lock. This module wraps the few DVC operations the tasks need, and turns
DVC's failures into errors that say what to fix.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from . import params_record
from .atomic import atomic_path
from .config import ConfigError, load_config
from .parent_death import popen_dying_with_this_thread
from .progress import say
from .redact import environ_snapshot, scrub


class StageError(RuntimeError):
    """A DVC command failed; the message carries the tail of its output."""


class RemoteRefused(StageError):
    """The DVC remote answered, and will answer the same on a retry: a missing bucket, refused
    credentials (unlike an endpoint that cannot be reached, which a retry may find up)."""


class NotARepository(ValueError):
    """A flow's `repo` that holds no dots pipeline."""


def require_repository(repo: str | Path) -> Path:
    """`repo` resolved, or NotARepository naming what it lacks, before a flow takes the folder's
    lock or runs a stage. Why: a run given the wrong folder (a deployment's `repo` typed wrong in the
    UI, a deployment made without DOTS_REPO) wrote its lock file there and failed only in its first
    DVC stage, with DVC's "not inside of a DVC repository", after the stage's retries (42 s)."""
    path = Path(repo).resolve()
    if not path.is_dir():
        raise NotARepository(f"repo {str(repo)!r}: no such folder ({path})")
    missing = [name for name in ("dvc.yaml", "params.yaml") if not (path / name).is_file()]
    if missing:
        raise NotARepository(f"repo {str(repo)!r} ({path}) is not a dots repository: no "
                             f"{' and no '.join(missing)}; give the flow the repository's path (its `repo` "
                             "parameter), or set DOTS_REPO to it where the deployments are made or served")
    return path


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Our venv's bin first on PATH, so stage commands (`dots ...`) resolve to this install."""
    env = environ_snapshot()  # dict(os.environ) can die of MLflow's telemetry thread changing it
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["PYTHONUNBUFFERED"] = "1"  # stage output reaches the caller as it is printed, not at exit
    env.update(extra or {})
    return env


def dvc(args: list[str], repo: str | Path, env: dict[str, str] | None = None, timeout: float | None = None,
        on_line: Callable[[str], None] | None = None) -> str:
    """Run `dvc <args>` in `repo` and return its output (stdout and stderr, interleaved).

    The output is streamed: `on_line` gets each line as the command prints it (a stage's
    progress reaches the caller while the stage runs), and a failure raises StageError with
    the tail of the output. `timeout` (seconds) kills the command and raises
    subprocess.TimeoutExpired, as subprocess.run does.
    """
    # dies with this process however it dies: a flow SIGKILLed mid-stage left dvc and the stage's
    # `dots` command writing the repository beside the next flow (dots.parent_death)
    proc = popen_dying_with_this_thread(
        [sys.executable, "-m", "dvc", *args], cwd=repo, env=_env(env), text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, bufsize=1, errors="replace")
    timed_out = threading.Event()

    def kill() -> None:
        """dvc and the stage command it runs (which holds the pipe open too)."""
        import psutil  # noqa: PLC0415  (a DVC dependency)

        try:
            family = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        for p in [*family, proc]:
            try:
                p.kill()
            except (psutil.NoSuchProcess, ProcessLookupError):
                pass

    def time_out() -> None:
        timed_out.set()
        kill()

    timer = threading.Timer(timeout, time_out) if timeout else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for text in proc.stdout:
            lines.append(text)
            if on_line is not None:
                on_line(text.rstrip("\n"))
        returncode = proc.wait()
    finally:
        if timer is not None:
            timer.cancel()
        if proc.poll() is None:  # the caller's on_line raised, or we were interrupted: leave no orphan
            kill()
            proc.wait()
    out = "".join(lines)
    if timed_out.is_set():
        raise subprocess.TimeoutExpired(proc.args, timeout, output=out)
    if returncode != 0:
        tail = "\n".join(out.strip().splitlines()[-25:])
        raise StageError(scrub(f"`dvc {' '.join(args)}` failed in {repo} (exit {returncode}):\n{tail}"))
    return out


def repro(stage: str, repo: str | Path = ".", env: dict[str, str] | None = None,
          on_line: Callable[[str], None] | None = None) -> str:
    """Run one stage (not its upstream: the flow orders the stages); DVC skips it when nothing changed.
    `on_line` gets the stage's output line by line while it runs."""
    return dvc(["repro", "--single-item", stage], repo, env, on_line=on_line)


def set_params(overrides: list[str] | dict | None, repo: str | Path = ".") -> None:
    """Write dotted overrides into params.yaml, as `dvc exp run -S` does in the workspace.

    The result is validated *before* the file is touched; comments and order are kept.
    """
    if not overrides:
        return
    text = _overridden_text(overrides, repo)
    with atomic_path(Path(repo) / "params.yaml") as tmp:
        tmp.write_text(text)


def _overridden_text(overrides: list[str] | dict, repo: str | Path) -> str:
    """params.yaml's text with `overrides` applied (validated; the file is not touched)."""
    path = Path(repo) / "params.yaml"
    cfg = load_config(path, overrides)  # raises ConfigError naming the key; the file is untouched
    if not (Path(repo) / cfg.paths.root).resolve().is_relative_to(Path(repo).resolve()):
        raise ConfigError(f"paths.root: {cfg.paths.root!r} is outside the repository {repo}, where the DVC "
                          "stages write; the file is untouched")
    from ruamel.yaml import YAML  # noqa: PLC0415  (a DVC dependency)

    ry = YAML()
    ry.preserve_quotes = True
    doc = ry.load(path.read_text()) if path.exists() else {}
    items = overrides.items() if isinstance(overrides, dict) else (
        (k.strip(), yaml.safe_load(v)) for k, v in (o.split("=", 1) for o in overrides))
    for key, value in items:
        node = doc
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    out = io.StringIO()
    ry.dump(doc, out)
    return out.getvalue()


@contextmanager
def held(repo: str | Path, what: str, wait: bool = True) -> Iterator[bool]:
    """The repository's lock (`dots.workspace_lock.exclusive`), with params.yaml as its user left it:
    the overrides of a run killed before it put the file back are undone first. Yields True: what
    was read from the repository before (params.yaml) is to be read again."""
    from .workspace_lock import exclusive  # noqa: PLC0415

    with exclusive(repo, what, wait=wait):
        params_record.restore_if_killed(repo, say)
        yield True


@contextmanager
def params_overridden(overrides: list[str] | dict | None, repo: str | Path = ".") -> Iterator[None]:
    """params.yaml with `overrides` applied for the duration of a run, then the user's file put
    back byte for byte, also when the run fails (what a flow's `overrides` parameter does).

    The stages run against the overridden file, so dvc.lock and the outputs describe the run
    that made them; afterwards `dvc status` names the stages whose params the overrides changed,
    and the next plain run (or `dvc repro`) brings them back to the user's params. If params.yaml
    was edited during the run, the edit is kept and the original is left beside it.
    """
    if not overrides:
        yield
        return
    path = Path(repo) / "params.yaml"
    params_record.restore_if_killed(repo, say)  # else a dead run's overrides would pass for the user's file
    original = path.read_bytes() if path.exists() else None
    applied = _overridden_text(overrides, repo).encode()  # validated first: a bad override raises here
    items = overrides.items() if isinstance(overrides, dict) else (o.split("=", 1) for o in overrides)
    params_record.write(repo, [f"{k.strip()}={v}" for k, v in items], original, applied)
    with atomic_path(path) as tmp:
        tmp.write_bytes(applied)
    try:
        yield
    finally:
        now = path.read_bytes() if path.exists() else None
        if now != applied:  # someone changed params.yaml while the run used it: do not undo their edit
            keep = path.with_name("params.yaml.before-overrides")
            if original is not None:
                keep.write_bytes(original)
            say(f"params.yaml changed during the run; left as it is (the file before the run's overrides: "
                f"{keep})")
        elif original is None:
            path.unlink()
        else:
            with atomic_path(path) as tmp:
                tmp.write_bytes(original)
        params_record.clear(repo)


def lock(repo: str | Path = ".") -> dict:
    p = Path(repo) / "dvc.lock"
    return (yaml.safe_load(p.read_text()) or {}).get("stages", {}) if p.exists() else {}


def data_version(repo: str | Path = ".") -> str:
    """The DVC hash of the prepared data (the `prepare` stage's output)."""
    for out in lock(repo).get("prepare", {}).get("outs", []):
        if out.get("md5"):
            return out["md5"]
    raise StageError("dvc.lock has no `prepare` output yet; run the prepare stage first")


def push(repo: str | Path = ".", targets: list[str] | None = None, remote: str | None = None) -> str:
    """Send the targets' cached data to the (default or named) DVC remote."""
    args = ["push", *(targets or [])]
    if remote:
        args += ["--remote", remote]
    try:
        return dvc(args, repo, timeout=600)
    except StageError as exc:
        text = str(exc)
        if "NoSuchBucket" in text or ("Bucket" in text and "not exist" in text):
            raise RemoteRefused("DVC remote bucket does not exist: create it or fix the remote url\n"
                                f"{text}") from None
        if any(k in text for k in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "Forbidden",
                                   "(403)")):
            raise RemoteRefused(f"DVC remote refused the credentials (AWS_ACCESS_KEY_ID / "
                                f"AWS_SECRET_ACCESS_KEY or `dvc remote modify`)\n{text}") from None
        if any(k in text for k in ("Could not connect to the endpoint", "Connection refused", "ConnectTimeout",
                                   "Name or service not known", "Cannot connect to host")):
            raise StageError(f"DVC remote endpoint unreachable: check `dvc remote modify <name> endpointurl` "
                             f"and the network; the local data and cache are untouched\n{text}") from None
        raise


def stage_inputs_key(stage: str, repo: str | Path = ".") -> str:
    """A hash of what `stage` reads and writes as this workspace holds them: its params' current
    values, the content of every dependency (code, and upstream outputs) and of its own outputs.
    Equal keys mean the stage's result is there and current (Prefect's cache key for embed and
    predictor). Why content and not the hashes dvc.lock records: a hand `dots fit-predictor`
    replaced predictor.pt without touching dvc.lock, the key stayed, and every flow for the cache's
    30 days skipped the stage and trained on the hand-made predictor (found by a review)."""
    repo = Path(repo)
    spec = (yaml.safe_load((repo / "dvc.yaml").read_text()) or {})["stages"][stage]
    params = yaml.safe_load((repo / "params.yaml").read_text()) or {}
    h = hashlib.sha256(stage.encode())
    for key in spec.get("params", []):
        value = params
        for part in str(key).split("."):
            value = value.get(part) if isinstance(value, dict) else None
        h.update(f"{key}={json.dumps(value, sort_keys=True, default=str)}".encode())
    # This workspace's own outputs: a fresh clone or deleted outputs never hit another run's cache.
    h.update(str(repo.resolve()).encode())
    outs = [out if isinstance(out, str) else next(iter(out)) for out in spec.get("outs", [])]
    for path in [*spec.get("deps", []), *outs]:
        h.update(f"{path}:{content_digest(repo / path)}".encode())
    return h.hexdigest()[:24]


def content_digest(path: Path) -> str:
    """sha256 of a file's bytes, or of a folder's files (relative names and bytes, in name
    order); "missing" when there is none."""
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
    else:
        return "missing"
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(path)).encode() if f != path else b"")
        with f.open("rb") as stream:
            while block := stream.read(1 << 20):
                h.update(block)
    return h.hexdigest()
