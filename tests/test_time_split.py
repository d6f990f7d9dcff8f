"""Where the time to target goes (`dots.time_split`): each phase's seconds up to the target, read
from the trainer's per-step records, and paired with grpo's time to target by seed."""

from __future__ import annotations

import json

import pytest

from dots import bench_goals, bench_summary, bench_table, time_split
from dots.config import Config
from dots.runfiles import Crossing


def _records(tmp_path, steps):
    """A run folder whose records hold each step's timers (step s = 0.1 * s seconds, split 40/40/10/10)."""
    with open(tmp_path / "records.jsonl", "w") as f:
        for s in steps:
            t = 0.1 * s
            f.write(json.dumps({"step": s, "time/step_s": t, "time/rollout_s": 0.4 * t, "time/update_s": 0.4 * t,
                                "time/select_s": 0.1 * t}) + "\n")
    return tmp_path


def test_seconds_to_target_sum_the_steps_up_to_the_target_in_step_order(tmp_path):
    run = _records(tmp_path, [3, 1, 2, 4])  # written out of order: read back in step order
    split = time_split.seconds_to_target(run, 3)  # steps 1..3: 0.6 s of steps
    assert split["rollout"] == pytest.approx(0.24) and split["update"] == pytest.approx(0.24)
    assert split["select"] == pytest.approx(0.06) and split["other"] == pytest.approx(0.06)
    assert sum(split.values()) == pytest.approx(0.6)
    assert time_split.row_fields(run, None) == {f"{p}_to_target_s": None for p in time_split.PARTS}


def test_a_record_without_a_phase_timer_gives_no_split(tmp_path):
    run = _records(tmp_path, [1, 2])
    with open(run / "records.jsonl", "a") as f:
        f.write(json.dumps({"step": 3, "time/step_s": 0.3, "time/rollout_s": 0.1}) + "\n")
    assert time_split.seconds_to_target(run, 2) is not None
    assert time_split.seconds_to_target(run, 3) is None  # never a made-up zero for a missing timer
    crossed = Crossing({"step": 2}, {"step": 3}, 0.5)  # a crossing whose later evaluation lacks it
    assert time_split.row_fields(run, crossed) == {f"{p}_to_target_s": None for p in time_split.PARTS}


def test_the_split_is_read_at_the_crossing_between_two_evaluations(tmp_path):
    run = _records(tmp_path, [1, 2, 3, 4])
    # a quarter of the way from step 2 (0.3 s of steps) to step 4 (1.0 s): 0.475 s, split 40/40/10/10
    fields = time_split.row_fields(run, Crossing({"step": 2}, {"step": 4}, 0.25))
    assert fields["rollout_to_target_s"] == pytest.approx(0.4 * 0.475)
    assert fields["select_to_target_s"] == pytest.approx(0.1 * 0.475)
    assert sum(fields.values()) == pytest.approx(0.475)
    # met at the first evaluation (no evaluation below the target): that evaluation's sums
    assert sum(time_split.row_fields(run, Crossing(None, {"step": 3}, 1.0)).values()) == pytest.approx(0.6)


def _row(method, seed, tts, update, rollout, select=0.0):
    other = None if tts is None else tts - update - rollout - select
    return {"method": method, "seed": seed, "time_to_target_s": tts, "time_to_target_adjusted_s": None,
            "steps_to_target": None if tts is None else 100, "tokens_sampled_to_target": None,
            "tokens_trained_to_target": None, "final_smoothed": 0.5, "final_accuracy": 0.5,
            "effective_ratio": 0.5, "step_s": 0.1, "reached": tts is not None,
            **{f"{p}_to_target_s": (None if tts is None else v)
               for p, v in zip(time_split.PARTS, (rollout, update, select, other))}}


def test_each_part_is_paired_with_grpos_time_by_seed_and_a_miss_is_left_out():
    rows = [_row("grpo", 0, 10.0, 4.0, 6.0), _row("grpo", 1, 20.0, 8.0, 12.0), _row("grpo", 2, 40.0, 16.0, 24.0),
            _row("dots_rr", 0, 6.0, 4.0, 1.5, 0.5), _row("dots_rr", 1, 10.0, 8.0, 1.0, 1.0),
            _row("dots_rr", 2, None, 0, 0)]
    s = bench_summary.summarize(rows, ["grpo", "dots_rr"])
    d = s["dots_rr"]
    assert d["update_time_ratio_per_seed"] == [0.4, 0.4] and d["update_time_ratio"] == pytest.approx(0.4)
    assert d["rollout_time_ratio_per_seed"] == [0.15, 0.05]  # seed 2 never arrived: no split, left out
    assert d["select_time_ratio"] == pytest.approx(0.05) and d["other_time_ratio"] == pytest.approx(0.0)
    assert s["grpo"]["update_time_ratio"] == pytest.approx(0.4) and s["grpo"]["rollout_time_ratio"] == pytest.approx(0.6)
    # the goal names what bounds dots_rr's ratio, and the table gets its section
    goal = next(g for g in bench_goals.goals(s, Config(), None, rows) if g["goal"].startswith("dots_rr"))
    assert "its update alone 0.40 of grpo's time" in goal["detail"]
    table = "\n".join(time_split.render(s, ["grpo", "dots_rr"], lambda v: bench_table.fmt(v, ".2f")))
    assert "Where the time to target goes" in table
    assert "| grpo | 0.60 | 0.40 | 0.00 | 0.00 | 1.00 |" in table
    assert "| dots_rr | 0.10 | 0.40 | 0.05 | 0.00 | 0.60 |" in table


def test_rows_without_a_split_leave_the_table_and_the_goal_as_they_were():
    rows = [_row("grpo", 0, 10.0, 4.0, 6.0), _row("dots_rr", 0, 5.0, 4.0, 1.0)]
    for r in rows:
        for p in time_split.PARTS:
            r[f"{p}_to_target_s"] = None  # read back from a bench written before the split was kept
    s = bench_summary.summarize(rows, ["grpo", "dots_rr"])
    assert s["dots_rr"]["update_time_ratio"] is None
    assert time_split.render(s, ["grpo", "dots_rr"], lambda v: bench_table.fmt(v, ".2f")) == []
    goal = next(g for g in bench_goals.goals(s, Config(), None, rows) if g["goal"].startswith("dots_rr"))
    assert "update alone" not in goal["detail"]
