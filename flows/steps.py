"""The deployments' pull step (prefect.yaml): Prefect runs it in each flow run's process before it
loads the flow, whose entrypoint (`flows/pipeline.py:pipeline`, ...) is a path relative to the
folder the step leaves the process in."""

from __future__ import annotations

import logging
import os

from dots import versioning


def enter_repository(directory: str = "") -> dict[str, str]:
    """Into the repository, checked to be one (`versioning.require_repository`). `directory` is
    prefect.yaml's "{{ $DOTS_REPO }}": `prefect deploy` writes DOTS_REPO's value into the deployment
    when it has one, and leaves the template otherwise, for the worker to fill in at each run.
    Why not Prefect's own `set_working_directory`: with DOTS_REPO set in neither place it got "" and
    left the run in the worker's temporary folder, where it crashed on "No such file or directory:
    '/tmp/tmp...prefect/flows/data.py'", which names neither the variable nor where to set it."""
    try:
        if not directory.strip() or "{{" in directory:
            raise versioning.NotARepository(
                "DOTS_REPO was set neither where `prefect deploy` ran nor where the Prefect worker runs, so "
                "this run does not know its repository: deploy again as `DOTS_REPO=/path/to/the/repository "
                "prefect deploy --all`, or start the worker with DOTS_REPO set (docs/pipeline.md, "
                "Deployments)")
        path = versioning.require_repository(directory)
    except versioning.NotARepository as exc:
        _run_logger().error("%s", exc)  # else it is in the worker's output alone: the run says "crashed"
        raise
    os.chdir(path)
    return {"directory": str(path)}


def _run_logger() -> logging.Logger | logging.LoggerAdapter:
    """A logger whose records reach the flow run's page: a pull step runs before the flow, outside
    any run context, with only the run's id in the environment."""
    from prefect.logging import get_logger  # noqa: PLC0415
    from prefect.logging.loggers import PrefectLogAdapter  # noqa: PLC0415

    run_id = os.environ.get("PREFECT__FLOW_RUN_ID")
    logger = get_logger("prefect.flow_runs")
    return PrefectLogAdapter(logger, extra={"flow_run_id": run_id}) if run_id else logger
