"""`dots all` end to end through the installed console script, on a very small config."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .conftest import REPO

SMALL = [
    "task.pool_size=512", "task.eval_size=64",
    "model.n_layer=1", "model.n_embd=32", "model.n_head=2",
    "warmup.steps=40", "warmup.checkpoints=[20]", "warmup.batch_size=64", "warmup.spectrum_questions=64",
    "label.policies=[step20, final]", "label.num_questions=128",
    "predictor.steps=20", "predictor.batch_size=32", "predictor.hidden=16",
    "selection.ref_size=16", "train.batch_size=8", "train.steps=4", "train.checkpoint_every=2",
    "eval.every=2", "eval.batch_size=64", "eval.probe_size=16", "rollout.batch_size=256", "rollout.group_size=4",
    "train.methods=[grpo, dots_rr]",
]


def _command() -> list[str]:
    script = Path(sys.executable).parent / "dots"
    if script.exists():
        return [str(script)]
    found = shutil.which("dots")
    if found:
        return [found]
    return [sys.executable, "-c", "from dots.cli import main; raise SystemExit(main())"]


def _run(args, cwd):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run(_command() + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_dots_all_end_to_end(tmp_path):
    root = tmp_path / "artifacts"
    args = ["all", "-p", str(REPO / "params.yaml")]
    for o in SMALL + [f"paths.root={root}"]:
        args += ["-S", o]
    proc = _run(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "time-to-target" in proc.stdout
    assert "| grpo |" in proc.stdout and "| dots_rr |" in proc.stdout
    comparison = json.loads((root / "compare" / "comparison.json").read_text())
    assert [r["method"] for r in comparison["rows"]] == ["grpo", "dots_rr"]
    assert "target_accuracy" in comparison
    # the target is grpo's smoothed end point: the mean of its last eval.smooth (3) evaluations
    grpo_evals = json.loads((root / "runs" / "grpo" / "evals.json").read_text())
    assert [e["step"] for e in grpo_evals] == [0, 2, 4]
    last3 = sum(e["accuracy"] for e in grpo_evals[-3:]) / 3
    assert comparison["target_accuracy"] == pytest.approx(last3)
    # beside the ratio, as the bench pairs them: the end point and the accuracy at equal seconds, minus grpo's
    rows = {r["method"]: r for r in comparison["rows"]}
    mine_evals = json.loads((root / "runs" / "dots_rr" / "evals.json").read_text())
    end = sum(e["accuracy"] for e in mine_evals[-3:]) / 3
    assert rows["dots_rr"]["end_point_diff"] == pytest.approx(end - last3)
    assert rows["grpo"]["end_point_diff"] == 0.0 and rows["grpo"]["equal_time_diff"] == 0.0
    seconds = min(grpo_evals[-1]["elapsed_s"], mine_evals[-1]["elapsed_s"])  # the shorter run's last second

    def at(evals, t):  # the smoothed curve (trailing mean of 3) read at t, straight between evaluations
        curve = [sum(e["accuracy"] for e in evals[max(0, i - 2): i + 1]) / len(evals[max(0, i - 2): i + 1])
                 for i in range(len(evals))]
        return float(np.interp(t, [e["elapsed_s"] for e in evals], curve))
    expected = at(mine_evals, seconds) - at(grpo_evals, seconds)
    assert rows["dots_rr"]["equal_time_diff"] == pytest.approx(expected)
    assert "| end point − grpo | at equal time − grpo |" in proc.stdout
    grpo_summary = json.loads((root / "runs" / "grpo" / "summary.json").read_text())
    assert grpo_summary["final_accuracy_smoothed"] == pytest.approx(last3)
    for key in ("tokens/sampled_total", "tokens/trained_total", "train/groups_trained_total"):
        assert grpo_summary[key] is not None and grpo_summary[key] >= 0, key
    assert grpo_summary["tokens/sampled_total"] > 0
    for method in ("grpo", "dots_rr"):
        run = root / "runs" / method
        records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
        assert len(records) == 4
        assert json.loads((run / "summary.json").read_text())["steps"] == 4
    for path in ("data/pool.jsonl", "data/eval.jsonl", "models/warmup/final/config.json",
                 "models/warmup/step20/config.json", "embeddings/pool.pt", "labels/labels.json",
                 "predictor/predictor.pt", "predictor/metrics.json", "compare/table.md"):
        assert (root / path).exists(), path


def test_console_script_refuses_bad_value(tmp_path):
    root = tmp_path / "artifacts"
    proc = _run(["prepare", "-p", str(REPO / "params.yaml"), "-S", f"paths.root={root}",
                 "-S", "rollout.group_size=1"], cwd=tmp_path)
    assert proc.returncode == 2
    assert "rollout.group_size" in proc.stderr
    assert not root.exists()


@pytest.mark.parametrize("case", ["no grpo", "a missing evaluation set", "a bad evaluation row"])
def test_dots_all_refuses_what_its_last_stages_need_before_the_first(tmp_path, capsys, case):
    """compare refused methods without grpo, and the evaluate stage a missing or bad evaluate.sets
    file, after the shared stages and every training run; `dots all` (and the pipeline flow) now
    checks them before prepare writes anything."""
    from dots.cli import main

    root = tmp_path / "artifacts"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"q": "1+1=", "a": "2", "i": 0}\n{"q": "", "a": "3", "i": 1}\n')
    extra, said = {
        "no grpo": (["train.methods=[dots_rr]"], "train.methods: ['dots_rr'] has no grpo"),
        "a missing evaluation set": ([f"evaluate.sets=[{{name: m, path: {tmp_path / 'gone.jsonl'}}}]"],
                                     f"{tmp_path / 'gone.jsonl'}"),
        "a bad evaluation row": ([f"evaluate.sets=[{{name: m, path: {bad}, question: q, answer: a, id: i}}]"],
                                 "bad.jsonl row 1 (id 1"),
    }[case]
    argv = ["all", "-p", str(REPO / "params.yaml")]
    for o in SMALL + [f"paths.root={root}", "tracking.enabled=false", *extra]:
        argv += ["-S", o]
    assert main(argv) == 1
    assert said in capsys.readouterr().err
    assert not (root / "data").exists()  # prepare never ran
    if case == "no grpo":  # a target given instead: a comparison without grpo is fine
        from dots.pipeline_inputs import check_pipeline
        from dots.config import load_config

        check_pipeline(load_config(None, ["train.methods=[dots_rr]", "train.target_accuracy=0.3"]))


def test_a_rollout_longer_than_the_model_is_refused_before_the_warm_up_trains(tmp_path, capsys):
    """max_new_tokens beside the longest prompt overran model.n_positions: the rollout said so after
    the whole warm-up had trained and saved its checkpoints."""
    from dots.cli import main

    root = tmp_path / "artifacts"
    argv = ["all", "-p", str(REPO / "params.yaml")]
    for o in SMALL + [f"paths.root={root}", "tracking.enabled=false", "rollout.max_new_tokens=60"]:
        argv += ["-S", o]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "rollout.max_new_tokens: 60 beside the task's longest prompt (" in err
    assert "model.n_positions (64)" in err
    assert not (root / "models").exists()

