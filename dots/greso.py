"""GRESO's pre-rollout filter (arXiv 2506.02177; its `presampling_selector.py`, `all_probabilistic`).

Each pool question keeps the streak of its latest rollouts: how many in a row were all correct
(> 0) or all wrong (< 0); any mixed group resets it. A question whose last z rollouts were all
correct is skipped before rollout with probability 1 − max(p_easy^z, 0.01), one whose last z were
all wrong with 1 − max(p_hard^z, 0.01); a question never rolled out, or whose last group was mixed,
is always kept. The two exploration bases adapt once a step by ±0.01 within [p_min, p_max]: when
the step's share of all-correct groups (among those rolled out) is at or above its target, p_easy
falls (skip more), else it rises; the same for all-wrong groups and p_hard. The targets split
`target_zero_variance` one third easy, two thirds hard (GRESO explores hard questions more, as
they are the likelier to change while the reward rises).

The streak is all of a question's history the rule reads, so it is what is kept (one int per
question) and checkpointed: a killed run resumes with the same skips.

Differences from GRESO's code, on purpose: all-correct and all-wrong mean every reward is 1 (or 0)
rather than a mean of at least 0.98 (at most 0.11), the same for binary rewards and any G; and the
bases adapt from the first step, since questions here are drawn uniformly each step and recur from
the start, where GRESO's epoch-ordered loader sees a question again only in its second epoch.
"""

from __future__ import annotations

import numpy as np

from .dynamic_sampling import all_correct, all_wrong
from .rollout import Group

FLOOR = 0.01  # GRESO: a question is never skipped with certainty
STEP = 0.01   # adaptation step of the exploration bases


class SelectiveRollout:
    def __init__(self, pool_size: int, p_easy: float = 0.5, p_hard: float = 0.5, target_zero_variance: float = 0.25,
                 p_min: float = 0.05, p_max: float = 0.95):
        self.streak = np.zeros(pool_size, dtype=np.int64)
        self.p_easy, self.p_hard = float(p_easy), float(p_hard)
        self.target_easy = target_zero_variance / 3
        self.target_hard = target_zero_variance * 2 / 3
        self.p_min, self.p_max = p_min, p_max

    def skip_probability(self, idx: np.ndarray) -> np.ndarray:
        """1 − max(p^z, 0.01) for each question, with p_easy for an all-correct streak of z, p_hard for
        an all-wrong one; 0 for a question without a streak."""
        z = self.streak[idx]
        keep = np.ones(len(idx), dtype=np.float64)
        easy, hard = z > 0, z < 0
        keep[easy] = np.maximum(self.p_easy ** z[easy].astype(np.float64), FLOOR)
        keep[hard] = np.maximum(self.p_hard ** (-z[hard]).astype(np.float64), FLOOR)
        return 1.0 - keep

    def pick(self, candidates: np.ndarray, size: int, rng: np.random.Generator,
             chunk: int = 256) -> tuple[np.ndarray, int, dict]:
        """Walk `candidates` in order, skipping each with its skip probability, until `size` are kept.
        Returns the kept questions, how many candidates were consumed, and counts for the metrics."""
        kept: list[np.ndarray] = []
        n_kept = used = 0
        stats = {"skipped_easy": 0, "skipped_hard": 0, "skip_prob_sum": 0.0}
        while n_kept < size and used < len(candidates):
            part = candidates[used:used + chunk]
            prob = self.skip_probability(part)
            keep = rng.random(len(part)) >= prob
            # stop at the size-th kept candidate: the rest of the chunk is not consumed
            cut = len(part) if keep.sum() < size - n_kept else int(np.flatnonzero(keep)[size - n_kept - 1]) + 1
            part, prob, keep = part[:cut], prob[:cut], keep[:cut]
            z = self.streak[part]
            stats["skipped_easy"] += int((~keep & (z > 0)).sum())
            stats["skipped_hard"] += int((~keep & (z < 0)).sum())
            stats["skip_prob_sum"] += float(prob.sum())
            kept.append(part[keep])
            n_kept += int(keep.sum())
            used += cut
        stats["considered"] = used
        return (np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)), used, stats

    def record(self, groups: list[Group]) -> None:
        """Extend each rolled-out question's streak (in rollout order)."""
        for g in groups:
            q = g.question_id
            if all_correct(g):
                self.streak[q] = max(self.streak[q], 0) + 1
            elif all_wrong(g):
                self.streak[q] = min(self.streak[q], 0) - 1
            else:
                self.streak[q] = 0

    def adapt(self, easy_share: float, hard_share: float) -> None:
        """GRESO's step-wise adaptation toward the target zero-variance shares."""
        if hard_share >= self.target_hard:
            self.p_hard = max(self.p_hard - STEP, self.p_min)
        else:
            self.p_hard = min(self.p_hard + STEP, self.p_max)
        if easy_share >= self.target_easy:
            self.p_easy = max(self.p_easy - STEP, self.p_min)
        else:
            self.p_easy = min(self.p_easy + STEP, self.p_max)

    def state_dict(self) -> dict:
        import torch  # noqa: PLC0415  (checkpoints hold tensors: they load with weights_only=True)

        return {"streak": torch.from_numpy(self.streak.copy()), "p_easy": self.p_easy, "p_hard": self.p_hard}

    def load_state_dict(self, state: dict) -> None:
        streak = state["streak"].numpy()
        if streak.shape != self.streak.shape:
            raise ValueError(f"greso state: a streak for {streak.shape[0]} questions, the pool has {self.streak.shape[0]}")
        self.streak = streak.astype(np.int64).copy()
        self.p_easy, self.p_hard = float(state["p_easy"]), float(state["p_hard"])
