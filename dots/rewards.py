"""Rewards in [0, 1] for a sampled answer against the ground truth.

The embedded task uses exact match of the digit string (the answer is written
least-significant digit first, so no normalisation beyond whitespace is needed).
"""

from __future__ import annotations


def exact_match(text: str, answer: str) -> float:
    """1.0 when the decoded response is exactly the answer (whitespace ignored), else 0.0."""
    return 1.0 if "".join(text.split()) == answer else 0.0


REWARDS = {"exact_match": exact_match}


def get_reward(name: str):
    try:
        return REWARDS[name]
    except KeyError:
        raise ValueError(f"reward: unknown reward {name!r}; allowed: {sorted(REWARDS)}") from None
