"""Resumable training checkpoints.

A checkpoint holds everything the next step depends on: policy and optimizer state, the
RNG states (numpy generator for selection/replay, torch generator for sampling, the
global torch RNG), the replay buffer, the DOTS round state, the step counter, the
training clock and the records so far. Written to a temp file and renamed, so a kill
mid-write never leaves a torn checkpoint (temp file, fsync, rename).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .atomic import atomic_path

CHECKPOINT = "checkpoint.pt"


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
    return torch.load(path, weights_only=False)
