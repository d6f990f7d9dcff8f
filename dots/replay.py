"""Rollout replay buffer (DESIGN §1, RR).

A FIFO of at most C informative groups (0 < mean reward < 1). Each group keeps its token
ids, rewards, per-token behaviour log-probs and the policy version that produced it, so
the loss can importance-correct it however stale it is. Sampling is without replacement
within a step; sampled groups stay in the buffer until FIFO eviction pushes them out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import numpy as np

from .rollout import Group
from .selection import gumbel_topk


class ReplayBuffer:
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"replay.capacity: must be >= 1; got {capacity}")
        self.capacity = capacity
        self._groups: deque[Group] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, group: Group) -> bool:
        """Store an informative group (evicting the oldest at capacity); refuse a degenerate one."""
        if group.rewards is None:
            raise ValueError("replay: a group must be scored before it is stored")
        if not group.informative:
            return False
        self._groups.append(group)
        return True

    def sample(self, k: int, rng: np.random.Generator, recency: float = 0.0,
               exclude: Iterable[Group] = ()) -> list[Group]:
        """Up to k distinct groups; fewer when the buffer holds fewer (the caller generates the
        shortfall fresh). Uniform by default (the paper); `recency` > 0 weighs a group by
        exp(−recency · age), age in policy versions behind the newest group, so replay leans
        to fresher, less off-policy groups. `exclude`: groups already drawn this step (a second
        draw never repeats them)."""
        taken = {id(g) for g in exclude}
        candidates = [g for g in self._groups if id(g) not in taken]
        k = min(k, len(candidates))
        if k <= 0:
            return []
        weights = None
        if recency > 0:  # ages against the newest group in the buffer, excluded or not
            newest = max(g.version for g in self._groups)
            ages = newest - np.array([g.version for g in candidates], dtype=np.float64)
            w = np.exp(-recency * ages)
            if np.count_nonzero(w) < k:
                # old groups' weights underflow to 0 at a steep recency (200: e^-200 per version) and
                # numpy's draw refuses fewer non-zero weights than draws; the same distribution
                # (successive draws without replacement) from the log-weights, which never underflow
                return [candidates[int(i)] for i in gumbel_topk(-recency * ages, k, rng)]
            weights = w / w.sum()
        idx = rng.choice(len(candidates), size=k, replace=False, p=weights)
        return [candidates[int(i)] for i in idx]

    @staticmethod
    def staleness(groups: list[Group], version: int) -> list[int]:
        """Policy versions elapsed since each group was generated."""
        return [version - g.version for g in groups]

    def state_dict(self) -> dict:
        return {"capacity": self.capacity, "groups": [g.__dict__.copy() for g in self._groups]}

    def load_state_dict(self, state: dict) -> None:
        self.capacity = int(state["capacity"])
        self._groups = deque((Group(**g) for g in state["groups"]), maxlen=self.capacity)
