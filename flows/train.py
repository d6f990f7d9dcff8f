"""One training run as a Prefect flow: bring the upstream stages up to date (DVC skips what
has not changed), then train and evaluate one method. A retried train task resumes from its
checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow

from dots import versioning
from dots.config import load_config
from dots.pipeline_status import pipeline_runs_ended
from flows.pipeline import prepare_models, run_env, workspace
from tasks import stages


@flow(name="dots-train", log_prints=True)
def train_run(method: str = "dots_rr", repo: str = ".", overrides: list[str] | None = None) -> dict:
    repo = str(versioning.require_repository(repo))  # before its lock
    # one flow writes the repository at a time; the user's params.yaml is back when this ends
    with workspace(repo, "dots-train"), versioning.params_overridden(overrides, repo):
        cfg = load_config(Path(repo) / "params.yaml")
        if method not in cfg.train.methods:
            raise ValueError(f"method {method!r}: the DVC train stages run train.methods={cfg.train.methods}; "
                             f"add it there (overrides=['train.methods=[...,{method}]'])")
        env = run_env()
        with pipeline_runs_ended(cfg, env["DOTS_PIPELINE_ID"], repo):  # no compare stage ends its parent run
            prepare_models(repo, env)
            stages.train(repo, method, env)
            stages.evaluate(repo, method, env)
    return json.loads((Path(repo) / cfg.paths.root / "runs" / method / "summary.json").read_text())


if __name__ == "__main__":
    train_run()
