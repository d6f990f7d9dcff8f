"""A Prefect flow's MLflow runs end with the flow: FINISHED when it completes, FAILED when it
fails, KILLED when it is cancelled or interrupted.

Why: the parent run of a flow is created by its first training stage and ended by the compare
stage (`tracking.log_pipeline`). A `dots-train` flow has no compare stage, and a pipeline flow
that fails stops before it: their parent runs, and the training run of a stage that died,
stayed RUNNING in the MLflow UI for good, beside the runs that are running. The flow knows how
it ended; the stages, separate processes, do not.

Only the flows and the bench import this module (no DVC stage reaches it): ending runs is the
orchestrator's job, and a `dots` command run by hand leaves its pipeline's parent open for the
next stage of the same pipeline (its id is the config's, the commit's and the training code's),
as before. The bench (`dots bench`, `make bench`) is its own orchestrator: it ends its runs the
same way. A training stage that raises ends its own training run wherever it runs
(`dots.stages.runs_ended_on_error`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .config import Config
from .progress import say
from .redact import scrub
from .tracking import PIPELINE_TAG, check_reachable, tracking_uri


def end_pipeline_runs(cfg: Config, pipeline: str, status: str, repo: str | Path = ".") -> list[str]:
    """Set `status` on the pipeline's runs still RUNNING: its parent run, and, unless the flow
    completed (a stage of a completed flow finished its own run), its training runs too. Returns
    "<run name> -> <status>" per run ended. `repo`: where the stages ran (the default store is
    `<repo>/<paths.root>/mlflow.db`, whatever this process's working directory)."""
    if not cfg.tracking.enabled:
        return []
    from mlflow.tracking import MlflowClient  # noqa: PLC0415  (heavy import, only when tracking)

    root = Path(repo) / cfg.paths.root
    uri = tracking_uri(cfg.model_copy(update={"paths": cfg.paths.model_copy(update={"root": str(root)})}))
    check_reachable(uri, timeout=5.0)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(cfg.tracking.experiment)
    if experiment is None:  # the flow stopped before any stage tracked anything
        return []
    running = client.search_runs([experiment.experiment_id],
                                 f"tags.`{PIPELINE_TAG}` = '{pipeline}' and attributes.status = 'RUNNING'")
    ended = []
    for run in running:
        if status == "FINISHED" and run.data.tags.get("dots.role") != "pipeline":
            continue
        client.set_terminated(run.info.run_id, status)
        ended.append(f"{run.info.run_name} -> {status}")
    return ended


@contextmanager
def pipeline_runs_ended(cfg: Config, pipeline: str, repo: str | Path = ".") -> Iterator[None]:
    """Around a flow's stages: end its MLflow runs as the flow ends (`end_pipeline_runs`). A
    tracking store that cannot be reached then is one line, never the flow's error."""
    status = "FINISHED"
    try:
        yield
    except BaseException as exc:
        status = "FAILED" if isinstance(exc, Exception) else "KILLED"  # else: cancelled, Ctrl-C
        raise
    finally:
        try:
            for line in end_pipeline_runs(cfg, pipeline, status, repo):
                say(f"tracking: MLflow run {line}")
        except Exception as exc:  # noqa: BLE001  (the flow's own outcome stands)
            why = scrub((str(exc).strip().splitlines() or [type(exc).__name__])[0])
            say(f"tracking: could not end the MLflow runs of {pipeline} ({why}); they stay RUNNING in the "
                "MLflow UI")
