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
