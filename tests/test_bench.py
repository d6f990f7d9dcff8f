"""The benchmark harness: the Prefect flow end to end on a very small config (two seeds, four
methods), and the arithmetic of its summary and goals on hand-made rows."""

from __future__ import annotations

import json
import math
import os

import pytest

from dots import bench
from dots.config import load_config

from .conftest import REPO, mlflow_runs
from .test_cli import SMALL

DEEPSCALER = REPO.parent / "shared" / "data" / "deepscaler.parquet"
METHODS = ["grpo", "dots", "rr", "dots_rr"]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory, monkeypatch_module):
    from prefect.testing.utilities import prefect_test_harness

    from flows.bench import bench_flow

    root = tmp_path_factory.mktemp("bench")
    monkeypatch_module.delenv("DOTS_PIPELINE_ID", raising=False)
    overrides = [*SMALL, f"paths.root={root / 'artifacts'}", f"tracking.uri=sqlite:///{root / 'mlflow.db'}"]
    with prefect_test_harness(server_startup_timeout=180):
        result = bench_flow(seeds=[0, 1], methods=METHODS, params=str(REPO / "params.yaml"), overrides=overrides,
                            out_dir=str(root / "results"))
    return root, overrides, result


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_bench_flow_writes_summary_table_and_plot(bench_run):
    root, _, result = bench_run
    out = root / "results"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [0, 1] and summary["methods"] == METHODS
    assert len(summary["runs"]) == 8
    for m in METHODS:
        stats = summary["summary"][m]
        for key in ("time_to_target_s", "steps_to_target", "final_accuracy", "step_s", "effective_ratio",
                    "time_to_target_ratio"):
            assert key in stats, (m, key)
    # grpo reaches its own final accuracy by definition, so its paired ratio is exactly 1
    assert summary["summary"]["grpo"]["time_to_target_ratio"] == pytest.approx(1.0)
    assert summary["summary"]["rr"]["staleness"] is not None
    assert "dots_pearson" in summary["summary"]["dots"]  # None here: this tiny policy's labels are all equal
    table = (out / "table.md").read_text()
    for m in METHODS:
        assert table.count(f"| {m} | 0 |") == 1 and table.count(f"| {m} | 1 |") == 1
    assert "Goals:" in table and (out / "curves.png").stat().st_size > 1000
    names = {g["goal"].split(" ")[0] for g in summary["goals"]}
    assert {"dots_rr", "dots/pearson", "dots", "rr", "Prefect"} <= names
    if DEEPSCALER.exists():
        assert summary["predictor_round"]["questions"] == 10240


def test_every_run_records_its_split_and_what_prefect_added(bench_run):
    _, _, result = bench_run
    for row in result["runs"]:
        parts = row["rollout_s"] + row["update_s"] + row["select_s"] + row["other_s"]
        assert parts == pytest.approx(row["step_s"])
        assert row["orchestration_s"] is not None and row["orchestration_s"] >= 0
        assert row["wall_s"] > 0 and row["tracking_s"] is not None


def test_mlflow_has_one_child_per_method_and_seed_under_one_parent(bench_run):
    root, _, _ = bench_run
    client, runs = mlflow_runs(root / "mlflow.db")
    children = [r for r in runs if r.data.tags.get("dots.role") == "train"]
    assert sorted((r.data.tags["method"], r.data.tags["seed"]) for r in children) == sorted(
        (m, s) for m in METHODS for s in ("0", "1"))
    parents = {r.data.tags["mlflow.parentRunId"] for r in children}
    assert len(parents) == 1
    parent = client.get_run(parents.pop())
    assert "bench/time_to_target_ratio/dots_rr" in parent.data.metrics or \
        summary_has_no_ratio(root, "dots_rr")
    arts = {a.path for a in client.list_artifacts(parent.info.run_id, "bench")}
    assert {"bench/summary.json", "bench/table.md", "bench/curves.png"} <= arts


def summary_has_no_ratio(root, method) -> bool:
    ratio = json.loads((root / "results" / "summary.json").read_text())["summary"][method]["time_to_target_ratio"]
    return ratio is None or not math.isfinite(ratio)


def test_a_rerun_reads_finished_runs_back_instead_of_training(bench_run):
    root, overrides, _ = bench_run
    cfg = bench.bench_config(load_config(REPO / "params.yaml", overrides))
    records = bench.run_dirs(cfg, 1, "dots_rr")[0] / "records.jsonl"
    before = records.stat().st_mtime_ns
    os.environ.pop("DOTS_PIPELINE_ID", None)
    bench.run_bench(cfg, [0, 1], METHODS, root / "results2")
    assert records.stat().st_mtime_ns == before
    assert (root / "results2" / "table.md").exists()


def test_a_variant_of_the_selection_params_reuses_the_grpo_and_rr_runs():
    from dots.config import Config

    base, variant = Config(), load_config(None, ["selection.tau=0.3", "selection.online_calibration=true"])
    for method in ("grpo", "rr"):
        assert bench.run_dirs(base, 0, method) == bench.run_dirs(variant, 0, method)
    for method in ("dots", "dots_rr"):
        assert bench.run_dirs(base, 0, method) != bench.run_dirs(variant, 0, method)
    assert bench.run_dirs(base, 0, "grpo") != bench.run_dirs(base, 1, "grpo")


def test_runs_are_interleaved_and_the_order_rotates():
    order = bench.run_order(METHODS, [0, 1, 2])
    assert order[:4] == [(0, "grpo"), (0, "dots"), (0, "rr"), (0, "dots_rr")]
    assert [m for s, m in order if s == 1] == ["dots", "rr", "dots_rr", "grpo"]
    assert [m for s, m in order if s == 2] == ["rr", "dots_rr", "grpo", "dots"]


def _row(method, seed, tts, steps, step_s=0.1, rollout=0.05, eff=0.5):
    return {"method": method, "seed": seed, "time_to_target_s": tts, "steps_to_target": steps,
            "final_accuracy": 0.5, "step_s": step_s, "rollout_s": rollout, "update_s": 0.03, "select_s": 0.0,
            "other_s": step_s - rollout - 0.03, "effective_ratio": eff, "staleness": None, "dots_pearson": None,
            "wall_s": 100.0, "tracking_s": 1.0, "orchestration_s": 0.5}


def test_ratios_are_paired_by_seed_and_a_miss_counts_as_never():
    rows = [_row("grpo", 0, 10.0, 100), _row("grpo", 1, 20.0, 200), _row("grpo", 2, 40.0, 400),
            _row("dots_rr", 0, 4.0, 30), _row("dots_rr", 1, 12.0, 60), _row("dots_rr", 2, None, None)]
    s = bench.summarize(rows, ["grpo", "dots_rr"])
    assert s["dots_rr"]["time_to_target_ratio_per_seed"][:2] == [0.4, 0.6]
    assert s["dots_rr"]["time_to_target_ratio"] == pytest.approx(0.6)  # median of 0.4, 0.6, inf
    assert s["dots_rr"]["reached_target"] == 2
    assert s["dots_rr"]["time_to_target_s_spread"] == [4.0, 12.0]


def test_goals_report_where_each_stands():
    from dots.config import Config

    rows = [_row("grpo", 0, 10.0, 100, step_s=0.2, rollout=0.1, eff=0.2),
            _row("dots", 0, 5.0, 40, eff=0.5), _row("rr", 0, 8.0, 90, step_s=0.16),
            _row("dots_rr", 0, 4.5, 40)]
    rows[1]["dots_pearson"] = rows[3]["dots_pearson"] = 0.85
    s = bench.summarize(rows, METHODS)
    cfg = Config()  # replay.delta = 0.5
    g = {x["goal"].split(" ")[0]: x for x in bench.goals(s, cfg, {"round_s": 0.02, "questions": 10240,
                                                                  "ref_size": 256, "dim": 1536, "threads": 2}, rows)}
    assert g["dots_rr"]["value"] == pytest.approx(0.45) and g["dots_rr"]["met"]
    assert g["dots/pearson"]["met"]
    assert g["dots"]["value"] == pytest.approx(2.5) and g["dots"]["met"]
    # rr saves 20% of a grpo step; its limit is 0.5 x 50% rollout share = 25%: 0.8 of it, not met
    assert g["rr"]["value"] == pytest.approx(0.8) and not g["rr"]["met"]
    assert g["predictor"]["met"]
    assert g["Prefect"]["value"] == pytest.approx(0.015) and g["Prefect"]["met"]
