"""DOTS selection: P(q) ∝ exp(−|d̂−α|/τ), sampled without replacement in log space."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dots.selection import gumbel_topk, log_weights, select_questions, selection_probs

PRED = np.array([0.02, 0.15, 0.3, 0.42, 0.5, 0.55, 0.61, 0.77, 0.9, 1.0])


def _first_pick_counts(pred, alpha, tau, draws, k=3, seed=0):
    rng = np.random.default_rng(seed)
    counts = np.zeros(len(pred), dtype=np.int64)
    for _ in range(draws):
        counts[select_questions(pred, k, alpha, tau, rng)[0]] += 1
    return counts


@pytest.mark.parametrize("alpha,tau", [(0.5, 0.2), (0.3, 0.1)])
def test_first_pick_frequency_matches_selection_probs(alpha, tau):
    draws = 20000
    probs = selection_probs(PRED, alpha, tau)
    expected_closed_form = np.exp(-np.abs(PRED - alpha) / tau)
    assert np.allclose(probs, expected_closed_form / expected_closed_form.sum())
    counts = _first_pick_counts(PRED, alpha, tau, draws)
    assert counts.sum() == draws
    result = stats.chisquare(counts, probs * draws)
    assert result.pvalue > 1e-3, (counts, probs * draws)
    # the test has power: uniform selection would be rejected
    assert stats.chisquare(counts, np.full(len(PRED), draws / len(PRED))).pvalue < 1e-6


def test_second_pick_is_without_replacement_and_proportional():
    """Given the first pick, the second follows the remaining weights renormalised."""
    rng = np.random.default_rng(1)
    probs = selection_probs(PRED, 0.5, 0.2)
    first, second = 4, np.zeros(len(PRED), dtype=np.int64)
    n = 0
    for _ in range(30000):
        idx = select_questions(PRED, 2, 0.5, 0.2, rng)
        assert idx[0] != idx[1]
        if idx[0] == first:
            second[idx[1]] += 1
            n += 1
    rest = probs.copy()
    rest[first] = 0
    rest /= rest.sum()
    keep = rest > 0
    assert second[first] == 0
    assert stats.chisquare(second[keep], rest[keep] * n).pvalue > 1e-3


def test_tiny_tau_is_stable_and_greedy():
    tau = 1e-3
    rng = np.random.default_rng(0)
    pred = rng.permutation(np.linspace(0.0, 1.0, 101))
    closest = int(np.argmin(np.abs(pred - 0.5)))
    lw = log_weights(pred, 0.5, tau)
    assert np.isfinite(lw).all()
    probs = selection_probs(pred, 0.5, tau)
    assert np.isfinite(probs).all() and probs.sum() == pytest.approx(1.0)
    assert probs[closest] > 0.99
    firsts = []
    for _ in range(200):
        idx = select_questions(pred, 10, 0.5, tau, rng)
        assert len(idx) == 10 and len(set(idx.tolist())) == 10
        assert ((idx >= 0) & (idx < len(pred))).all()
        firsts.append(int(idx[0]))
    assert np.mean(np.array(firsts) == closest) >= 0.99


def test_tiny_tau_far_from_alpha_does_not_underflow():
    """All predictions far from α: exp(−|d̂−α|/τ) underflows to 0 in float32 (and float64),
    log-space sampling still prefers the closest one."""
    tau = 1e-3
    pred = np.array([0.95, 0.99, 0.9, 1.0, 0.97])
    assert (np.exp(-np.abs(pred.astype(np.float32) - 0.5) / np.float32(tau)) == 0).all()
    probs = selection_probs(pred, 0.5, tau)
    assert np.isfinite(probs).all() and probs.sum() == pytest.approx(1.0)
    rng = np.random.default_rng(3)
    for _ in range(50):
        idx = select_questions(pred, 3, 0.5, tau, rng)
        assert idx.tolist()[0] == 2
        assert len(set(idx.tolist())) == 3


def test_more_than_the_pool_returns_only_what_exists():
    rng = np.random.default_rng(0)
    idx = select_questions(PRED, 25, 0.5, 0.1, rng)
    assert sorted(idx.tolist()) == list(range(len(PRED)))


def test_respects_available_mask():
    rng = np.random.default_rng(0)
    available = np.zeros(len(PRED), dtype=bool)
    available[[1, 4, 7, 9]] = True
    for k in (2, 4, 10):
        for _ in range(50):
            idx = select_questions(PRED, k, 0.5, 0.1, rng, available)
            assert len(idx) == min(k, 4)
            assert len(set(idx.tolist())) == len(idx)
            assert available[idx].all()
    assert len(select_questions(PRED, 5, 0.5, 0.1, rng, np.zeros(len(PRED), dtype=bool))) == 0
    assert len(select_questions(PRED, 0, 0.5, 0.1, rng)) == 0


def test_available_mask_with_tiny_tau_never_picks_unavailable():
    rng = np.random.default_rng(0)
    available = np.ones(len(PRED), dtype=bool)
    available[4] = False  # the one at α itself
    for _ in range(100):
        idx = select_questions(PRED, 3, 0.5, 1e-3, rng, available)
        assert 4 not in idx.tolist()
        assert idx[0] == 5  # 0.55 is the closest available


def test_gumbel_topk_returns_int_indices_in_key_order():
    rng = np.random.default_rng(0)
    idx = gumbel_topk(np.log(np.array([1.0, 2.0, 3.0])), 3, rng)
    assert idx.dtype == np.int64
    assert sorted(idx.tolist()) == [0, 1, 2]


def test_nonpositive_tau_refused():
    with pytest.raises(ValueError, match="selection.tau"):
        select_questions(PRED, 2, 0.5, 0.0, np.random.default_rng(0))
