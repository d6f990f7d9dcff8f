"""A comparison of methods as a Prefect flow: the same pipeline with `train.methods` set,
so every method shares model, pool, batch size, learning rate and step budget. The methods
and overrides apply to this run only: the user's params.yaml is the same after it (the
pipeline flow restores it), whether it ran on the nightly schedule or on demand."""

from __future__ import annotations

from prefect import flow

from flows.pipeline import pipeline


@flow(name="dots-compare", log_prints=True)
def compare_methods(methods: list[str] | None = None, repo: str = ".", overrides: list[str] | None = None) -> dict:
    methods = methods or ["grpo", "dots", "rr", "dots_rr"]
    extra = [f"train.methods=[{','.join(methods)}]"]
    return pipeline.with_options(name="dots-compare-pipeline")(repo=repo, overrides=(overrides or []) + extra)


if __name__ == "__main__":
    compare_methods()
