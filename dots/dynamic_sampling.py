"""Dynamic sampling, the peer baselines' way to a batch of informative groups (`dapo`, `greso`).

DAPO (arXiv 2503.14476; verl's `algorithm.filter_groups`) rolls out a generation batch of
uniformly drawn prompts, keeps the groups whose rewards are not all equal, and keeps drawing
generation batches until B such groups are collected or `max_gen_batches` batches have been
drawn; surplus groups are dropped, as verl does. Where verl raises at the round limit, we train
on what there is and count the step as short (`sampling/short`), so that a hard pool shows up
in the numbers instead of killing a run.

GRESO (arXiv 2506.02177) filters prompts before rolling them out (`dots.greso`) and then applies
the same filter; its generation batches are sized adaptively (`greso_sizes`).

Why here and not in the trainer: the loop is the same for both peers; only the size of each
generation batch and the pre-rollout filter differ, so both are passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .rollout import Group


def has_variance(g: Group) -> bool:
    """DAPO's filter: the group's rewards are not all equal (its advantage is not zero everywhere)."""
    assert g.rewards is not None, "rewards not scored yet"
    return bool((g.rewards != g.rewards[0]).any())


def all_correct(g: Group) -> bool:
    assert g.rewards is not None, "rewards not scored yet"
    return bool(g.rewards.min() >= 1.0)


def all_wrong(g: Group) -> bool:
    assert g.rewards is not None, "rewards not scored yet"
    return bool(g.rewards.max() <= 0.0)


@dataclass
class Collected:
    """One step's dynamic sampling: what is trained and what it cost."""

    groups: list[Group] = field(default_factory=list)  # at most B groups with varied rewards, rollout order
    rolled_out: int = 0      # groups generated this step, every generation batch together
    gen_batches: int = 0     # generation batches drawn
    filtered: int = 0        # groups dropped for equal rewards
    surplus: int = 0         # varied groups dropped beyond B
    easy: int = 0            # rolled-out groups that were all correct
    hard: int = 0            # rolled-out groups that were all wrong
    short: bool = False      # the round limit (or the pool) ran out before B groups

    def metrics(self) -> dict:
        n = max(self.rolled_out, 1)
        return {"sampling/gen_batches": self.gen_batches, "sampling/rollouts": self.rolled_out,
                "sampling/filtered": self.filtered, "sampling/surplus": self.surplus,
                "sampling/short": int(self.short), "sampling/informative_share": (self.rolled_out - self.filtered) / n,
                "sampling/easy_share": self.easy / n, "sampling/hard_share": self.hard / n}


def collect(batch_size: int, order: np.ndarray, next_size: Callable[[Collected, list[Group]], int | None],
            rollout: Callable[[np.ndarray], list[Group]],
            pick: Callable[[np.ndarray, int], tuple[np.ndarray, int]] | None = None) -> Collected:
    """Roll out generation batches until `batch_size` groups with varied rewards are collected.

    `order` is the step's uniform draw of the pool (a permutation); generation batches take
    prompts from it in turn, so a step never rolls out one prompt twice. `next_size(state, last)`
    gives the next generation batch's size in prompts (None: stop, train on what there is).
    `pick(candidates, size)` chooses which of the next candidates are rolled out and returns them
    with how many candidates it consumed (GRESO's skip filter); by default the first `size`."""
    out = Collected()
    pos, last = 0, []
    while len(out.groups) < batch_size:
        size = next_size(out, last)
        if size is None or pos >= len(order):
            out.short = True
            break
        if pick is None:
            idx, used = order[pos:pos + size], min(size, len(order) - pos)
        else:
            idx, used = pick(order[pos:], size)
        pos += used
        last = rollout(np.asarray(idx, dtype=np.int64)) if len(idx) else []
        out.gen_batches += 1
        out.rolled_out += len(last)
        out.easy += sum(all_correct(g) for g in last)
        out.hard += sum(all_wrong(g) for g in last)
        varied = [g for g in last if has_variance(g)]
        out.filtered += len(last) - len(varied)
        room = batch_size - len(out.groups)
        out.groups.extend(varied[:room])
        out.surplus += max(0, len(varied) - room)
    return out


def dapo_sizes(gen_batch_size: int, max_gen_batches: int) -> Callable[[Collected, list[Group]], int | None]:
    """DAPO: every generation batch has `gen_batch_size` prompts, at most `max_gen_batches` a step
    (0: no limit)."""
    def size(state: Collected, last: list[Group]) -> int | None:
        if max_gen_batches and state.gen_batches >= max_gen_batches:
            return None
        return gen_batch_size
    return size


def greso_sizes(batch_size: int, sampling_batch_size: int, min_sampling_batch_size: int, max_gen_batches: int,
                margin: float = 1.25) -> Callable[[Collected, list[Group]], int | None]:
    """GRESO's adaptive generation batches (its `ray_trainer.fit`): the first has `sampling_batch_size`
    prompts (kept by the skip filter); after a short batch the next is sized to what is missing,
    remaining / (1 − the last batch's zero-variance share) × 1.25, at least `min_sampling_batch_size`
    and at most `sampling_batch_size`. A batch sized below the full one is the step's last: the step
    trains on what it then has. `max_gen_batches` (0: none) caps the rounds, which GRESO leaves open."""
    done = {"last_round": False}

    def size(state: Collected, last: list[Group]) -> int | None:
        if state.gen_batches == 0:
            done["last_round"] = False
            return sampling_batch_size
        if done["last_round"] or (max_gen_batches and state.gen_batches >= max_gen_batches):
            return None
        zero_var = 1.0 - sum(has_variance(g) for g in last) / len(last) if last else 1.0
        if zero_var >= 1.0:
            return sampling_batch_size  # nothing varied in the last batch: no estimate, a full batch again
        estimate = int((batch_size - len(state.groups)) / (1.0 - zero_var) * margin)
        if estimate <= sampling_batch_size:
            done["last_round"] = True
        return max(min(estimate, sampling_batch_size), min_sampling_batch_size)
    return size
