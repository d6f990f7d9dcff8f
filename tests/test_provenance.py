"""Which code a checkpoint, a bench run and an embedding cache are valid for (`dots.provenance`).

The identity of each part is read from the package's imports: an edit to a module the part can
run makes it another part (a killed run starts over, a bench trains again, `dots embed` embeds
again); an edit to a module it never runs (the bench's report, MLflow logging, the CLI) leaves it
as it was (until stop 68 the identity was the whole package: an edit to the bench's table made a
bench train every run again, 27 minutes here). The coverage tests make a module a stage comes to
reach either part of its identity or named below as one that decides nothing about its results.
"""

from __future__ import annotations

import shutil

import pytest

from dots import provenance

from .import_graph import ROOT
from .test_lineage import reached

# Modules a stage's code reaches that decide nothing about what it produces, and why.
NOT_RESULTS = {
    "cli": "parses the command line and calls a stage; what it passes on is the config, keyed apart",
    "tracking": "reports a run to MLflow; where results are logged, not what they are",
    "versioning": "wraps DVC's commands for the flows and the tracking tags",
    "memory_plan": "refuses, before it starts, a run that would not fit the device; trains nothing",
}
SHARED_STAGES = ("prepare", "run_warmup", "embed", "label", "fit")


@pytest.fixture()
def package(tmp_path):
    """A copy of the package's source to edit."""
    copy = tmp_path / "dots"
    shutil.copytree(ROOT / "dots", copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _identities(package) -> dict[str, str]:
    provenance.module_graph.cache_clear()
    provenance.module_hashes.cache_clear()
    return {part: provenance.code_identity(part, package) for part in provenance.PARTS}


def _edit(package, module: str) -> None:
    with (package / f"{module}.py").open("a") as f:
        f.write("\n# an edit\n")


@pytest.mark.parametrize("module, moves", [
    ("update", {"training", "bench run"}),  # the trainer imports it at the top
    ("rollout_vllm", {"training", "bench shared stages", "bench run"}),  # imported inside a function
    ("stages", set(provenance.PARTS)),  # sets every part up
    ("warmup", {"bench shared stages", "bench run"}),  # the pipeline's checkpoints hash the policy it makes
    ("models", set(provenance.PARTS)),
    ("embeddings", set(provenance.PARTS)),
    ("bench", {"bench shared stages", "bench run"}),
    ("bench_table", set()), ("bench_summary", set()), ("plots", set()), ("tracking", set()), ("cli", set()),
])
def test_an_edit_moves_the_identity_of_the_parts_that_run_the_module(package, module, moves):
    before = _identities(package)
    _edit(package, module)
    after = _identities(package)
    try:
        assert {part for part in before if before[part] != after[part]} == moves
        named = provenance.changed_modules(provenance.module_hashes.__wrapped__("training", ROOT / "dots"),
                                           provenance.module_hashes.__wrapped__("training", package))
        assert named == ([f"{module}.py"] if "training" in moves else [])
    finally:
        provenance.module_graph.cache_clear()
        provenance.module_hashes.cache_clear()


def test_changed_modules_names_added_and_removed_files_and_nothing_when_unrecorded():
    mine = {"a.py": "1", "b.py": "2"}
    assert provenance.changed_modules({"a.py": "1", "c.py": "3"}, mine) == ["b.py", "c.py"]
    assert provenance.changed_modules(mine, mine) == []
    assert provenance.changed_modules(None, mine) == []  # a checkpoint from before stop 68


def _stage_modules(*functions: str) -> set[str]:
    return set().union(*(reached(f)[0] for f in functions)) - set(NOT_RESULTS)


def test_training_identity_covers_what_a_training_runs():
    """Everything `dots train` and the bench's lockstep training reach, through stages.py."""
    assert _stage_modules("train", "train_lockstep") <= provenance.part_modules("training")


def test_the_embedding_cache_identity_covers_what_the_embed_stage_runs():
    assert _stage_modules("embed") <= provenance.part_modules("embeddings")


def test_the_bench_identities_cover_its_shared_stages_and_its_runs():
    """A bench run is read back only by its code's identity: the code of the shared stages that
    made its policy, data and predictor counts as much as the trainer's."""
    shared = _stage_modules(*SHARED_STAGES, "run_shared") | {"bench"}
    assert shared <= provenance.part_modules("bench shared stages")
    assert shared | _stage_modules("train_lockstep") <= provenance.part_modules("bench run")


def test_the_report_modules_stay_out_of_every_identity():
    """What the parts leave out is what makes an edit to the report cheap: if one of these came to
    be imported by training, the coverage tests above would take it in, and this names the cost."""
    report = {"bench_table", "bench_summary", "bench_goals", "bench_diff", "plots", "machine_load",
              "time_split", "pipeline_status", "tracking", "cli"}
    for part in provenance.PARTS:
        assert not report & provenance.part_modules(part), part
