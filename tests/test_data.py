"""The embedded task: deterministic, disjoint pool and held-out set, reversed answers, exact match."""

from __future__ import annotations

import pytest

from dots.config import TaskConfig, Tier
from dots.data import generate, load_questions, pool_hash, render, save_questions
from dots.rewards import exact_match, get_reward

TASK = TaskConfig(seed=3, pool_size=300, eval_size=100,
                  tiers=[Tier(operands=2, digits=1), Tier(operands=2, digits=2), Tier(operands=3, digits=2)])


def test_render_reverses_the_answer():
    assert render([372, 45, 9]) == ("372+45+9=", "624")
    assert render([5, 5]) == ("5+5=", "01")


def test_generate_is_deterministic_and_disjoint():
    pool, held = generate(TASK)
    again, held_again = generate(TASK)
    assert pool == again and held == held_again
    assert len(pool) == 300 and len(held) == 100
    prompts = [q.prompt for q in pool + held]
    assert len(set(prompts)) == len(prompts)  # no duplicates, pool ∩ eval = ∅
    assert [q.id for q in pool + held] == list(range(400))
    other, _ = generate(TASK.model_copy(update={"seed": 4}))
    assert [q.prompt for q in other] != [q.prompt for q in pool]


def test_answers_are_correct_and_tiers_respected():
    pool, held = generate(TASK)
    for q in pool + held:
        numbers = [int(x) for x in q.prompt.rstrip("=").split("+")]
        tier = TASK.tiers[q.tier]
        assert len(numbers) == tier.operands
        assert all(len(str(n)) == tier.digits or (tier.digits == 1 and n < 10) for n in numbers)
        assert q.answer == str(sum(numbers))[::-1]
    # the 1-digit tier holds 100 distinct sums: never more than half of them are used
    assert sum(q.tier == 0 for q in pool + held) <= 50


def test_too_small_tiers_refused():
    task = TaskConfig(pool_size=200, eval_size=16, tiers=[Tier(operands=2, digits=1)])
    with pytest.raises(ValueError, match="task.tiers"):
        generate(task)


def test_save_load_round_trip_and_hash(tmp_path):
    pool, _ = generate(TASK)
    path = tmp_path / "pool.jsonl"
    save_questions(pool, path)
    assert load_questions(path) == pool
    assert pool_hash(load_questions(path)) == pool_hash(pool)
    assert pool_hash(pool[::-1]) != pool_hash(pool)
    path.write_text(path.read_text() + "{not json}\n")
    with pytest.raises(ValueError, match=":301"):
        load_questions(path)
    with pytest.raises(FileNotFoundError, match="dots prepare"):
        load_questions(tmp_path / "missing.jsonl")


def test_exact_match():
    assert exact_match("624", "624") == 1.0
    assert exact_match(" 62 4\n", "624") == 1.0
    assert exact_match(" 6 2\n4 ", "624") == 1.0
    assert exact_match("6240", "624") == 0.0
    assert exact_match("", "624") == 0.0
    assert get_reward("exact_match") is exact_match
    with pytest.raises(ValueError, match="exact_match"):
        get_reward("f1")


def test_padded_operands_keep_one_layout_and_the_same_answer():
    from dots.config import load_config
    from dots.data import generate, render

    assert render([7, 45], 4) == ("0007+0045=", "25")
    cfg = load_config(None, ["task.pool_size=4096", "task.eval_size=16", "task.pad_width=4"])
    pool, _ = generate(cfg.task)
    for q in pool:
        operands = q.prompt[:-1].split("+")
        assert all(len(o) == 4 for o in operands), q.prompt
        assert str(sum(int(o) for o in operands))[::-1] == q.answer


def test_a_pad_narrower_than_a_tier_is_refused():
    import pytest

    from dots.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="task.pad_width"):
        load_config(None, ["task.pad_width=2"])
