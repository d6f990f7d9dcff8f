"""Rewards: exact match for the embedded task; math-verify on real deepscaler ground truths, bounded in time.

The math_verify checks run on the first 500 deepscaler rows plus every row whose ground truth
holds a percent sign or display-math delimiters (the cases that needed normalisation), ~3 s on
two cores. Timings are printed, never asserted, except as generous bounds on *hanging*.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from dots.rewards import (
    REWARDS,
    MathVerifyPool,
    RewardUnavailable,
    get_reward,
    latex_answer,
    math_verify_reward,
    math_verify_rewards,
)

from .conftest import SHARED_DATA, require_shared

DEEPSCALER = SHARED_DATA / "deepscaler.parquet"




def test_registry():
    assert REWARDS["math_verify"] is math_verify_reward
    assert get_reward("math_verify") is math_verify_reward
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        get_reward("nope")


def test_latex_answer_normalises_percent_and_delimiters():
    assert latex_answer("24\\%") == "24"
    assert latex_answer("\\[ 6 \\]") == "6"
    assert latex_answer("$\\frac{1}{2}$") == "\\frac{1}{2}"
    assert latex_answer("$a$ and $b$") == "$a$ and $b$"  # two blocks: left alone
    assert latex_answer(" 6 ") == "6"


def test_equivalent_forms_and_robust_inputs():
    texts = ["so the answer is \\boxed{\\frac{1}{2}}", "so the answer is \\boxed{0.5}",
             "the answer is $1/2$", "\\boxed{3}", "", None, "\\boxed{24\\%}", "\\boxed{24}"]
    answers = ["0.5", "\\frac12", "\\frac{1}{2}", "\\frac{1}{2}", "1", "1", "24\\%", "24\\%"]
    assert math_verify_rewards(texts, answers) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    assert math_verify_reward("\\boxed{6}", "") == 0.0
    assert math_verify_reward("\\boxed{6}", 6) == 0.0  # not a string: 0, never an exception
    assert math_verify_reward("\\boxed{\\frac{", "6") == 0.0  # unparsable
    with pytest.raises(ValueError, match="2 texts but 1 answers"):
        math_verify_rewards(["a", "b"], ["a"])


def _deepscaler_sample():
    require_shared(DEEPSCALER)
    from dots.datasets import load_pool

    pool = load_pool(str(DEEPSCALER))
    tricky = [q for q in pool[500:] if "\\%" in q.answer or "\\[" in q.answer]
    return pool[:500] + tricky


def _gold_parses(answer: str) -> bool:
    """Does math-verify turn this ground truth into a sympy object (in-process, main thread)?"""
    from math_verify import LatexExtractionConfig, parse
    from sympy import Basic, MatrixBase

    from dots.rewards import _gold_candidates

    for candidate in _gold_candidates(answer):
        parsed = parse(candidate, extraction_config=[LatexExtractionConfig()])
        if parsed and isinstance(parsed[0], (Basic, MatrixBase)):
            return True
    return False


def test_deepscaler_right_and_wrong_answers():
    sample = _deepscaler_sample()
    answers = [q.answer for q in sample]
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    parses = [_gold_parses(a) for a in answers]
    start = time.perf_counter()
    right = math_verify_rewards([f"Step by step ... so the answer is \\boxed{{{a}}}." for a in answers],
                                answers)
    wrong = math_verify_rewards([f"Step by step ... so the answer is \\boxed{{{latex_answer(a)} + 1}}."
                                 for a in answers], answers)
    elapsed = time.perf_counter() - start
    n_parse = sum(parses)
    print(f"\nmath-verify parses {n_parse} of {len(answers)} deepscaler ground truths; "
          f"{sum(right):.0f} right answers score 1, {sum(wrong):.0f} wrong answers score 1; "
          f"{2 * len(answers)} scored in {elapsed:.1f}s ({elapsed / (2 * len(answers)) * 1e3:.2f} ms each)")
    assert n_parse >= 0.99 * len(answers)
    assert [i for i, (p, r) in enumerate(zip(parses, right)) if p and r != 1.0] == []
    assert [answers[i] for i, w in enumerate(wrong) if w != 0.0] == []


def test_per_call_overhead_is_small():
    math_verify_reward("\\boxed{6}", "6")  # start the pool
    n = 200
    start = time.perf_counter()
    scores = [math_verify_reward("so the answer is \\boxed{6}", "6") for _ in range(n)]
    per_call = (time.perf_counter() - start) / n
    print(f"\nmath_verify_reward: {per_call * 1e3:.2f} ms per call (pool, trivial answer)")
    assert scores == [1.0] * n
    assert per_call < 0.5  # a bound on something badly wrong, not a benchmark


@pytest.mark.parametrize("text", [
    "so the answer is \\boxed{9^{9^{9^{9^{9}}}}}",
    "\\boxed{" + "(" * 400 + "1" + ")" * 400 + "}",
])
def test_pathological_answer_times_out_to_zero(text):
    math_verify_reward("\\boxed{6}", "6")  # pool started: measure scoring, not start-up
    timeout = 1.0
    start = time.perf_counter()
    score = math_verify_reward(text, "6", timeout_s=timeout)
    elapsed = time.perf_counter() - start
    print(f"\npathological answer scored {score} in {elapsed:.2f}s (timeout {timeout}s)")
    assert score == 0.0
    assert elapsed < timeout * 3 + 5
    assert math_verify_reward("\\boxed{6}", "6") == 1.0  # the pool still works


def test_worker_stuck_beyond_its_alarm_is_killed_and_replaced():
    """A worker that cannot be interrupted (stopped here, so taken for hung after wall_factor times its
    budget; stuck in C code in real life, killed when that has used the budget's CPU time) scores 0.0
    and is replaced by a working one."""
    pool = MathVerifyPool(workers=1, wall_factor=2.0)
    try:
        assert pool.score(["\\boxed{6}"], ["6"]) == [1.0]
        os.kill(pool._workers[0].proc.pid, signal.SIGSTOP)
        start = time.perf_counter()
        assert pool.score(["\\boxed{6}"], ["6"], timeout_s=1.0) == [0.0]
        elapsed = time.perf_counter() - start
        assert 1.5 * 2.0 <= elapsed < 1.5 * 2.0 + 5
        assert pool.stats["killed"] == 1
        assert pool.score(["\\boxed{6}", "\\boxed{7}"], ["6", "6"]) == [1.0, 0.0]
        os.kill(pool._workers[0].proc.pid, signal.SIGKILL)  # dies while idle: its next answer is re-queued
        pool._workers[0].proc.wait()
        assert pool.score(["\\boxed{6}"], ["6"]) == [1.0]
    finally:
        pool.close()


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/stat"), reason="CPU time is read from /proc")
def test_budget_is_cpu_time_so_a_worker_kept_off_the_cpu_still_answers():
    """A busy machine must not change a reward: a worker that gets no CPU for three times its budget
    (stopped here, as a loaded machine's scheduler would leave it waiting) answers when it runs again,
    and scores as on an idle machine. Counted by the wall clock, it was killed and scored 0.0."""
    pool = MathVerifyPool(workers=1)
    try:
        assert pool.score(["\\boxed{6}"], ["6"]) == [1.0]
        pid = pool._workers[0].proc.pid
        os.kill(pid, signal.SIGSTOP)
        resume = threading.Timer(3.0, os.kill, (pid, signal.SIGCONT))
        resume.start()
        start = time.perf_counter()
        got = pool.score(["\\boxed{6}", "\\boxed{7}"], ["6", "6"], timeout_s=0.5)
        elapsed = time.perf_counter() - start
        resume.join()
        assert got == [1.0, 0.0]
        assert elapsed >= 3.0 and pool.stats["killed"] == 0
        assert pool._workers[0].proc.pid == pid  # the same worker, not a replacement
        got = pool.check_answers(["1", "9^{"], timeout_s=0.5)
        assert got == [None, "unparsed"]
    finally:
        pool.close()


def test_ground_truth_check_is_batched_and_a_stuck_worker_costs_one_answer():
    """check_answers sends many answers per request and gets one reply per answer: a worker stuck on
    one (stopped here) is killed (as hung, after wall_factor times timeout + grace), that answer reads
    as a timeout, and the rest of its request is re-sent to the replacement."""
    pool = MathVerifyPool(workers=1, wall_factor=2.0)
    try:
        answers = ["1", "\\frac{1}{2}", "7\\sqrt{2}.", "x^2", "1", "\\{x \\mid 2 < x < 3\\}", "3", "4"]
        assert pool.check_answers(answers) == [None, None, "unparsed", None, None, "unparsed", None, None]
        requests = []
        send = pool._workers[0].requests.send_bytes
        pool._workers[0].requests.send_bytes = lambda b: (requests.append(b), send(b))[1]
        pool.check_answers([f"{k}" for k in range(100, 120)])
        assert 1 < len(requests) < 20  # batched: fewer requests than answers
        os.kill(pool._workers[0].proc.pid, signal.SIGSTOP)
        start = time.perf_counter()
        got = pool.check_answers(["5", "6", "\\frac{7}{8}", "9^{", "10", "11", "12", "13"], timeout_s=1.0)
        elapsed = time.perf_counter() - start
        assert got == ["timeout", None, None, "unparsed", None, None, None, None]
        assert elapsed < 1.5 * 2.0 + 30  # taken for hung, then a new worker's start-up
        assert pool.score(["\\boxed{6}"], ["6"]) == [1.0]  # the replacement scores too
    finally:
        pool.close()


def test_unreadable_answers_per_reward():
    from dots.rewards import unreadable_answers

    got = unreadable_answers("math_verify", ["6", "7\\sqrt{2}.", "24\\%", "\\[ 6 \\]"])
    assert got[0] is None and got[2] is None and got[3] is None  # normalised as scoring normalises
    assert "math-verify cannot parse it" in got[1]
    assert unreadable_answers("exact_match", ["12", "1 2"]) == [None, unreadable_answers("exact_match", [" 3"])[0]]
    assert "holds whitespace" in unreadable_answers("exact_match", ["1 2"])[0]
    with pytest.raises(ValueError, match="unknown reward"):
        unreadable_answers("nope", ["1"])


def test_same_answers_is_what_the_reward_scores_as_one_answer():
    """Two ground truths agree when a response giving the first is rewarded against the second: forms
    math-verify equates agree, DeepScaleR's real conflicts (150 against 60; 12.648 against 12\\sqrt{10},
    a rounding) do not; exact_match agrees on the text only."""
    from dots.rewards import same_answers

    pairs = [("\\dfrac{1}{2}", "\\frac{1}{2}"), ("0.5", "\\frac12"), ("12\\%", "12"), ("097", "97"),
             ("150", "60"), ("12.648", "12\\sqrt{10}"), ("", "3")]
    assert same_answers("math_verify", pairs) == [True, True, True, True, False, False, False]
    assert same_answers("exact_match", [("3", "3"), ("3", "4"), ("0.5", "\\frac12")]) == [True, False, False]
    with pytest.raises(ValueError, match="unknown reward"):
        same_answers("nope", [("1", "1")])


def test_callable_from_threads():
    """math-verify's own timeout (signal.alarm) fails outside the main thread; ours does not."""
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda k: math_verify_reward(f"\\boxed{{{k}}}", str(k % 3)), range(12)))
    assert got == [1.0 if k == k % 3 else 0.0 for k in range(12)]
    assert threading.current_thread() is threading.main_thread()


def _score_in_child(queue):
    queue.put(math_verify_reward("\\boxed{\\frac{1}{2}}", "0.5"))


def test_forked_child_gets_its_own_pool():
    """A fork (DataLoader, Prefect task runner) must not share, or kill, the parent's workers."""
    import multiprocessing

    assert math_verify_reward("\\boxed{6}", "6") == 1.0  # parent pool running
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_score_in_child, args=(queue,))
    child.start()
    assert queue.get(timeout=60) == 1.0
    child.join(timeout=30)
    assert child.exitcode == 0
    assert math_verify_reward("\\boxed{7}", "7") == 1.0  # parent pool untouched


def test_worker_that_cannot_start_is_a_loud_error(monkeypatch):
    monkeypatch.setenv("DOTS_REWARD_MEMORY_MB", "40")  # too small to import sympy
    pool = MathVerifyPool(workers=1)
    try:
        with pytest.raises(RewardUnavailable, match="worker failed to start"):
            pool.score(["\\boxed{6}"], ["6"])
    finally:
        pool.close()
