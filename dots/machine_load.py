"""Load-adjusted training seconds: the bench's time-to-target with the machine's load divided out.

Why: the bench trains a seed's arms in lockstep (one step of each in turn), so load that hits the
machine for a few seconds hits every arm alike. It cannot cancel load that falls inside one
arm's window to the target and outside another's: dapo reaches grpo's target by step 140-170,
grpo at 270-300, so a slow stretch in rounds 170-300 lengthens grpo's time and not dapo's. Two
clean-clone benches of one commit gave dapo / grpo 1.43 and 1.26 that way, while every step and
token was identical.

How: every round of the lockstep group measures the load once, with the arms themselves as the
probe. An arm's step seconds over its own median step is how slow the machine ran it in that
round; the median of that over the round's arms is the round's load factor (1 = a typical round).
An arm's load-adjusted seconds are its step seconds each divided by its round's factor. The
median over arms keeps one arm's own cost trend (greso's steps fall by a third as its skip rule
warms up) out of the factor, so it needs at least `MIN_ARMS` arms; with fewer, or with arms timed
one after another (on a GPU, `bench.timing`), there is no common clock and no adjusted figure.

Checked offline on the two benches above: the adjusted ratios agreed within 0.02 for every
method and every baseline (raw: 0.17); the per-window load factors of the two runs differ from
each other, so what is divided out is load, not a training trend common to every arm. Four
later benches of the same runs (two commits, two pairs) showed its limit: dots_rr / grpo stayed
at 0.81-0.82 adjusted in all six (raw 0.80-0.85), but dapo / grpo differed by 0.12 and 0.08
adjusted within a pair (raw 0.08 and 0.05). Between two of them dapo's rollouts (192 prompts x 8
samples a step, three times grpo's) slowed 12-20% where every other arm's phases slowed 6-9%: one factor
per round cannot divide out load that slows one kind of work more than another. A factor per
phase (rollout, update), or per token of each phase, did no better on that pair (0.07).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

MIN_ARMS = 3  # the median of fewer arms is one arm's own cost trend as much as the machine's load


def round_loads(step_seconds: Mapping[str, Sequence[float]]) -> np.ndarray | None:
    """Per lockstep round, the machine's load factor: the median over arms of the arm's step
    seconds over its own median step. `step_seconds[arm][i]` is the arm's i-th step; every arm
    of a lockstep group trains the same steps. None with fewer than `MIN_ARMS` arms."""
    if len(step_seconds) < MIN_ARMS:
        return None
    lengths = {len(v) for v in step_seconds.values()}
    if len(lengths) != 1:
        raise ValueError(f"round_loads: arms of one lockstep group trained different step counts: "
                         f"{ {arm: len(v) for arm, v in step_seconds.items()} }")
    steps = np.asarray([np.asarray(v, dtype=np.float64) for v in step_seconds.values()])
    typical = np.median(steps, axis=1, keepdims=True)
    if steps.size == 0 or np.any(typical <= 0):
        raise ValueError("round_loads: every arm needs positive step seconds")
    return np.median(steps / typical, axis=0)


def adjusted_seconds(step_seconds: Sequence[float], loads: np.ndarray, steps: int) -> float:
    """An arm's training seconds over its first `steps` steps, each step divided by its round's
    load factor (`round_loads`)."""
    if steps > len(loads) or steps > len(step_seconds):
        raise ValueError(f"adjusted_seconds: {steps} steps asked, {min(len(loads), len(step_seconds))} timed")
    return float(np.sum(np.asarray(step_seconds[:steps], dtype=np.float64) / loads[:steps]))
