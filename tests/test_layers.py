"""The modules form layers: no import cycles (lazy imports count), no dead helpers, no unused
imports or undefined names, and the config's defaults are the embedded default that params.yaml ships."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from dots.config import Config, load_config

from .import_graph import ROOT, cycles, graph


def test_the_import_graph_is_read_from_the_source():
    g = graph()
    assert "rollout" in g["trainer"] and "config" in g["data"]  # a module-level import
    assert "rollout_vllm" in g["engines"]  # an import inside a function counts too


def test_dots_modules_have_no_import_cycle():
    assert cycles() == [], f"import cycles among dots modules: {cycles()}"


def test_rollout_engine_layers():
    """HF rollouts and Group sit below the loss; only dots.engines knows vLLM's engine."""
    g = graph()
    assert "rollout_vllm" not in g["rollout"]
    assert {m for m, deps in g.items() if "rollout_vllm" in deps} == {"engines"}


def test_config_defaults_are_the_shipped_params():
    """A Config built in code (tests, notebooks) is the run `make run` does, key for key."""
    shipped = load_config(ROOT / "params.yaml").model_dump()
    defaults = Config().model_dump()
    differ = {k for k in shipped if shipped[k] != defaults[k]}
    assert not differ, f"Config defaults differ from params.yaml in sections {sorted(differ)}"
    shipped_train = yaml.safe_load((ROOT / "params.yaml").read_text())["train"]
    assert shipped_train["lr"] == Config().train.lr
    assert shipped_train["lr_by_method"] == Config().train.lr_by_method
    assert shipped_train["downsample"] == Config().train.downsample
    assert shipped_train["downsample_by_method"] == Config().train.downsample_by_method
    shipped_replay = yaml.safe_load((ROOT / "params.yaml").read_text())["replay"]
    assert shipped_replay["delta"] == Config().replay.delta
    assert shipped_replay["delta_by_method"] == Config().replay.delta_by_method


def test_no_unused_imports_or_variables_and_no_undefined_names():
    """pyflakes' checks (through ruff, the dev extra's linter): an unused import or variable is dead
    code, an undefined name a crash waiting on its branch. Four had crept in unseen before this ran
    with the suite. A fixed list of codes, so a newer ruff's new rules cannot turn the suite red."""
    pytest.importorskip("ruff")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           "--select", "F401,F811,F821,F823,F841,E9", "dots", "flows", "tasks", "tests", "scripts"],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
