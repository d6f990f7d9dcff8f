"""A comparison of methods as a Prefect flow: the same pipeline with `train.methods` set,
so every method shares model, pool, batch size and step budget (each at its own rate,
`train.lr_by_method`, unless `train.lr` sets one). By default the methods `make bench` times:
the paper's four and the peer baselines `dapo` and `greso`, so the nightly comparison shows
what a user's trainer may already offer beside dots. The methods and overrides apply to this
run only: the user's params.yaml is the same after it (the pipeline flow restores it), whether
it ran on the nightly schedule or on demand."""

from __future__ import annotations

from prefect import flow

from dots.config import BENCH_METHODS
from flows.pipeline import pipeline


@flow(name="dots-compare", log_prints=True)
def compare_methods(methods: list[str] | None = None, repo: str = ".", overrides: list[str] | None = None) -> dict:
    methods = methods or list(BENCH_METHODS)
    extra = [f"train.methods=[{','.join(methods)}]"]
    return pipeline.with_options(name="dots-compare-pipeline")(repo=repo, overrides=(overrides or []) + extra)


if __name__ == "__main__":
    compare_methods()
