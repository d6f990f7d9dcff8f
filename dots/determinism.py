"""Same seed, same numbers: the torch settings every stage applies before it computes.

Why: with two or more CPU threads, some of torch's backward kernels (the accumulating index
ops behind a shared prompt's gradient, `kp[rows]` in `dots.fast_decode`, and the embedding
gradient) add their parts in an order that depends on which thread gets there first. On a
quiet machine that order rarely changes; on a loaded one it does, and a run's weights left
an identical quiet run's after a few steps (measured: `dots_rr`, 2 threads, one busy process
beside it). `torch.use_deterministic_algorithms(True)` makes torch pick the kernels whose
result does not depend on thread timing, so a run is a function of its seed, its params and
`train.threads` alone (the thread count still sets how reductions are split, so a run with
another `train.threads` is another run).

On CUDA the same switch also needs cuBLAS's fixed workspace (`CUBLAS_WORKSPACE_CONFIG`, set
here before the first cuBLAS call when the user has not set it) and cuDNN's deterministic
kernels; ops that have no deterministic CUDA kernel warn instead of failing. Bit-exact GPU
runs cost speed, so the GPU profile turns `train.deterministic` off.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def setup_torch(threads: int, deterministic: bool = True) -> None:
    """Thread count and deterministic kernels for this process (idempotent)."""
    torch.set_num_threads(threads)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic


def setup_from_config(cfg) -> None:
    setup_torch(cfg.train.threads, cfg.train.deterministic)


class GlobalRng:
    """The process-wide random states (torch's CPU and CUDA generators, Python's `random`,
    NumPy's legacy global), kept apart for one of several runs that share a process.

    Why: the bench's lockstep steps several trainers in turn in one process. Each trainer
    draws from its own generators, but a library may still draw from the global ones, and a
    run must be the same run whether it trains alone or beside others. `capture()` right
    after the run is built; then `with slot:` around each of its steps swaps its states in
    and the others' out.
    """

    def __init__(self):
        self.state: tuple | None = None

    @staticmethod
    def _get() -> tuple:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        return torch.get_rng_state(), cuda, random.getstate(), np.random.get_state()

    @staticmethod
    def _set(state: tuple) -> None:
        cpu, cuda, py, nps = state
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(py)
        np.random.set_state(nps)

    def capture(self) -> "GlobalRng":
        self.state = self._get()
        return self

    def __enter__(self) -> "GlobalRng":
        self._outer = self._get()
        if self.state is not None:
            self._set(self.state)
        return self

    def __exit__(self, *exc) -> None:
        self.state = self._get()
        self._set(self._outer)
