"""Theorem 1 of the paper, checked numerically through the project's own loss.

Statement: for a question the current policy solves with probability p, the expected
squared norm of the (unclipped) GRPO gradient of one group of G responses is
∝ p(1−p)(1−1/G); it vanishes at p ∈ {0, 1} and is largest at p = 0.5.

Assumptions of this check (those of the theorem):
- rewards r_i ~ Bernoulli(p), i.i.d., independent of the sampled response's gradient
  direction: the toy policy is a softmax over a small vocabulary with one-token responses,
  o_i ~ π, and the reward coin is flipped independently of o_i. Each response's
  score-function gradient g_i = ∇ log π(o_i) = e_{o_i} − π is then an independent random
  vector with E[g_i] = 0 and fixed second moment σ² = E||g_i||² = 1 − ||π||²;
- on-policy: the behaviour log-probs are the current ones, so the ratio is 1 (its value),
  and no clipping engages;
- no std normalisation (loss.scale_rewards = none): Â_i = r_i − mean(r);
- β = 0 (no KL term).

Under these, the gradient of the project's per-group objective (1/G) Σ_i Â_i log π(o_i) is
(1/G) Σ_i Â_i g_i, and E||·||² = σ²/G² · E[Σ_i Â_i²] = σ²/G² · (G−1) p(1−p)
= (σ²/G) · p(1−p)(1−1/G): proportional to p(1−p)(1−1/G) with the constant σ²/G that the
project's 1/G group mean contributes.

To get one gradient per group from a single call of `grpo_loss` (which averages over all
groups of a Batch), each group gets its own copy of the logits, so the gradient with respect
to group m's copy, times the number of groups, is that group's own gradient.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dots.loss import Batch, collate, group_advantages, grpo_loss
from dots.rollout import Group

VOCAB = 8
P_GRID = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]


def _policy_logits() -> torch.Tensor:
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(0)) * 0.7


def _batch(tokens: torch.Tensor, logp: torch.Tensor, rewards: torch.Tensor) -> Batch:
    """A Batch of one-token responses: what `collate` builds, without its per-row Python loop."""
    n = tokens.numel()
    ids = torch.cat([torch.ones(n, 1, dtype=torch.long), tokens.reshape(n, 1)], dim=1)
    return Batch(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=torch.arange(2).expand(n, 2),
                 response_ids=tokens.reshape(n, 1), response_mask=torch.ones(n, 1, dtype=torch.bool),
                 old_logprobs=logp.detach().reshape(n, 1), advantages=group_advantages(rewards).reshape(n),
                 prompt_width=1)


def squared_grad_norms(p: float, g: int, groups: int, seed: int) -> tuple[np.ndarray, dict]:
    """||∇ loss of one group||² for `groups` independent groups of G one-token responses."""
    gen = torch.Generator().manual_seed(seed)
    base = _policy_logits()
    delta = torch.zeros(groups, VOCAB, requires_grad=True)  # one copy of the logits per group
    logits = base + delta                                    # (M, V)
    probs = torch.softmax(base, -1)
    tokens = torch.multinomial(probs.expand(groups * g, VOCAB), 1, generator=gen).reshape(groups, g)
    logp = torch.log_softmax(logits, -1).gather(1, tokens)  # (M, G), differentiable in delta
    rewards = torch.bernoulli(torch.full((groups, g), p), generator=gen)  # independent of tokens
    batch = _batch(tokens, logp, rewards)
    loss, stats = grpo_loss(logp.reshape(-1, 1), batch, clip_eps=0.2, beta=0.0)
    (grad,) = torch.autograd.grad(loss, delta)
    per_group = (grad.double() * groups).pow(2).sum(-1)
    return per_group.numpy(), stats


def sigma2() -> float:
    probs = torch.softmax(_policy_logits(), -1).double()
    return float(1 - (probs ** 2).sum())


def theory(p: float, g: int) -> float:
    return sigma2() / g * p * (1 - p) * (1 - 1 / g)


def test_direct_batch_matches_collate():
    """The hand-built Batch above is what `collate` makes of the same groups."""
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(3, VOCAB, (5, 4), generator=gen)
    rewards = torch.bernoulli(torch.full((5, 4), 0.5), generator=gen)
    lp = -torch.rand(5, 4, generator=gen)
    groups = [Group(question_id=m, prompt_ids=torch.tensor([1]), response_ids=tokens[m][:, None],
                    response_mask=torch.ones(4, 1, dtype=torch.bool), logprobs=lp[m][:, None], texts=[""] * 4,
                    rewards=rewards[m]) for m in range(5)]
    ref = collate(groups, pad_id=0)
    ours = _batch(tokens, lp, rewards)
    for field in ("input_ids", "attention_mask", "response_ids", "response_mask", "old_logprobs", "advantages"):
        assert torch.equal(getattr(ref, field), getattr(ours, field)), field
    assert ref.prompt_width == ours.prompt_width


@pytest.fixture(scope="module")
def measured():
    out = {}
    for g, groups in ((4, 20000), (16, 8000)):
        for j, p in enumerate(P_GRID):
            norms, stats = squared_grad_norms(p, g, groups, seed=100 * g + j)
            out[(p, g)] = (norms, stats)
    return out


def test_on_policy_no_clip(measured):
    for (p, g), (_, stats) in measured.items():
        assert stats["clip_fraction"] == 0.0, (p, g)
        assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
        assert stats["ratio_max"] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("g", [4, 16])
def test_zero_gradient_when_always_or_never_solved(measured, g):
    for p in (0.0, 1.0):
        norms, _ = measured[(p, g)]
        assert norms.max() < 1e-20, (p, g)
    assert measured[(0.5, g)][0].mean() > 1e-3


@pytest.mark.parametrize("g", [4, 16])
def test_largest_near_half(measured, g):
    means = [measured[(p, g)][0].mean() for p in P_GRID]
    assert P_GRID[int(np.argmax(means))] == 0.5
    # symmetric in p ↔ 1 − p, within sampling error
    for p in (0.1, 0.25):
        assert means[P_GRID.index(p)] == pytest.approx(means[P_GRID.index(1 - p)], rel=0.15)


@pytest.mark.parametrize("g", [4, 16])
def test_proportional_to_p_one_minus_p_times_one_minus_inverse_g(measured, g):
    for p in P_GRID[1:-1]:
        norms, _ = measured[(p, g)]
        ratio = norms.mean() / theory(p, g)
        stderr = norms.std() / np.sqrt(len(norms)) / theory(p, g)
        assert stderr < 0.05  # the check below has the power to fail
        assert 0.85 < ratio < 1.15, (p, g, ratio)


def test_dependence_on_group_size(measured):
    """Across G the constant is σ²/G, so G·E||∇||² / (p(1−p)(1−1/G)) is the same for G = 4 and 16."""
    for p in (0.25, 0.5, 0.75):
        scaled = {g: g * measured[(p, g)][0].mean() / (p * (1 - p) * (1 - 1 / g)) for g in (4, 16)}
        assert scaled[4] == pytest.approx(scaled[16], rel=0.15)
        assert scaled[4] == pytest.approx(sigma2(), rel=0.15)
    # and the (1 − 1/G) factor is visible: with G·E||∇||² the two sizes differ by (1−1/16)/(1−1/4) = 1.25
    r = (16 * measured[(0.5, 16)][0].mean()) / (4 * measured[(0.5, 4)][0].mean())
    assert r == pytest.approx(1.25, rel=0.1)
