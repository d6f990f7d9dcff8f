"""Data versioning as its own flow: prepare the dataset, push it to the DVC remote, and emit
a `dots.data.versioned` event that the triggered deployment listens for."""

from __future__ import annotations

from prefect import flow
from prefect.events import emit_event

from dots import versioning
from flows.pipeline import run_env, workspace
from tasks import stages


@flow(name="dots-version-data", log_prints=True)
def version_data(repo: str = ".", remote: str | None = None) -> str:
    repo = str(versioning.require_repository(repo))  # before its lock
    with workspace(repo, "dots-version-data"):
        version = stages.version_data(repo, remote, run_env())
    emit_event(event="dots.data.versioned", resource={"prefect.resource.id": f"dots.dataset.{version}"},
               payload={"data_version": version, "repo": repo})
    return version


if __name__ == "__main__":
    version_data()
