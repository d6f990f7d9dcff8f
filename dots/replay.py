"""Rollout replay buffer (DESIGN §1, RR).

A FIFO of at most C informative groups (0 < mean reward < 1). Each group keeps its token
ids, rewards, per-token behaviour log-probs and the policy version that produced it, so
the loss can importance-correct it however stale it is. Sampling is without replacement
within a step; sampled groups stay in the buffer until FIFO eviction pushes them out.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .rollout import Group


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

    def sample(self, k: int, rng: np.random.Generator) -> list[Group]:
        """Up to k distinct groups, uniformly; fewer when the buffer holds fewer (the caller
        generates the shortfall fresh)."""
        k = min(k, len(self._groups))
        if k <= 0:
            return []
        idx = rng.choice(len(self._groups), size=k, replace=False)
        return [self._groups[int(i)] for i in idx]

    @staticmethod
    def staleness(groups: list[Group], version: int) -> list[int]:
        """Policy versions elapsed since each group was generated."""
        return [version - g.version for g in groups]

    def state_dict(self) -> dict:
        return {"capacity": self.capacity, "groups": [g.__dict__.copy() for g in self._groups]}

    def load_state_dict(self, state: dict) -> None:
        self.capacity = int(state["capacity"])
        self._groups = deque((Group(**g) for g in state["groups"]), maxlen=self.capacity)
