"""`dots bench-diff`: two benches of one commit compared ratio by ratio (issue 11's bound of 0.10),
with the figures no load can move (steps, tokens) checked identical, and bad input refused."""

from __future__ import annotations

import copy
import json

import pytest

from dots.bench_diff import BenchDiffError, compare_benches, moved_runs, render_comparison
from dots.cli import main


def _summary(dapo_ratio: float = 1.34) -> dict:
    """A bench of grpo, dots_rr and the peer dapo, two seeds, as `summary.json` holds it."""
    def stats(raw: float, adjusted: float, vs_dapo: float | None = None) -> dict:
        s = {"time_to_target_ratio": raw, "time_to_target_ratio_ci90": [raw - 0.1, raw + 0.1],
             "time_to_target_ratio_per_seed": [raw, raw], "time_to_target_adjusted_ratio": adjusted,
             "steps_to_target_ratio": 0.7}
        if vs_dapo is not None:
            s |= {"time_to_target_ratio_vs_dapo": vs_dapo, "time_to_target_adjusted_ratio_vs_dapo": vs_dapo}
        return s

    runs = [{"method": m, "seed": seed, "steps_to_target": steps, "tokens_sampled_to_target": 1000 * steps,
             "tokens_trained_to_target": 500 * steps, "time_to_target_s": 0.1 * steps,
             "time_to_target_adjusted_s": 0.1 * steps}
            for m, steps in (("grpo", 300), ("dots_rr", 170), ("dapo", 150)) for seed in (0, 1)]
    return {"methods": ["grpo", "dots_rr", "dapo"], "seeds": [0, 1], "steps": 300, "runs": runs,
            "summary": {"grpo": stats(1.0, 1.0, 0.73), "dots_rr": stats(0.82, 0.82, 0.56),
                        "dapo": stats(1.40, dapo_ratio, 1.0)}}  # raw seconds agreed, adjusted did not


def test_benches_within_the_tolerance_agree():
    a, b = _summary(1.34), _summary(1.41)
    result = compare_benches(a, b)
    assert result["within"] and not result["mismatched_runs"]
    assert result["worst"]["method"] == "dapo" and result["worst"]["diff"] == pytest.approx(0.07)
    pairs = {(r["method"], r["baseline"]) for r in result["ratios"]}
    assert pairs == {("grpo", "dapo"), ("dots_rr", "grpo"), ("dots_rr", "dapo"), ("dapo", "grpo")}  # none to itself


def test_a_never_agrees_only_with_a_never():
    a, b = _summary(), _summary()
    for s in (a, b):
        s["summary"]["dapo"]["time_to_target_adjusted_ratio"] = float("inf")  # most seeds missed
    assert compare_benches(a, b)["within"]
    b["summary"]["dapo"]["time_to_target_adjusted_ratio"] = 1.34
    result = compare_benches(a, b)
    assert not result["within"] and result["worst"]["diff"] == float("inf")
    row = "| dapo | grpo | 1.400 | 1.400 | 0.000 | never | 1.340 | inf **(> 0.10)** |"
    assert row in render_comparison(result)


def test_a_ratio_beyond_the_tolerance_is_named():
    result = compare_benches(_summary(1.27), _summary(1.39))  # the 9859ddc pair's dapo / grpo
    assert not result["within"]
    bad = [r for r in result["ratios"] if not r["within"]]
    assert [(r["method"], r["ratio"]) for r in bad] == [("dapo", "time_to_target_adjusted_ratio")]
    text = render_comparison(result)
    assert "**(> 0.10)**" in text and "do **not** agree on the load-adjusted seconds" in text
    assert "Load-adjusted seconds (what the goals judge): **beyond** 0.10" in text
    assert "Raw seconds: within 0.10" in text


def test_the_load_adjusted_ratios_decide_and_raw_seconds_are_shown_with_their_own_verdict():
    """The 57a3b8b pair: raw dapo / grpo 1.48 against 1.36, load-adjusted within 0.03. The goals
    judge the adjusted ratio, so the benches agree, and the raw difference is still flagged."""
    a, b = _summary(1.34), _summary(1.34)
    b["summary"]["dapo"]["time_to_target_ratio"] = 1.52
    result = compare_benches(a, b)
    assert result["within"] and result["judged"] == "time_to_target_adjusted_ratio"
    assert not result["verdicts"]["time_to_target_ratio"]["within"]
    text = render_comparison(result)
    assert "Raw seconds: **beyond** 0.10; largest difference dapo / grpo 1.400 against 1.520 (0.120)" in text
    assert "The benches agree on the load-adjusted seconds." in text
    for bench in (a, b):  # a GPU bench: no adjusted ratios, so raw seconds decide
        for stats in bench["summary"].values():
            for key in [k for k in stats if k.startswith("time_to_target_adjusted_ratio")]:
                del stats[key]
    result = compare_benches(a, b)
    assert result["judged"] == "time_to_target_ratio" and not result["within"]
    assert compare_benches(_summary(1.27), _summary(1.39), tolerance=0.15)["within"]


def test_runs_whose_steps_or_tokens_differ_are_listed_and_fail_the_comparison():
    """Steps and tokens are deterministic for one build: a difference means the benches are not
    of the same code or config, whatever the seconds say."""
    a = _summary()
    b = copy.deepcopy(a)
    b["runs"][2]["steps_to_target"] = 180
    result = compare_benches(a, b)
    assert not result["within"]
    assert result["mismatched_runs"] == [{"method": "dots_rr", "seed": 0, "field": "steps_to_target",
                                          "a": 170, "b": 180}]
    assert "dots_rr seed 0: steps_to_target 170 against 180" in render_comparison(result)


def test_ratios_only_lists_runs_that_differ_but_lets_the_ratios_decide(tmp_path, capsys):
    """Benches of two machines (yours against the published one): other draws of the same runs."""
    a = _summary()
    b = copy.deepcopy(a)
    for r in b["runs"]:
        r["steps_to_target"] += 10
    assert not compare_benches(a, b)["within"]
    for r in b["runs"]:  # other draws take other seconds too: not "runs that moved"
        r["time_to_target_adjusted_s"] *= 1.3 if r["method"] == "dapo" else 1.0
    assert compare_benches(a, b)["moved_runs"]
    result = compare_benches(a, b, ratios_only=True)
    assert result["within"] and len(result["mismatched_runs"]) == 6 and not result["moved_runs"]
    text = render_comparison(result)
    assert ("6 run figures that no load can move differ, in 6 runs; with --ratios-only they do not "
            "decide") in text
    assert text.endswith("The benches agree on the load-adjusted seconds.")
    b["summary"]["dapo"]["time_to_target_adjusted_ratio"] = 1.60  # 0.26 from a's 1.34
    assert not compare_benches(a, b, ratios_only=True)["within"]
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, summary in zip(paths, (a, b)):
        path.write_text(json.dumps(summary))
    assert main(["bench-diff", *map(str, paths), "--ratios-only"]) == 1
    b["summary"]["dapo"]["time_to_target_adjusted_ratio"] = 1.34
    paths[1].write_text(json.dumps(b))
    assert main(["bench-diff", *map(str, paths)]) == 1
    assert "--ratios-only compares the ratios alone" in capsys.readouterr().out
    assert main(["bench-diff", *map(str, paths), "--ratios-only"]) == 0


def test_a_run_whose_end_point_differs_is_listed_and_fails_the_comparison():
    """The end point is as deterministic as the steps (the bench pairs it by seed): two benches of
    one build whose runs end apart are not of the same runs, even with the same steps to target."""
    a = _summary()
    for r in a["runs"]:
        r["final_smoothed"] = 0.3
    b = copy.deepcopy(a)
    b["runs"][3]["final_smoothed"] = 0.31
    result = compare_benches(a, b)
    assert not result["within"]
    assert result["mismatched_runs"] == [{"method": "dots_rr", "seed": 1, "field": "final_smoothed",
                                          "a": 0.3, "b": 0.31}]
    assert compare_benches(a, copy.deepcopy(a))["within"]
    assert "end points: identical for every run" in render_comparison(compare_benches(a, copy.deepcopy(a)))


def test_benches_of_other_methods_seeds_or_budgets_are_refused_naming_the_field():
    a = _summary()
    for key, value in (("methods", ["grpo", "dots_rr"]), ("seeds", [0, 1, 2]), ("steps", 200)):
        b = copy.deepcopy(a)
        b[key] = value
        with pytest.raises(BenchDiffError, match=f"differ in '{key}'"):
            compare_benches(a, b)


def test_cli_exit_status_is_diffs(tmp_path, capsys):
    paths = {}
    for name, ratio in (("a", 1.34), ("b", 1.41), ("c", 1.52)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(_summary(ratio)))
    assert main(["bench-diff", str(paths["a"]), str(paths["b"])]) == 0
    assert "The benches agree on the load-adjusted seconds." in capsys.readouterr().out
    assert main(["bench-diff", str(paths["a"]), str(paths["c"])]) == 1
    assert main(["bench-diff", str(paths["a"]), str(paths["c"]), "--tolerance", "0.2"]) == 0
    capsys.readouterr()
    assert main(["bench-diff", str(paths["a"]), str(tmp_path / "missing.json")]) == 2
    assert "missing.json: no such file" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text(json.dumps({"methods": []}))
    assert main(["bench-diff", str(paths["a"]), str(tmp_path / "bad.json")]) == 2
    assert "not a bench summary (no 'seeds')" in capsys.readouterr().err
    assert main(["bench-diff", str(paths["a"]), str(paths["b"]), "--tolerance", "-1"]) == 2


def test_a_bench_folder_stands_for_its_summary(tmp_path, capsys):
    """A user names the bench's folder (`--out`, results/bench) as often as its summary.json; the
    folder was refused as "no such file". A folder without a summary is still refused, saying so."""
    for name, ratio in (("a", 1.34), ("b", 1.41)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(_summary(ratio)))
    assert main(["bench-diff", str(tmp_path / "a"), str(tmp_path / "b" / "summary.json")]) == 0
    assert "The benches agree on the load-adjusted seconds." in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert main(["bench-diff", str(tmp_path / "a"), str(tmp_path / "empty")]) == 2
    assert "empty: a folder without a summary.json" in capsys.readouterr().err


def test_the_runs_whose_seconds_moved_apart_from_their_seeds_arms_are_named():
    """B's machine 10% slower for every run, except dapo seed 1, 25% slower: that run is the one
    that moved on its own, by 1.25 / 1.10 - 1 = +13.6%."""
    a = _summary()
    b = copy.deepcopy(a)
    for r in b["runs"]:
        slower = 1.25 if (r["method"], r["seed"]) == ("dapo", 1) else 1.10
        r["time_to_target_adjusted_s"] *= slower
        r["time_to_target_s"] *= 1.10
    moved = moved_runs(a, b)
    assert [(m["method"], m["seed"], m["seconds"]) for m in moved] == [("dapo", 1, "time_to_target_adjusted_s")]
    assert moved[0]["shift"] == pytest.approx(1.25 / 1.10 - 1)
    assert "- dapo seed 1: +13.6%" in render_comparison(compare_benches(a, b))
    for r in a["runs"] + b["runs"]:  # arms timed one after another (GPU): raw seconds, which moved alike here
        r["time_to_target_adjusted_s"] = None
    assert moved_runs(a, b) == []


def test_runs_not_timed_in_one_sitting_of_their_bench_are_named():
    """A second bench that read A's runs back holds A's very seconds (its agreement proves nothing);
    a resumed run's seconds span sittings. Both are named; a bench of its own runs says nothing."""
    a, b = _summary(), _summary()
    assert "Bench A:" not in (clean := render_comparison(compare_benches(a, b))) and "Bench B:" not in clean
    b["runs_read_back"] = ["grpo seed 0", "dots_rr seed 0"]
    a["runs_resumed"] = ["dots_rr seed 1 at step 150"]
    result = compare_benches(a, b)
    assert result["not_one_sitting"] == {"read_back": [[], ["grpo seed 0", "dots_rr seed 0"]],
                                         "resumed": [["dots_rr seed 1 at step 150"], []]}
    text = render_comparison(result)
    assert "Bench B: 2 runs read back from an earlier bench, not timed by it: grpo seed 0; dots_rr seed 0." \
        in text
    assert ("Bench A: 1 run resumed from a checkpoint, timed in more than one sitting: "
            "dots_rr seed 1 at step 150.") in text


def test_the_published_bench_is_what_make_bench_compares_with(capsys):
    """docs/bench/summary.json is the README's bench: a summary `dots bench-diff` reads, of the methods,
    seeds and budget `make bench` runs now (a default changed without a new bench published fails here),
    with every run timed in one sitting. Compared with itself it agrees."""
    from dots.bench_diff import read_summary
    from dots.config import BENCH_METHODS, BENCH_SEEDS, load_config

    from .conftest import REPO

    published = read_summary(REPO / "docs" / "bench")
    assert published["methods"] == list(BENCH_METHODS) and published["seeds"] == list(BENCH_SEEDS)
    assert published["steps"] == load_config(REPO / "params.yaml").train.steps
    assert len(published["runs"]) == len(BENCH_METHODS) * len(BENCH_SEEDS)
    assert not published["runs_read_back"] and not published["runs_resumed"]
    bench = str(REPO / "docs" / "bench")
    assert main(["bench-diff", "--ratios-only", bench, bench]) == 0
    assert "identical for every run" in capsys.readouterr().out
