"""Prefect tasks, one per pipeline stage. Each runs its DVC stage (`dots.versioning.repro`),
so the lineage is DVC's whatever started the run (see README, "One lineage").

- storage and tracking steps retry (a remote or MLflow store can fail transiently);
- embed and fit_predictor are cached on their inputs (params, upstream hashes, code);
- train retries resume from the method's last checkpoint (artifacts/checkpoints/<method>),
  which DVC does not delete because it is not a stage output.
"""

from __future__ import annotations

from datetime import timedelta

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from dots import versioning
from dots.redact import scrub


def _repro(stage: str, repo: str, env: dict | None) -> str:
    out = versioning.repro(stage, repo, env)
    get_run_logger().info("%s\n%s", stage, scrub(out.strip()))
    return out


def _inputs_key(stage: str):
    def key(context, parameters) -> str:
        return f"{stage}-{versioning.stage_inputs_key(stage, parameters['repo'])}"
    return key


@task(name="version-data", retries=3, retry_delay_seconds=[2, 10, 30], cache_policy=NO_CACHE)
def version_data(repo: str, remote: str | None = None, env: dict | None = None) -> str:
    """Prepare the dataset, record its DVC hash and push it to the remote."""
    _repro("prepare", repo, env)
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


@task(name="compare", retries=2, retry_delay_seconds=[2, 10], cache_policy=NO_CACHE)
def compare(repo: str, env: dict | None = None) -> str:
    return _repro("compare", repo, env)
