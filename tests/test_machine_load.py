"""Load-adjusted seconds (dots.machine_load): the load of each lockstep round, measured with the
arms themselves, is divided out, so a slow stretch that falls inside one arm's window to the
target and outside another's no longer moves their ratio."""

from __future__ import annotations

import numpy as np
import pytest

from dots.machine_load import MIN_ARMS, adjusted_seconds, round_loads

ROUNDS = 300


def _arms(load: np.ndarray, costs=(0.2, 0.3, 0.4, 0.25)) -> dict[str, np.ndarray]:
    """Arms of constant cost per step, every round slowed by the machine's load."""
    return {f"arm{i}": c * load for i, c in enumerate(costs)}


def test_the_load_of_each_round_is_recovered_from_the_arms():
    load = np.ones(ROUNDS)
    load[170:230] = 1.6  # a slow stretch late in the run, shorter than half of it
    load[10:12] = 3.0  # and a spike
    assert np.allclose(round_loads(_arms(load)), load)


def test_a_slow_stretch_after_one_arm_reached_the_target_leaves_the_adjusted_ratio_alone():
    """The bench's case: dapo reaches the target at step 150, grpo at 300; a slow stretch in
    rounds 170-300 lengthens grpo's seconds and not dapo's."""
    quiet = np.ones(ROUNDS)
    loaded = quiet.copy()
    loaded[170:] = 1.4
    ratios = {}
    for name, load in (("quiet", quiet), ("loaded", loaded)):
        arms = _arms(load)
        fast, slow = arms["arm2"], arms["arm0"]  # 0.4 s per step for 150 steps, 0.2 s for 300
        raw = fast[:150].sum() / slow[:300].sum()
        loads = round_loads(arms)
        adjusted = adjusted_seconds(fast, loads, 150) / adjusted_seconds(slow, loads, 300)
        ratios[name] = (raw, adjusted)
    assert ratios["quiet"][0] == pytest.approx(1.0)
    assert ratios["loaded"][0] < 0.9  # raw seconds: the load moved the ratio
    assert ratios["loaded"][1] == pytest.approx(ratios["quiet"][1]) == pytest.approx(1.0)


def test_one_arms_own_cost_trend_is_not_taken_for_load():
    """greso's steps fall by a third as its skip rule warms up: with the median over arms, that
    is greso's cost, not the machine's, and it stays in greso's seconds."""
    arms = _arms(np.ones(ROUNDS))
    arms["arm3"] = arms["arm3"] * np.linspace(1.5, 0.8, ROUNDS)
    loads = round_loads(arms)
    assert np.allclose(loads, 1.0)
    assert adjusted_seconds(arms["arm3"], loads, 100) == pytest.approx(arms["arm3"][:100].sum())


def test_too_few_arms_give_no_factor_and_bad_input_is_refused():
    two = dict(list(_arms(np.ones(10)).items())[:MIN_ARMS - 1])
    assert round_loads(two) is None  # two arms' median is either arm's own trend as much as load
    arms = _arms(np.ones(10))
    arms["arm0"] = arms["arm0"][:9]
    with pytest.raises(ValueError, match="different step counts"):
        round_loads(arms)
    with pytest.raises(ValueError, match="positive"):
        round_loads({"a": [0.0, 0.0], "b": [1.0, 1.0], "c": [1.0, 1.0]})
    with pytest.raises(ValueError, match="11 steps asked, 10 timed"):
        adjusted_seconds(np.ones(10), np.ones(10), 11)
    assert adjusted_seconds(np.ones(10), np.ones(10), 0) == 0.0  # a target met at step 0
