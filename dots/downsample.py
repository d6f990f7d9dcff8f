"""Max-variance down-sampling of a group's rollouts for the update (PODS, Xu et al. 2025,
arXiv 2504.13818): `train.downsample: m` trains on m of each group's G rollouts.

Why: the update costs per trained token, generation per sampled token; PODS samples G and
trains on the m whose rewards vary most, which keeps most of a group's learning signal (its
advantage is recomputed on the m kept) at m/G of its update cost. On the embedded task this is
what `dots_rr` needs: it trains as many tokens as `grpo` to the target, and its update is
most of its time (docs/benchmark.md, "Max-variance down-sampling").

The max-variance subset of m values is always some i lowest and m − i highest of the sorted
rewards (PODS), so trying the m + 1 splits finds it in O(G log G). The sort is stable and a
tie between splits is broken by a fixed rule, so a replayed group is down-sampled to the same rows
every time.

Why the tie rule is a setting (`train.downsample_ties`): with exact-match rewards and an odd m,
the max-variance subset is not unique (three of a group with right and wrong answers: two right
and one wrong, or one right and two wrong, have the same variance), and which side it favours
changes what the update learns: "low" keeps more of the lower rewards (the default: `dots_rr`
trains on 3 of its 8 rollouts, one right and two wrong where it can, 0.86-0.87x the time of 4 of
8 in two six-seed benches, docs/benchmark.md), "high" more of the higher ones (the rule before,
with which 3 of 8 took about 1.3x the steps of 4). With an even m and a group that allows a balanced
cut the mix of right and wrong is the same either way; only which rows of a kind are kept
(the lowest-indexed or the highest-indexed) can differ.
"""

from __future__ import annotations

import dataclasses
from typing import get_args

import numpy as np
import torch

from .config import DownsampleTies
from .rollout import Group


# train.downsample_ties: which side of the rewards a tie between splits favours (the config's own list)
TIES = get_args(DownsampleTies)


def max_variance_rows(rewards: torch.Tensor, m: int, ties: str = "low") -> torch.Tensor:
    """Sorted indices of the m rewards with the largest variance (all of them when m ≥ G); a tie
    between subsets goes to the one with more of the lower rewards (`ties="low"`) or higher ones."""
    return max_variance_rows_batch(rewards[None, :], m, ties)[0]


def max_variance_rows_batch(rewards: torch.Tensor, m: int, ties: str = "low") -> torch.Tensor:
    """`max_variance_rows` for every row of (groups, G) rewards at once: (groups, min(m, G)).

    Why batched: a step cuts every trained group, and one group at a time it cost a few dozen
    Python operations each (about a twentieth of `dots_rr`'s update on the embedded task). The
    arithmetic is the one-group rule's, in the same order (float64 sums over the kept rewards in
    split order, a later split winning only by more than 1e-12), so every group keeps the same rows.
    Splits are tried from the fewest low rewards (`ties="high"`: the first tried wins a tie) or from
    the most (`"low"`)."""
    if ties not in TIES:
        raise ValueError(f"train.downsample_ties: must be one of {', '.join(TIES)}; got {ties!r}")
    values = rewards.detach().to("cpu", torch.float64).numpy()
    n_groups, n = values.shape
    if m >= n:
        return torch.arange(n).expand(n_groups, n).clone()
    order = np.argsort(values, axis=1, kind="stable")  # stable, like the ranks of the rewards
    ranked = np.take_along_axis(values, order, axis=1)
    best = np.zeros((n_groups, m), dtype=np.int64)
    best_var = np.full(n_groups, -1.0)
    for low in (range(m + 1) if ties == "high" else range(m, -1, -1)):
        cols = [*range(low), *range(n - m + low, n)]  # the `low` lowest and the m − low highest
        total = ranked[:, cols[0]]
        for c in cols[1:]:
            total = total + ranked[:, c]
        mean = total / m
        var = (ranked[:, cols[0]] - mean) ** 2
        for c in cols[1:]:
            var = var + (ranked[:, c] - mean) ** 2
        var = var / m
        better = var > best_var + 1e-12
        best[better] = order[better][:, cols]
        best_var = np.where(better, var, best_var)
    return torch.from_numpy(np.sort(best, axis=1))


def downsample_group(group: Group, m: int | None, ties: str = "low") -> Group:
    """`group` with only its max-variance m rollouts (itself when m is None or ≥ G)."""
    if m is None or m >= group.size:
        return group
    return _cut(group, max_variance_rows(group.rewards, m, ties))


def _cut(group: Group, keep: torch.Tensor) -> Group:
    """`group` with only the rollouts `keep` (sorted row indices)."""
    return dataclasses.replace(
        group, response_ids=group.response_ids[keep], response_mask=group.response_mask[keep],
        logprobs=group.logprobs[keep], texts=[group.texts[i] for i in keep.tolist()],
        rewards=group.rewards[keep])


def downsample_groups(groups: list[Group], m: int | None, ties: str = "low") -> list[Group]:
    """Each group down-sampled to m rollouts (`train.downsample`, ties broken by
    `train.downsample_ties`); unchanged when m is None. Groups of one size (a step's) have their
    rows chosen in one batch (`max_variance_rows_batch`)."""
    if m is None:
        return groups
    cut = [g.size > m for g in groups]
    sizes = {g.size for g, c in zip(groups, cut) if c}
    if len(sizes) != 1:
        return [downsample_group(g, m, ties) for g in groups]
    todo = [g for g, c in zip(groups, cut) if c]
    keeps = iter(max_variance_rows_batch(torch.stack([g.rewards for g in todo]), m, ties))
    return [_cut(g, next(keeps)) if c else g for g, c in zip(groups, cut)]
