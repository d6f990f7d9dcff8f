"""DVC lineage is complete: every stage in dvc.yaml lists, as deps, each dots module its code
can run (the stage function in dots/stages.py, what it calls there, and everything those
import, transitively, lazy imports included) and, as params, each params section or key that
code reads. A stage whose list misses one would not re-run after a change that moves its
results (the README once recorded a fast_decode change that `dvc repro` did not retrain for).
"""

from __future__ import annotations

import ast
from functools import cache

import yaml

from dots.config import Config

from .import_graph import PACKAGE, ROOT, closure

# dvc.yaml stage -> its function in dots/stages.py (what `dots <command>` runs).
STAGE_FUNCTIONS = {"prepare": "prepare", "warmup": "run_warmup", "embed": "embed", "label": "label",
                   "fit_predictor": "fit", "train": "train", "evaluate": "evaluate", "compare": "compare"}
# Every stage runs through the CLI, which validates params.yaml with the config module and calls
# a function of dots/stages.py: these files are deps of every stage. Only what the stage
# function reaches is followed further (stages.py imports the trainer for the train stage alone).
ENTRY_MODULES = {"cli", "config", "stages"}
SECTIONS = set(Config.model_fields)
# Sections that decide where results go or where they are reported, not what they are.
NOT_RESULTS = {"paths", "tracking"}
# Set by the stage's command line (`dots train --method ${item}`), not read from params.yaml.
FROM_COMMAND = {"train.method"}
# Config methods, by the params they read.
DERIVED = {"train.rate_for": {"train.lr", "train.lr_by_method"},
           "train.downsample_for": {"train.downsample", "train.downsample_by_method"},
           "replay.delta_for": {"replay.delta", "replay.delta_by_method"}}


def _dvc_stages() -> dict:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def _entry(stage: dict) -> dict:
    return stage.get("do", stage)  # a foreach stage's template


@cache
def _stages_module() -> tuple[dict[str, ast.AST], dict[str, str]]:
    """(top-level functions and classes of stages.py by name, {imported name: dots module})."""
    tree = ast.parse((PACKAGE / "stages.py").read_text())
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    imported: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            for a in node.names:
                imported[a.asname or a.name] = node.module or a.name
    return defs, imported


def _lazy_imports(node: ast.AST) -> set[str]:
    return {(n.module or n.names[0].name).split(".")[0] for n in ast.walk(node)
            if isinstance(n, ast.ImportFrom) and n.level == 1}


def reached(function: str) -> tuple[set[str], list[ast.AST]]:
    """(dots modules a stage function can run, the stages.py definitions it reaches)."""
    defs, imported = _stages_module()
    modules, seen, todo = {"config"}, set(), [function]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        node = defs[name]
        modules |= _lazy_imports(node)
        for n in ast.walk(node):
            ref = n.id if isinstance(n, ast.Name) else None
            if ref in defs:
                todo.append(ref)
            elif ref in imported:
                modules.add(imported[ref].split(".")[0])
    out = set(ENTRY_MODULES)
    for m in modules:
        out |= closure(m)
    return out, [defs[n] for n in seen]


def _is_config(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id in ("cfg", "config")) or \
        (isinstance(node, ast.Attribute) and node.attr == "cfg")


def params_read(trees: list[ast.AST]) -> set[str]:
    """`section.key` for each `cfg.section.key` read, `section` where the section is passed whole."""
    out = set()
    for tree in trees:
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and n.attr in SECTIONS and _is_config(n.value):
                parent = parents.get(n)
                out.add(f"{n.attr}.{parent.attr}" if isinstance(parent, ast.Attribute) else n.attr)
    out = set().union(*(DERIVED.get(p, {p}) for p in out))
    return {p for p in out if p.split(".")[0] not in NOT_RESULTS and p not in FROM_COMMAND}


def stage_needs(stage: str) -> tuple[set[str], set[str]]:
    """(dots/<module>.py files, params) that a stage's code depends on."""
    modules, stage_defs = reached(STAGE_FUNCTIONS[stage])
    # The config module's validators only refuse, and the CLI only dispatches (`dots all` reads
    # train.methods, but no stage runs `dots all`): the sections they read are not results.
    trees = stage_defs + [ast.parse((PACKAGE / f"{m}.py").read_text()) for m in modules - {"stages", "config", "cli"}]
    return {f"dots/{m}.py" for m in modules}, params_read(trees)


def _covered(param: str, listed: list[str]) -> bool:
    return any(param == p or param.startswith(p + ".") for p in listed)


def test_every_dvc_stage_has_a_known_function():
    assert set(_dvc_stages()) <= set(STAGE_FUNCTIONS), "map a new dvc.yaml stage to its dots/stages.py function"
    defs, _ = _stages_module()
    assert all(fn in defs for s, fn in STAGE_FUNCTIONS.items() if s in _dvc_stages())


def test_the_analysis_sees_what_a_stage_runs():
    """Guards the analysis itself: known facts about the train and prepare stages."""
    files, params = stage_needs("train")
    assert {"dots/trainer.py", "dots/fast_decode.py", "dots/rewards.py", "dots/rollout.py"} <= files
    assert {"selection.tau", "replay.capacity", "reward.timeout_s"} & params
    files, params = stage_needs("prepare")
    assert "dots/trainer.py" not in files and "selection.tau" not in params and "task.tiers" in params
    assert not _covered("selection.tau", ["selection.ref_size"]) and _covered("selection.tau", ["selection"])


def test_dvc_stages_list_every_module_and_param_their_code_reads():
    problems = []
    for name, stage in _dvc_stages().items():
        entry = _entry(stage)
        files, params = stage_needs(name)
        missing_files = sorted(files - set(entry.get("deps", [])))
        missing_params = sorted(p for p in params if not _covered(p, entry.get("params", [])))
        if missing_files:
            problems.append(f"{name}: deps lack {missing_files}")
        if missing_params:
            problems.append(f"{name}: params lack {missing_params}")
    assert not problems, "dvc.yaml lineage is incomplete:\n" + "\n".join(problems)


def test_every_listed_param_is_in_params_yaml():
    """DVC reads listed params from params.yaml: a key that only has a code default there would be
    tracked as missing, so params.yaml spells out every key a stage lists."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    missing = []
    for name, stage in _dvc_stages().items():
        for key in _entry(stage).get("params", []):
            node = params
            for part in key.split("."):
                if not isinstance(node, dict) or part not in node:
                    missing.append(f"{name}: {key}")
                    break
                node = node[part]
    assert not missing, f"params.yaml lacks keys that dvc.yaml lists: {missing}"
