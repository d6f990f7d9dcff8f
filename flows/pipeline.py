"""The whole pipeline as one Prefect flow: version data → warm-up → embed → label → fit
predictor → train and evaluate each of `train.methods` → compare (MLflow parent run + children).

Every task runs its DVC stage, so this flow and `dvc repro` produce the same artifacts and
dvc.lock. Overrides (dotted keys, validated first) are written into params.yaml for the run,
as `dvc exp run -S` does, and the user's params.yaml is restored byte for byte when the flow
ends, failed or not (`dots.versioning.params_overridden`): a scheduled or triggered variant
never changes the user's params. dvc.lock and the outputs then describe the variant's run,
so `dvc status` names the stages the overrides changed and the next plain run redoes them.
"""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from dots import versioning
from dots.config import load_config
from dots.pipeline_inputs import check_pipeline
from dots.pipeline_status import pipeline_runs_ended
from tasks import stages


def run_env() -> dict[str, str]:
    """Stage processes group their MLflow runs under this flow run."""
    return {"DOTS_PIPELINE_ID": f"prefect-{flow_run.get_id() or 'local'}"}


def workspace(repo: str, flow_name: str):
    """This flow run's hold on the repository: overlapping deployments (a cron and a trigger) take
    turns instead of one failing on DVC's lock or running on the other's overrides; the overrides a
    killed flow left in params.yaml are undone before this one reads it. The holder is named by the
    run's own flow, which a user finds in the UI (the nightly comparison runs this pipeline as its
    subflow dots-compare-pipeline); `flow_name` outside a flow run."""
    name = flow_run.flow_name or flow_name  # attributes, not get_*(): tests set them in the environment
    return versioning.held(repo, f"Prefect flow run {flow_run.name or 'local'} of {name}")


def prepare_models(repo: str, env: dict, remote: str | None = None) -> str:
    """Data, warm-up, embeddings, labels, predictor: everything training needs."""
    version = stages.version_data(repo, remote, env)
    stages.warmup(repo, env)
    stages.embed(repo, env)
    stages.label(repo, env)
    stages.fit_predictor(repo, env)
    return version


@flow(name="dots-pipeline", log_prints=True)
def pipeline(repo: str = ".", overrides: list[str] | None = None, remote: str | None = None) -> dict:
    repo = str(versioning.require_repository(repo))  # before its lock
    # one flow writes the repository at a time; the user's params.yaml is back when this ends
    with workspace(repo, "dots-pipeline"), versioning.params_overridden(overrides, repo):
        cfg = load_config(Path(repo) / "params.yaml")
        check_pipeline(cfg, repo)  # what compare and evaluate need, before the shared stages' minutes
        env = run_env()
        with pipeline_runs_ended(cfg, env["DOTS_PIPELINE_ID"], repo):  # failed: its MLflow runs say so
            version = prepare_models(repo, env, remote)
            for method in cfg.train.methods:
                stages.train(repo, method, env)
                stages.evaluate(repo, method, env)
            stages.compare(repo, env)
    get_run_logger().info("pipeline done: data %s, methods %s", version, cfg.train.methods)
    return json.loads((Path(repo) / cfg.paths.root / "compare" / "comparison.json").read_text())


if __name__ == "__main__":
    pipeline()
