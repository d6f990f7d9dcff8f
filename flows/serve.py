"""Serve the deployments locally in one process (`make serve`): a nightly comparison on a
cron schedule, and the pipeline triggered whenever a `dots.data.versioned` event arrives
(emitted by the dots-version-data flow). Uses the Prefect API in PREFECT_API_URL, or a local
server started with `prefect server start`. The repository is $DOTS_REPO (as in prefect.yaml's
pull step), else the working directory. tests/test_deployments.py serves these against a real
server and runs both the triggered and the scheduled deployment."""

from __future__ import annotations

import os
from pathlib import Path

from prefect import serve
from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger

from flows.compare import compare_methods
from flows.data import version_data
from flows.pipeline import pipeline
from flows.train import train_run

NEW_DATA = DeploymentEventTrigger(expect={"dots.data.versioned"}, match={"prefect.resource.id": "dots.dataset.*"},
                                  parameters={"repo": "{{ event.payload.repo }}"})


def deployments(repo: str | None = None):
    """The four deployments, for the repository `repo` (default: $DOTS_REPO, else the working
    directory), as an absolute path so a run does not depend on where the runner starts it."""
    repo = str(Path(repo or os.environ.get("DOTS_REPO") or ".").resolve())
    return [
        compare_methods.to_deployment(name="nightly-compare", cron="0 2 * * *", parameters={"repo": repo}),
        pipeline.to_deployment(name="pipeline-on-new-data", triggers=[NEW_DATA]),
        version_data.to_deployment(name="version-data", parameters={"repo": repo}),
        train_run.to_deployment(name="train", parameters={"repo": repo}),
    ]


if __name__ == "__main__":
    serve(*deployments())
