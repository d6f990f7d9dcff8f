"""Resumable training checkpoints.

A checkpoint holds everything the next step depends on: policy and optimizer state, the
RNG states (numpy generator for selection/replay, torch generator for sampling, the
global torch RNG), the replay buffer, the DOTS round state, the step counter, the
training clock and the records so far. Written to a temp file and renamed, so a kill
mid-write never leaves a torn checkpoint (temp file, fsync, rename).

Everything in it is a tensor or plain data (numbers, strings, lists, dicts), so it loads
with `torch.load(weights_only=True)`: a checkpoint, embedding cache or predictor file that
someone hands over cannot run code when opened (`load_tensors` refuses it, naming the file).
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from .atomic import atomic_path

CHECKPOINT = "checkpoint.pt"


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
