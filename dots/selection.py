"""DOTS selection (DESIGN §1): sample questions without replacement with

    P(q) ∝ exp(−|d̂_q − α| / τ)

in log space with the Gumbel-top-k trick (top-k of log-weight + Gumbel noise is a draw of
k items without replacement, sequentially proportional to the weights). A float32
softmax of −|d̂−α|/τ underflows to zeros at small τ; log-weights never do.
"""

from __future__ import annotations

import numpy as np


def log_weights(pred: np.ndarray, alpha: float, tau: float) -> np.ndarray:
    """Unnormalised log P(q) of each question (float64)."""
    if tau <= 0:
        raise ValueError(f"selection.tau: must be > 0; got {tau}")
    return -np.abs(np.asarray(pred, dtype=np.float64) - alpha) / tau


def selection_probs(pred: np.ndarray, alpha: float, tau: float) -> np.ndarray:
    """Normalised P(q) computed stably (for diagnostics and tests)."""
    lw = log_weights(pred, alpha, tau)
    lw -= lw.max()
    w = np.exp(lw)
    return w / w.sum()


def gumbel_topk(logw: np.ndarray, k: int, rng: np.random.Generator,
                available: np.ndarray | None = None) -> np.ndarray:
    """Indices of k draws without replacement ∝ exp(logw), among `available` (bool mask)."""
    logw = np.asarray(logw, dtype=np.float64)
    keys = logw + rng.gumbel(size=logw.shape)
    if available is not None:
        keys = np.where(available, keys, -np.inf)
        k = min(k, int(available.sum()))
    k = min(k, logw.shape[0])
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    top = np.argpartition(-keys, k - 1)[:k]
    return top[np.argsort(-keys[top], kind="stable")].astype(np.int64)


def select_questions(pred: np.ndarray, k: int, alpha: float, tau: float, rng: np.random.Generator,
                     available: np.ndarray | None = None) -> np.ndarray:
    """The round's questions: k (at most as many as are available) drawn ∝ exp(−|d̂−α|/τ)."""
    return gumbel_topk(log_weights(pred, alpha, tau), k, rng, available)
