"""What a whole pipeline needs from its inputs beyond the config's own checks, checked before its
first stage (`dots all`, the Prefect pipeline flow).

Why a module of its own: the flow checks them in its own process, which need not import the trainer
for it. The evaluation sets are read by `heldout.evaluation_sets`, as the evaluate stage reads them,
so the check and the stage cannot disagree on what a set is (and DVC's prepare stage, which reads
datasets.py, does not depend on evaluate.sets).
"""

from __future__ import annotations

from pathlib import Path

from .config import Config


def check_pipeline(cfg: Config, repo: str | Path = ".") -> None:
    """A target for the compare stage (grpo among train.methods, or train.target_accuracy), and
    every file of evaluate.sets readable, row by row. Both were found at the end: the evaluate
    stage named a missing set file after the shared stages and a whole training run, and compare
    refused methods without grpo after all of them had trained."""
    if "grpo" not in cfg.train.methods and cfg.train.target_accuracy is None:
        raise ValueError(f"train.methods: {cfg.train.methods} has no grpo, whose end point is the compare "
                         "stage's target; add grpo or set train.target_accuracy")
    from .heldout import evaluation_sets  # noqa: PLC0415

    evaluation_sets(cfg, repo)
