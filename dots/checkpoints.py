"""Resumable training checkpoints.

A checkpoint holds everything the next step depends on: policy and optimizer state, the
RNG states (numpy generator for selection/replay, torch generator for sampling, the
global torch RNG), the replay buffer, the DOTS round state, the step counter, the
training clock and the records so far. Written to a temp file and renamed, so a kill
mid-write never leaves a torn checkpoint (temp file, fsync, rename).

Everything in it is a tensor or plain data (numbers, strings, lists, dicts), so it loads
with `torch.load(weights_only=True)`: a checkpoint, embedding cache or predictor file that
someone hands over cannot run code when opened (`load_tensors` refuses it, naming the file).

A checkpoint the run cannot go on from (made with other params, by other dots code, on other
data: `dots.provenance`; or past a shorter `train.steps`) is set aside, not deleted:
`checkpoint.<run key>.step<N>.pt`, its run's key in the name. Why the key: a run whose params
come back (a params change reverted, a longer budget again) goes on from its own set-aside
checkpoint instead of starting over, which on the GPU profile is hours of training. Why at most
`SET_ASIDE_KEPT` of them: a set-aside checkpoint of Qwen2.5-Math-1.5B with its AdamW states is
about 9 GB (`dots plan`: weights 2.88 GiB, AdamW states 5.75), and every params change made
another.
"""

from __future__ import annotations

import hashlib
import pickle
import re
import time
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

import torch

from .atomic import atomic_path

CHECKPOINT = "checkpoint.pt"
SET_ASIDE_KEPT = 2  # set-aside checkpoints kept per run folder: the ones set aside last; older ones removed
_SET_ASIDE = re.compile(r"checkpoint\.(?P<key>[0-9a-f]{16})\.step(?P<step>\d+)\.pt")


class UnsafeFileError(ValueError):
    """A saved file holds pickled objects other than tensors and plain data, or is not readable."""


def load_tensors(path: str | Path, what: str) -> Any:
    """`torch.load(path, weights_only=True)`, with one clear error naming the file when it holds
    pickled code (refused, never executed) or is torn or not a torch file at all."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        found = next((ln.strip() for ln in str(exc).splitlines() if "Unsupported" in ln or "global" in ln.lower()),
                     str(exc).splitlines()[0])
        raise UnsafeFileError(f"{path}: refused to load this {what}: it holds pickled objects other than tensors "
                              f"and plain data ({found}); it was not executed. Delete it or recreate it") from None
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise UnsafeFileError(f"{path}: not a readable {what} ({str(exc).splitlines()[0]}); "
                              "delete it or recreate it") from None


def save_checkpoint(run_dir: str | Path, state: dict[str, Any]) -> Path:
    path = Path(run_dir) / CHECKPOINT
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    return path


def load_checkpoint(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's last checkpoint, or None when it has none."""
    path = Path(run_dir) / CHECKPOINT
    if not path.exists():
        return None
    return load_tensors(path, "checkpoint")


class SetAside(NamedTuple):
    """A checkpoint set aside in a run folder: its file, and the step it holds (from its name)."""
    path: Path
    step: int


def run_key(fingerprint: str) -> str:
    """The short key of a run's fingerprint that names its set-aside checkpoints (a fingerprint
    holds a ':' and may hold a path, neither fit for a file name)."""
    return hashlib.sha256(fingerprint.encode()).hexdigest()[:16]


def set_aside_path(run_dir: str | Path, fingerprint: str, step: int) -> Path:
    """Where a checkpoint of the run `fingerprint` at `step` is set aside."""
    return Path(run_dir) / f"checkpoint.{run_key(fingerprint)}.step{step}.pt"


def set_asides(run_dir: str | Path, fingerprint: str | None = None) -> list[SetAside]:
    """The checkpoints set aside in run_dir (of one run, given its fingerprint), by their names.
    Files named otherwise (set aside before the names held the run's key) are not listed."""
    key = None if fingerprint is None else run_key(fingerprint)
    out = []
    for path in sorted(Path(run_dir).glob("checkpoint.*.step*.pt")):
        m = _SET_ASIDE.fullmatch(path.name)
        if m and (key is None or m["key"] == key):
            out.append(SetAside(path, int(m["step"])))
    return out


def furthest_set_aside(run_dir: str | Path, fingerprint: str, max_step: int) -> SetAside | None:
    """The set-aside checkpoint of this run that got furthest within its budget (step <= max_step)."""
    usable = [a for a in set_asides(run_dir, fingerprint) if a.step <= max_step]
    return max(usable, key=lambda a: a.step, default=None)


def prune_set_asides(run_dir: str | Path, keep: int = SET_ASIDE_KEPT) -> list[str]:
    """Remove all but the `keep` set-aside checkpoints set aside last (the trainer stamps each file
    with the time it sets it aside); one line per file removed, naming it, its step and that time."""
    found = sorted(set_asides(run_dir), key=lambda a: a.path.stat().st_mtime, reverse=True)
    removed = []
    for a in found[keep:]:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(a.path.stat().st_mtime))
        a.path.unlink(missing_ok=True)
        removed.append(f"{a.path.name} (step {a.step}, set aside {when})")
    return removed
