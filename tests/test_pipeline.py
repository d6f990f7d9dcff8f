"""The pipeline: the Prefect flow over DVC stages, one lineage with `dvc repro`, MLflow runs as
the UI sees them (through a real `mlflow server`), retries, and S3 through a real
S3-compatible server (moto) on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from dots import versioning
from dots.config import load_config

from .conftest import REPO, mlflow_runs, tiny_config
from .test_cli import SMALL

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

SECTION4 = {"train/reward_mean", "train/loss", "train/effective_ratio", "train/policy_version", "time/step_s",
            "time/rollout_s", "time/update_s", "time/select_s", "time/elapsed_s", "eval/accuracy",
            "final_accuracy"}
DOTS_RR_EXTRA = {"dots/ref_difficulty_mean", "replay/size", "replay/fraction", "replay/staleness_mean",
                 "replay/staleness_max", "replay/ratio_mean", "replay/ratio_max"}


def _git(args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                            GIT_COMMITTER_EMAIL="t@t"))


def make_repo(path: Path, overrides: list[str], remote: str | None = None) -> Path:
    """A git + DVC repo holding this project's pipeline and a small params.yaml."""
    path.mkdir(parents=True)
    shutil.copytree(REPO / "dots", path / "dots", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", ".dvcignore"):
        shutil.copy(REPO / name, path / name)
    (path / "params.yaml").write_text(yaml.safe_dump(load_config(None, overrides).model_dump(), sort_keys=False))
    (path / ".gitignore").write_text("artifacts/mlflow.db\nartifacts/checkpoints/\nartifacts/mlartifacts/\n")
    _git(["init", "-q"], path)
    versioning.dvc(["init", "-q"], path)
    shutil.copytree(REPO / ".dvc" / "plots", path / ".dvc" / "plots")  # dvc.yaml's plot template
    versioning.dvc(["remote", "add", "-d", "local", remote or str(path.parent / (path.name + "-remote"))], path)
    _git(["add", "-A"], path)
    _git(["commit", "-qm", "init"], path)
    return path


@pytest.fixture(scope="session")
def flow_repo(tmp_path_factory):
    """The whole pipeline flow, run once under prefect_test_harness, with the compare task
    failing on its first try (it must be retried and the flow complete)."""
    from prefect.testing.utilities import prefect_test_harness

    from flows.pipeline import pipeline
    from tasks import stages as task_module

    repo = make_repo(tmp_path_factory.mktemp("flow") / "repo", SMALL)
    calls = {"compare": 0}
    real = task_module._repro

    def flaky(stage, repo_, env):
        if stage == "compare":
            calls["compare"] += 1
            if calls["compare"] == 1:
                raise ConnectionError("simulated tracking outage")
        return real(stage, repo_, env)

    task_module._repro = flaky
    try:
        with prefect_test_harness(server_startup_timeout=180):
            comparison = pipeline(repo=str(repo))
    finally:
        task_module._repro = real
    return repo, comparison, calls


def test_flow_completes_after_a_retried_task(flow_repo):
    repo, comparison, calls = flow_repo
    assert calls["compare"] == 2  # failed once, retried, succeeded
    assert {r["method"] for r in comparison["rows"]} == {"grpo", "dots_rr"}
    for name in ("compare/comparison.json", "compare/table.md", "compare/learning_curve.png",
                 "runs/grpo/summary.json", "runs/dots_rr/records.jsonl", "predictor/metrics.json",
                 "runs/grpo/model/model.safetensors", "evaluations/dots_rr/metrics.json"):
        assert (repo / "artifacts" / name).exists(), name
    assert versioning.data_version(repo)  # dvc.lock records the data's hash
    assert any((repo.parent / "repo-remote").rglob("*")), "the data was pushed to the DVC remote"


def test_prefect_run_and_dvc_repro_share_one_lineage(flow_repo):
    repo, _, _ = flow_repo
    status = json.loads(versioning.dvc(["status", "--json"], repo).strip().splitlines()[-1] or "{}")
    assert status == {}, f"dvc sees stale stages after the Prefect run: {status}"
    out = versioning.dvc(["repro"], repo)
    assert "Running stage" not in out  # nothing to do: the flow wrote what dvc repro would


def test_dvc_plots_show_draws_every_trained_method(flow_repo):
    """`dvc plots show` (docs/pipeline.md) after a run of two methods: the chart of all methods
    holds both, colour by method, and each method's own chart its evaluations. It drew neither:
    DVC drops a file whose rows do not share their keys (`dots_rr`'s step-0 evaluation has no
    probe Pearson), and the combined plot listed the evals.json of all seven methods, failing whole
    on the five not trained ("argument of type 'NoneType' is not iterable")."""
    repo, _, _ = flow_repo
    shown = json.loads(versioning.dvc(["plots", "show", "--json"], repo).strip().splitlines()[-1])
    assert not shown.get("errors"), shown.get("errors")

    def rows(plot_id: str) -> list[dict]:
        (plot,) = shown["data"][plot_id]
        return plot["content"]["data"]["values"]

    combined = rows("accuracy_vs_training_seconds")
    assert {r["method"] for r in combined} == {"grpo", "dots_rr"}
    encoding = shown["data"]["accuracy_vs_training_seconds"][0]["content"]["encoding"]
    assert encoding["color"]["field"] == "method"
    for method in ("grpo", "dots_rr"):
        evals = json.loads((repo / "artifacts" / "runs" / method / "evals.json").read_text())
        assert len(rows(f"artifacts/runs/{method}/evals.json")) == len(evals) > 1
        assert len({tuple(e) for e in evals}) == 1  # every row has the same keys
        assert [r["accuracy"] for r in combined if r["method"] == method] == [e["accuracy"] for e in evals]


def test_a_clone_that_pulls_the_run_has_nothing_to_redo(flow_repo, tmp_path):
    """What `dvc push` sends is the whole run: another checkout of the commit and its dvc.lock
    that runs `dvc pull` has every output, metrics and plot files too, and `dvc repro` nothing to
    do. With the metrics uncached (`cache: false`, while .gitignore keeps artifacts/ out of git)
    they were in neither, and that clone re-ran training to make them."""
    repo, _, _ = flow_repo
    versioning.dvc(["push"], repo)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    # as committed beside the code: dvc.lock, and the .gitignore files DVC wrote beside its outputs
    # (this repository's .gitignore leaves artifacts/ to them; they are part of compare's inputs)
    for path in [repo / "dvc.lock", *(repo / "artifacts").rglob(".gitignore")]:
        (clone / path.relative_to(repo)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, clone / path.relative_to(repo))
    versioning.dvc(["pull"], clone)
    status = json.loads(versioning.dvc(["status", "--json"], clone).strip().splitlines()[-1] or "{}")
    assert status == {}, f"after dvc pull the clone still lacks: {status}"
    for name in ("runs/dots_rr/summary.json", "evaluations/grpo/metrics.json", "compare/curves.json",
                 "compare/comparison.json", "predictor/metrics.json"):
        assert (clone / "artifacts" / name).read_bytes() == (repo / "artifacts" / name).read_bytes(), name


def test_changing_a_selection_param_reruns_only_what_depends_on_it(flow_repo, tmp_path):
    repo, _, _ = flow_repo
    clone = tmp_path / "clone"
    shutil.copytree(repo, clone, symlinks=True)
    versioning.set_params(["selection.tau=0.25"], clone)
    assert "tau: 0.25" in (clone / "params.yaml").read_text()
    status = json.loads(versioning.dvc(["status", "--json"], clone).strip().splitlines()[-1])
    assert set(status) == {"train@grpo", "train@dots_rr"}, status  # changed directly
    out = versioning.dvc(["repro"], clone)
    ran = set(re.findall(r"Running stage '([^']+)'", out))
    # and downstream of them only: the evaluation of a model whose weights moved, and compare
    assert {"train@grpo", "train@dots_rr", "compare"} <= ran <= {"train@grpo", "train@dots_rr", "evaluate@grpo",
                                                                 "evaluate@dots_rr", "compare"}, out
    # grpo never reads selection params: its stage goes on from its finished checkpoint and trains
    # nothing (it trained grpo again before stop 67), so its model and evaluation stay as they were
    assert "artifacts/checkpoints/grpo: resuming from step" in out and "evaluate@grpo" not in ran, out


def test_an_experiment_dvc_runs_in_a_temporary_copy_logs_to_the_repositorys_mlflow_store(flow_repo, tmp_path):
    """`dvc exp run --queue` and `--temp` run the stages in a copy of the repository under
    .dvc/tmp/exps that DVC deletes when the experiment ends. The default MLflow store was the
    copy's `artifacts/mlflow.db`: every run of a queued sweep was lost with it, and `make ui` showed
    none (found at stop 67). Now the store is the repository's (DVC_ROOT), and each run is tagged
    with the experiment's name; a training whose key the change leaves as it was goes on from the
    repository's checkpoint (stop 68)."""
    from mlflow.tracking import MlflowClient

    repo, _, _ = flow_repo
    clone = tmp_path / "clone"
    shutil.copytree(repo, clone, symlinks=True)
    out = versioning.dvc(["exp", "run", "--temp", "-n", "tau3", "-S", "selection.tau=0.3"], clone)
    assert "Running stage 'train@dots_rr'" in out, out
    assert "Creating initial MLflow database tables" not in out, out  # a store of the copy's own
    client = MlflowClient(f"sqlite:///{clone / 'artifacts' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("dots").experiment_id
    runs = client.search_runs([experiment], "tags.dvc_experiment = 'tau3'")
    assert {r.data.tags["method"] for r in runs} == {"pipeline", "grpo", "dots_rr"}, out
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert not list((clone / ".dvc" / "tmp").rglob("mlflow.db"))
    # grpo never reads selection params: in the copy, which holds no checkpoints, its stage goes on
    # from the repository's finished checkpoint (it trained from step 0 until stop 68), and its run
    # in the experiment still carries the whole curve
    assert "going on from the repository's" in out, out
    grpo = next(r for r in runs if r.data.tags["method"] == "grpo")
    losses = client.get_metric_history(grpo.info.run_id, "train/loss")
    assert max(m.step for m in losses) == load_config(clone / "params.yaml").train.steps


def test_the_default_store_of_a_stage_dvc_runs_in_a_copy_is_the_repositorys(tmp_path, monkeypatch):
    from dots.tracking import store_root, tracking_uri

    cfg = load_config(None, ["paths.root=artifacts"])
    copy = tmp_path / "repo" / ".dvc" / "tmp" / "exps" / "tmpabc"
    copy.mkdir(parents=True)
    monkeypatch.chdir(copy)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert store_root(cfg) == copy / "artifacts"  # not run by DVC: paths.root as it is
    monkeypatch.setenv("DVC_ROOT", str(copy))  # `dvc repro`: the stage runs in the repository itself
    assert store_root(cfg) == copy / "artifacts"
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "repo"))  # `dvc exp run --queue`: in a copy of it
    assert tracking_uri(cfg) == f"sqlite:///{tmp_path / 'repo' / 'artifacts' / 'mlflow.db'}"
    outside = load_config(None, [f"paths.root={tmp_path / 'elsewhere'}"])
    assert store_root(outside) == tmp_path / "elsewhere"  # a root outside the copy is not the copy's


def test_changing_only_evaluation_params_reruns_only_evaluation(flow_repo, tmp_path):
    repo, _, _ = flow_repo
    clone = tmp_path / "clone"
    shutil.copytree(repo, clone, symlinks=True)
    versioning.set_params(["evaluate.samples=1"], clone)
    status = json.loads(versioning.dvc(["status", "--json"], clone).strip().splitlines()[-1])
    assert set(status) == {"evaluate@grpo", "evaluate@dots_rr"}, status
    out = versioning.dvc(["repro"], clone)
    assert set(re.findall(r"Running stage '([^']+)'", out)) == {"evaluate@grpo", "evaluate@dots_rr", "compare"}, out
    metrics = json.loads((clone / "artifacts" / "evaluations" / "grpo" / "metrics.json").read_text())
    assert "pass@1" in metrics["heldout"]["task"]


def test_set_params_refuses_bad_values_and_leaves_the_file_alone(flow_repo):
    from dots.config import ConfigError

    repo, _, _ = flow_repo
    before = (repo / "params.yaml").read_text()
    with pytest.raises(ConfigError, match="replay.delta"):
        versioning.set_params(["replay.delta=2"], repo)
    assert (repo / "params.yaml").read_text() == before


def test_mlflow_store_has_parent_children_names_tags_and_plot(flow_repo, tmp_path):
    repo, _, _ = flow_repo
    client, runs = mlflow_runs(repo / "artifacts" / "mlflow.db")
    parents = [r for r in runs if r.data.tags.get("dots.role") == "pipeline"]
    children = {r.data.tags["method"]: r for r in runs if r.data.tags.get("dots.role") == "train"}
    assert len(parents) == 1 and set(children) == {"grpo", "dots_rr"}
    parent = parents[0]
    for method, run in children.items():
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["git_commit"] != "" and run.data.tags["data_version"].startswith("dvc:")
        assert SECTION4 <= set(run.data.metrics), SECTION4 - set(run.data.metrics)
        assert run.data.params["train.batch_size"] == "8"
        history = client.get_metric_history(run.info.run_id, "train/loss")
        assert sorted(m.step for m in history) == [1, 2, 3, 4]
    assert DOTS_RR_EXTRA <= set(children["dots_rr"].data.metrics)
    # train.lr is null by default: each run records the rate it trained with
    assert {m: float(r.data.params["train.lr_used"]) for m, r in children.items()} == {"grpo": 3e-4, "dots_rr": 6e-4}
    # train.downsample is null too: each run records the m it trained on (dots_rr 3 of 8, grpo all of them)
    used = {m: r.data.params["train.downsample_used"] for m, r in children.items()}
    assert used == {"grpo": "None", "dots_rr": "3"}
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"learning_curve.png", "table.md", "comparison.json", "config.json", "metrics.json"} <= artifacts
    # the comparison's paired figures beside the ratio, as the bench logs them
    assert {f"{k}/{m}" for k in ("end_point_diff", "equal_time_diff") for m in children} <= set(parent.data.metrics)
    assert parent.data.metrics["end_point_diff/grpo"] == 0.0
    # into the test's folder: without dst_path MLflow makes a temporary one and leaves it behind
    png = Path(client.download_artifacts(parent.info.run_id, "learning_curve.png", dst_path=str(tmp_path)))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, seconds: float, proc: subprocess.Popen) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early: {proc.stdout.read() if proc.stdout else ''}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return  # it answers (e.g. 403 without credentials): it is up
        except Exception:  # noqa: BLE001  (not up yet)
            time.sleep(0.5)
    raise TimeoutError(url)


def _get(base: str, path: str, **query) -> dict:
    with urllib.request.urlopen(f"{base}{path}?{urllib.parse.urlencode(query)}", timeout=30) as r:
        return json.loads(r.read())


def _post(base: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_the_mlflow_ui_server_serves_the_runs(flow_repo):
    """What the UI's comparison view reads: runs search and metric histories, over REST."""
    repo, _, _ = flow_repo
    port = _free_port()
    proc = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
                             f"sqlite:///{repo / 'artifacts' / 'mlflow.db'}", "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{base}/health", 120, proc)
        exp = _get(base, "/api/2.0/mlflow/experiments/get-by-name", experiment_name="dots")["experiment"]
        runs = _post(base, "/api/2.0/mlflow/runs/search",
                     {"experiment_ids": [exp["experiment_id"]], "filter": "tags.method = 'dots_rr'"})["runs"]
        assert len(runs) == 1
        run_id = runs[0]["info"]["run_id"]
        for key in ("eval/accuracy", "replay/staleness_mean"):
            hist = _get(base, "/api/2.0/mlflow/metrics/get-history", run_id=run_id, metric_key=key)["metrics"]
            assert hist, key
            assert all(0 <= m["value"] for m in hist)
        steps = [m["step"] for m in _get(base, "/api/2.0/mlflow/metrics/get-history", run_id=run_id,
                                          metric_key="eval/accuracy")["metrics"]]
        assert 0 in steps and 4 in steps  # the start and the end of training
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _moto(env: dict | None = None):
    """moto's standalone S3 server on 127.0.0.1 (a real HTTP endpoint, not an in-process mock)."""
    port = _free_port()
    exe = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=dict(os.environ, **(env or {})))
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(url, 60, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def s3_server():
    yield from _moto()


@pytest.fixture(scope="module")
def s3_server_with_auth():
    """The same server checking credentials (moto enforces IAM auth from the first request)."""
    yield from _moto({"INITIAL_NO_AUTH_ACTION_COUNT": "0"})


S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def test_dvc_and_mlflow_round_trip_through_s3(s3_server, tmp_path, monkeypatch):
    import boto3

    for k, v in S3_ENV.items():
        monkeypatch.setenv(k, v)
    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.create_bucket(Bucket="dots-data")
    repo = make_repo(tmp_path / "repo", SMALL)
    versioning.dvc(["remote", "add", "-f", "-d", "s3", "s3://dots-data/dvc"], repo)
    versioning.dvc(["remote", "modify", "s3", "endpointurl", s3_server], repo)
    versioning.repro("prepare", repo)
    versioning.push(repo, ["prepare"])
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="dots-data").get("Contents", [])]
    assert any(k.startswith("dvc/") for k in keys)
    # pull into a fresh checkout of the same commit + lock
    shutil.rmtree(repo / "artifacts" / "data")
    shutil.rmtree(repo / ".dvc" / "cache")
    versioning.dvc(["pull", "prepare"], repo)
    assert (repo / "artifacts" / "data" / "pool.jsonl").exists()

    # MLflow artifacts on the same endpoint
    from dots.tracking import Tracker

    monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", s3_server)
    s3.create_bucket(Bucket="dots-mlflow")
    cfg = load_config(None, [f"paths.root={tmp_path / 'art'}", "tracking.artifact_location=s3://dots-mlflow/mlflow",
                             "tracking.experiment=s3-test"])
    tracker = Tracker(cfg)
    run_id = tracker.parent()
    note = tmp_path / "note.txt"
    note.write_text("hello s3")
    tracker.log_artifacts(run_id, [note])
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="dots-mlflow").get("Contents", [])]
    assert any(k.endswith("note.txt") for k in keys), keys


def _prepared_repo_on_s3(tmp_path, monkeypatch, endpoint: str, bucket: str, **env) -> Path:
    """A repo whose default DVC remote is `bucket` on `endpoint`, with the data prepared."""
    for k, v in {**S3_ENV, **env}.items():
        monkeypatch.setenv(k, v)
    repo = make_repo(tmp_path / "repo", SMALL)
    versioning.dvc(["remote", "add", "-f", "-d", "s3", f"s3://{bucket}/dvc"], repo)
    versioning.dvc(["remote", "modify", "s3", "endpointurl", endpoint], repo)
    versioning.repro("prepare", repo)
    return repo


def test_a_missing_bucket_is_named(s3_server, tmp_path, monkeypatch):
    repo = _prepared_repo_on_s3(tmp_path, monkeypatch, s3_server, "no-such-bucket")
    with pytest.raises(versioning.StageError, match="bucket does not exist"):
        versioning.push(repo, ["prepare"])


def test_wrong_s3_credentials_are_named(s3_server_with_auth, tmp_path, monkeypatch):
    repo = _prepared_repo_on_s3(tmp_path, monkeypatch, s3_server_with_auth, "dots-data", AWS_ACCESS_KEY_ID="not-a-key")
    with pytest.raises(versioning.StageError, match="refused the credentials"):
        versioning.push(repo, ["prepare"])


def test_deployments_schedule_and_trigger():
    """prefect.yaml and `make serve` declare the same deployments: a cron one and an event-triggered one."""
    import importlib

    from flows.serve import deployments

    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    by_name = {d["name"]: d for d in spec["deployments"]}
    for d in spec["deployments"]:  # every entrypoint resolves to a Prefect flow
        path, func = d["entrypoint"].split(":")
        module = path.removesuffix(".py").replace("/", ".")
        assert hasattr(getattr(importlib.import_module(module), func), "fn"), d["entrypoint"]
    assert by_name["nightly-compare"]["schedules"][0]["cron"] == "0 2 * * *"
    assert by_name["pipeline-on-new-data"]["triggers"][0]["expect"] == ["dots.data.versioned"]

    served = {d.name: d for d in deployments(".")}
    assert set(served) == set(by_name)
    assert served["nightly-compare"].schedules[0].schedule.cron == "0 2 * * *"
    trigger = served["pipeline-on-new-data"].triggers[0]
    assert "dots.data.versioned" in trigger.expect


def test_a_tracking_fault_mid_run_loses_no_metric(tmp_path):
    """MLflow failing mid-run: training goes on, the records are retried, and what never
    gets through is written to the local fallback file."""
    from dots.tracking import LiveLogger, Tracker

    cfg = load_config(None, [f"paths.root={tmp_path}", "tracking.experiment=faults"])
    tracker = Tracker(cfg)
    real = tracker.log_metrics
    state = {"down": True}

    def flaky(run_id, records, start_ms):
        if state["down"]:
            raise ConnectionError("tracking server unreachable")
        return real(run_id, records, start_ms)

    tracker.log_metrics = flaky
    logger = LiveLogger(tracker, "grpo", every=2, fallback=tmp_path / "fallback.jsonl")
    recs = [{"step": s, "train/loss": float(s), "time/elapsed_s": 0.1 * s} for s in range(1, 9)]
    for rec in recs[:4]:
        logger(rec)  # writes at steps 2 and 4 fail (backing off): nothing raised, everything kept
    assert logger.failures == 2 and [r["step"] for r in logger.buffer] == [1, 2, 3, 4]
    state["down"] = False
    for rec in recs[4:]:
        logger(rec)  # back up: the backlog goes through with the new records
    hist = tracker.client.get_metric_history(logger.run_id, "train/loss")
    assert sorted(m.step for m in hist) == list(range(1, 9))
    state["down"] = True
    logger({"step": 9, "train/loss": 9.0, "time/elapsed_s": 0.9})
    logger.finish({"final_accuracy": 0.5}, [])
    lines = [json.loads(x) for x in (tmp_path / "fallback.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [9] and lines[0]["run_id"] == logger.run_id


@pytest.mark.parametrize("error, status", [(RuntimeError("loss is NaN"), "FAILED"),
                                           (KeyboardInterrupt(), "KILLED")])
def test_a_training_stage_that_stops_ends_its_mlflow_run_and_logs_its_steps(
        tiny_pipeline, tmp_path, monkeypatch, capsys, error, status):
    """`dvc repro` and a hand `dots train` have no Prefect flow to end their runs: a stage that
    raised (or was stopped with Ctrl-C) left its run RUNNING in the MLflow UI, its buffered steps
    unlogged. Now FAILED (KILLED) with every step it trained; the same stage run again, from step 0
    (no checkpoint yet), trains into a new run and finishes it, the stopped one left as it ended."""
    from mlflow.tracking import MlflowClient

    from dots import stages
    from dots.trainer import Trainer

    uri = f"sqlite:///{tiny_pipeline.root / 'mlflow.db'}"  # the default store, an experiment of its own
    cfg = tiny_config(tiny_pipeline.root, f"tracking.experiment=stopped-{status}")
    real = Trainer.train_step

    def second_step_fails(self):
        if self.step == 1:
            raise error
        return real(self)

    monkeypatch.setattr(Trainer, "train_step", second_step_fails)
    folders = {"run_dir": tmp_path / "run", "checkpoint_dir": tmp_path / "ck"}
    with pytest.raises(type(error)):
        stages.train(cfg, "grpo", resume=False, **folders)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(f"stopped-{status}").experiment_id
    [run] = client.search_runs([experiment], "tags.`dots.role` = 'train'")
    assert run.info.status == status
    logged = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in logged] == [1]  # buffered (log_every is 10), logged as the stage stopped
    assert f"MLflow run {run.info.run_id} -> {status} (stopped at step 1)" in capsys.readouterr().out
    monkeypatch.setattr(Trainer, "train_step", real)
    stages.train(cfg, "grpo", **folders)
    stopped, again = client.search_runs([experiment], "tags.`dots.role` = 'train'",
                                        order_by=["attributes.start_time ASC"])
    assert stopped.info.run_id == run.info.run_id and client.get_run(run.info.run_id).info.status == status
    assert again.info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(again.info.run_id, "train/loss")) == [1, 2, 3]


def test_a_stage_run_again_by_other_code_trains_anew_into_a_new_mlflow_run(
        tiny_pipeline, tmp_path, monkeypatch, capsys):
    """`dvc repro` re-runs a training stage when one of its modules changed. It went on from the
    old code's checkpoint at the last step and trained nothing, and its MLflow run (the pipeline's
    id is params and commit, so the same at an uncommitted edit) was the old one taken back: no
    new step logged, the old curve under the new figures (found at stop 67). Now the stage trains
    from step 0 into a new run, under a parent of its own; the earlier run keeps its own curve."""
    from mlflow.tracking import MlflowClient

    import dots.trainer
    from dots import stages

    monkeypatch.delenv("DOTS_PIPELINE_ID", raising=False)  # a by-hand stage: no flow's or bench's id
    cfg = tiny_config(tiny_pipeline.root, "tracking.experiment=recoded")
    folders = {"run_dir": tmp_path / "run", "checkpoint_dir": tmp_path / "ck"}
    first = stages.train(cfg, "grpo", **folders)
    import dots.tracking

    monkeypatch.setattr(dots.trainer, "code_identity", lambda part: "edited")
    monkeypatch.setattr(dots.tracking, "code_identity", lambda part: "edited")  # the same files, read by both
    capsys.readouterr()
    again = stages.train(cfg, "grpo", **folders)
    out = capsys.readouterr().out
    assert "was made by other dots code" in out and "resuming from step" not in out
    assert again["resumed_at"] == [] and again["steps"] == first["steps"] == cfg.train.steps
    client = MlflowClient(f"sqlite:///{tiny_pipeline.root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("recoded").experiment_id
    runs = client.search_runs([experiment], "tags.`dots.role` = 'train'",
                              order_by=["attributes.start_time ASC"])
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}
    steps = list(range(1, cfg.train.steps + 1))
    for run in runs:
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss")) == steps
    from dots.tracking import Tracker, method_run

    assert method_run(Tracker(cfg), "grpo") == runs[-1].info.run_id  # the evaluate stage's run: the new one
    # under a parent of its own (since stop 68): the commit's earlier parent keeps its figures
    parents = [r.data.tags["dots.pipeline"] for r in runs]
    assert parents[0] != parents[1] and parents[1].endswith("-edited"), parents


def test_a_run_closed_before_the_error_stays_finished_and_a_store_gone_is_one_line(tmp_path, capsys):
    """In lockstep one run can be closed when another of its group fails: it stays FINISHED. A store
    that cannot be reached when a stage stops is one line; the stage's own error is what raises."""
    from dots.tracking import LiveLogger, Tracker

    tracker = Tracker(load_config(None, [f"paths.root={tmp_path}", "tracking.experiment=closed"]))
    done = LiveLogger(tracker, "grpo", every=10)
    done.finish({"final_accuracy": 0.5}, [])
    done.abort(RuntimeError("the other run's export failed"))
    assert tracker.client.get_run(done.run_id).info.status == "FINISHED"
    stopped = LiveLogger(tracker, "dots_rr", every=10)

    def gone(*args, **kwargs):
        raise ConnectionError("tracking server unreachable")

    tracker.client.set_terminated = gone
    stopped.abort(RuntimeError("loss is NaN"))
    assert "could not end MLflow run" in capsys.readouterr().out and stopped.ended is None


def test_a_run_whose_process_was_killed_outright_is_ended_by_the_next_stage(tmp_path, capsys):
    """SIGKILL (the out-of-memory killer, a preempted node) runs no cleanup: the run of a process
    killed so stayed RUNNING for good unless the same stage ran again. The next training stage on
    the machine ends it KILLED; a live process's run and another host's are left alone."""
    import signal
    import socket

    from dots.processes import pid_namespace
    from dots.tracking import OWNER_TAG, Tracker

    params = [f"paths.root={tmp_path}", "tracking.experiment=killed"]
    code = ("import os, signal; from dots.config import load_config; from dots.tracking import Tracker; "
            f"Tracker(load_config(None, {params!r})).child('grpo'); os.kill(os.getpid(), signal.SIGKILL)")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    killed = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env)
    assert killed.returncode == -signal.SIGKILL
    tracker = Tracker(load_config(None, params))
    [stale] = tracker.client.search_runs([tracker.experiment_id], "tags.method = 'grpo'")
    assert stale.info.status == "RUNNING"
    capsys.readouterr()
    live, _ = tracker.child("dots")  # the next stage, in this process
    assert f"MLflow run grpo ({stale.info.run_id}) was left RUNNING by process" in capsys.readouterr().out
    elsewhere, _ = tracker.child("rr")
    tracker.client.set_tag(elsewhere, OWNER_TAG, f"not-{socket.gethostname()} {pid_namespace()} 1 1.0")
    container, _ = tracker.child("greso")  # this host's name, another container's pids
    tracker.client.set_tag(container, OWNER_TAG, f"{socket.gethostname()} pid:[1] 1 1.0")
    tracker.child("dots_rr")  # and one more: this process's run, another host's and container's stay RUNNING
    status = {m: tracker.client.get_run(i).info.status for m, i in
              (("grpo", stale.info.run_id), ("dots", live), ("rr", elsewhere), ("greso", container))}
    assert status == {"grpo": "KILLED", "dots": "RUNNING", "rr": "RUNNING", "greso": "RUNNING"}
    again, _ = tracker.child("grpo")  # the killed stage run again takes its run back
    assert again == stale.info.run_id and tracker.client.get_run(again).info.status == "RUNNING"


def test_the_flow_cache_key_follows_the_files_on_disk_not_dvc_lock(tmp_path):
    """A hand `dots fit-predictor` replaced predictor.pt without touching dvc.lock: the key, made of
    the hashes dvc.lock records, stayed, and every flow skipped the stage with the hand-made file."""
    from dots.versioning import stage_inputs_key

    (tmp_path / "dvc.yaml").write_text("stages:\n  fit:\n    cmd: x\n    deps: [emb.pt, code.py, models]\n"
                                       "    params: [predictor.steps]\n    outs: [predictor.pt]\n")
    (tmp_path / "params.yaml").write_text("predictor:\n  steps: 3\n")
    for name, text in (("emb.pt", "e"), ("code.py", "c"), ("predictor.pt", "p"), ("models/a", "m")):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    key = stage_inputs_key("fit", tmp_path)
    assert stage_inputs_key("fit", tmp_path) == key
    for name, text in (("predictor.pt", "hand-made"), ("emb.pt", "other"), ("models/a", "other")):
        before = (tmp_path / name).read_text()
        (tmp_path / name).write_text(text)
        assert stage_inputs_key("fit", tmp_path) != key, name
        (tmp_path / name).write_text(before)
    assert stage_inputs_key("fit", tmp_path) == key
    (tmp_path / "predictor.pt").unlink()
    assert stage_inputs_key("fit", tmp_path) != key
