"""Micro-batches of one update: a step's sequences split under a token budget.

Why: at the GPU profile's sizes one step's informative groups are up to B x G = 4,096
sequences of about 4K tokens; one forward and backward over all of them cannot fit any GPU.
`pack` cuts the step's rows, in order, into micro-batches whose padded size
(rows x (longest prompt + longest response)) stays within `train.micro_batch_tokens`;
a group may be split across micro-batches and a micro-batch always holds at least one
sequence. `collate_rows` lays a micro-batch out like `dots.loss.collate` does, with each
row's advantage taken from its *whole* group and a per-row weight 1 / (G x groups in the
step), so the micro-batches' losses — and their accumulated gradients — add up to the
one-batch loss of DESIGN §1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .loss import Batch, collate, group_advantages
from .rollout import Group


@dataclass(frozen=True)
class Rows:
    """Rows [start, stop) of one group: the unit a micro-batch is made of."""

    group: Group
    start: int
    stop: int

    @property
    def n(self) -> int:
        return self.stop - self.start


def response_lengths(group: Group) -> list[int]:
    """Each sample's generated tokens (eos included), at least 1 so an empty answer still has a column."""
    return [max(1, int(x)) for x in group.response_mask.sum(-1).tolist()]


def pack(groups: list[Group], budget: int | None) -> list[list[Rows]]:
    """Split the groups' rows, in order, into micro-batches of padded size <= `budget` tokens
    (None: one micro-batch of everything). A row longer than the budget gets a micro-batch of its own."""
    if budget is None:
        return [[Rows(g, 0, g.size) for g in groups]] if groups else []
    batches: list[list[Rows]] = []
    current: list[Rows] = []
    rows, width, length = 0, 0, 0
    for g in groups:
        prompt = len(g.prompt_ids)
        for i, resp in enumerate(response_lengths(g)):
            w, ln = max(width, prompt), max(length, resp)
            if rows and (rows + 1) * (w + ln) > budget:
                batches.append(current)
                current, rows, w, ln = [], 0, prompt, resp
            if current and current[-1].group is g and current[-1].stop == i:
                current[-1] = Rows(g, current[-1].start, i + 1)
            else:
                current.append(Rows(g, i, i + 1))
            rows, width, length = rows + 1, w, ln
    if current:
        batches.append(current)
    return batches


def collate_rows(parts: list[Rows], pad_id: int, n_groups: int, scale_rewards: str = "none") -> Batch:
    """One micro-batch as a `Batch`: responses trimmed to the micro-batch's longest answer,
    advantages from each whole group, and row weights 1 / (G x n_groups) so that the sum of
    the micro-batches' objectives is the mean over the step's `n_groups` groups."""
    subs, advantages, weights = [], [], []
    for p in parts:
        g = p.group
        width = max(response_lengths(g)[p.start:p.stop])
        rows = slice(p.start, p.stop)
        subs.append(Group(question_id=g.question_id, prompt_ids=g.prompt_ids,
                          response_ids=g.response_ids[rows, :width], response_mask=g.response_mask[rows, :width],
                          logprobs=g.logprobs[rows, :width], texts=g.texts[rows], rewards=g.rewards[rows],
                          version=g.version))
        advantages.append(group_advantages(g.rewards[None, :], scale_rewards)[0][rows])
        weights.append(torch.full((p.n,), 1.0 / (g.size * n_groups), dtype=torch.float64))
    batch = collate(subs, pad_id, scale_rewards)
    batch.advantages = torch.cat(advantages).to(batch.old_logprobs.dtype)
    batch.weights = torch.cat(weights).to(batch.old_logprobs.dtype)
    return batch
