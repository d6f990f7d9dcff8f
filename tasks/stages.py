"""Prefect tasks, one per pipeline stage. Each runs its DVC stage (`dots.versioning.repro`),
so the lineage is DVC's whatever started the run (see docs/pipeline.md, "One lineage: DVC").

- storage and tracking steps retry (a remote or MLflow store can fail transiently);
- embed and fit_predictor are cached on their inputs (params, upstream hashes, code);
- train retries resume from the method's last checkpoint (artifacts/checkpoints/<method>),
  which DVC does not delete because it is not a stage output;
- a stage's output reaches the task's log line by line while it runs, and its progress lines
  (dots.progress) update a progress artifact per bar on the flow run's page.

A new stage is one more task calling `_repro("<dvc stage>", repo, env)`.
"""

from __future__ import annotations

import re
from datetime import timedelta
from uuid import UUID

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE

from dots import progress, versioning
from dots.redact import scrub


class _StageOutput:
    """Each line of a running stage into the task's log as it is printed, and its progress lines
    into one Prefect progress artifact per bar (warm-up, labelling, training, evaluation), so
    the flow run's page shows how far each has got while the stage runs."""

    def __init__(self, stage: str):
        self.stage, self.logger = stage, get_run_logger()
        self.artifacts: dict[str, UUID] = {}
        self.artifacts_broken = False

    def __call__(self, line: str) -> None:
        line = scrub(line)
        if line.strip():
            self.logger.info("%s | %s", self.stage, line)
        parsed = progress.parse(line)
        if parsed is not None and not self.artifacts_broken:
            self._progress(*parsed, line.strip())

    def _progress(self, title: str, done: int, total: int, description: str) -> None:
        percent = min(100.0, 100.0 * done / total) if total else 100.0
        try:
            if title in self.artifacts:
                update_progress_artifact(self.artifacts[title], percent, description=description)
            else:
                self.artifacts[title] = create_progress_artifact(percent, key=artifact_key(title),
                                                                 description=description)
        except Exception as exc:  # noqa: BLE001  (progress display must never fail a stage)
            self.artifacts_broken = True
            self.logger.warning("%s: progress artifacts disabled for this stage (%s)", self.stage, exc)


def artifact_key(title: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) for a progress bar's title."""
    return "progress-" + (re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "stage")


def _repro(stage: str, repo: str, env: dict | None) -> str:
    """Run the DVC stage, its output streamed into the task's log line by line."""
    return versioning.repro(stage, repo, env, on_line=_StageOutput(stage))


def _inputs_key(stage: str):
    def key(context, parameters) -> str:
        return f"{stage}-{versioning.stage_inputs_key(stage, parameters['repo'])}"
    return key


class PrepareFailed(versioning.StageError):
    """The prepare stage failed: it reads local files and params, and fails the same way again."""


def worth_retrying(task, task_run, state) -> bool:
    """version-data's retry condition: retry what a remote may answer otherwise next time (an
    endpoint that cannot be reached, a timeout), not what fails the same way twice: the prepare
    stage (a dataset row it refuses), a missing bucket, refused credentials. Before stop 67 those
    were tried three times more, 42 s, the same error four times in the run's log."""
    return not isinstance(state.result(raise_on_failure=False), (PrepareFailed, versioning.RemoteRefused))


@task(name="version-data", retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=worth_retrying,
      cache_policy=NO_CACHE)
def version_data(repo: str, remote: str | None = None, env: dict | None = None) -> str:
    """Prepare the dataset, record its DVC hash and push it to the remote."""
    try:
        _repro("prepare", repo, env)
    except versioning.StageError as exc:
        raise PrepareFailed(str(exc)) from None
    versioning.push(repo, ["prepare"], remote)
    return versioning.data_version(repo)


@task(name="warmup", retries=1, retry_delay_seconds=5, cache_policy=NO_CACHE, timeout_seconds=3 * 3600)
def warmup(repo: str, env: dict | None = None) -> str:
    return _repro("warmup", repo, env)


@task(name="embed", cache_key_fn=_inputs_key("embed"), cache_expiration=timedelta(days=30), persist_result=True)
def embed(repo: str, env: dict | None = None) -> str:
    return _repro("embed", repo, env)


@task(name="label", retries=1, retry_delay_seconds=5, cache_policy=NO_CACHE, timeout_seconds=3 * 3600)
def label(repo: str, env: dict | None = None) -> str:
    return _repro("label", repo, env)


@task(name="fit-predictor", cache_key_fn=_inputs_key("fit_predictor"), cache_expiration=timedelta(days=30),
      persist_result=True)
def fit_predictor(repo: str, env: dict | None = None) -> str:
    return _repro("fit_predictor", repo, env)


@task(name="train", task_run_name="train-{method}", retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE,
      timeout_seconds=24 * 3600)
def train(repo: str, method: str, env: dict | None = None) -> str:
    return _repro(f"train@{method}", repo, env)


@task(name="evaluate", task_run_name="evaluate-{method}", retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE,
      timeout_seconds=6 * 3600)
def evaluate(repo: str, method: str, env: dict | None = None) -> str:
    """The exported policy on the held-out sets (evaluate@<method>); a retry simply runs it again."""
    return _repro(f"evaluate@{method}", repo, env)


@task(name="compare", retries=2, retry_delay_seconds=[2, 10], cache_policy=NO_CACHE)
def compare(repo: str, env: dict | None = None) -> str:
    return _repro("compare", repo, env)
