"""A flow's MLflow runs end with the flow (`dots.pipeline_status`): a `dots-train` flow has no
compare stage to end its parent run, and a failed pipeline flow never reaches it; both left runs
RUNNING in the MLflow UI for good."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dots.config import load_config
from dots.pipeline_status import end_pipeline_runs

PARAMS = "paths: {root: artifacts}\ntracking: {experiment: status-test}\n"


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "params.yaml").write_text(PARAMS)
    (repo / "dvc.yaml").write_text("stages: {}\n")  # the stages are faked: a flow asks only that it is there
    return repo


def _stage_runs(repo: Path, pipeline: str, methods: dict[str, bool]) -> dict[str, str]:
    """What a pipeline's train stages leave in MLflow, run in the repository as DVC runs them:
    the parent and one training run per method, finished (True) or left running (False)."""
    from dots.tracking import Tracker

    here, env = Path.cwd(), os.environ.get("DOTS_PIPELINE_ID")
    os.chdir(repo)
    os.environ["DOTS_PIPELINE_ID"] = pipeline
    try:
        tracker = Tracker(load_config(repo / "params.yaml"))
        ids = {"pipeline": tracker.parent()}
        for method, finished in methods.items():
            ids[method], _ = tracker.child(method)
            if finished:
                tracker.client.set_terminated(ids[method], "FINISHED")
        return ids
    finally:
        os.chdir(here)
        if env is None:
            os.environ.pop("DOTS_PIPELINE_ID", None)
        else:
            os.environ["DOTS_PIPELINE_ID"] = env


def _status(repo: Path, run_id: str) -> str:
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{repo / 'artifacts' / 'mlflow.db'}").get_run(run_id).info.status


def test_a_failed_flow_fails_its_runs_and_a_completed_one_finishes_its_parent(tmp_path, monkeypatch):
    repo = _repo(tmp_path)
    failed = _stage_runs(repo, "prefect-a", {"grpo": True, "dots_rr": False})
    done = _stage_runs(repo, "prefect-b", {"grpo": True, "dots_rr": False})
    other = _stage_runs(repo, "prefect-c", {"grpo": False})
    monkeypatch.chdir(tmp_path)  # the flow's working directory need not be the repository
    cfg = load_config(repo / "params.yaml")
    assert sorted(end_pipeline_runs(cfg, "prefect-a", "FAILED", repo)) == [
        "dots_rr -> FAILED", "pipeline-refect-a -> FAILED"]
    order = ("pipeline", "grpo", "dots_rr")
    assert [_status(repo, failed[k]) for k in order] == ["FAILED", "FINISHED", "FAILED"]
    # completed: its stages ended their own runs; a run one left open is not called finished for it
    assert end_pipeline_runs(cfg, "prefect-b", "FINISHED", repo) == ["pipeline-refect-b -> FINISHED"]
    assert [_status(repo, done[k]) for k in order] == ["FINISHED", "FINISHED", "RUNNING"]
    assert {_status(repo, i) for i in other.values()} == {"RUNNING"}  # another flow's runs are its own
    assert end_pipeline_runs(cfg, "prefect-a", "FAILED", repo) == []  # nothing left running
    off = load_config(repo / "params.yaml", ["tracking.enabled=false"])
    assert end_pipeline_runs(off, "prefect-c", "FAILED", repo) == []


def _fake_stages(monkeypatch, fail_at: str | None = None) -> None:
    """flows.train's stages, each leaving in MLflow what the real one does (the train stage a
    training run, under the flow's pipeline id); `fail_at` raises as a failed stage task does."""
    import flows.train as train_flow

    def prepare(repo, env, remote=None):
        return "v1"

    def train(repo, method, env):
        _stage_runs(Path(repo), env["DOTS_PIPELINE_ID"], {method: fail_at != "train"})
        if fail_at == "train":
            raise RuntimeError("stage train@grpo failed")
        summary = Path(repo) / "artifacts" / "runs" / method / "summary.json"
        summary.parent.mkdir(parents=True)
        summary.write_text("{}")

    def evaluate(repo, method, env):
        if fail_at == "evaluate":
            raise RuntimeError("stage evaluate@grpo failed")

    monkeypatch.setattr(train_flow, "prepare_models", prepare)
    monkeypatch.setattr(train_flow.stages, "train", train)
    monkeypatch.setattr(train_flow.stages, "evaluate", evaluate)
    monkeypatch.setattr(train_flow, "run_env", lambda: {"DOTS_PIPELINE_ID": "prefect-flow1"})


def _runs(repo: Path, store: Path | None = None) -> dict[str, str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{store or repo / 'artifacts' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("status-test")
    return {r.info.run_name: r.info.status for r in client.search_runs([exp.experiment_id])}


def test_a_train_flow_ends_its_parent_run(tmp_path, monkeypatch, capsys):
    from flows.train import train_run

    repo = _repo(tmp_path)
    _fake_stages(monkeypatch)
    train_run.fn(method="grpo", repo=str(repo))
    assert _runs(repo) == {"pipeline-ct-flow1": "FINISHED", "grpo": "FINISHED"}  # was RUNNING for good
    assert "tracking: MLflow run pipeline-ct-flow1 -> FINISHED" in capsys.readouterr().out


@pytest.mark.parametrize("stage", ["train", "evaluate"])
def test_a_failed_train_flow_fails_its_runs_and_keeps_its_error(tmp_path, monkeypatch, stage):
    from flows.train import train_run

    repo = _repo(tmp_path)
    _fake_stages(monkeypatch, fail_at=stage)
    with pytest.raises(RuntimeError, match=f"stage {stage}@grpo failed"):
        train_run.fn(method="grpo", repo=str(repo))
    expected = {"train": {"pipeline-ct-flow1": "FAILED", "grpo": "FAILED"},
                "evaluate": {"pipeline-ct-flow1": "FAILED", "grpo": "FINISHED"}}[stage]
    assert _runs(repo) == expected


def test_a_store_gone_at_the_end_is_one_line_not_the_flows_error(tmp_path, monkeypatch, capsys):
    from flows.train import train_run

    repo = _repo(tmp_path)
    _fake_stages(monkeypatch)
    import dots.pipeline_status as status

    def gone(*args, **kwargs):
        raise ConnectionError("MLflow tracking server http://mlflow:5000 unreachable")

    monkeypatch.setattr(status, "end_pipeline_runs", gone)
    train_run.fn(method="grpo", repo=str(repo))  # completes
    assert ("tracking: could not end the MLflow runs of prefect-flow1 (MLflow tracking server "
            "http://mlflow:5000 unreachable); they stay RUNNING in the MLflow UI") in capsys.readouterr().out


def test_a_failed_bench_fails_its_parent_run(tmp_path, monkeypatch):
    """`dots bench` and `make bench` end their runs too: a seed that failed left the bench's parent
    and its own training run RUNNING."""
    from dots import bench
    from dots.tracking import Tracker

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DOTS_PIPELINE_ID", "bench-status-test")
    cfg = load_config(None, ["paths.root=artifacts", "tracking.experiment=status-test"])

    def seed_fails(cfg, seed, arms, variants):  # what a seed's process leaves when it dies mid-run
        tracker = Tracker(cfg)
        tracker.parent()
        tracker.child("grpo", seed)
        raise RuntimeError("seed 0 failed")

    with pytest.raises(RuntimeError, match="seed 0 failed"):
        bench.run_bench(bench.bench_config(cfg), [0], ["grpo"], tmp_path / "out", runner=seed_fails,
                        shared=lambda c: {})
    store = tmp_path / "artifacts" / "bench" / "mlflow.db"  # the bench's own workspace
    assert _runs(tmp_path, store) == {"pipeline-tus-test": "FAILED", "grpo/seed0": "FAILED"}


def test_sigterm_ends_a_training_run_killed_with_its_steps_logged(tiny_pipeline, tmp_path):
    """SIGTERM (`kill`, `timeout`, a scheduler, a dying parent's PDEATHSIG) killed `dots train` at
    once: its MLflow run stayed RUNNING, its buffered steps unlogged, until the next training stage
    on the machine. Now it ends as Ctrl-C does: KILLED, every step it had trained logged, exit 143."""
    import signal
    import subprocess
    import sys
    import time

    from .conftest import REPO, default_params, mlflow_runs, tiny_overrides

    root = tmp_path / "artifacts"
    root.mkdir()
    for part in ("data", "models", "embeddings", "predictor"):  # the fixture's inputs; outputs go here
        (root / part).symlink_to(tiny_pipeline.root / part)
    args = [sys.executable, "-m", "dots.cli", "train", "--method", "grpo", "-p", default_params(tmp_path)]
    for o in tiny_overrides(root) + ["train.steps=400", "train.checkpoint_every=2", "tracking.enabled=true",
                                     "tracking.log_every=50",
                                     f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", "train.threads=1"]:
        args += ["-S", o]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, HF_HUB_OFFLINE="1"))
    checkpoint = root / "checkpoints" / "grpo" / "checkpoint.pt"  # step 2 trained
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not checkpoint.exists():
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "dots train: stopped by SIGTERM; run it again to go on from its last checkpoint" in err
    client, runs = mlflow_runs(tmp_path / "mlflow.db")
    run = next(r for r in runs if r.data.tags.get("method") == "grpo" and r.data.tags.get("dots.role") == "train")
    assert run.info.status == "KILLED"
    logged = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
    assert len(logged) >= 2 and logged == list(range(1, len(logged) + 1))  # fewer than log_every: flushed
