"""Prefect flows: the whole pipeline, one training run, a comparison of methods, data versioning."""
