"""The peer baselines `dapo` (DAPO dynamic sampling) and `greso` (GRESO selective rollouts):
the collect loop and its generation-batch sizes on hand-made groups, GRESO's streaks, skip
probabilities and adaptive bases, their config checks, short training runs of both methods
and their bit-exact resume."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from dots import stages
from dots.config import DapoConfig, GresoConfig, load_config
from dots.dynamic_sampling import Collected, collect, dapo_sizes, greso_sizes, has_variance
from dots.greso import SelectiveRollout
from dots.rollout import Group
from dots.trainer import Trainer

from .conftest import refused, spy_rollouts, tiny_config

G = 4  # responses per hand-made group
REWARDS = {"easy": [1.0] * G, "hard": [0.0] * G, "varied": [1.0, 0.0, 1.0, 0.0]}


def group(q: int, kind: str) -> Group:
    """A scored group of G tiny responses to question q: all correct, all wrong or mixed."""
    return Group(question_id=int(q), prompt_ids=torch.tensor([1, 2, 3]),
                 response_ids=torch.ones(G, 2, dtype=torch.long), response_mask=torch.ones(G, 2, dtype=torch.bool),
                 logprobs=torch.zeros(G, 2), texts=[""] * G, rewards=torch.tensor(REWARDS[kind]))


class FakeRollout:
    """`rollout(idx)` for `collect`: groups for the given questions, rewards by `kinds` (default
    hard); remembers every call."""

    def __init__(self, kinds: dict[int, str]):
        self.kinds, self.calls = kinds, []

    def __call__(self, idx: np.ndarray) -> list[Group]:
        self.calls.append([int(q) for q in idx])
        return [group(q, self.kinds.get(int(q), "hard")) for q in idx]

    @property
    def rolled(self) -> list[int]:
        return [q for call in self.calls for q in call]


# ---- dynamic sampling: collect with DAPO's fixed generation batches -------------------------------

def test_collect_keeps_the_first_varied_groups_in_rollout_order_and_drops_the_surplus():
    order = np.array([7, 3, 0, 11, 5, 2, 9, 1, 4, 6, 8, 10])
    kinds = {7: "easy", 3: "varied", 0: "hard", 11: "varied",   # batch 1: 2 varied
             5: "varied", 2: "easy", 9: "varied", 1: "varied",  # batch 2: 3 varied, room for 2
             4: "varied", 6: "varied", 8: "varied", 10: "varied"}  # never reached
    fake = FakeRollout(kinds)
    got = collect(4, order, dapo_sizes(4, 0), fake)
    assert [g.question_id for g in got.groups] == [3, 11, 5, 9]
    assert all(has_variance(g) for g in got.groups)
    assert fake.calls == [[7, 3, 0, 11], [5, 2, 9, 1]]
    assert (got.gen_batches, got.rolled_out, got.filtered, got.surplus) == (2, 8, 3, 1)
    assert (got.easy, got.hard, got.short) == (2, 1, False)
    m = got.metrics()
    assert m["sampling/gen_batches"] == 2 and m["sampling/rollouts"] == 8 and m["sampling/filtered"] == 3
    assert m["sampling/surplus"] == 1 and m["sampling/short"] == 0
    assert m["sampling/informative_share"] == pytest.approx(5 / 8)
    assert m["sampling/easy_share"] == pytest.approx(2 / 8) and m["sampling/hard_share"] == pytest.approx(1 / 8)
    # rolled out + nothing lost: trained + filtered + surplus = rolled out
    assert len(got.groups) + got.filtered + got.surplus == got.rolled_out


def test_collect_never_rolls_out_a_question_twice_and_stops_when_the_pool_is_spent():
    rng = np.random.default_rng(3)
    order = rng.permutation(10)
    fake = FakeRollout({int(order[4]): "varied"})  # one varied group where 3 are wanted
    got = collect(3, order, dapo_sizes(4, 0), fake)
    assert [len(c) for c in fake.calls] == [4, 4, 2]  # the last batch is what the pool has left
    assert fake.rolled == order.tolist()  # the permutation, in turn, each question once
    assert sorted(fake.rolled) == list(range(10))
    assert got.short and got.gen_batches == 3 and got.rolled_out == 10
    assert [g.question_id for g in got.groups] == [int(order[4])]
    assert got.filtered == 9 and got.surplus == 0


def test_collect_stops_at_the_round_limit_and_trains_on_what_there_is():
    order = np.arange(40)
    fake = FakeRollout({2: "varied", 9: "varied", 30: "varied"})
    got = collect(4, order, dapo_sizes(4, 3), fake)
    assert len(fake.calls) == got.gen_batches == 3
    assert got.rolled_out == 12 and got.short
    assert [g.question_id for g in got.groups] == [2, 9]
    assert got.filtered == 10 and got.surplus == 0
    assert got.metrics()["sampling/short"] == 1


def test_collect_reaching_the_batch_on_the_last_allowed_round_is_not_short():
    fake = FakeRollout({1: "varied", 6: "varied", 10: "varied"})
    got = collect(3, np.arange(40), dapo_sizes(4, 3), fake)
    assert got.gen_batches == 3 and not got.short
    assert [g.question_id for g in got.groups] == [1, 6, 10]


def test_collect_without_a_round_limit_runs_until_the_pool_is_spent():
    fake = FakeRollout({2: "varied", 9: "varied", 30: "varied"})
    got = collect(4, np.arange(40), dapo_sizes(4, 0), fake)
    assert got.gen_batches == 10 and got.rolled_out == 40 and got.short
    assert fake.rolled == list(range(40))
    assert [g.question_id for g in got.groups] == [2, 9, 30]


def test_dapo_sizes():
    size = dapo_sizes(6, 2)
    state = Collected()
    assert size(state, []) == 6
    state.gen_batches = 1
    assert size(state, []) == 6
    state.gen_batches = 2
    assert size(state, []) is None
    unlimited = dapo_sizes(6, 0)
    state.gen_batches = 1000
    assert unlimited(state, []) == 6


# ---- GRESO's adaptive generation batches -----------------------------------------------------------

def _state(batches: int, kept: int) -> Collected:
    return Collected(groups=[group(i, "varied") for i in range(kept)], gen_batches=batches)


def _last(varied: int, total: int) -> list[Group]:
    return [group(i, "varied" if i < varied else "hard") for i in range(total)]


def test_greso_sizes_first_full_then_sized_to_what_is_missing():
    size = greso_sizes(batch_size=16, sampling_batch_size=24, min_sampling_batch_size=4, max_gen_batches=0)
    assert size(Collected(), []) == 24
    # 10 missing, half the last batch varied: 10 / 0.5 x 1.25 = 25 > 24 -> a full batch, not the last
    assert size(_state(1, 6), _last(12, 24)) == 24
    # 6 missing, 3/4 varied: int(6 / 0.75 x 1.25) = 10 <= 24 -> 10, and the step's last batch
    assert size(_state(2, 10), _last(18, 24)) == int(6 / (1 - (1 - 18 / 24)) * 1.25) == 10
    assert size(_state(3, 12), _last(1, 10)) is None


def test_greso_sizes_clamps_to_the_minimum_and_that_batch_is_the_last():
    size = greso_sizes(16, 24, 4, 0)
    assert size(Collected(), []) == 24
    # 1 missing, half varied: int(1 / 0.5 x 1.25) = 2 -> clamped up to 4
    assert size(_state(1, 15), _last(12, 24)) == 4
    assert size(_state(2, 15), _last(0, 4)) is None


def test_greso_sizes_nothing_varied_gives_a_full_batch_again():
    size = greso_sizes(16, 24, 4, 0)
    assert size(Collected(), []) == 24
    for batches in range(1, 6):  # zero_var == 1: no estimate, never the last round
        assert size(_state(batches, 0), _last(0, 24)) == 24
    # an empty last batch (every candidate skipped) counts as nothing varied
    assert size(_state(6, 0), []) == 24
    # then an estimate again: 16 missing, all varied: int(16 x 1.25) = 20 <= 24, the last
    assert size(_state(7, 0), _last(24, 24)) == 20
    assert size(_state(8, 5), _last(24, 24)) is None


def test_greso_sizes_round_limit_and_a_fresh_step_starts_over():
    size = greso_sizes(16, 24, 4, 2)
    assert size(Collected(), []) == 24
    assert size(_state(1, 0), _last(0, 24)) == 24
    assert size(_state(2, 0), _last(0, 24)) is None
    size = greso_sizes(16, 24, 4, 0)
    assert size(Collected(), []) == 24
    assert size(_state(1, 15), _last(12, 24)) == 4
    assert size(Collected(), []) == 24  # the closure starts a new step at gen_batches == 0
    assert size(_state(1, 6), _last(12, 24)) == 24


def test_collect_with_greso_sizes_draws_the_sizes_in_turn():
    # B = 8; batch 1 (8 prompts): 4 varied; 4 missing, zero_var 0.5 -> int(4/0.5*1.25) = 10 > 8 -> 8;
    # batch 2: 2 varied; 2 missing, zero_var 0.75 -> int(2/0.25*1.25) = 10 > 8 -> 8;
    # batch 3: 1 varied; 1 missing, zero_var 7/8 -> int(1/0.125*1.25) = 10 -> 8; batch 4: 0 varied -> 8;
    # batch 5: 4 varied (1 kept, 3 surplus): done.
    kinds = {q: "varied" for q in [0, 2, 4, 6, 9, 12, 16, 33, 35, 37, 39]}
    fake = FakeRollout(kinds)
    got = collect(8, np.arange(100), greso_sizes(8, 8, 2, 0), fake)
    assert [len(c) for c in fake.calls] == [8, 8, 8, 8, 8]
    assert [g.question_id for g in got.groups] == [0, 2, 4, 6, 9, 12, 16, 33]
    assert got.surplus == 3 and not got.short
    kinds = {q: "varied" for q in [0, 1, 2, 8, 9, 10, 11, 12, 13]}
    fake = FakeRollout(kinds)
    got = collect(8, np.arange(100), greso_sizes(8, 8, 2, 0), fake)
    # batch 1: 3 varied; 5 missing, zero_var 5/8 -> int(5/0.375*1.25) = 16 -> 8; batch 2: 6 varied -> done
    assert [len(c) for c in fake.calls] == [8, 8]
    fake = FakeRollout({q: "varied" for q in range(0, 12, 2)})
    got = collect(8, np.arange(100), greso_sizes(8, 16, 2, 0), fake)
    # batch 1 (16): 6 varied; 2 missing, zero_var 10/16 -> int(2/0.375*1.25) = 6 <= 16: the last batch, 6 prompts
    assert fake.calls == [list(range(16)), list(range(16, 22))]
    assert got.short and len(got.groups) == 6 and got.gen_batches == 2


# ---- GRESO's selective rollouts ----------------------------------------------------------------------

def test_skip_probability_follows_the_streaks():
    sr = SelectiveRollout(8, p_easy=0.5, p_hard=0.8)
    sr.streak[:] = [0, 1, 3, -1, -2, 20, -30, 7]
    p = sr.skip_probability(np.arange(8))
    # floor: 0.5^20, 0.8^30 = 0.0012 and 0.5^7 = 0.0078 are all below 0.01
    expected = [0.0, 1 - 0.5, 1 - 0.5 ** 3, 1 - 0.8, 1 - 0.8 ** 2, 0.99, 0.99, 0.99]
    assert p == pytest.approx(expected, abs=1e-12)
    # the bases matter: the same streaks under other bases
    sr.p_easy, sr.p_hard = 0.9, 0.3
    p = sr.skip_probability(np.array([2, 4, 0]))
    assert p == pytest.approx([1 - 0.9 ** 3, 1 - 0.3 ** 2, 0.0])


def test_record_builds_the_streaks():
    sr = SelectiveRollout(4)
    sr.record([group(0, "easy"), group(1, "hard"), group(2, "varied")])
    assert sr.streak.tolist() == [1, -1, 0, 0]
    sr.record([group(0, "easy"), group(1, "hard"), group(0, "easy")])
    assert sr.streak.tolist() == [3, -2, 0, 0]
    sr.record([group(0, "hard"), group(1, "easy")])  # the sign switches: a new streak at -1 / +1
    assert sr.streak.tolist() == [-1, 1, 0, 0]
    sr.record([group(0, "varied"), group(1, "varied"), group(3, "easy")])  # mixed resets
    assert sr.streak.tolist() == [0, 0, 0, 1]
    # all-correct is every reward 1, not a high mean: a 0.5 among ones breaks a streak
    sr.streak[2] = 5
    g = group(2, "easy")
    g.rewards = torch.tensor([1.0, 1.0, 1.0, 0.5])
    sr.record([g])
    assert sr.streak[2] == 0


def test_adapt_steps_the_bases_toward_their_targets_within_bounds():
    sr = SelectiveRollout(4, p_easy=0.5, p_hard=0.5, target_zero_variance=0.3, p_min=0.1, p_max=0.9)
    assert sr.target_easy == pytest.approx(0.1) and sr.target_hard == pytest.approx(0.2)
    sr.adapt(easy_share=0.15, hard_share=0.1)  # easy at or above target: skip more; hard below: skip less
    assert sr.p_easy == pytest.approx(0.49) and sr.p_hard == pytest.approx(0.51)
    sr.adapt(easy_share=0.05, hard_share=0.25)
    assert sr.p_easy == pytest.approx(0.50) and sr.p_hard == pytest.approx(0.50)
    sr.adapt(easy_share=sr.target_easy, hard_share=sr.target_hard)  # at the target counts as above
    assert sr.p_easy == pytest.approx(0.49) and sr.p_hard == pytest.approx(0.49)
    sr.p_easy, sr.p_hard = 0.105, 0.895
    sr.adapt(easy_share=1.0, hard_share=0.0)
    assert sr.p_easy == 0.1 and sr.p_hard == 0.9  # clamped
    for _ in range(5):
        sr.adapt(easy_share=1.0, hard_share=0.0)
    assert sr.p_easy == 0.1 and sr.p_hard == 0.9
    for _ in range(3):
        sr.adapt(easy_share=0.0, hard_share=1.0)
    assert sr.p_easy == pytest.approx(0.13) and sr.p_hard == pytest.approx(0.87)


def _walk(sr: SelectiveRollout, candidates: np.ndarray, size: int, seed: int, chunk: int = 256):
    """Reference: the same per-chunk draws, walked one candidate at a time until `size` are kept."""
    rng = np.random.default_rng(seed)
    kept, used = [], 0
    while len(kept) < size and used < len(candidates):
        part = candidates[used:used + chunk]
        u = rng.random(len(part))
        prob = sr.skip_probability(part)
        for q, draw, p in zip(part, u, prob):
            used += 1
            if draw >= p:
                kept.append(int(q))
                if len(kept) == size:
                    break
    return kept, used


def test_pick_keeps_size_candidates_in_order_reproducibly():
    sr = SelectiveRollout(600, p_easy=0.5, p_hard=0.5)
    rng = np.random.default_rng(0)
    sr.streak[:] = rng.integers(-3, 4, size=600)
    candidates = rng.permutation(600)
    for seed in range(5):
        kept, used, stats = sr.pick(candidates, 150, np.random.default_rng(seed))
        assert len(kept) == 150
        assert len(set(kept.tolist())) == 150
        # a subsequence of the consumed candidates, in their order
        consumed = candidates[:used].tolist()
        pos = [consumed.index(q) for q in kept.tolist()]
        assert pos == sorted(pos)
        assert stats["considered"] == used
        assert stats["skipped_easy"] + stats["skipped_hard"] == used - 150
        # streak-free candidates are never skipped
        skipped = set(consumed) - set(kept.tolist())
        assert all(sr.streak[q] != 0 for q in skipped)
        again = sr.pick(candidates, 150, np.random.default_rng(seed))
        assert np.array_equal(again[0], kept) and again[1] == used and again[2] == stats
    other = sr.pick(candidates, 150, np.random.default_rng(99))[0]
    assert not np.array_equal(other, kept)  # the draws matter


def test_pick_when_candidates_run_out_keeps_what_there_is():
    sr = SelectiveRollout(10)
    kept, used, stats = sr.pick(np.arange(10), 50, np.random.default_rng(0))
    assert kept.tolist() == list(range(10)) and used == 10  # no streaks: nothing skipped
    assert stats["skipped_easy"] == stats["skipped_hard"] == 0 and stats["skip_prob_sum"] == 0.0
    kept, used, _ = sr.pick(np.zeros(0, dtype=np.int64), 5, np.random.default_rng(0))
    assert len(kept) == 0 and used == 0


def test_pick_matches_a_one_by_one_walk_across_chunks():
    """The stop point is the size-th kept candidate, also across chunk borders (chunk=7)."""
    sr = SelectiveRollout(200, p_easy=0.4, p_hard=0.6)
    rng = np.random.default_rng(1)
    sr.streak[:] = rng.integers(-2, 3, size=200)
    candidates = rng.permutation(200)
    for seed in range(20):
        for size in (1, 5, 13, 40):
            kept = sr.pick(candidates, size, np.random.default_rng(seed), chunk=7)[0]
            ref_kept = _walk(sr, candidates, size, seed, chunk=7)[0]
            # what is kept agrees; what is consumed is checked in the next test (where it does not)
            assert kept.tolist() == ref_kept, (seed, size)


def test_pick_stops_consuming_at_the_size_th_kept_candidate():
    # candidates 0, 1 have no streak (always kept); 2, 3 have long easy streaks (kept with p 0.01).
    # With two to keep, the walk ends at candidate 1: used should be 2, and nothing was skipped.
    sr = SelectiveRollout(4, p_easy=0.05)
    sr.streak[:] = [0, 0, 9, 9]
    seed = next(s for s in range(100) if (np.random.default_rng(s).random(4)[2:] < 0.99).all())
    kept, used, stats = sr.pick(np.arange(4), 2, np.random.default_rng(seed))
    assert kept.tolist() == [0, 1]
    assert (used, stats["skipped_easy"]) == (2, 0), (used, stats)


@pytest.mark.parametrize("streak,p_easy,p_hard,keep", [
    (2, 0.6, 0.5, 0.36), (1, 0.3, 0.5, 0.3), (-3, 0.5, 0.7, 0.343), (-1, 0.5, 0.2, 0.2), (60, 0.9, 0.5, 0.01),
])
def test_pick_skips_at_the_formula_rate(streak, p_easy, p_hard, keep):
    n = 40000
    sr = SelectiveRollout(1, p_easy=p_easy, p_hard=p_hard)
    sr.streak[0] = streak
    candidates = np.zeros(n, dtype=np.int64)  # one question offered n times: n independent draws
    kept, used, stats = sr.pick(candidates, n, np.random.default_rng(7))
    assert used == n
    rate = 1 - len(kept) / n
    sigma = math.sqrt(keep * (1 - keep) / n)
    assert abs(rate - (1 - keep)) < 5 * sigma, (rate, 1 - keep)
    assert stats["skip_prob_sum"] / stats["considered"] == pytest.approx(1 - keep)
    skipped = stats["skipped_easy"] if streak > 0 else stats["skipped_hard"]
    assert skipped == n - len(kept)
    assert (stats["skipped_hard"] if streak > 0 else stats["skipped_easy"]) == 0


def test_state_dict_round_trip_and_a_wrong_pool_size_isrefused():
    sr = SelectiveRollout(6, p_easy=0.4, p_hard=0.6)
    sr.streak[:] = [3, -2, 0, 1, -5, 0]
    sr.adapt(0.0, 1.0)
    state = sr.state_dict()
    assert isinstance(state["streak"], torch.Tensor)
    back = SelectiveRollout(6)
    back.load_state_dict(state)
    assert back.streak.tolist() == [3, -2, 0, 1, -5, 0] and back.streak.dtype == np.int64
    assert (back.p_easy, back.p_hard) == (sr.p_easy, sr.p_hard) == (pytest.approx(0.41), pytest.approx(0.59))
    sr.streak[0] = 99  # the state is a copy, in both directions
    assert back.streak[0] == 3 and int(state["streak"][0]) == 3
    back.streak[1] = -99
    assert int(state["streak"][1]) == -2
    with pytest.raises(ValueError, match="pool"):
        SelectiveRollout(7).load_state_dict(state)


def test_collect_with_the_greso_filter_skips_before_rollout():
    """GRESO's filter inside collect, wired as the trainer wires it: skipped questions are never
    rolled out, none twice, and the rolled-out ones are a subsequence of the step's order."""
    pool = 60
    sr = SelectiveRollout(pool, p_easy=0.3, p_hard=0.3)
    kinds = {q: ("easy" if q % 3 == 0 else "hard" if q % 3 == 1 else "varied") for q in range(pool)}
    rng = np.random.default_rng(0)
    fake, picked = FakeRollout(kinds), []

    def rollout(idx):
        groups = fake(idx)
        sr.record(groups)
        return groups

    def pick(candidates, size):
        kept, used, _ = sr.pick(candidates, size, rng)
        picked.append(kept.tolist())
        return kept, used

    for step in range(6):
        fake.calls.clear()
        picked.clear()
        order = rng.permutation(pool)
        got = collect(8, order, greso_sizes(8, 12, 4, 0), rollout, pick)
        assert fake.calls == [c for c in picked if c]  # an empty pick (candidates spent) rolls out nothing
        rolled = fake.rolled
        assert len(set(rolled)) == len(rolled)
        where = [order.tolist().index(q) for q in rolled]
        assert where == sorted(where)
        assert all(has_variance(g) for g in got.groups)
        assert len(fake.calls[0]) == 12
        if step >= 2:  # streaks exist: the easy and hard questions get skipped
            assert sum(kinds[q] == "varied" for q in rolled) > len(rolled) / 3
    assert (sr.streak[[q for q in range(pool) if kinds[q] == "varied"]] == 0).all()
    assert (sr.streak[[q for q in range(pool) if kinds[q] == "easy"]] >= 0).all()
    assert (sr.streak[[q for q in range(pool) if kinds[q] == "hard"]] <= 0).all()


# ---- config -----------------------------------------------------------------------------------------

def test_greso_min_sampling_batch_above_the_full_onerefused():
    refused(["greso.sampling_batch_size=32", "greso.min_sampling_batch_size=33"],
             "greso.min_sampling_batch_size", "greso.sampling_batch_size")
    load_config(None, ["greso.sampling_batch_size=32", "greso.min_sampling_batch_size=32"])  # equal is fine


def test_greso_p_min_above_p_maxrefused():
    refused(["greso.p_min=0.6", "greso.p_max=0.5"], "greso.p_min", "greso.p_max")
    load_config(None, ["greso.p_min=0.5", "greso.p_max=0.5"])


@pytest.mark.parametrize("override,key", [("dapo.gen_batch_size=0", "dapo.gen_batch_size"),
                                          ("dapo.max_gen_batches=-1", "dapo.max_gen_batches"),
                                          ("greso.p_easy=1.5", "greso.p_easy"),
                                          ("greso.sampling_batch_size=0", "greso.sampling_batch_size")])
def test_peer_rangesrefused(override, key):
    refused([override], key)


def test_peer_defaults_match_params_yaml():
    from .conftest import REPO

    cfg = load_config(REPO / "params.yaml")
    assert cfg.dapo == DapoConfig() and cfg.greso == GresoConfig()  # params.yaml spells out the defaults
    assert (cfg.dapo.gen_batch_size, cfg.dapo.max_gen_batches) == (192, 10)
    g = cfg.greso
    assert (g.p_easy, g.p_hard, g.target_zero_variance, g.p_min, g.p_max) == (0.5, 0.5, 0.25, 0.05, 0.95)
    assert (g.sampling_batch_size, g.min_sampling_batch_size, g.max_gen_batches) == (96, 16, 10)


# ---- the trainer ----------------------------------------------------------------------------------------

POOL = 48  # a slice of the tiny pool: questions recur within a few steps, so GRESO's streaks matter
PEER = ("train.batch_size=8", "dapo.gen_batch_size=8", "dapo.max_gen_batches=4", "greso.sampling_batch_size=12",
        "greso.min_sampling_batch_size=4", "greso.max_gen_batches=4", "eval.probe_size=0")
SAMPLING = ("sampling/rollouts", "sampling/gen_batches", "sampling/filtered", "sampling/short",
            "sampling/short_total", "sampling/surplus")
GRESO = ("greso/p_easy", "greso/p_hard", "greso/skip_prob_mean", "greso/skipped_easy", "greso/skipped_hard")


def _peer(pipeline_cfg, pipeline_data, method, run_dir, *extra, resume=False):
    cfg = tiny_config(pipeline_cfg.root, *PEER, *extra)
    pool, held, _, _ = pipeline_data
    return cfg, Trainer(cfg, method, stages.paths(cfg).policy, pool[:POOL], held, run_dir, resume=resume)


@pytest.mark.parametrize("method", ["dapo", "greso"])
def test_peer_steps_train_only_varied_groups_and_record_their_sampling(tiny_pipeline, pipeline_data, tmp_path,
                                                                      method):
    cfg, trainer = _peer(tiny_pipeline, pipeline_data, method, tmp_path / method, "train.steps=4")
    b, gs, t = cfg.train.batch_size, cfg.rollout.group_size, cfg.rollout.max_new_tokens
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    calls = spy_rollouts(trainer)
    trained, update = [], trainer._update

    def spy_update(groups, replayed):
        trained.extend(groups)
        return update(groups, replayed)

    trainer._update = spy_update
    records, short_total, p_prev, several = [], 0, (cfg.greso.p_easy, cfg.greso.p_hard), 0
    for _ in range(4):
        calls.clear()
        trained.clear()
        rec = trainer.train_step()
        records.append(rec)
        for name in SAMPLING + (GRESO if method == "greso" else ()):
            assert name in rec, (method, rec["step"], name)
        assert not any(k.startswith("greso/") for k in rec) or method == "greso"
        rolled = [g for call in calls for g in call]
        ids = [g.question_id for g in rolled]
        assert len(ids) == len(set(ids)), "a question rolled out twice in one step"
        assert rec["sampling/gen_batches"] == len(calls) >= 1
        assert rec["sampling/rollouts"] == len(rolled)
        assert rec["sampling/filtered"] == sum(not has_variance(g) for g in rolled)
        assert rec["sampling/rollouts"] == rec["sampling/filtered"] + rec["sampling/surplus"] + len(trained)
        # the fresh-group counts read every group generated, the filtered-out ones too
        assert rec["train/fresh_groups"] == len(rolled)
        assert rec["train/fresh_informative"] == sum(has_variance(g) for g in rolled)
        # only groups with varied rewards are trained, B of them unless the step was short
        assert all(has_variance(g) for g in trained)
        assert len(trained) == rec["train/groups_trained"]
        assert (len(trained) < b) == bool(rec["sampling/short"])
        if not rec["sampling/short"]:
            assert len(trained) == b and rec["train/effective_ratio"] == 1.0
        elif trained:
            assert rec["train/effective_ratio"] == 1.0
        short_total += rec["sampling/short"]
        assert rec["sampling/short_total"] == short_total
        # what was sampled is every rolled-out response, not only the trained ones
        assert rec["tokens/sampled"] == sum(int(g.response_mask.sum()) for g in rolled)
        assert rec["sampling/rollouts"] * gs <= rec["tokens/sampled"] <= rec["sampling/rollouts"] * gs * t
        if rec["sampling/gen_batches"] > 1:
            several += 1
            assert rec["sampling/rollouts"] > b and rec["tokens/sampled"] > b * gs  # more than grpo's B groups
        if method == "dapo":
            assert [len(c) for c in calls] == [cfg.dapo.gen_batch_size] * len(calls)
            assert rec["sampling/gen_batches"] <= cfg.dapo.max_gen_batches
        else:
            assert len(calls[0]) == cfg.greso.sampling_batch_size
            # follow-ups within [min, full]; smaller only when the step walked the whole pool
            spent = rec["sampling/rollouts"] + rec["greso/skipped_easy"] + rec["greso/skipped_hard"] == POOL
            assert all(len(c) <= cfg.greso.sampling_batch_size for c in calls)
            assert all(len(c) >= cfg.greso.min_sampling_batch_size for c in calls[1:-1])
            assert len(calls[-1]) >= cfg.greso.min_sampling_batch_size or spent
            assert rec["sampling/gen_batches"] <= cfg.greso.max_gen_batches
            # the bases move by exactly one step each, once a step
            assert abs(rec["greso/p_easy"] - p_prev[0]) == pytest.approx(0.01)
            assert abs(rec["greso/p_hard"] - p_prev[1]) == pytest.approx(0.01)
            p_prev = (rec["greso/p_easy"], rec["greso/p_hard"])
            assert 0.0 <= rec["greso/skip_prob_mean"] < 1.0
            assert (rec["greso/p_easy"], rec["greso/p_hard"]) == (trainer.greso.p_easy, trainer.greso.p_hard)
            # the streaks follow the last rollout of each question
            for g in rolled:
                z = trainer.greso.streak[g.question_id]
                assert (z > 0) if g.rewards.min() >= 1 else (z < 0) if g.rewards.max() <= 0 else (z == 0)
    assert several, "no step drew more than one generation batch: the test proves nothing about it"
    if method == "greso":
        assert sum(r["greso/skipped_easy"] + r["greso/skipped_hard"] for r in records) > 0
        assert (trainer.greso.streak != 0).any()
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "the policy did not move"


@pytest.mark.parametrize("method", ["dapo", "greso_rr"])
def test_a_step_with_nothing_varied_is_short_and_leaves_the_policy(tiny_pipeline, pipeline_data, tmp_path,
                                                                   method):
    """Every rollout all wrong: the round limit ends the step with no group to train on. greso_rr's
    buffer is empty then too: its replay fraction divided by the step's group count
    (ZeroDivisionError, the run died); it is null, as the step's reward mean is."""
    peer = method.removesuffix("_rr")
    cfg, trainer = _peer(tiny_pipeline, pipeline_data, method, tmp_path / method, f"{peer}.max_gen_batches=2")
    inner = trainer._rollout

    def all_wrong(idx):
        groups = inner(idx)
        for g in groups:
            g.rewards = torch.zeros_like(g.rewards)
        return groups

    trainer._rollout = all_wrong
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no mean over an empty list of groups
        rec = trainer.train_step()
    assert rec["train/reward_mean"] is None and rec["train/effective_ratio"] == 0.0
    assert rec["sampling/short"] == 1 and rec["sampling/short_total"] == 1
    rollouts = 16 if method == "dapo" else 2 * cfg.greso.sampling_batch_size  # nothing varied: full batches
    assert rec["sampling/gen_batches"] == 2
    assert rec["sampling/rollouts"] == rec["sampling/filtered"] == rollouts
    assert rec["train/groups_trained"] == 0 and rec["tokens/trained"] == 0 and rec["train/loss"] == 0.0
    assert rec["tokens/sampled"] >= rollouts * cfg.rollout.group_size
    if method == "greso_rr":
        assert rec["replay/size"] == 0 and rec["replay/fraction"] is None
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


# ---- bit-exact resume -------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["dapo", "greso", "greso_rr"])
def test_peer_resume_is_exact(tiny_pipeline, pipeline_data, tmp_path, method):
    extra = ("train.steps=4", "train.checkpoint_every=2", "eval.every=4")
    _, whole = _peer(tiny_pipeline, pipeline_data, method, tmp_path / "whole", *extra)
    full = whole.run()

    _, first = _peer(tiny_pipeline, pipeline_data, method, tmp_path / "split", *extra)
    first.run(stop_after=2)
    assert first.step == 2 and (tmp_path / "split" / "checkpoint.pt").exists()
    if method != "dapo":
        assert (first.greso.streak != 0).any()  # the checkpoint carries streaks that matter
        at_two = (first.greso.streak.copy(), first.greso.p_easy, first.greso.p_hard)
    del first
    _, second = _peer(tiny_pipeline, pipeline_data, method, tmp_path / "split", *extra, resume=True)
    assert second.step == 2
    if method != "dapo":
        assert np.array_equal(second.greso.streak, at_two[0])
        assert (second.greso.p_easy, second.greso.p_hard) == at_two[1:]
    resumed = second.run()

    def untimed(r):
        return {k: v for k, v in r.items() if not k.startswith("time/")}

    assert len(full.records) == len(resumed.records) == 4
    # the summary holds the per-step means of the sampling figures the bench reads
    assert full.summary["mean:sampling/rollouts"] == pytest.approx(np.mean([r["sampling/rollouts"] for r in full.records]))
    assert full.summary["mean:sampling/short"] == pytest.approx(np.mean([r["sampling/short"] for r in full.records]))
    assert (full.summary["mean:greso/skip_prob_mean"] is None) == (method == "dapo")
    if method == "greso_rr":  # the replay buffer resumes with the run too
        assert len(whole.buffer) == len(second.buffer) > 0
        assert any(r["replay/fraction"] > 0 for r in full.records[2:])
    assert [untimed(r) for r in resumed.records] == [untimed(r) for r in full.records]
    assert [{k: v for k, v in e.items() if k != "elapsed_s"} for e in resumed.evals] == [
        {k: v for k, v in e.items() if k != "elapsed_s"} for e in full.evals]
    sa, sb = whole.model.state_dict(), second.model.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    assert any(r["train/loss"] != 0.0 for r in full.records)
    assert any(r["sampling/gen_batches"] > 1 for r in full.records[2:])  # the resumed steps drew dynamically
    if method != "dapo":
        assert np.array_equal(whole.greso.streak, second.greso.streak)
        assert (whole.greso.p_easy, whole.greso.p_hard) == (second.greso.p_easy, second.greso.p_hard)
        # after the resume some question was skipped: the restored streaks were read
        assert sum(r["greso/skipped_easy"] + r["greso/skipped_hard"] for r in full.records[2:]) > 0


# ---- greso_rr: GRESO's fresh groups with replay --------------------------------------------------------

def test_greso_rr_collects_the_fresh_share_with_greso_and_replays_the_rest(tiny_pipeline, pipeline_data, tmp_path):
    cfg, trainer = _peer(tiny_pipeline, pipeline_data, "greso_rr", tmp_path / "greso_rr", "train.steps=4")
    b = cfg.train.batch_size
    calls = spy_rollouts(trainer)
    batches, update = [], trainer._update

    def spy_update(groups, replayed):
        batches.append((list(groups), list(replayed)))
        return update(groups, replayed)

    trainer._update = spy_update
    for step in range(4):
        calls.clear()
        rec = trainer.train_step()
        groups, replayed = batches[-1]
        fresh = [g for g in groups if not any(g is r for r in replayed)]
        n_fresh = b - len(replayed)
        # what is not replayed is collected fresh, by GRESO: varied rewards only, this step's policy
        assert all(has_variance(g) for g in fresh) and all(g.version == step for g in fresh)
        assert len(fresh) == n_fresh or rec["sampling/short"]
        assert all(g.version < step for g in replayed)
        # the generation batches are sized for the fresh share, not the whole batch
        assert len(calls[0]) == max(1, round(cfg.greso.sampling_batch_size * n_fresh / b))
        assert "greso/p_easy" in rec and "replay/fraction" in rec
        if step > 0:
            assert 0 < len(replayed) <= b - max(1, round(cfg.replay.delta_for("greso_rr") * b))
    assert (trainer.greso.streak != 0).any() and len(trainer.buffer) > 0
