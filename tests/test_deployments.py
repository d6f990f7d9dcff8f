"""The deployments served for real: a `prefect server start` on a free port, `python -m
flows.serve` (what `make serve` runs) against a tiny repository, a `dots.data.versioned`
event that starts `pipeline-on-new-data`, and `nightly-compare` run on demand with overrides;
both runs must complete, and the user's params.yaml must be byte for byte what it was.

The same server checks live progress through Prefect: a task's log lines reach the API while
its stage still runs, and the stage's progress lines become a progress artifact.

Every process this module starts is killed in a `finally`; each wait has a deadline and
fails with the server's or the runner's log tail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from dots import versioning

from .conftest import REPO
from .test_cli import SMALL
from .test_pipeline import _free_port, make_repo

pytestmark = pytest.mark.slow

TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _tail(path: Path, n: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else "(no log)"


def _kill_tree(proc: subprocess.Popen) -> None:
    """Stop a process we started and everything it started (flow-run processes of the runner)."""
    import psutil

    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
    for child in family:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def _wait(what: str, check: Callable[[], object], seconds: float, log: Path | None = None, every: float = 1.0):
    """Poll `check` until it returns something truthy; fail naming `what` with a log's tail."""
    deadline = time.time() + seconds
    while True:
        result = check()
        if result:
            return result
        if time.time() > deadline:
            pytest.fail(f"timed out after {seconds:.0f}s waiting for {what}\n--- {log} ---\n"
                        f"{_tail(log) if log else ''}")
        time.sleep(every)


def _drain() -> None:
    """Send what this process's Prefect log and event workers still hold."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=30)
    EventsWorker.drain_all(timeout=30)


class Server:
    def __init__(self, url: str, home: Path, log: Path):
        self.url, self.home, self.log = url, home, log

    def env(self, **extra: str) -> dict[str, str]:
        """What a process talking to this server needs (and fast log shipping, quick polling)."""
        return dict(os.environ, PREFECT_API_URL=self.url, PREFECT_HOME=str(self.home),
                    PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1",
                    PREFECT_LOGGING_TO_API_BATCH_INTERVAL="0.5", PREFECT_RUNNER_POLL_FREQUENCY="2",
                    PYTHONPATH=str(REPO), **extra)

    @contextmanager
    def client(self) -> Iterator:
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: self.url}), get_client(sync_client=True) as c:
            yield c


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    """A real Prefect server (API, events, automations) on 127.0.0.1 in a temporary PREFECT_HOME."""
    home = tmp_path_factory.mktemp("prefect_home")
    port = _free_port()
    srv = Server(f"http://127.0.0.1:{port}/api", home, home / "server.log")
    with srv.log.open("w") as log:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host",
                                 "127.0.0.1", "--port", str(port)], cwd=home, stdout=log, stderr=subprocess.STDOUT,
                                env=srv.env(PREFECT_UI_ENABLED="false", PREFECT_SERVER_UI_ENABLED="false"))
    try:
        import urllib.request

        def healthy() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"prefect server exited ({proc.returncode}):\n{_tail(srv.log)}")
            try:
                with urllib.request.urlopen(f"{srv.url}/health", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        _wait("the Prefect server's /api/health", healthy, 120, srv.log)
        yield srv
    finally:
        _kill_tree(proc)


def _wait_for_completion(server: Server, run_id, seconds: float, log: Path) -> object:
    def done():
        with server.client() as c:
            run = c.read_flow_run(run_id)
        return run if run.state_type.value in TERMINAL else None

    run = _wait(f"flow run {run_id} to finish", done, seconds, log, every=2)
    if run.state_type.value != "COMPLETED":
        logs = _logs(server, run_id)
        pytest.fail(f"flow run {run.name} ended {run.state_type.value}: {run.state.message}\n"
                    + "\n".join(x.message for x in logs[-40:]) + f"\n--- {log} ---\n{_tail(log)}")
    return run


def wait_for_trigger(server: Server, deployment_id, log: Path) -> None:
    """Until the server holds the automation of the deployment's event trigger, and a margin for its
    trigger service to hold it too (an event emitted before then starts nothing)."""
    def automation():
        with server.client() as c:
            return [a for a in c.read_automations() if a.actions
                    and getattr(a.actions[0], "deployment_id", None) == deployment_id]

    _wait("the trigger's automation", automation, 60, log)
    time.sleep(2)


def _logs(server: Server, flow_run_id=None) -> list:
    """Every log record the API holds (of one flow run), oldest first, page by page."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    flt = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])) if flow_run_id else None
    out: list = []
    with server.client() as c:
        while True:
            page = c.read_logs(flt, limit=200, offset=len(out))
            out += page
            if len(page) < 200:
                return out


def _progress_artifacts(server: Server, flow_run_id) -> dict[str, float]:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterType

    with server.client() as c:
        arts = c.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]), type=ArtifactFilterType(any_=["progress"])))
    return {a.key: float(a.data) for a in arts}


# ---- live logs: a stage's lines reach Prefect while it runs ------------------------------------

LIVE_STAGE = textwrap.dedent("""
    import pathlib, sys, time
    from dots.progress import line
    marker = sys.argv[1]
    print(line("slow", 1, 2), flush=True)
    print(f"waiting for go {marker}", flush=True)
    deadline = time.time() + 120
    while not pathlib.Path("go").exists():
        if time.time() > deadline:
            sys.exit("no go within 120 s: the line never reached the Prefect API while the stage ran")
        time.sleep(0.1)
    print(line("slow", 2, 2), flush=True)
    print(f"stage done {marker}", flush=True)
""")

LIVE_FLOW = textwrap.dedent("""
    import sys
    from prefect import flow, task
    from tasks.stages import _repro

    @task(name="slow-stage")
    def slow(repo):
        return _repro("slow", repo, None)

    @flow(name="dots-live-logs")
    def live(repo):
        return slow(repo)

    live(sys.argv[1])
""")


def test_stage_lines_reach_prefect_while_the_stage_runs(server, tmp_path):
    marker = uuid.uuid4().hex[:12]
    repo = tmp_path / "repo"
    repo.mkdir()
    versioning.dvc(["init", "--no-scm", "-q"], repo)
    (tmp_path / "stage.py").write_text(LIVE_STAGE)
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"slow": {
        "cmd": f"{sys.executable} {tmp_path / 'stage.py'} {marker}", "always_changed": True}}}))
    (tmp_path / "flow.py").write_text(LIVE_FLOW)
    log = tmp_path / "flow.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, str(tmp_path / "flow.py"), str(repo)], cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, env=server.env())
    try:
        def line_in_api():
            if proc.poll() is not None:
                pytest.fail(f"the flow ended before its stage's line reached the API:\n{_tail(log)}")
            return next((x for x in _logs(server) if f"waiting for go {marker}" in x.message), None)

        record = _wait("the stage's line in the Prefect API's logs", line_in_api, 90, log)
        assert record.task_run_id is not None and record.message.startswith("slow | ")
        assert not (repo / "go").exists()  # the stage is still waiting: it cannot have ended
        assert _progress_artifacts(server, record.flow_run_id) == {"progress-slow": 50.0}
        (repo / "go").touch()
        assert proc.wait(timeout=120) == 0, _tail(log)
    finally:
        _kill_tree(proc)
    messages = [x.message for x in _logs(server, flow_run_id=record.flow_run_id)]
    assert any(f"stage done {marker}" in m for m in messages)
    assert _progress_artifacts(server, record.flow_run_id) == {"progress-slow": 100.0}


# ---- the deployments, served ------------------------------------------------------------------

def test_served_deployments_run_on_new_data_and_on_demand(server, tmp_path):
    repo = make_repo(tmp_path / "repo", SMALL + ["train.methods=[grpo]"])  # one method: a couple of minutes
    params = repo / "params.yaml"
    params.write_bytes(b"# the user's params: comments and layout must survive a scheduled run\n"
                       + params.read_bytes())
    user_params = params.read_bytes()
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        serve = subprocess.Popen([sys.executable, "-m", "flows.serve"], cwd=REPO, stdout=out,
                                 stderr=subprocess.STDOUT, env=server.env(DOTS_REPO=str(repo)))
    try:
        def deployments():
            if serve.poll() is not None:
                pytest.fail(f"flows.serve exited ({serve.returncode}):\n{_tail(log)}")
            with server.client() as c:
                try:
                    return (c.read_deployment_by_name("dots-pipeline/pipeline-on-new-data"),
                            c.read_deployment_by_name("dots-compare/nightly-compare"))
                except Exception:  # noqa: BLE001  (not registered yet)
                    return None

        triggered, nightly = _wait("the served deployments", deployments, 120, log)
        assert nightly.parameters["repo"] == str(repo.resolve())

        wait_for_trigger(server, triggered.id, log)

        from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
        from prefect.events import emit_event
        from prefect.settings import PREFECT_API_URL, temporary_settings

        def triggered_runs():
            with server.client() as c:
                return c.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[triggered.id])))

        start = time.perf_counter()
        with temporary_settings(updates={PREFECT_API_URL: server.url}):
            emit_event(event="dots.data.versioned", resource={"prefect.resource.id": f"dots.dataset.test-{uuid.uuid4()}"},
                       payload={"data_version": "test", "repo": str(repo)})
            _drain()
        runs = _wait("a flow run of pipeline-on-new-data after the event", triggered_runs, 90, log, every=2)
        assert len(runs) == 1 and runs[0].parameters == {"repo": str(repo)}  # templated from the event
        run = _wait_for_completion(server, runs[0].id, 300, log)
        pipeline_s = time.perf_counter() - start
        assert (repo / "artifacts" / "compare" / "comparison.json").exists()
        assert params.read_bytes() == user_params

        # live progress through a real deployment: each long stage's bar, at its end
        bars = _progress_artifacts(server, run.id)
        for key in ("progress-warm-up", "progress-fit-predictor", "progress-train-grpo"):
            assert bars.get(key) == 100.0, (key, bars)
        messages = [x.message for x in _logs(server, flow_run_id=run.id)]
        assert any(m.startswith("warmup | warm-up: 40/40 steps (100%)") for m in messages), messages[:40]

        # the scheduled deployment, run on demand with a variant: the user's params stay as they were
        start = time.perf_counter()
        with server.client() as c:
            variant = c.create_flow_run_from_deployment(
                nightly.id, parameters={"methods": ["grpo"], "overrides": ["train.steps=2"]})
        _wait_for_completion(server, variant.id, 240, log)
        compare_s = time.perf_counter() - start
        assert params.read_bytes() == user_params, "the nightly compare rewrote the user's params.yaml"
        recorded = versioning.lock(repo)["train@grpo"]["params"]["params.yaml"]
        assert recorded.get("train.steps", recorded.get("train", {}).get("steps")) == 2  # the variant's lineage
        status = versioning.dvc(["status", "--json"], repo).strip().splitlines()[-1]
        assert "train@grpo" in status  # and DVC says so: the user's params differ from that run's
        print(f"\ntriggered pipeline {pipeline_s:.0f}s, nightly compare variant {compare_s:.0f}s")
    finally:
        _kill_tree(serve)


def test_a_failing_compare_leaves_the_user_params_alone(server, tmp_path, monkeypatch):
    """compare_methods with overrides whose first stage fails: the stage saw the overrides,
    and params.yaml is byte for byte the user's afterwards."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.compare import compare_methods
    from tasks import stages as task_module

    params = tmp_path / "params.yaml"
    user_params = b"# mine\ntrain:\n  steps: 7   # seven\n  methods: [grpo, dots_rr]\n"
    params.write_bytes(user_params)
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")  # the stages are faked: the flow asks that it is there
    seen = {}

    def failing(stage, repo, env):
        seen["params"] = yaml.safe_load(params.read_text())["train"]
        raise RuntimeError(f"simulated failure of {stage}")

    monkeypatch.setattr(task_module, "_repro", failing)
    monkeypatch.setattr(task_module, "version_data", task_module.version_data.with_options(retries=0))
    with temporary_settings(updates={PREFECT_API_URL: server.url}):
        try:
            with pytest.raises(RuntimeError, match="simulated"):
                compare_methods(methods=["grpo"], repo=str(tmp_path), overrides=["train.steps=2"])
        finally:
            _drain()  # while the server is up: nothing left to send once it is gone
    assert seen["params"]["steps"] == 2 and seen["params"]["methods"] == ["grpo"]  # the run used the variant
    assert params.read_bytes() == user_params


@pytest.mark.parametrize("fails, error, tries", [
    ("prepare", "a dataset row it refuses", 1),  # the stage reads local files: the same error again
    ("push", "DVC remote refused the credentials", 1),
    ("push", "DVC remote endpoint unreachable", 4),  # a remote may be up on the next try: three retries
])
def test_version_data_retries_only_what_may_pass_next_time(server, tmp_path, monkeypatch, fails, error,
                                                           tries):
    """version-data retried every failure three times (42 s), a prepare stage that refuses a dataset
    row or a bucket that does not exist too, saying the same thing four times."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from dots import versioning
    from flows.data import version_data
    from tasks import stages as task_module

    for name in ("params.yaml", "dvc.yaml"):
        (tmp_path / name).write_text("stages: {}\n" if name == "dvc.yaml" else "{}\n")
    calls = []

    def step(kind):
        def run(*args, **kwargs):
            calls.append(kind)
            if kind == fails:
                refused = versioning.RemoteRefused if "refused" in error else versioning.StageError
                raise refused(f"{error} (simulated)")
        return run

    monkeypatch.setattr(task_module, "_repro", step("prepare"))
    monkeypatch.setattr(versioning, "push", step("push"))
    quick = task_module.version_data.with_options(retry_delay_seconds=0)  # the retry condition stays
    monkeypatch.setattr(task_module, "version_data", quick)
    with temporary_settings(updates={PREFECT_API_URL: server.url}):
        try:
            with pytest.raises(versioning.StageError, match=error):
                version_data(repo=str(tmp_path))
        finally:
            _drain()
    assert calls.count(fails) == tries, calls
