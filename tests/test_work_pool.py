"""The deployments as docs/pipeline.md tells a user to run them with a work pool: `prefect.yaml`
deployed with `prefect deploy --all` and a `prefect worker start --pool dots-pool` process worker.
tests/test_deployments.py serves the same flows through `flows/serve.py`, which reads none of
prefect.yaml: its pull step (`flows.steps.enter_repository` into $DOTS_REPO), an entrypoint or a
template that Prefect no longer accepts would otherwise surface only on a user's server.

Deployed without DOTS_REPO (the template is kept for the worker to fill in at each run), a worker
without it gets a run that stops in the pull step, saying so on the run's page; a worker with it
runs `version-data`, whose `dots.data.versioned` event starts `pipeline-on-new-data`, and both
complete in the repository; deployed with it, the path is written into the deployments.

Its own module, so its own server: deployed under the served deployments' names on one server,
the trigger's automation would be registered twice and the served test's one-run check fail."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO
from .test_cli import SMALL
from .test_deployments import (TERMINAL, _kill_tree, _logs, _tail, _wait, _wait_for_completion,
                               wait_for_trigger)
from .test_deployments import server as _served_tests_server
from .test_pipeline import make_repo

server = _served_tests_server  # the same module-scoped fixture: a server of this module's own
pytestmark = pytest.mark.slow


def _prefect(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "prefect"), *args]


def _worker(log: Path, env: dict[str, str]) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(_prefect("worker", "start", "--pool", "dots-pool"), cwd=log.parent,
                                stdout=out, stderr=subprocess.STDOUT, env=env)


def test_prefect_yaml_deploys_to_a_work_pool_and_its_worker_runs_the_trigger(server, tmp_path):
    repo = make_repo(tmp_path / "repo", SMALL + ["train.methods=[grpo]"])
    # deployed from another checkout than the repository, so that only the pull step can bring a
    # run into it (without one, Prefect's default is the folder `prefect deploy` ran in)
    project = tmp_path / "project"
    for folder in (repo, project):
        for name in ("flows", "tasks"):  # the entrypoints, loaded in the pull step's working directory
            shutil.copytree(REPO / name, folder / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "prefect.yaml", project / "prefect.yaml")
    user_params = (repo / "params.yaml").read_bytes()
    env = server.env(PREFECT_WORKER_QUERY_SECONDS="2")
    env.pop("DOTS_REPO", None)
    with_repo = dict(env, DOTS_REPO=str(repo))

    def cli(*args: str, environ: dict[str, str] = env) -> None:
        done = subprocess.run(_prefect(*args), cwd=project, env=environ, capture_output=True, text=True,
                              timeout=180, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout}\n{done.stderr}"

    def deployment(name: str):
        with server.client() as c:
            return c.read_deployment_by_name(name)

    cli("work-pool", "create", "dots-pool", "--type", "process")
    cli("deploy", "--all")
    triggered = deployment("dots-pipeline/pipeline-on-new-data")
    versioner = deployment("dots-version-data/version-data")
    assert triggered.work_pool_name == "dots-pool" and versioner.work_pool_name == "dots-pool"
    assert versioner.pull_steps == [{"flows.steps.enter_repository": {"directory": "{{ $DOTS_REPO }}"}}]

    log = tmp_path / "worker-without-repo" / "worker.log"
    log.parent.mkdir()
    worker = _worker(log, env)
    try:
        with server.client() as c:
            lost = c.create_flow_run_from_deployment(versioner.id)

        def ended():
            with server.client() as c:
                run = c.read_flow_run(lost.id)
            return run if run.state_type.value in TERMINAL else None

        state = _wait("the run of a worker without DOTS_REPO to end", ended, 120, log, every=2).state_type
        said = [x for x in _logs(server, lost.id) if "DOTS_REPO was set neither where" in x.message]
        assert state.value != "COMPLETED" and said and said[0].level >= 40, _tail(log)
    finally:
        _kill_tree(worker)
    assert not (repo / "artifacts").exists()

    log = tmp_path / "worker.log"
    worker = _worker(log, with_repo)
    try:
        wait_for_trigger(server, triggered.id, log)
        with server.client() as c:
            run = c.create_flow_run_from_deployment(versioner.id)
        _wait_for_completion(server, run.id, 180, log)  # the worker ran it in the repository

        from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

        def triggered_runs():
            if worker.poll() is not None:
                pytest.fail(f"the worker exited ({worker.returncode}):\n{_tail(log)}")
            with server.client() as c:
                only = DeploymentFilter(id=DeploymentFilterId(any_=[triggered.id]))
                return c.read_flow_runs(deployment_filter=only)

        runs = _wait("a flow run of pipeline-on-new-data after version-data's event", triggered_runs, 90, log,
                     every=2)
        assert len(runs) == 1 and runs[0].parameters == {"repo": str(repo.resolve())}  # the event's payload
        _wait_for_completion(server, runs[0].id, 300, log)
    finally:
        _kill_tree(worker)
    assert (repo / "artifacts" / "compare" / "comparison.json").exists()
    assert (repo / "params.yaml").read_bytes() == user_params
    assert any((repo.parent / "repo-remote").rglob("*")), "version-data pushed nothing to the DVC remote"

    cli("deploy", "--all", environ=with_repo)  # as docs/pipeline.md has it: DOTS_REPO=$PWD prefect deploy
    assert deployment("dots-version-data/version-data").pull_steps == [
        {"flows.steps.enter_repository": {"directory": str(repo)}}]
