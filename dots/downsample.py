"""Max-variance down-sampling of a group's rollouts for the update (PODS, Xu et al. 2025,
arXiv 2504.13818): `train.downsample: m` trains on m of each group's G rollouts.

Why: the update costs per trained token, generation per sampled token; PODS samples G and
trains on the m whose rewards vary most, which keeps most of a group's learning signal (its
advantage is recomputed on the m kept) at m/G of its update cost. On the embedded task this is
what `dots_rr` needs: it trains as many tokens as `grpo` to the target, and its update is
most of its time (docs/benchmark.md, "Max-variance down-sampling").

The max-variance subset of m values is always some i lowest and m − i highest of the sorted
rewards (PODS), so trying the m + 1 splits finds it in O(G log G). The sort is stable and a
tie goes to the first split tried, so a replayed group is down-sampled to the same rows every time.
"""

from __future__ import annotations

import dataclasses

import torch

from .rollout import Group


def max_variance_rows(rewards: torch.Tensor, m: int) -> torch.Tensor:
    """Sorted indices of the m rewards with the largest variance (all of them when m ≥ G)."""
    values = rewards.tolist()  # G plain floats: a few list operations instead of dozens of tiny tensor ops a group
    n = len(values)
    if m >= n:
        return torch.arange(n)
    order = sorted(range(n), key=values.__getitem__)  # stable, like the ranks of the rewards
    best, best_var = [], -1.0
    for low in range(m + 1):
        keep = order[:low] + order[n - m + low:]  # the `low` lowest and the m − low highest
        mean = sum(values[i] for i in keep) / m
        var = sum((values[i] - mean) ** 2 for i in keep) / m
        if var > best_var + 1e-12:
            best, best_var = keep, var
    return torch.tensor(sorted(best), dtype=torch.long)


def downsample_group(group: Group, m: int | None) -> Group:
    """`group` with only its max-variance m rollouts (itself when m is None or ≥ G)."""
    if m is None or m >= group.size:
        return group
    keep = max_variance_rows(group.rewards, m)
    return dataclasses.replace(
        group, response_ids=group.response_ids[keep], response_mask=group.response_mask[keep],
        logprobs=group.logprobs[keep], texts=[group.texts[i] for i in keep.tolist()],
        rewards=group.rewards[keep])


def downsample_groups(groups: list[Group], m: int | None) -> list[Group]:
    """Each group down-sampled to m rollouts (`train.downsample`); unchanged when m is None."""
    return groups if m is None else [downsample_group(g, m) for g in groups]
