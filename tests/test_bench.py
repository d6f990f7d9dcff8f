"""The benchmark harness: the Prefect flow end to end on a very small config (two seeds, four
methods), and the arithmetic of its summary and goals on hand-made rows.

The flow runs on the tiny pipeline's shared stages (conftest: a warm-up past its plateau, labels
with spread, a predictor that learned something), copied in, so that its DOTS runs select with a
real predictor rather than one fitted on constant labels."""

from __future__ import annotations

import json
import math
import os
import re
import shutil

import numpy as np
import pytest

from dots import bench, bench_goals, bench_summary, bench_table, time_split
from dots.runfiles import crossing
from dots.config import BENCH_METHODS, BENCH_SEEDS, ConfigError, load_config, with_overrides

from .conftest import REPO, SHARED_DATA, mlflow_runs, require_shared, tiny_overrides

DEEPSCALER = SHARED_DATA / "deepscaler.parquet"
METHODS = ["grpo", "dots", "rr", "dots_rr"]
VARIANT = "tau3=dots:selection.tau=0.3"  # benched beside the methods in the flow below
ARMS = [*METHODS, "tau3"]
SHARED_STAGES = ("data", "models", "embeddings", "labels", "predictor")


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory, monkeypatch_module, tiny_pipeline):
    from prefect.testing.utilities import prefect_test_harness

    from flows.bench import bench_flow

    root = tmp_path_factory.mktemp("bench")
    monkeypatch_module.delenv("DOTS_PIPELINE_ID", raising=False)
    overrides = [*tiny_overrides(root / "artifacts"), "train.steps=4", "eval.every=2", "train.checkpoint_every=2",
                 f"tracking.uri=sqlite:///{root / 'mlflow.db'}"]
    cfg = bench.bench_config(load_config(REPO / "params.yaml", overrides))
    # The bench's shared stages are the tiny pipeline's (same task, model, warm-up, labels, predictor):
    # copy them in and mark them current, as prepare_shared would after running them itself.
    assert bench._shared_key(cfg) == bench._shared_key(tiny_pipeline)
    for sub in SHARED_STAGES:
        shutil.copytree(tiny_pipeline.root / sub, cfg.root / sub)
    (cfg.root / "shared.json").write_text(json.dumps({"key": bench._shared_key(cfg), "info": {}}))
    with prefect_test_harness(server_startup_timeout=180):
        result = bench_flow(seeds=[0, 1], methods=METHODS, params=str(REPO / "params.yaml"), overrides=overrides,
                            out_dir=str(root / "results"), variants=[VARIANT])
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
    assert summary["seeds"] == [0, 1] and summary["methods"] == ARMS
    assert len(summary["runs"]) == 10
    # the flow trained its two seeds at once, each in a process of its own, one torch thread a run
    assert summary["timing"] == {"mode": "lockstep", "workers": 2, "threads": 1}
    # the variant: its own runs, trained in each seed's lockstep group, paired with dots by seed
    tau3 = summary["summary"]["tau3"]
    assert tau3["variant_of"] == "dots" and tau3["overrides"] == ["selection.tau=0.3"]
    # paired on every seed; where dots never reached the target, tau3 counts as infinitely faster (0)
    # when it did, else as a tie
    runs = {(r["method"], r["seed"]): r["steps_to_target"] is not None for r in summary["runs"]}
    for seed, ratio in zip((0, 1), tau3["time_to_target_ratio_vs_dots_per_seed"], strict=True):
        if not runs["dots", seed]:
            assert ratio == (0.0 if runs["tau3", seed] else 1.0)
    assert "time_to_target_ratio" in tau3
    assert summary["variants"] == {"tau3": {"method": "dots", "overrides": ["selection.tau=0.3"]}}
    lock = {r["seed"]: r["lockstep"] for r in summary["runs"] if r["method"] == "grpo"}
    assert all(sorted(v) == sorted(ARMS) for v in lock.values()), lock
    dirs = {r["method"]: r["run_dir"] for r in summary["runs"] if r["seed"] == 0}
    assert dirs["tau3"] != dirs["dots"] and "/runs/dots/" in dirs["tau3"]
    for m in METHODS:
        stats = summary["summary"][m]
        for key in ("time_to_target_s", "steps_to_target", "final_accuracy", "step_s", "effective_ratio",
                    "time_to_target_ratio"):
            assert key in stats, (m, key)
    # grpo reaches its own final accuracy by definition, so its paired ratio is exactly 1
    assert summary["summary"]["grpo"]["time_to_target_ratio"] == pytest.approx(1.0)
    assert summary["summary"]["grpo"]["time_to_target_adjusted_ratio"] == pytest.approx(1.0)
    # five arms in lockstep on the CPU: every run that reached the target has load-adjusted seconds,
    # the same steps re-timed at each round's load, so within the spread of that load of its raw ones
    cfg = bench.bench_config(load_config(REPO / "params.yaml", bench_run[1]))
    variants = [bench.parse_variant(VARIANT, cfg)]
    for row in summary["runs"]:
        raw, adjusted = row["time_to_target_s"], row["time_to_target_adjusted_s"]
        assert (raw is None) == (adjusted is None), row["method"]
        if raw:
            loads = bench.seed_loads(cfg, row["seed"], ARMS, variants,
                                     bench.lockstep_group(cfg, row["seed"], ARMS, variants))
            assert raw / loads.max() - 1e-9 <= adjusted <= raw / loads.min() + 1e-9, row["method"]
    assert summary["summary"]["rr"]["staleness"] is not None
    # the predictor was fitted on labels with spread, and DOTS measured it on the questions it chose
    labels = json.loads((root / "artifacts" / "bench" / "labels" / "labels.json").read_text())["policies"]
    assert labels and all(np.std(d) > 0.1 for d in labels.values()), {k: np.std(d) for k, d in labels.items()}
    for m in ("dots", "dots_rr"):
        pearson = summary["summary"][m]["dots_pearson"]
        assert pearson is not None and -1.0 <= pearson <= 1.0, (m, pearson)
    for m in ("grpo", "rr"):
        assert summary["summary"][m]["dots_pearson"] is None
    table = (out / "table.md").read_text()
    assert "| tau3 | dots with selection.tau=0.3 |" in table
    for m in ARMS:
        assert table.count(f"| {m} | 0 |") == 1 and table.count(f"| {m} | 1 |") == 1
    assert "Goals:" in table and (out / "curves.png").stat().st_size > 1000
    names = {g["goal"].split(" ")[0] for g in summary["goals"]}
    assert {"dots_rr", "dots/pearson", "dots", "Prefect"} <= names and "rr" not in names
    assert summary["eval_metric"] == "sampled" and summary["smooth"] == 3 and summary["confidence"] == 0.9
    assert [c["target"] for c in summary["task_checks"]] == ["<= 0.5", ">= 10", "> 0.2"]
    for c in summary["task_checks"]:
        assert len(c["per_seed"]) == 2  # one value per grpo seed
    for m in METHODS:
        stats = summary["summary"][m]
        for _, name in bench_summary.RATIOS:
            assert name in stats and f"{name}_ci90" in stats, (m, name)
    # the end points and the accuracy at equal seconds, paired by seed from the runs' own curves
    grpo_runs = {r["seed"]: r for r in summary["runs"] if r["method"] == "grpo"}
    mine_runs = [r for r in summary["runs"] if r["method"] == "dots_rr"]  # the summary's pairing order
    at_equal, ends = [], []
    for mine in mine_runs:
        base = grpo_runs[mine["seed"]]
        assert mine["curve_smoothed"][-1] == pytest.approx(mine["final_smoothed"])
        t = min(mine["curve_s"][-1], base["curve_s"][-1])
        at_equal.append(np.interp(t, mine["curve_s"], mine["curve_smoothed"])
                        - np.interp(t, base["curve_s"], base["curve_smoothed"]))
        ends.append(mine["final_smoothed"] - base["final_smoothed"])
    assert summary["summary"]["dots_rr"]["equal_time_diff_per_seed"] == pytest.approx(at_equal)
    assert summary["summary"]["dots_rr"]["end_point_diff_per_seed"] == pytest.approx(ends)
    assert "| end point − grpo | at equal time − grpo |" in table
    for row in summary["runs"]:
        # the target is grpo's smoothed end point of the same seed
        assert row["target_accuracy"] == pytest.approx(summary["targets"][str(row["seed"])])
        if row["method"] == "grpo":
            assert row["target_accuracy"] == pytest.approx(row["final_smoothed"])
            assert row["tokens_sampled_to_target"] is not None and row["tokens_trained_to_target"] is not None
    if DEEPSCALER.exists() or os.environ.get("CI", "").strip().lower() == "true":
        require_shared(DEEPSCALER)  # in CI a missing file fails here instead of passing unchecked
        assert summary["predictor_round"]["questions"] == 10240
    else:
        assert summary["predictor_round"] is None  # no file, no timing: never a made-up figure


def test_every_run_records_its_split_and_what_prefect_added(bench_run):
    root, overrides, result = bench_run
    cfg = bench.bench_config(load_config(REPO / "params.yaml", overrides))
    for row in result["runs"]:
        variants = [bench.parse_variant(VARIANT, cfg)]
        method, acfg = bench.resolve(cfg, row["method"], variants)
        run_dir, _ = bench.run_dirs(acfg, row["seed"], method, bench.lockstep_group(cfg, row["seed"], ARMS, variants))
        assert str(run_dir) == row["run_dir"]
        records = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines() if line]
        assert [r["step"] for r in records] == [1, 2, 3, 4]
        # the row's split is the per-step mean of what the trainer timed, not a number made to add up
        for part in ("step", "rollout", "update", "select"):
            assert row[f"{part}_s"] == pytest.approx(np.mean([r[f"time/{part}_s"] for r in records])), part
        for r in records:  # rollout, update and selection are disjoint spans inside the step
            assert r["time/step_s"] >= r["time/rollout_s"] + r["time/update_s"] + r["time/select_s"], r
        assert row["other_s"] >= 0 and row["rollout_s"] > 0 and row["update_s"] > 0
        assert (row["select_s"] > 0) == (method in ("dots", "dots_rr")), row
        assert row["orchestration_s"] is not None and row["orchestration_s"] >= 0
        assert row["process_start_s"] > 0  # two workers: each seed trained in a spawned process
        if row["steps_to_target"] is not None:
            # where its time to target went: the first steps' own timers, which with the rest of each
            # step add up to the time to target the row reports (dots.time_split)
            # read between the evaluations around the crossing, as the time to target is (runfiles.Crossing)
            crossed = crossing(json.loads((run_dir / "evals.json").read_text()), row["target_accuracy"],
                               cfg.eval.smooth)
            before, at = crossed.steps
            assert row["steps_to_target"] == pytest.approx(crossed.at(before, at))
            for part in ("update", "rollout"):
                def upto(n: int) -> float:
                    return sum(r[f"time/{part}_s"] for r in records[:n])
                assert row[f"{part}_to_target_s"] == pytest.approx(crossed.at(upto(before), upto(at)))
            assert sum(row[f"{p}_to_target_s"] for p in time_split.PARTS) == pytest.approx(row["time_to_target_s"])
        else:
            assert all(row[f"{p}_to_target_s"] is None for p in time_split.PARTS)
        # the run's own wall-clock holds its training steps (and its evaluations, loading, tracking)
        assert row["wall_s"] > sum(r["time/step_s"] for r in records) and row["tracking_s"] is not None


def test_mlflow_has_one_child_per_method_and_seed_under_one_parent(bench_run):
    root, _, _ = bench_run
    client, runs = mlflow_runs(root / "mlflow.db")
    children = [r for r in runs if r.data.tags.get("dots.role") == "train"]
    assert sorted((r.data.tags["method"], r.data.tags["seed"]) for r in children) == sorted(
        (m, s) for m in ARMS for s in ("0", "1"))
    parents = {r.data.tags["mlflow.parentRunId"] for r in children}
    assert len(parents) == 1
    parent = client.get_run(parents.pop())
    # every finite median of the summary is on the parent run with its value; no other is
    _, _, result = bench_run
    logged = 0
    for m in METHODS:
        for key in ("time_to_target_s", "time_to_target_ratio", "steps_to_target", "final_accuracy", "step_s",
                    "effective_ratio", "dots_pearson"):
            value = result["summary"][m].get(key)
            name = f"bench/{key}/{m}"
            if isinstance(value, (int, float)) and math.isfinite(value):
                assert parent.data.metrics.get(name) == pytest.approx(value), name
                logged += 1
            else:
                assert name not in parent.data.metrics, name
    assert parent.data.metrics["bench/time_to_target_ratio/grpo"] == pytest.approx(1.0)  # grpo is its own target
    own = result["summary"]["tau3"]["time_to_target_ratio_vs_dots"]  # the variant's ratio to its own method
    if isinstance(own, float) and math.isfinite(own):
        assert parent.data.metrics["bench/time_to_target_ratio_vs_dots/tau3"] == pytest.approx(own)
    else:
        assert "bench/time_to_target_ratio_vs_dots/tau3" not in parent.data.metrics
    assert logged >= 4 * 4
    arts = {a.path for a in client.list_artifacts(parent.info.run_id, "bench")}
    assert {"bench/summary.json", "bench/table.md", "bench/curves.png"} <= arts


def test_a_rerun_reads_finished_runs_back_instead_of_training(bench_run, monkeypatch):
    root, overrides, _ = bench_run
    cfg = bench.bench_config(load_config(REPO / "params.yaml", overrides))
    variants = [bench.parse_variant(VARIANT, cfg)]
    records = bench.run_dirs(cfg, 1, "dots_rr", bench.lockstep_group(cfg, 1, ARMS, variants))[0] / "records.jsonl"
    before = records.stat().st_mtime_ns
    os.environ.pop("DOTS_PIPELINE_ID", None)
    bench.run_bench(cfg, [0, 1], METHODS, root / "results2", variants=variants)
    assert records.stat().st_mtime_ns == before
    assert (root / "results2" / "table.md").exists()
    # the runs' wall-clock survives a re-written report that read every run back
    first, again = (json.loads((root / d / "summary.json").read_text()) for d in ("results", "results2"))
    assert again["runs_wall_s"] == pytest.approx(first["runs_wall_s"]) and first["runs_wall_s"] > 0
    # and it says its seconds are the first bench's, run by run; the first bench timed all its own
    assert first["runs_read_back"] == [] and "Read back" not in (root / "results" / "table.md").read_text()
    assert first["runs_resumed"] == [] and "Resumed" not in (root / "results" / "table.md").read_text()
    every = [f"{arm} seed {s}" for s, arm in bench.run_order(ARMS, [0, 1])]
    assert again["runs_read_back"] == every
    note = (root / "results2" / "table.md").read_text()
    assert f"Read back, not timed by this bench: {len(every)} of {len(every)} runs" in note
    assert str(cfg.root / "runs") in note
    # a run trained by other dots code is another measurement: not read back, and the shared stages
    # made by other code are made again (until stop 67 params alone decided)
    group = bench.lockstep_group(cfg, 1, ARMS, variants)
    shared = bench._shared_key(cfg)
    assert bench.finished_run(cfg, 1, "dots_rr", group) is not None
    monkeypatch.setattr(bench, "code_identity", lambda part: f"edited {part}")
    assert bench.finished_run(cfg, 1, "dots_rr", group) is None and bench._shared_key(cfg) != shared


@pytest.mark.parametrize("made_by", ["this code", "other code"])
def test_shared_stages_made_by_other_code_are_made_again(tmp_path, monkeypatch, capsys, made_by):
    """After a change to the code the shared stages run, the bench makes them again; the embedding
    cache is left to the embed stage, which knows the code that made it (`load_embeddings`)."""
    from dots import stages

    cfg = bench.bench_config(load_config(None, [f"paths.root={tmp_path}"]))
    cfg.root.mkdir(parents=True)
    code = bench.code_identity("bench shared stages") if made_by == "this code" else "other"
    (cfg.root / "shared.json").write_text(json.dumps({"key": "other params", "code": code, "info": {}}))
    monkeypatch.setattr(stages, "run_shared", lambda c: {"ran": True})
    assert bench.prepare_shared(cfg) == {"ran": True}
    made_again = "were made by other dots code; making them again" in capsys.readouterr().out
    assert made_again is (made_by != "this code")
    recorded = json.loads((cfg.root / "shared.json").read_text())["code"]
    assert recorded == bench.code_identity("bench shared stages")


def test_a_resumed_run_is_named_beside_the_table(tmp_path):
    rows = [{**_row("grpo", 0, 10.0, 100), "resumed_at": []},
            {**_row("dots_rr", 0, 5.0, 60), "resumed_at": [150]},
            {**_row("dots_rr", 1, 5.0, 60), "resumed_at": [50, 250]}, _row("grpo", 1, 10.0, 100)]
    resumed = bench_table.runs_resumed(rows)
    assert resumed == ["dots_rr seed 0 at step 150", "dots_rr seed 1 at step 50, 250"]
    note = bench_table.resumed_note(resumed, len(rows), tmp_path)
    assert ("Resumed from a checkpoint: 2 of 4 runs (dots_rr seed 0 at step 150; "
            "dots_rr seed 1 at step 50, 250)") in note and str(tmp_path / "checkpoints") in note
    assert bench_table.runs_resumed([_row("grpo", 0, 10.0, 100)]) == []  # rows of a bench before resumed_at existed


@pytest.mark.parametrize("seeds, methods, message", [
    ([-1], ["grpo", "dots_rr"], r"--seeds -1: invalid config:\n  train.seed: .*got -1"),
    ([0, 1, 0], ["grpo", "dots_rr"], "--seeds: 0 given twice"),
    ([], ["grpo", "dots_rr"], "--seeds: give at least one seed"),
    ([0], ["grpo", "dots_rr", "grpo"], "--methods: grpo given twice"),
])
def test_bad_seeds_or_methods_are_refused_before_any_work(tmp_path, seeds, methods, message):
    cfg = bench.bench_config(load_config(REPO / "params.yaml", [f"paths.root={tmp_path / 'artifacts'}"]))
    with pytest.raises(ConfigError, match=message):
        bench.run_bench(cfg, seeds, methods, tmp_path / "results")
    # refused before the shared stages: nothing written
    assert not (tmp_path / "artifacts").exists() and not (tmp_path / "results").exists()


def test_the_prefect_bench_flow_checks_its_arguments_before_its_shared_stages(tmp_path):
    """The flow ran its shared-stages task first and run_bench's checks after it: a seed given twice
    through `make bench` or a deployment was refused only after the warm-up's minutes. The flow's
    body (`.fn`, no server needed) now hands its task to run_bench, which checks first."""
    from flows.bench import bench_flow

    root = tmp_path / "artifacts"
    with pytest.raises(ConfigError, match="--seeds: 0 given twice"):
        bench_flow.fn(seeds=[0, 0], methods=["grpo", "dots_rr"], params=str(REPO / "params.yaml"),
                      overrides=[f"paths.root={root}"], out_dir=str(tmp_path / "results"))
    assert not root.exists() and not (tmp_path / "results").exists()
    with pytest.raises(ConfigError, match="--seeds: give at least one seed"):  # [] was the default seeds
        bench_flow.fn(seeds=[], params=str(REPO / "params.yaml"), overrides=[f"paths.root={root}"])
    assert not root.exists()


def test_an_out_folder_it_cannot_write_is_refused_before_any_work(tmp_path):
    cfg = bench.bench_config(load_config(REPO / "params.yaml", [f"paths.root={tmp_path / 'artifacts'}"]))
    (tmp_path / "taken").write_text("a file, not a folder")
    with pytest.raises(ConfigError, match="--out .*taken: cannot write the report there"):
        bench.run_bench(cfg, [0], ["grpo", "dots_rr"], tmp_path / "taken")
    assert not (tmp_path / "artifacts").exists()
    assert (tmp_path / "taken").read_text() == "a file, not a folder"


def test_a_missing_dataset_is_said_before_the_shared_stages(tmp_path, monkeypatch, capsys):
    cfg = bench.bench_config(load_config(REPO / "params.yaml", [f"paths.root={tmp_path / 'artifacts'}",
                                                                  "tracking.enabled=false"]))

    def stop(_cfg):
        raise RuntimeError("shared stages reached")

    monkeypatch.setattr(bench, "prepare_shared", stop)
    with pytest.raises(RuntimeError, match="shared stages reached"):
        bench.run_bench(cfg, [0], ["grpo", "dots_rr"], tmp_path / "results", tmp_path / "nope.parquet")
    said = f"bench: --dataset {tmp_path / 'nope.parquet'}: no such file; the predictor round will not be "
    said += "timed"
    assert said in capsys.readouterr().out


def test_a_bench_after_an_edit_logs_under_its_own_mlflow_parent(tmp_path, monkeypatch):
    """A bench after an edit to the package trains every run again (`finished_run`): its runs go
    under a parent of their own, not beside the old code's in the same one; the same code again
    takes the same parent (a bench run again finishes it). The bench's id lasts as long as the
    bench: a second bench or a by-hand stage in the same process does not inherit it, and a flow's
    id set before is kept and left as it was."""
    cfg = bench.bench_config(load_config(REPO / "params.yaml", [f"paths.root={tmp_path / 'artifacts'}"]))
    ids = []

    def stop(_cfg):
        ids.append(os.environ["DOTS_PIPELINE_ID"])
        raise RuntimeError("shared stages reached")

    monkeypatch.setattr(bench, "prepare_shared", stop)
    monkeypatch.setenv("DOTS_PIPELINE_ID", "set by the test")
    monkeypatch.delenv("DOTS_PIPELINE_ID")  # restored as it was (unset) after the test
    for code in ("this code", "this code", "edited"):
        if code == "edited":
            monkeypatch.setattr(bench, "code_identity", lambda part: "edited-code")
        with pytest.raises(RuntimeError, match="shared stages reached"):
            bench.run_bench(cfg, [0], ["grpo", "dots_rr"], tmp_path / "results")
        assert "DOTS_PIPELINE_ID" not in os.environ  # the bench's id ended with it
    assert ids[0] == ids[1] != ids[2] and ids[2].startswith("bench-"), ids
    monkeypatch.setenv("DOTS_PIPELINE_ID", "prefect-flow-run")  # a flow's parent: the bench's runs go there
    with pytest.raises(RuntimeError, match="shared stages reached"):
        bench.run_bench(cfg, [0], ["grpo", "dots_rr"], tmp_path / "results")
    assert ids[3] == os.environ["DOTS_PIPELINE_ID"] == "prefect-flow-run"


def test_the_comparison_names_a_resumed_run():
    from dots import stages

    row = {"method": "grpo", "time_to_target_s": 10.0, "steps_to_target": 300.0, "final_accuracy": 0.3,
           "time_to_target_ratio": 1.0, "end_point_diff": 0.0, "equal_time_diff": 0.0, "mean_step_s": 0.1,
           "effective_ratio": 0.5, "dots_pearson": None, "resumed_at": []}
    rows = [row, {**row, "method": "dots_rr", "resumed_at": [150]}]
    table = stages.render_table({"target_accuracy": 0.3, "rows": rows})
    assert "Resumed from a checkpoint: dots_rr at step 150. A resumed run's seconds" in table
    assert "Resumed" not in stages.render_table({"target_accuracy": 0.3, "rows": rows[:1]})


def test_the_comparison_says_never_for_a_run_that_missed_the_target():
    """`dots compare` showed "—" for a method that never reached the target, as for a figure it
    cannot read; the bench says "never"."""
    from dots import stages

    row = {"method": "grpo", "time_to_target_s": 10.0, "steps_to_target": 300.0, "final_accuracy": 0.3,
           "time_to_target_ratio": 1.0, "end_point_diff": 0.0, "equal_time_diff": 0.0, "mean_step_s": 0.1,
           "effective_ratio": 0.5, "dots_pearson": None, "resumed_at": []}
    missed = {**row, "method": "dots", "time_to_target_s": None, "steps_to_target": None,
              "time_to_target_ratio": None}
    table = stages.render_table({"target_accuracy": 0.3, "rows": [row, missed]})
    assert "| dots | never | never | 0.3000 | never | +0.000 |" in table
    # grpo itself missed a target set by hand (train.target_accuracy): no ratio to read
    table = stages.render_table({"target_accuracy": 0.9, "rows": [{**missed, "method": "grpo"}, missed]})
    assert "| grpo | never | never | 0.3000 | — |" in table
    assert "| dots | never | never | 0.3000 | — |" in table


def test_the_runs_wall_clock_counts_each_lockstep_group_once():
    arms = ["grpo", "dots_rr"]
    rows = [{**_row(m, s, 10.0, 100), "wall_s": w, "lockstep": arms} for s, m, w in
            [(0, "grpo", 100.0), (0, "dots_rr", 120.0), (1, "grpo", 90.0), (1, "dots_rr", 80.0)]]
    assert bench_goals.runs_wall_s(rows) == pytest.approx(120.0 + 90.0)  # a seed's group: its longest run
    alone = [{**_row(m, 0, 10.0, 100), "wall_s": w, "lockstep": None} for m, w in [("grpo", 30.0), ("rr", 40.0)]]
    assert bench_goals.runs_wall_s(alone) == pytest.approx(70.0)  # one after another (a GPU): each its own
    assert bench_goals.runs_wall_s([{**_row("grpo", 0, 10.0, 100), "wall_s": None}]) is None


def test_a_variant_of_the_selection_params_reuses_the_grpo_and_rr_runs():
    from dots.config import Config

    base, variant = Config(), load_config(None, ["selection.tau=0.3", "selection.online_calibration=true"])
    for method in ("grpo", "rr"):
        assert bench.run_dirs(base, 0, method) == bench.run_dirs(variant, 0, method)
    for method in ("dots", "dots_rr"):
        assert bench.run_dirs(base, 0, method) != bench.run_dirs(variant, 0, method)
    assert bench.run_dirs(base, 0, "grpo") != bench.run_dirs(base, 1, "grpo")


def test_in_lockstep_a_changed_arm_retrains_its_whole_group_and_one_by_one_it_does_not(monkeypatch):
    """Seconds timed beside other runs are another measurement: a bench whose dots runs change
    trains its grpo runs anew beside them (new folders: the earlier bench's runs stay intact);
    on a GPU, where each run is timed alone, the grpo runs are read back."""
    from dots.config import Config

    base, variant = Config(), load_config(None, ["selection.tau=0.3"])
    gb, gv = bench.lockstep_group(base, 0, METHODS), bench.lockstep_group(variant, 0, METHODS)
    assert gb and gv and gb != gv and gb == bench.lockstep_group(base, 0, METHODS[::-1])
    assert bench.run_dirs(base, 0, "grpo", gb) != bench.run_dirs(variant, 0, "grpo", gv)
    assert bench.run_fingerprint(base, 0, "grpo", gb) != bench.run_fingerprint(variant, 0, "grpo", gv)
    v = bench.parse_variant("every2=dots_rr:selection.every=2", base)
    assert bench.lockstep_group(base, 0, METHODS) != bench.lockstep_group(base, 0, [*METHODS, "every2"], [v])
    monkeypatch.setattr(bench, "timing", lambda c: "alone")
    assert bench.lockstep_group(base, 0, METHODS) == bench.lockstep_group(variant, 0, METHODS) == ""


def test_runs_are_interleaved_and_the_order_rotates():
    order = bench.run_order(METHODS, [0, 1, 2])
    assert order[:4] == [(0, "grpo"), (0, "dots"), (0, "rr"), (0, "dots_rr")]
    assert [m for s, m in order if s == 1] == ["dots", "rr", "dots_rr", "grpo"]
    assert [m for s, m in order if s == 2] == ["rr", "dots_rr", "grpo", "dots"]


def _row(method, seed, tts, steps, step_s=0.1, rollout=0.05, eff=0.5, tokens=None, early=0.3, gain_se=12.0,
         frontier=0.4):
    """A hand-made run_row: tokens to target default to 1000 tokens per step to target."""
    sampled = None if steps is None else (1000 * steps if tokens is None else tokens)
    return {"method": method, "seed": seed, "target_accuracy": 0.5, "time_to_target_s": tts,
            "steps_to_target": steps, "tokens_sampled_to_target": sampled,
            "tokens_trained_to_target": None if sampled is None else sampled // 2,
            "initial_accuracy": 0.2, "final_smoothed": 0.5, "gain": 0.3, "early_gain_share": early,
            "gain_se": gain_se, "frontier_min": frontier, "frontier_final": frontier,
            "s_per_group_trained": 0.01, "final_accuracy": 0.5, "best_accuracy": 0.55, "elapsed_s": 20.0,
            "step_s": step_s, "rollout_s": rollout, "update_s": 0.03, "select_s": 0.0,
            "other_s": step_s - rollout - 0.03, "effective_ratio": eff, "staleness": None, "dots_pearson": None,
            "wall_s": 100.0, "tracking_s": 1.0, "orchestration_s": 0.5}


def test_ratios_are_paired_by_seed_and_a_miss_counts_as_never():
    rows = [_row("grpo", 0, 10.0, 100), _row("grpo", 1, 20.0, 200), _row("grpo", 2, 40.0, 400),
            _row("dots_rr", 0, 4.0, 30), _row("dots_rr", 1, 12.0, 60), _row("dots_rr", 2, None, None)]
    s = bench_summary.summarize(rows, ["grpo", "dots_rr"])
    assert s["dots_rr"]["time_to_target_ratio_per_seed"][:2] == [0.4, 0.6]
    assert s["dots_rr"]["time_to_target_ratio"] == pytest.approx(0.6)  # median of 0.4, 0.6, inf
    assert s["dots_rr"]["reached_target"] == 2
    # the seconds' median counts the miss as never too: 12, not 8 (the mean of the two that reached it)
    assert s["dots_rr"]["time_to_target_s"] == 12.0 and s["dots_rr"]["steps_to_target"] == 60
    assert s["dots_rr"]["time_to_target_s_spread"] == [4.0, float("inf")]


def test_an_arm_that_misses_on_most_seeds_costs_never_and_summary_json_says_so(tmp_path):
    from dots.bench_diff import read_summary
    from dots.bench_table import fmt
    from dots.runfiles import INFINITY, json_safe

    rows = [_row("grpo", s, 10.0 * (s + 1), 100 * (s + 1)) for s in range(3)]
    rows += [_row("dots", 0, 4.0, 30), _row("dots", 1, None, None), _row("dots", 2, None, None)]
    rows += [{**_row("rr", s, None, None), "target_accuracy": None} for s in range(3)]  # no target at all
    s = bench_summary.summarize(rows, ["grpo", "dots", "rr"])
    for key in bench_summary.TO_TARGET[:1] + bench_summary.TO_TARGET[2:]:
        assert s["dots"][key] == float("inf"), key  # not the one seed that reached it
        assert s["rr"][key] is None, key  # not measured is not never
    assert s["dots"]["time_to_target_ratio"] == float("inf")
    assert fmt(s["dots"]["time_to_target_s"], ".1f") == "never"
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(json_safe({"methods": [], "seeds": [], "runs": [], "summary": s}, INFINITY)))
    raw = json.loads(path.read_text())  # strict JSON: an infinity is the string, not null
    assert raw["summary"]["dots"]["time_to_target_s"] == "inf"
    assert raw["summary"]["rr"]["time_to_target_s"] is None
    assert raw["summary"]["dots"]["time_to_target_ratio_per_seed"][1:] == ["inf", "inf"]
    back = read_summary(path)["summary"]
    assert back["dots"]["time_to_target_ratio"] == float("inf") and back["rr"]["time_to_target_s"] is None
    assert json_safe([float("nan"), float("-inf")], INFINITY) == [None, "-inf"]


ROUND = {"round_s": 0.02, "questions": 10240, "ref_size": 256, "dim": 1536, "threads": 2}


def _goals(rows):
    from dots.config import Config

    s = bench_summary.summarize(rows, METHODS)
    return s, {x["goal"].split(" ")[0]: x for x in bench_goals.goals(s, Config(), ROUND, rows)}


def test_goals_report_where_each_stands():
    rows = []
    for seed, base in enumerate((10.0, 20.0, 40.0)):  # dots_rr needs 0.45, 0.4, 0.4 of grpo's time
        rows += [_row("grpo", seed, base, 100, step_s=0.2, rollout=0.1, eff=0.2),
                 _row("dots", seed, base / 2, 40, eff=0.5), _row("rr", seed, 0.8 * base, 90, step_s=0.16),
                 _row("dots_rr", seed, [0.45, 0.4, 0.4][seed] * base, 40)]
    for r in rows:
        if r["method"] in ("dots", "dots_rr"):
            r["dots_pearson"], r["pearson_ceiling"] = 0.85, 0.9
    s, g = _goals(rows)
    assert s["dots_rr"]["time_to_target_ratio"] == pytest.approx(0.4)
    lo, hi = s["dots_rr"]["time_to_target_ratio_ci90"]
    assert 0.4 <= lo <= 0.4 + 1e-9 and 0.4 <= hi <= 0.45 + 1e-9
    assert g["dots_rr"]["value"] == pytest.approx(0.4) and g["dots_rr"]["met"]
    assert "90% CI" in g["dots_rr"]["detail"]
    assert g["dots_rr"]["detail"].endswith("; 3 of 3 seeds at or below 0.5")  # 0.45, 0.4, 0.4
    assert g["dots/pearson"]["met"]
    # beside it, what a predictor knowing the true pass rates would score on the same labels
    assert s["dots"]["pearson_ceiling"] == 0.9 and "would score about 0.90" in g["dots/pearson"]["detail"]
    # dots trains on 0.5 informative groups of its fresh ones, grpo on 0.2: 2.5x, and dots' own >= 0.5
    assert g["dots"]["value"] == pytest.approx(2.5) and g["dots"]["met"]
    assert "rr" not in g  # the per-step saving goal is gone
    assert g["predictor"]["met"]
    assert g["Prefect"]["value"] == pytest.approx(0.015) and g["Prefect"]["met"]
    assert "seed process" not in g["Prefect"]["detail"]  # no run was trained in a spawned process
    for r in rows:
        r["process_start_s"] = 4.0  # of each seed's 100 s wall-clock: beside the Prefect + MLflow share
    _, g = _goals(rows)
    assert g["Prefect"]["value"] == pytest.approx(0.015)
    assert g["Prefect"]["detail"].endswith(
        "the seed process's start (spawn and imports, the bench's own): 0.040")
    table = bench_table.render(rows, s, list(g.values()), METHODS, bench_goals.task_checks(rows))
    assert "Does the task decide?" in table and "Goals:" in table
    assert table.count("| dots_rr | ") == 3 + 1  # three runs and the median line


def test_the_goals_judge_the_load_adjusted_time_and_show_the_raw_one_beside():
    """Raw seconds say dots_rr takes 0.6 of grpo's time; with a slow stretch divided out of grpo's
    later rounds it takes 0.45 (within the goal). Without adjusted seconds (arms timed one after
    another on a GPU), the goals judge raw seconds."""
    rows = []
    for seed in range(3):
        grpo, dots_rr = _row("grpo", seed, 10.0, 100), _row("dots_rr", seed, 6.0, 40)
        grpo["time_to_target_adjusted_s"], dots_rr["time_to_target_adjusted_s"] = 8.0, 3.6
        rows += [grpo, dots_rr]
    s, g = _goals(rows)
    assert s["dots_rr"]["time_to_target_ratio"] == pytest.approx(0.6)
    assert s["dots_rr"]["time_to_target_adjusted_ratio"] == pytest.approx(0.45)
    assert g["dots_rr"]["value"] == pytest.approx(0.45) and g["dots_rr"]["met"]
    assert g["dots_rr"]["detail"].startswith("load-adjusted") and "raw seconds 0.60" in g["dots_rr"]["detail"]
    assert "3 of 3 seeds at or below 0.5" in g["dots_rr"]["detail"]  # the seeds it judges: load-adjusted
    table = bench_table.render(rows, s, list(g.values()), METHODS)
    assert "| dots_rr | 0 | 6.0 | 3.6 | 40.0 |" in table  # steps read between evaluations: one decimal
    assert "| dots_rr | 0.60 [0.60–0.60] | 0.45 [0.45–0.45] | 0.40 [0.40–0.40] |" in table
    for r in rows:
        r["time_to_target_adjusted_s"] = None
    s, g = _goals(rows)
    assert g["dots_rr"]["value"] == pytest.approx(0.6) and not g["dots_rr"]["met"]
    assert not g["dots_rr"]["detail"].startswith("load-adjusted")
    assert "0 of 3 seeds at or below 0.5" in g["dots_rr"]["detail"]  # raw seconds: 0.6 on every seed


def test_arms_timed_one_after_another_have_no_round_loads(monkeypatch, tmp_path):
    """On a GPU each run is timed alone: its rounds share no clock with the other arms', so there is
    no load to measure and no adjusted figure (nothing is read from the run folders)."""
    cfg = bench.bench_config(load_config(None, [f"paths.root={tmp_path}"]))
    monkeypatch.setattr(bench, "timing", lambda cfg: "alone")
    assert bench.seed_loads(cfg, 0, ["grpo", "dots", "rr"]) is None


def test_a_median_at_half_with_a_wide_interval_misses_the_dots_rr_goal():
    rows = []
    ratios = [0.3, 0.4, 0.5, 0.9, None]  # median 0.5, but two seeds of five are slow or never arrive
    for seed, ratio in enumerate(ratios):
        rows += [_row("grpo", seed, 10.0, 100), _row("dots_rr", seed, None if ratio is None else 10.0 * ratio,
                                                      None if ratio is None else 50)]
    s, g = _goals(rows)
    assert s["dots_rr"]["time_to_target_ratio"] == pytest.approx(0.5)
    assert s["dots_rr"]["time_to_target_ratio_ci90"][1] >= 0.8
    assert g["dots_rr"]["value"] == pytest.approx(0.5) and not g["dots_rr"]["met"]


@pytest.mark.parametrize("dots_eff,grpo_eff,share,met", [
    (0.5, 0.25, 2.0, True),
    (0.45, 0.2, 2.25, False),  # twice grpo's share, but dots itself trains on fewer than half its groups
    (0.6, 0.35, 0.6 / 0.35, False),  # dots' share is high, but not twice grpo's
])
def test_dots_informative_share_goal(dots_eff, grpo_eff, share, met):
    rows = [_row("grpo", 0, 10.0, 100, eff=grpo_eff), _row("dots", 0, 6.0, 60, eff=dots_eff)]
    _, g = _goals(rows)
    assert g["dots"]["value"] == pytest.approx(share) and g["dots"]["met"] is met


def test_the_informative_goal_counts_every_fresh_group_and_says_when_runs_lack_the_counts():
    """dots trains on informative groups 0.5 of the time, but counted over every group it generated
    (its degenerate references too) 0.44: the goal reads the latter. Runs written before the counts
    are judged on the trained groups' share, and the line says so."""
    rows = [_row("grpo", 0, 10.0, 100, eff=0.22), _row("dots", 0, 6.0, 60, eff=0.5)]
    rows[0]["fresh_effective_ratio"], rows[1]["fresh_effective_ratio"] = 0.22, 0.44
    s, g = _goals(rows)
    assert s["dots"]["fresh_effective_ratio"] == 0.44 and s["dots"]["effective_ratio"] == 0.5
    assert g["dots"]["value"] == pytest.approx(2.0) and g["dots"]["met"] is False  # 0.44 < 0.5
    assert g["dots"]["detail"] == "dots 0.44, grpo 0.22"
    assert "| 0.50 | 0.44 |" in bench_table.render(rows, s, list(g.values()), ["grpo", "dots"])
    rows[0]["fresh_effective_ratio"] = None  # a grpo run read back from before the counts
    _, g = _goals(rows)
    assert g["dots"]["value"] == pytest.approx(0.5 / 0.22)
    assert g["dots"]["detail"].startswith("dots 0.50, grpo 0.22 (runs without fresh-group counts")


def test_token_ratios_are_paired_like_seconds():
    rows = [_row("grpo", 0, 10.0, 100, tokens=100_000), _row("grpo", 1, 20.0, 200, tokens=300_000),
            _row("dots_rr", 0, 8.0, 40, tokens=30_000), _row("dots_rr", 1, 18.0, 120, tokens=60_000)]
    s = bench_summary.summarize(rows, ["grpo", "dots_rr"])["dots_rr"]
    assert s["tokens_sampled_ratio_per_seed"] == pytest.approx([0.3, 0.2])
    assert s["tokens_sampled_ratio"] == pytest.approx(0.25)
    assert s["tokens_trained_ratio_per_seed"] == pytest.approx([0.3, 0.2])
    assert s["steps_to_target_ratio_per_seed"] == pytest.approx([0.4, 0.6])
    lo, hi = s["tokens_sampled_ratio_ci90"]
    assert 0.2 <= lo <= 0.25 <= hi <= 0.3


# ---- the bootstrap interval of the median over seeds ------------------------------------------

def test_median_interval_contains_the_median_and_is_deterministic():
    import numpy as np

    vals = [0.31, 0.52, 0.44, 0.75, 0.48, 0.39, 0.6]
    ci = bench_summary.median_interval(vals)
    assert ci == bench_summary.median_interval(vals)  # a fixed bootstrap seed: the same figures every run
    lo, hi = ci
    assert min(vals) <= lo <= np.median(vals) <= hi <= max(vals)
    assert lo < hi
    # a wider confidence gives a wider (never narrower) interval
    lo99, hi99 = bench_summary.median_interval(vals, 0.99)
    assert lo99 <= lo and hi <= hi99


def test_median_interval_of_identical_values_and_edge_cases():
    assert bench_summary.median_interval([0.7, 0.7, 0.7]) == [0.7, 0.7]
    assert bench_summary.median_interval([0.42]) == [0.42, 0.42]
    assert bench_summary.median_interval([]) is None and bench_summary.median_interval([None, None]) is None
    assert bench_summary.median_interval([None, 0.5, None]) == [0.5, 0.5]  # None is no value, not a miss
    inf = float("inf")
    assert bench_summary.median_interval([inf, inf, inf]) == [inf, inf]


def test_median_interval_ends_at_inf_when_most_seeds_never_reach():
    inf = float("inf")
    for vals in ([0.4, inf, inf, inf, inf], [0.4, 0.5, inf, inf, inf], [0.5, inf]):
        lo, hi = bench_summary.median_interval(vals)
        assert hi == inf, vals
        assert lo <= hi and lo >= 0.4
    # one miss of five: the interval is still finite at the bottom and does not pretend the miss away
    lo, hi = bench_summary.median_interval([0.3, 0.4, 0.45, 0.5, inf])
    assert 0.3 <= lo <= 0.45 <= hi


def test_a_median_interval_bound_is_a_ratio_of_the_data_or_inf():
    inf = float("inf")
    for vals in ([0.4, 0.5, 0.6, inf], [0.4, 0.5, 0.6, 0.7, 0.8, inf]):
        lo, hi = bench_summary.median_interval(vals)
        finite = [v for v in vals if v != inf]
        for bound in (lo, hi):
            assert bound == inf or bound <= max(finite), (vals, lo, hi)


# ---- does the task decide? --------------------------------------------------------------------

def test_task_checks_met_when_every_grpo_seed_passes():
    rows = [_row("grpo", 0, 10.0, 100, early=0.3, gain_se=12.0, frontier=0.35),
            _row("grpo", 1, 10.0, 100, early=0.5, gain_se=10.0, frontier=0.25),
            _row("dots", 0, 5.0, 50, early=0.9, gain_se=1.0, frontier=0.0)]  # only grpo is checked
    checks = bench_goals.task_checks(rows)
    assert len(checks) == 3 and all(c["met"] for c in checks), checks
    by_target = {c["target"]: c for c in checks}
    assert by_target["<= 0.5"]["per_seed"] == [0.3, 0.5] and by_target["<= 0.5"]["worst"] == 0.5
    assert by_target[">= 10"]["worst"] == 10.0
    assert by_target["> 0.2"]["worst"] == 0.25


@pytest.mark.parametrize("field,value,target", [
    ("early_gain_share", 0.6, "<= 0.5"),  # most of the gain in the first 20% of the budget
    ("gain_se", 9.0, ">= 10"),  # the gain is within evaluation noise
    ("frontier_min", 0.2, "> 0.2"),  # the frontier dried up (the bound is strict)
    ("early_gain_share", None, "<= 0.5"),  # no gain at all: the check cannot pass
    ("gain_se", None, ">= 10"),
    ("frontier_min", None, "> 0.2"),  # no probe
])
def test_task_checks_not_met_when_one_grpo_seed_fails(field, value, target):
    good = _row("grpo", 0, 10.0, 100)
    bad = _row("grpo", 1, 10.0, 100)
    bad[field] = value
    checks = {c["target"]: c for c in bench_goals.task_checks([good, bad])}
    assert not checks[target]["met"], checks[target]
    assert all(c["met"] for t, c in checks.items() if t != target)


def test_task_checks_without_grpo_rows_are_not_met():
    assert not any(c["met"] for c in bench_goals.task_checks([_row("dots", 0, 5.0, 50)]))


# ---- the peer baselines (dapo, greso) ---------------------------------------------------------
def test_dots_rr_is_paired_with_each_peer_by_seed_and_the_goal_reads_those_ratios():
    rows = []
    for seed, base in enumerate((10.0, 20.0, 40.0)):
        rows += [_row("grpo", seed, base, 100), _row("dots_rr", seed, 0.5 * base, 50),
                 _row("dapo", seed, base, 60, tokens=300_000), _row("greso", seed, [0.5, 0.6, 0.6][seed] * base, 60)]
    for r in rows:
        if r["method"] in ("dapo", "greso"):
            r.update(rollouts_per_step=150.0, gen_batches=1.5, short_share=0.0,
                     skip_prob=0.2 if r["method"] == "greso" else None)
    methods = ["grpo", "dots_rr", "dapo", "greso"]
    s = bench_summary.summarize(rows, methods)
    assert s["dots_rr"]["time_to_target_ratio_vs_dapo_per_seed"] == pytest.approx([0.5, 0.5, 0.5])
    assert s["dots_rr"]["time_to_target_ratio_vs_greso_per_seed"] == pytest.approx([1.0, 0.5 / 0.6, 0.5 / 0.6])
    assert s["dapo"]["time_to_target_ratio"] == pytest.approx(1.0)  # still paired with grpo too
    assert s["dots_rr"]["tokens_sampled_ratio_vs_dapo_per_seed"] == pytest.approx([50_000 / 300_000] * 3)
    assert s["dapo"]["rollouts_per_step"] == 150.0 and s["grpo"]["rollouts_per_step"] is None
    goals = {g["goal"]: g for g in bench_goals.goals(s, __import__("dots.config").config.Config(), None, rows)}
    dapo_goal = goals["peer dapo: dots_rr time-to-target / dapo (median over seeds)"]
    greso_goal = goals["peer greso: dots_rr time-to-target / greso (median over seeds)"]
    assert dapo_goal["met"] and dapo_goal["value"] == pytest.approx(0.5)
    assert not greso_goal["met"] and greso_goal["value"] == pytest.approx(0.5 / 0.6)
    table = bench_table.render(rows, s, list(goals.values()), methods)
    assert "Against the peer baselines" in table and "time / dapo" in table and "How the peers sample" in table
    assert table.count("| greso | 1.50 | 150.0 |") == 1  # the sampling table lists only the peers


def test_a_peer_that_never_reaches_the_target_keeps_its_seed_in_the_pairing():
    """greso misses grpo's end point on seed 2: dots_rr, which reached it, is infinitely faster there
    (0), not left out; on seed 1 both miss: a tie. Before, both seeds fell out of the median."""
    rows = []
    for seed, base in enumerate((10.0, 20.0, 40.0)):
        greso = (0.8 * base, 80) if seed == 0 else (None, None)
        rows += [_row("grpo", seed, base, 100), _row("greso", seed, *greso)]
        rows.append(_row("dots_rr", seed, *((None, None) if seed == 1 else (0.5 * base, 50))))
    s = bench_summary.summarize(rows, ["grpo", "dots_rr", "greso"])["dots_rr"]
    assert s["time_to_target_ratio_vs_greso_per_seed"] == pytest.approx([0.5 / 0.8, 1.0, 0.0])
    assert s["steps_to_target_ratio_vs_greso_per_seed"] == pytest.approx([50 / 80, 1.0, 0.0])
    assert s["time_to_target_ratio_vs_greso"] == pytest.approx(0.5 / 0.8)
    assert s["time_to_target_ratio_per_seed"] == [0.5, float("inf"), 0.5]  # against grpo, as before


@pytest.mark.parametrize("lockstep", [True, False])
def test_a_miss_costs_never_only_in_the_figures_the_bench_measured(lockstep):
    """Off lockstep (a GPU bench, fewer than 3 arms) no run has load-adjusted seconds. A dapo that
    missed on seed 0 once made the adjusted ratio to dapo 0.0 from that seed alone, the peer goal
    judged it (met at 0.0 against a raw 0.9) and dapo's adjusted median was never; in lockstep the
    miss is still never (+inf, 0 in the ratio to it)."""
    from dots.config import Config

    rows = []
    for seed in range(5):
        for method, tts in (("grpo", 100.0), ("dots_rr", 90.0), ("dapo", None if seed == 0 else 100.0)):
            row = _row(method, seed, tts, None if tts is None else 3 * tts)
            row["time_to_target_adjusted_s"] = tts if lockstep and tts is not None else None
            rows.append(row)
    s = bench_summary.summarize(rows, ["grpo", "dots_rr", "dapo"])
    assert s["dots_rr"]["time_to_target_ratio_vs_dapo_per_seed"] == pytest.approx([0.0, 0.9, 0.9, 0.9, 0.9])
    assert s["dapo"]["time_to_target_s"] == 100.0 and s["dapo"]["time_to_target_s_spread"][1] == float("inf")
    peer = next(g for g in bench_goals.goals(s, Config(), ROUND, rows) if g["goal"].startswith("peer dapo"))
    assert peer["value"] == pytest.approx(0.9) and not peer["met"]
    adjusted = s["dots_rr"]["time_to_target_adjusted_ratio_vs_dapo_per_seed"]
    if lockstep:
        assert adjusted == pytest.approx([0.0, 0.9, 0.9, 0.9, 0.9])
        assert s["dapo"]["time_to_target_adjusted_s_spread"][1] == float("inf")
    else:
        assert adjusted == [] and s["dots_rr"]["time_to_target_adjusted_ratio_vs_dapo"] is None
        assert s["dapo"]["time_to_target_adjusted_s"] is None
        assert s["dots_rr"]["time_to_target_adjusted_ratio"] is None


def test_the_peers_params_leave_the_other_methods_runs_alone():
    from dots.config import Config

    base = Config()
    variant = load_config(None, ["dapo.gen_batch_size=128", "greso.p_easy=0.6"])
    for method in ("grpo", "dots", "rr", "dots_rr"):
        assert bench.run_dirs(base, 0, method) == bench.run_dirs(variant, 0, method)
    for method in ("dapo", "greso"):
        assert bench.run_dirs(base, 0, method) != bench.run_dirs(variant, 0, method)
    assert bench.run_dirs(base, 0, "dapo") == bench.run_dirs(load_config(None, ["greso.p_easy=0.6"]), 0, "dapo")
    # greso_rr reads greso's and the replay's params, not dapo's or DOTS's
    for overrides, same in ((["greso.p_easy=0.6"], False), (["replay.delta=0.25"], False),
                            (["dapo.gen_batch_size=128"], True), (["selection.tau=0.3"], True)):
        assert (bench.run_dirs(base, 0, "greso_rr") == bench.run_dirs(load_config(None, overrides), 0, "greso_rr")) \
            == same, overrides


def test_make_bench_trains_the_six_methods_and_greso_rr_only_on_demand():
    from dots.config import METHODS

    assert BENCH_METHODS == ("grpo", "dots", "rr", "dots_rr", "dapo", "greso")
    assert set(METHODS) - set(BENCH_METHODS) == {"greso_rr"}
    from dots.config import unread_sections

    for method in METHODS:  # every method says which params its runs ignore (an unknown one: KeyError)
        assert isinstance(unread_sections(method), tuple), method


def test_dots_bench_trains_six_seeds_by_default():
    """Two seeds train at a time: a sixth fills the core a fifth left idle (dots.config.BENCH_SEEDS)."""
    from dots.cli import _parser
    from dots.config import BENCH_SEEDS

    assert BENCH_SEEDS == (0, 1, 2, 3, 4, 5)
    assert _parser().parse_args(["bench"]).seeds == list(BENCH_SEEDS)


def test_lockstep_runs_are_the_runs_trained_alone(tiny_pipeline, tmp_path):
    """The bench trains a seed's methods in lockstep; each must be the same run, step for step
    and token for token, as the method trained alone (only its seconds may differ)."""
    import torch

    from dots import stages

    cfg = load_config(REPO / "params.yaml", [*tiny_overrides(tiny_pipeline.root), "train.steps=4", "eval.every=2",
                                             "train.checkpoint_every=2", "tracking.enabled=false"])
    methods = ["grpo", "dots_rr", "greso"]

    for m in methods:
        stages.train(cfg, m, resume=False, run_dir=tmp_path / "alone" / m, checkpoint_dir=tmp_path / "ck1" / m)
    together = stages.train_lockstep(cfg, [(m, tmp_path / "lock" / m, tmp_path / "ck2" / m) for m in methods])
    assert sorted(together) == sorted(methods)
    from safetensors.torch import load_file

    for m in methods:
        assert together[m]["lockstep"] == methods and together[m]["steps"] == 4
        assert _untimed(tmp_path / "lock" / m) == _untimed(tmp_path / "alone" / m), m
        alone, lock = (load_file(tmp_path / d / m / "model" / "model.safetensors") for d in ("alone", "lock"))
        assert all(torch.equal(alone[k], lock[k]) for k in alone), m


def _untimed(run_dir):
    """A run's records and evaluations less their seconds: what must not depend on how it was timed."""
    records = [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
               for line in (run_dir / "records.jsonl").read_text().splitlines() if line]
    evals = [{k: v for k, v in e.items() if k != "elapsed_s"} for e in json.loads((run_dir / "evals.json").read_text())]
    return records, evals


def test_a_seed_trained_in_its_own_process_is_the_run_trained_in_this_one(tiny_pipeline, tmp_path):
    """With `bench.workers` > 1 each seed trains in a spawned process with `bench.threads` torch
    threads: the same runs, step for step and token for token, as in-process with those threads."""
    base = [*tiny_overrides(tiny_pipeline.root), "train.steps=4", "eval.every=2", "train.checkpoint_every=2",
            "tracking.enabled=false", "bench.threads=1"]
    arms = ["grpo", "dots_rr"]
    runs = {}
    for n in (1, 2):
        cfg = load_config(REPO / "params.yaml", [*base, f"bench.workers={n}"])
        cfg = with_overrides(cfg, [f"paths.root={tmp_path / f'w{n}'}"])
        for sub in SHARED_STAGES:  # the tiny pipeline's shared stages, as the bench flow's fixture does
            shutil.copytree(tiny_pipeline.root / sub, cfg.root / sub)
        assert bench.workers(cfg) == n and bench.seed_config(cfg, 0).train.threads == 1
        out = bench.run_seed(cfg, 0, arms)
        assert sorted(out) == sorted(arms) and all(s["steps"] == 4 for s in out.values())
        # a spawned seed's runs say what starting its process cost (the bench's own, apart from Prefect's);
        # in this process there is none to count
        for s in out.values():
            started = s["process_start_s"]
            assert (started > 0) if n == 2 else started is None, (n, started)
        group = bench.lockstep_group(cfg, 0, arms)
        runs[n] = {m: _untimed(bench.run_dirs(cfg, 0, m, group)[0]) for m in arms}
    assert runs[1] == runs[2]


def test_seeds_train_workers_at_a_time_and_a_failed_seed_lets_the_others_finish(tmp_path):
    import threading

    cfg = bench.bench_config(load_config(None, [f"paths.root={tmp_path}", "train.device=cpu", "bench.workers=2",
                                                "tracking.enabled=false"]))
    both = threading.Barrier(2, timeout=30)  # passes only if two seeds' calls run at the same time
    done, lock = [], threading.Lock()

    def runner(c, seed, arms, variants):
        if seed in (0, 1):
            both.wait()
        if seed == 1:
            raise RuntimeError("seed 1 broke")
        with lock:
            done.append(seed)
        return {}
    order = [(s, ["grpo"]) for s in (0, 1, 2, 3)]
    with pytest.raises(RuntimeError, match="seed 1 broke"):
        bench.train_seeds(cfg, order, runner=runner)
    assert 0 in done  # the seed beside the failed one finished; the bench stopped at the failure
    done.clear()
    one = bench.bench_config(load_config(None, [f"paths.root={tmp_path}", "train.device=cpu", "bench.workers=1",
                                                "tracking.enabled=false"]))
    bench.train_seeds(one, [(s, ["grpo"]) for s in (2, 3)], runner=lambda c, s, a, v: done.append(s) or {})
    assert done == [2, 3]  # one at a time, in order


def test_global_rng_slots_keep_each_runs_sequence():
    import random

    import torch

    from dots.determinism import GlobalRng

    torch.manual_seed(0)
    random.seed(0)
    a = GlobalRng().capture()
    expected = [torch.rand(3) for _ in range(3)], [random.random() for _ in range(3)]
    torch.manual_seed(1)
    b = GlobalRng().capture()
    got_a, got_py, outer = [], [], torch.get_rng_state()
    for _ in range(3):
        with a:
            got_a.append(torch.rand(3))
            got_py.append(random.random())
        with b:
            torch.rand(5)  # b's draws must not move a's sequence
            random.random()
    assert all(torch.equal(x, y) for x, y in zip(got_a, expected[0])) and got_py == expected[1]
    assert torch.equal(torch.get_rng_state(), outer)  # and the caller's state is left as it was


def test_a_seed_trains_in_lockstep_on_the_cpu_and_run_by_run_on_a_gpu(monkeypatch, tmp_path):
    """Six methods' models fit one process on the CPU; on a GPU each run is planned to fill the
    device alone, so there the bench must train them one after another."""
    from dots import stages

    cfg = bench.bench_config(load_config(None, [f"paths.root={tmp_path}", "train.device=cpu"]))
    assert bench.timing(cfg) == "lockstep" and bench.run_fingerprint(cfg, 0, "grpo").endswith("/lockstep")
    calls = []

    def fake(scfg, specs, seed_tag=None):
        calls.append([s.name for s in specs])
        return {s.name: {"steps": 1} for s in specs}
    monkeypatch.setattr(stages, "train_lockstep", fake)
    bench.train_seed(cfg, 0, ["grpo", "dots_rr"])
    assert calls == [["grpo", "dots_rr"]]
    calls.clear()
    monkeypatch.setattr(bench, "timing", lambda c: "alone")
    out = bench.train_seed(cfg, 1, ["grpo", "dots_rr"])
    assert calls == [["grpo"], ["dots_rr"]] and sorted(out) == ["dots_rr", "grpo"]


def test_orchestration_is_what_a_seed_task_spent_outside_its_training_calls():
    from flows.bench import orchestration_per_group

    lock = ["grpo", "dots_rr"]  # one lockstep group: one shared wall-clock, the longest of its runs'
    together = {"grpo": {"wall_s": 99.0, "lockstep": lock}, "dots_rr": {"wall_s": 100.0, "lockstep": lock}}
    assert orchestration_per_group(103.0, together) == pytest.approx(3.0)
    # one run after another (a GPU): training is the sum of the runs' wall-clocks, the rest split per run
    alone = {"grpo": {"wall_s": 40.0, "lockstep": ["grpo"]}, "dots_rr": {"wall_s": 60.0, "lockstep": ["dots_rr"]}}
    assert orchestration_per_group(104.0, alone) == pytest.approx(2.0)
    assert orchestration_per_group(90.0, alone) == 0.0  # never negative
    assert orchestration_per_group(5.0, {"grpo": {}}) is None
    # starting the seed's process (spawn, imports) is the bench's own, not Prefect's: left out
    for s in together.values():
        s["process_start_s"] = 2.5
    assert orchestration_per_group(103.0, together) == pytest.approx(0.5)


EVERY2 = "every2=dots_rr:selection.every=2"  # selection.every defaults to 8


def test_a_variant_is_parsed_and_refused_before_any_work_with_the_reason():
    from dots.config import Config, ConfigError

    cfg = Config()
    v = bench.parse_variant("every2=dots_rr:selection.every=2, replay.recency=0.1", cfg)
    assert v == bench.Variant("every2", "dots_rr", ("selection.every=2", "replay.recency=0.1"))
    method, vcfg = bench.resolve(cfg, "every2", [v])
    assert method == "dots_rr" and vcfg.selection.every == 2 and vcfg.replay.recency == 0.1
    assert bench.resolve(cfg, "grpo", [v]) == ("grpo", cfg)
    # its own run folder, beside the method's (a different config), never the method's own
    assert bench.run_dirs(vcfg, 0, "dots_rr") != bench.run_dirs(cfg, 0, "dots_rr")
    bad = {"every4": "expected LABEL=METHOD", "every4=dots_rr": "expected LABEL=METHOD",
           "Every4=dots_rr:selection.every=4": "label 'Every4'", "rr=dots_rr:selection.every=4": "label 'rr'",
           "e=ppo:selection.every=4": "method 'ppo'", "e=dots_rr:selection.evry=4": "selection.evry: unknown key",
           "e=dots_rr:selection.every=0": "selection.every", "e=dots_rr:selection.every": "not KEY=VALUE",
           "e=dots_rr:selection.ref_size=64": "shared stages read it",
           "e=dots_rr:train.seed=3": "every arm of a bench shares it",
           "e=grpo:selection.every=2": "grpo does not read selection.every=2",
           "e=dots_rr:selection.every=8": "the variant would be the dots_rr run itself",
           # the rate dots_rr trains with already (train.lr_by_method), and another method's rate
           "e=dots_rr:train.lr=0.0006": "the variant would be the dots_rr run itself",
           "e=grpo:train.lr_by_method.dots_rr=0.001": "grpo does not read train.lr_by_method.dots_rr=0.001",
           # a key twice: the last won silently (here the default, so it was called the run itself)
           "e=dots_rr:selection.tau=0.05, selection.tau=0.1": "selection.tau given twice"}
    for text, why in bad.items():
        with pytest.raises(ConfigError, match=re.escape(why)):
            bench.parse_variant(text, cfg)


def test_the_cli_refuses_a_bad_variant_with_exit_2_and_names_the_key(tmp_path, capsys):
    from dots.cli import main

    rc = main(["bench", "-S", f"paths.root={tmp_path}", "--variant", "e=dots_rr:selection.alpah=0.4"])
    assert rc == 2 and "selection.alpah: unknown key" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before any stage wrote anything


def test_a_variant_without_its_method_in_the_bench_is_refused(tmp_path):
    from dots.config import ConfigError

    cfg = bench.bench_config(load_config(None, [f"paths.root={tmp_path}"]))
    v = bench.parse_variant(EVERY2, cfg)
    with pytest.raises(ConfigError, match="its method dots_rr must be benched too"):
        bench.run_bench(cfg, [0], ["grpo", "dots"], tmp_path / "out", variants=[v])
    with pytest.raises(ConfigError, match="labels must differ"):
        bench.run_bench(cfg, [0], ["grpo", "dots_rr"], tmp_path / "out", variants=[v, v])
    assert not (tmp_path / "bench").exists()


def test_a_variant_trains_in_its_methods_lockstep_group_with_its_own_config(monkeypatch, tmp_path):
    from dots import stages

    cfg = bench.bench_config(load_config(None, [f"paths.root={tmp_path}", "train.device=cpu"]))
    v = bench.parse_variant(EVERY2, cfg)
    seen = {}

    def fake(scfg, specs, seed_tag=None):
        for s in specs:
            seen[s.name] = (s.method, s.cfg.selection.every, s.cfg.train.seed, s.run_dir)
        return {s.name: {"steps": 1} for s in specs}
    monkeypatch.setattr(stages, "train_lockstep", fake)
    out = bench.train_seed(cfg, 3, ["grpo", "dots_rr", "every2"], [v])
    assert sorted(out) == ["dots_rr", "every2", "grpo"]
    assert seen["every2"][:3] == ("dots_rr", 2, 3) and seen["dots_rr"][:3] == ("dots_rr", 8, 3)
    assert seen["every2"][3] != seen["dots_rr"][3]
    vcfg, group = bench.arm_config(cfg, v), bench.lockstep_group(cfg, 3, ["grpo", "dots_rr", "every2"], [v])
    assert seen["every2"][3] == bench.run_dirs(vcfg, 3, "dots_rr", group)[0]
    assert json.loads((seen["every2"][3] / "summary.json").read_text())["bench_fingerprint"] \
        == bench.run_fingerprint(vcfg, 3, "dots_rr", group)
    assert bench.finished_run(vcfg, 3, "dots_rr", group) is not None
    assert bench.finished_run(vcfg, 3, "dots_rr") is None  # not a run of a group without the variant
    seen.clear()  # a second call reads every arm back and trains nothing
    assert sorted(bench.train_seed(cfg, 3, ["every2", "grpo", "dots_rr"], [v])) == ["dots_rr", "every2", "grpo"]
    assert seen == {}


def test_a_variant_is_paired_with_its_own_method_by_seed_and_gets_its_own_table():
    from dots.config import Config

    v = bench.Variant("every4", "dots_rr", ("selection.every=4",))
    rows = []
    for seed, (g, d, e) in enumerate([(10.0, 12.0, 9.0), (20.0, 22.0, 22.0), (40.0, 44.0, 33.0)]):
        rows += [_row("grpo", seed, g, 100), _row("dots_rr", seed, d, 80), _row("every4", seed, e, 90)]
    arms = bench.arms(["grpo", "dots_rr"], [v])
    assert arms == ["grpo", "dots_rr", "every4"]
    s = bench_summary.summarize(rows, arms, [v])
    assert s["every4"]["variant_of"] == "dots_rr" and s["every4"]["overrides"] == ["selection.every=4"]
    assert s["every4"]["time_to_target_ratio_vs_dots_rr_per_seed"] == pytest.approx([0.75, 1.0, 0.75])
    assert s["every4"]["time_to_target_ratio_vs_dots_rr"] == pytest.approx(0.75)
    assert s["every4"]["steps_to_target_ratio_vs_dots_rr"] == pytest.approx(90 / 80)
    assert s["every4"]["time_to_target_ratio"] == pytest.approx(0.9)  # and to grpo, like any arm (0.9, 1.1, 0.825)
    assert "time_to_target_ratio_vs_dots_rr" not in s["dots_rr"]
    table = bench_table.render(rows, s, bench_goals.goals(s, Config(), None, rows), arms)
    line = next(x for x in table.splitlines() if x.startswith("| every4 | dots_rr with selection.every=4 |"))
    assert "0.75 [" in line


def test_end_points_are_paired_by_seed_beside_the_ratios_and_a_variant_says_where_it_ended_lower():
    """A variant can reach grpo's end point sooner and still end below its own method: the
    summary holds the seed-paired difference of the smoothed end points, with its interval, to
    grpo and to the variant's method, and the tables print it with the seeds it ended lower on."""
    from dots.config import Config

    v = bench.Variant("d25", "dots_rr", ("replay.delta_by_method.dots_rr=0.25",))
    ends = [(0.30, 0.40, 0.39), (0.28, 0.41, 0.42), (0.29, 0.38, 0.36), (0.27, 0.39, 0.38)]
    rows = []
    for seed, (g, d, e) in enumerate(ends):
        rows += [_row("grpo", seed, 10.0, 100), _row("dots_rr", seed, 5.0, 60), _row("d25", seed, 4.8, 58)]
        for r, end in zip(rows[-3:], (g, d, e)):
            r["final_smoothed"] = end
    arms = bench.arms(["grpo", "dots_rr"], [v])
    s = bench_summary.summarize(rows, arms, [v])
    assert s["dots_rr"]["end_point_diff_per_seed"] == pytest.approx([0.10, 0.13, 0.09, 0.12])
    assert s["dots_rr"]["end_point_diff"] == pytest.approx(0.11)  # median of the four
    low, high = s["dots_rr"]["end_point_diff_ci90"]
    assert 0.09 - 1e-12 <= low <= 0.11 <= high <= 0.13 + 1e-12
    assert s["d25"]["end_point_diff_vs_dots_rr_per_seed"] == pytest.approx([-0.01, 0.01, -0.02, -0.01])
    assert s["d25"]["end_point_diff_vs_dots_rr"] == pytest.approx(-0.01)
    assert s["grpo"]["end_point_diff"] == 0.0 and "end_point_diff_vs_dots_rr" not in s["dots_rr"]
    assert s["dots_rr"]["equal_time_diff"] is None  # rows without curves: no figure at equal time
    table = bench_table.render(rows, s, bench_goals.goals(s, Config(), None, rows), arms)
    medians = table.split("Medians over seeds")[1]
    assert "| final acc | end point − grpo | at equal time − grpo |" in medians
    assert next(x for x in medians.splitlines() if x.startswith("| dots_rr |")).split(" | ")[8].startswith("+0.110 [")
    line = next(x for x in table.splitlines() if x.startswith("| d25 | dots_rr with "))
    assert line.split(" | ")[-3].startswith("-0.010 [") and line.endswith("| 3/4 | — |")


def test_accuracy_at_equal_time_reads_both_curves_at_the_shorter_runs_last_second():
    """A peer that spends 3x the seconds a step can end higher and still be behind at the same
    compute: each seed's pair is read at the shorter run's last second, linearly between
    evaluations, on the smoothed curves."""
    from dots.config import Config

    rows = []
    for seed, slow_end in enumerate([0.50, 0.48, 0.52]):
        fast = _row("dots_rr", seed, 5.0, 60)  # 0 .. 10 s, smoothed 0.1 -> 0.4
        fast.update(curve_s=[0.0, 5.0, 10.0], curve_smoothed=[0.1, 0.3, 0.4])
        slow = _row("dapo", seed, 15.0, 50)  # 0 .. 30 s: at 10 s a third of the way from 0.1 to 0.25
        slow.update(curve_s=[0.0, 15.0, 30.0], curve_smoothed=[0.1, 0.25, slow_end])
        rows += [_row("grpo", seed, 10.0, 100), fast, slow]
    s = bench_summary.summarize(rows, ["grpo", "dots_rr", "dapo"])
    assert s["dots_rr"]["equal_time_diff_vs_dapo_per_seed"] == pytest.approx([0.4 - 0.2] * 3)
    assert s["dapo"]["equal_time_diff_per_seed"] == []  # grpo's rows have no curve
    table = bench_table.render(rows, s, bench_goals.goals(s, Config(), None, rows), ["grpo", "dots_rr", "dapo"])
    peers = table.split("Against the peer baselines")[1].split("How the peers sample")[0]
    assert "| end point − dapo | at equal time − dapo |" in peers
    assert next(x for x in peers.splitlines() if x.startswith("| dots_rr |")).endswith("| +0.200 [+0.200–+0.200] |")


def test_a_variant_of_grpo_is_a_baseline_every_other_arm_is_compared_with():
    """`grpo_all=grpo:train.skip_degenerate=false` (grpo as a plain trainer runs it): dots_rr's
    ratios to it, paired by seed, beside those to the bench's grpo, and their own table."""
    from dots.config import Config

    v = bench.Variant("grpo_all", "grpo", ("train.skip_degenerate=false",))
    rows = []
    for seed, (g, a, d) in enumerate([(10.0, 16.0, 12.0), (20.0, 30.0, 18.0), (40.0, 60.0, 36.0)]):
        rows += [_row("grpo", seed, g, 100), _row("dots_rr", seed, d, 80), _row("grpo_all", seed, a, 100)]
    arms = bench.arms(["grpo", "dots_rr"], [v])
    s = bench_summary.summarize(rows, arms, [v])
    assert s["dots_rr"]["time_to_target_ratio_vs_grpo_all_per_seed"] == pytest.approx([0.75, 0.6, 0.6])
    assert s["dots_rr"]["time_to_target_ratio_vs_grpo_all"] == pytest.approx(0.6)
    assert s["dots_rr"]["time_to_target_ratio"] == pytest.approx(0.9)  # to the bench's grpo: 1.2, 0.9, 0.9
    assert s["grpo"]["time_to_target_ratio_vs_grpo_all"] == pytest.approx(1 / 1.5)
    assert "time_to_target_ratio_vs_grpo_all" not in s["grpo_all"]  # not against itself
    assert s["grpo_all"]["time_to_target_ratio_vs_grpo"] == pytest.approx(1.5)  # as any variant, to its method
    table = bench_table.render(rows, s, bench_goals.goals(s, Config(), None, rows), arms)
    section = table.split("Against grpo's variants as baselines")[1]
    assert ("| time / grpo_all | load-adjusted time / grpo_all | tokens sampled / grpo_all "
            "| tokens trained / grpo_all |") in section
    assert next(x for x in section.splitlines() if x.startswith("| dots_rr |")).startswith("| dots_rr | 0.60 [")
    assert next(x for x in section.splitlines() if x.startswith("| grpo_all |")).startswith("| grpo_all | — |")


def _peer_variant_bench() -> tuple[list, list[str], list[dict]]:
    """(variants, arms, rows) of a hand-made bench of grpo, dots_rr and greso with both of the
    latter also at lr 6e-4: dots_rr_lr6e4 takes 0.75, 0.7 and 0.8 of greso_lr6e4's time."""
    variants = [bench.Variant("dots_rr_lr6e4", "dots_rr", ("train.lr=0.0006",)),
                bench.Variant("greso_lr6e4", "greso", ("train.lr=0.0006",))]
    rows = []
    for seed, (g, d, d6, p, p6) in enumerate([(10.0, 9.0, 6.0, 10.0, 8.0), (20.0, 18.0, 14.0, 20.0, 20.0),
                                              (40.0, 36.0, 24.0, 40.0, 30.0)]):
        rows += [_row("grpo", seed, g, 100), _row("dots_rr", seed, d, 80), _row("greso", seed, p, 70),
                 _row("dots_rr_lr6e4", seed, d6, 60), _row("greso_lr6e4", seed, p6, 60)]
    for r in rows:
        if r["method"].startswith("greso"):
            r.update(rollouts_per_step=110.0, gen_batches=1.4, short_share=0.0, skip_prob=0.4)
    return variants, bench.arms(["grpo", "dots_rr", "greso"], variants), rows


def test_a_variant_of_a_peer_is_a_peer_baseline_every_arm_is_paired_with():
    """`greso_lr6e4=greso:train.lr=0.0006` beside `dots_rr_lr6e4`: dots_rr at the larger rate
    meets greso at the same rate, paired by seed against grpo's target, in the peers' tables."""
    from dots.config import Config

    variants, arms, rows = _peer_variant_bench()
    assert bench_summary.peer_arms(arms, {v.label: v.method for v in variants}) == ["greso", "greso_lr6e4"]
    s = bench_summary.summarize(rows, arms, variants)
    assert s["dots_rr_lr6e4"]["time_to_target_ratio_vs_greso_lr6e4_per_seed"] == pytest.approx([0.75, 0.7, 0.8])
    assert s["dots_rr_lr6e4"]["time_to_target_ratio_vs_greso_per_seed"] == pytest.approx([0.6, 0.7, 0.6])
    assert s["greso_lr6e4"]["time_to_target_ratio_vs_greso"] == pytest.approx(0.8)  # to its own method, once
    assert s["dots_rr"]["time_to_target_ratio_vs_greso_lr6e4"] == pytest.approx(1.125)
    assert "time_to_target_ratio_vs_dots_rr_lr6e4" not in s["greso"]  # a dots_rr variant is no baseline
    table = bench_table.render(rows, s, bench_goals.goals(s, Config(), None, rows), arms)
    section = table.split("Against the peer baselines")[1].split("How the peers sample")[0]
    assert ("| time / greso | load-adjusted time / greso | tokens sampled / greso | tokens trained / greso "
            "| time / greso_lr6e4 |") in section
    line = next(x for x in section.splitlines() if x.startswith("| dots_rr_lr6e4 |"))
    assert line.split(" | ")[5].startswith("0.75 [")  # time / greso_lr6e4, after greso's four cells
    assert table.count("| greso_lr6e4 | 1.40 | 110.0 |") == 1  # the sampling table lists the peer's variant


def test_mlflow_holds_every_ratio_an_arm_was_paired_with_and_no_other(tmp_path, monkeypatch):
    """The bench's parent run holds `bench/time_to_target_ratio_vs_<baseline>/<arm>` for exactly
    the pairings the summary made: the peers, the peers' variants (greso_lr6e4), a variant's own
    method; none for a pairing the summary did not make (greso against dots_rr_lr6e4)."""
    from dots.tracking import log_bench

    from .conftest import mlflow_runs

    monkeypatch.setenv("DOTS_PIPELINE_ID", "bench-test-ratios")
    variants, arms, rows = _peer_variant_bench()
    summary = bench_summary.summarize(rows, arms, variants)
    cfg = load_config(None, [f"paths.root={tmp_path / 'art'}", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"])
    parent = log_bench(cfg, {"summary": summary, "runs": []}, [])
    client, _ = mlflow_runs(tmp_path / "mlflow.db")
    logged = {k: v for k, v in client.get_run(parent).data.metrics.items()
              if k.startswith("bench/time_to_target_ratio_vs_")}
    expected = {f"bench/{k}/{m}": v for m, stats in summary.items() for k, v in stats.items()
                if k.startswith("time_to_target_ratio_vs_") and isinstance(v, float) and math.isfinite(v)}
    assert logged == pytest.approx(expected)
    assert logged["bench/time_to_target_ratio_vs_greso_lr6e4/dots_rr_lr6e4"] == pytest.approx(0.75)
    assert logged["bench/time_to_target_ratio_vs_greso/greso_lr6e4"] == pytest.approx(0.8)  # to its own method
    assert logged["bench/time_to_target_ratio_vs_dots_rr/dots_rr_lr6e4"] == pytest.approx(
        summary["dots_rr_lr6e4"]["time_to_target_ratio_vs_dots_rr"])
    assert "bench/time_to_target_ratio_vs_dots_rr_lr6e4/greso" not in logged  # a dots_rr variant is no baseline
    metrics = client.get_run(parent).data.metrics  # the end points' paired differences beside the ratios
    assert metrics["bench/end_point_diff_vs_dots_rr/dots_rr_lr6e4"] == pytest.approx(
        summary["dots_rr_lr6e4"]["end_point_diff_vs_dots_rr"])
    assert metrics["bench/end_point_diff/dots_rr"] == pytest.approx(summary["dots_rr"]["end_point_diff"])
    assert "bench/equal_time_diff/dots_rr" not in metrics  # hand-made rows without curves: nothing to log


def test_a_grpo_variant_is_a_baseline_against_its_own_end_point():
    """grpo_all is grpo's gradient up to float order, and ended below grpo's end point on 3 of 5
    seeds (measured 2026-12-01): against grpo's target it never arrives and no seed could pair
    with it. Against its own smoothed end point (`baseline_targets`) every seed pairs."""
    v = bench.Variant("grpo_all", "grpo", ("train.skip_degenerate=false",))
    arms = bench.arms(["grpo", "dots_rr"], [v])
    vs_grpo, vs_own = [], []
    for seed, (g, a, d) in enumerate([(10.0, 16.0, 12.0), (20.0, 30.0, 18.0), (40.0, 60.0, 36.0)]):
        vs_grpo += [_row("grpo", seed, g, 100), _row("dots_rr", seed, d, 80), _row("grpo_all", seed, None, None)]
        vs_own += [_row("grpo", seed, g - 1, 90), _row("dots_rr", seed, d / 2, 40), _row("grpo_all", seed, a, 100)]
    for r in vs_grpo:
        r["final_smoothed"] = 0.49 if r["method"] == "grpo_all" else 0.5 + 0.01 * r["seed"]
    assert bench_summary.baseline_targets(vs_grpo, [v]) == {"grpo_all": {0: 0.49, 1: 0.49, 2: 0.49}}
    assert bench_summary.baseline_targets(vs_grpo, []) == {}  # no variant of grpo, no extra target
    without = bench_summary.summarize(vs_grpo, arms, [v])
    # grpo_all never arrived: every seed pairs as infinitely faster (0), which says nothing of the two
    assert without["dots_rr"]["time_to_target_ratio_vs_grpo_all_per_seed"] == [0.0, 0.0, 0.0]
    s = bench_summary.summarize(vs_grpo, arms, [v], {"grpo_all": vs_own})
    assert s["dots_rr"]["time_to_target_ratio_vs_grpo_all_per_seed"] == pytest.approx([6 / 16, 9 / 30, 18 / 60])
    assert s["dots_rr"]["steps_to_target_ratio_vs_grpo_all"] == pytest.approx(0.4)
    assert s["grpo"]["time_to_target_ratio_vs_grpo_all"] == pytest.approx(19 / 30)
    assert s["dots_rr"]["time_to_target_ratio"] == pytest.approx(0.9)  # to grpo: still against grpo's own target


def test_a_bound_an_ulp_above_the_largest_ratio_is_that_ratio_not_never():
    """Measured (switches bench, 2026-12-01): five finite ratios whose bootstrap upper bound came
    out 1 ulp above the largest, and the table printed it as 'never'."""
    ratios = [1.271974536470274, 1.4484018019590599, 1.405164567880485, 1.4204178644269219, 1.487465944395762]
    lo, hi = bench_summary.median_interval(ratios)
    assert lo == min(ratios) and hi == max(ratios)
    assert bench_summary.median_interval([1.0, 2.0, float("inf"), float("inf"), float("inf")])[1] == float("inf")


def test_make_bench_takes_s_style_overrides_and_refuses_a_bad_one_in_one_line(monkeypatch, capsys):
    """`make bench BENCH_ARGS="-S train.steps=0"` was a traceback from inside the flow run; now
    the params are checked before the flow starts and the key is named in one line."""
    from dots.cli import parse_bench_args
    from flows import bench as bench_module

    assert parse_bench_args(["-S", "train.steps=200", "--set", "eval.every=5", "bench.workers=1"]).overrides \
        == ["train.steps=200", "eval.every=5", "bench.workers=1"]
    monkeypatch.chdir(REPO)
    started = []
    monkeypatch.setattr(bench_module, "bench_flow", lambda **kw: started.append(kw))
    assert bench_module.main(["-S", "train.steps=0"]) == 2
    err = capsys.readouterr().err
    assert "train.steps" in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2
    assert started == []
    assert bench_module.main(["-S", "bench.workers=1"]) == 0
    assert started[0]["overrides"] == ["bench.workers=1"] and started[0]["seeds"] == list(BENCH_SEEDS)
    assert started[0]["methods"] == list(BENCH_METHODS) and started[0]["variants"] == []


def test_make_bench_takes_dots_bench_arguments_and_refuses_bad_ones_before_the_flow(monkeypatch, capsys,
                                                                                   tmp_path):
    """`make bench BENCH_ARGS="--seeds 0 1"` was refused as an override without '=': the flow took
    params overrides only. It takes `dots bench`'s arguments now, and what run_bench would refuse
    after the shared stages (a seed twice, an --out it cannot write, a variant without its method)
    is refused before the flow starts, in one line."""
    from flows import bench as bench_module

    monkeypatch.chdir(REPO)
    started = []
    monkeypatch.setattr(bench_module, "bench_flow", lambda **kw: started.append(kw))
    out = tmp_path / "quick"
    argv = ["--seeds", "3", "4", "bench.workers=1", "--methods", "grpo", "dots_rr",
            "--variant", "every4=dots_rr:selection.every=4", "--out", str(out)]
    assert bench_module.main(argv) == 0
    assert started == [{"seeds": [3, 4], "methods": ["grpo", "dots_rr"], "params": "params.yaml",
                        "overrides": ["bench.workers=1"], "out_dir": str(out),
                        "variants": ["every4=dots_rr:selection.every=4"],
                        "dataset": "../shared/data/deepscaler.parquet"}]
    taken = tmp_path / "taken"
    taken.write_text("keep")
    for bad, said in ((["--seeds", "0", "0"], "--seeds: 0 given twice"),
                      (["--out", str(taken)], f"--out {taken}: cannot write the report there"),
                      (["--methods", "grpo", "--variant", "e=dots_rr:selection.every=4"],
                       "its method dots_rr must be benched too"),
                      (["--methods", "dots_rr"], "--methods: must include grpo")):
        assert bench_module.main(bad) == 2, bad
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(SystemExit) as exc:
        bench_module.main(["--seeds", "x"])
    err = capsys.readouterr().err  # named as the user ran it (it said `dots bench`)
    assert exc.value.code == 2 and "make bench: error: argument --seeds: invalid int value: 'x'" in err
    assert len(started) == 1 and taken.read_text() == "keep"
