"""The trained policy as the product: train@<method> exports a standard model folder, registers it
in the MLflow Model Registry (against a real `mlflow server`), evaluate@<method> scores it, and
compare writes time-to-target onto each method's own run and registered version."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dots import stages
from dots.checkpoints import load_checkpoint
from dots.models import load_policy

from .conftest import tiny_config

SHARED = ("data", "models", "embeddings", "labels", "predictor")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` (sqlite store, proxied artifacts) on a free port."""
    where = tmp_path_factory.mktemp("mlflow_server")
    port = _free_port()
    proc = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
                             f"sqlite:///{where / 'mlflow.db'}", "--artifacts-destination", str(where / "art"),
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited: {proc.stdout.read()}")
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2)
            break
        except Exception:  # noqa: BLE001  (not up yet)
            if time.time() > deadline:
                proc.kill()
                raise TimeoutError(f"mlflow server at {uri} did not answer in 180 s") from None
            time.sleep(0.5)
    yield uri
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def trained(tiny_pipeline, tmp_path_factory, mlflow_server):
    """grpo trained 3 steps in its own root (the shared stages copied from the tiny pipeline),
    tracked on the real server."""
    root = tmp_path_factory.mktemp("export") / "artifacts"
    for name in SHARED:
        shutil.copytree(tiny_pipeline.root / name, root / name)
    cfg = tiny_config(root, f"tracking.uri={mlflow_server}", "evaluate.samples=2")
    summary = stages.train(cfg, "grpo")
    return cfg, summary


def _greedy(model, tok, prompts: list[str]) -> list[str]:
    enc = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=10, do_sample=False, pad_token_id=tok.pad_token_id)
    return tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def test_exported_folder_loads_with_plain_transformers_and_answers_as_the_trainer(trained):
    cfg, _ = trained
    p = stages.paths(cfg)
    folder = p.model("grpo")
    assert {"config.json", "model.safetensors", "tokenizer.json", "dots.json"} <= {f.name for f in folder.iterdir()}
    exported = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    tok.padding_side = "left"
    # the trainer's final policy: the warm-up model with the final checkpoint's weights
    final, _ = load_policy(p.policy)
    final.load_state_dict(load_checkpoint(p.checkpoints("grpo"))["model"])
    final.eval()
    warm, _ = load_policy(p.policy)
    moved = any(not torch.equal(a, b) for a, b in zip(final.state_dict().values(), warm.state_dict().values()))
    assert moved, "training changed no weight: the comparison below would not test the export"
    for key, value in final.state_dict().items():
        assert torch.equal(exported.state_dict()[key], value), key
    prompts = [q.prompt for q in stages.load_data(cfg)[1][:16]]
    assert _greedy(exported, tok, prompts) == _greedy(final, tok, prompts)
    assert json.loads((folder / "dots.json").read_text())["method"] == "grpo"


def test_the_model_is_registered_once_with_its_tags_and_loads_from_the_registry(trained, mlflow_server, tmp_path):
    from mlflow.tracking import MlflowClient

    cfg, summary = trained
    client = MlflowClient(mlflow_server)
    versions = client.search_model_versions("name = 'dots-grpo'")
    assert len(versions) == 1
    v = versions[0]
    for tag in ("method", "data_version", "git_commit", "final_accuracy", "weights_sha256"):
        assert v.tags.get(tag), tag
    assert v.tags["method"] == "grpo" and float(v.tags["final_accuracy"]) == pytest.approx(summary["final_accuracy"])
    assert summary["registered_version"] == v.version
    # a retried stage (same run, same weights: the checkpoint is at the last step) registers no duplicate
    again = stages.train(cfg, "grpo")
    assert again["registered_version"] == v.version
    assert len(client.search_model_versions("name = 'dots-grpo'")) == 1
    # the documented way to load a registered version (docs/pipeline.md), in its own process: the
    # tracking URI in the environment, as a user sets it (mlflow.set_tracking_uri in this process
    # would export it to every later test's stage processes)
    script = ("import mlflow, sys\n"
              "from transformers import AutoModelForCausalLM\n"
              "path = mlflow.artifacts.download_artifacts(artifact_uri='models:/dots-grpo/1', dst_path=sys.argv[1])\n"
              "AutoModelForCausalLM.from_pretrained(path)\n"
              "print(path)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MLFLOW_TRACKING_URI": mlflow_server, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    model = AutoModelForCausalLM.from_pretrained(proc.stdout.strip().splitlines()[-1])
    exported = AutoModelForCausalLM.from_pretrained(stages.paths(cfg).model("grpo"))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), exported.state_dict().values()))


def test_evaluate_stage_scores_the_export_and_compare_writes_time_to_target_per_run(trained, mlflow_server):
    from mlflow.tracking import MlflowClient

    cfg, summary = trained
    out = stages.evaluate(cfg, "grpo")
    task = out["heldout"]["task"]
    assert task["questions"] == cfg.task.eval_size
    for key in ("greedy_accuracy", "pass@2", "mean@2"):
        assert 0.0 <= task[key] <= 1.0, key
    assert task["pass@2"] >= task["mean@2"]  # solved by one of two samples >= mean of the two
    written = json.loads(stages.paths(cfg).evaluation("grpo").read_text())
    assert written["heldout"]["task"]["greedy_accuracy"] == task["greedy_accuracy"]
    client = MlflowClient(mlflow_server)
    run_id = client.search_model_versions("name = 'dots-grpo'")[0].run_id
    metrics = client.get_run(run_id).data.metrics
    assert metrics["heldout/task/greedy_accuracy"] == pytest.approx(task["greedy_accuracy"])
    assert metrics["heldout/task/mean_at_2"] == pytest.approx(task["mean@2"])
    assert metrics["heldout/task/pass_at_2"] == pytest.approx(task["pass@2"])

    comparison = stages.compare(cfg, ["grpo"])
    row = comparison["rows"][0]
    assert row["heldout"]["heldout/task/greedy_accuracy"] == pytest.approx(task["greedy_accuracy"])
    run = client.get_run(run_id)
    assert run.data.metrics["target_accuracy"] == pytest.approx(comparison["target_accuracy"])
    assert run.data.metrics["time_to_target_s"] == pytest.approx(row["time_to_target_s"])  # grpo reaches its own
    assert run.data.metrics["steps_to_target"] == row["steps_to_target"]
    assert run.data.tags["reached_target"] == "true"
    version = client.search_model_versions("name = 'dots-grpo'")[0]
    assert float(version.tags["time_to_target_s"]) == pytest.approx(row["time_to_target_s"])


def test_evaluate_names_the_questions_of_an_extra_set_that_are_also_in_the_pool(trained, tmp_path, capsys):
    """An extra held-out set made elsewhere can share questions with the training pool (MATH500 beside a
    pool of MATH problems): the stage says how many and which, and the results keep their ids."""
    from dots.config import HeldoutSet

    cfg, _ = trained
    pool, held = stages.load_data(cfg)
    # three pool questions (one space more: the same question) and two of the task's held-out set
    rows = [{"q": " " + q.prompt, "a": q.answer, "i": 900 + k} for k, q in enumerate(pool[:3])]
    rows += [{"q": q.prompt, "a": q.answer, "i": 950 + k} for k, q in enumerate(held[:2])]
    (tmp_path / "extra.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    extra = HeldoutSet(name="extra", path=str(tmp_path / "extra.jsonl"), question="q", answer="a", id="i")
    cfg = cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update={"sets": [extra], "samples": 0}),
                                 "tracking": cfg.tracking.model_copy(update={"enabled": False})})
    out = stages.evaluate(cfg, "grpo")
    assert out["heldout"]["extra"]["in_pool"] == [900, 901, 902] and out["heldout"]["extra"]["questions"] == 5
    assert "in_pool" not in out["heldout"]["task"]  # the task's own held-out set never is
    assert ("evaluate: extra: 3 of 5 questions are also in the training pool (ids 900, 901, 902): their "
            "scores are not held out") in capsys.readouterr().out


def test_evaluate_scores_a_set_as_its_file_has_it_naming_repeats_and_conflicts(trained, tmp_path, capsys):
    """A benchmark file is scored row by row, so that its score compares with those published on it; a
    repeated question (counted twice) and one whose rows' ground truths conflict (every answer scored
    wrong against one label) are named on a line and kept in the results."""
    from dots.config import HeldoutSet

    cfg, _ = trained
    _, held = stages.load_data(cfg)
    a, b = held[0], held[1]
    rows = [{"q": a.prompt, "a": a.answer, "i": 10}, {"q": b.prompt, "a": b.answer, "i": 11},
            {"q": a.prompt + " ", "a": a.answer, "i": 12}, {"q": b.prompt, "a": b.answer + "9", "i": 13}]
    (tmp_path / "extra.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    extra = HeldoutSet(name="extra", path=str(tmp_path / "extra.jsonl"), question="q", answer="a", id="i")
    cfg = cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update={"sets": [extra], "samples": 0}),
                                 "tracking": cfg.tracking.model_copy(update={"enabled": False})})
    out = stages.evaluate(cfg, "grpo")["heldout"]
    assert out["extra"]["questions"] == 4
    assert (out["extra"]["repeats"], out["extra"]["conflicting"]) == ([12, 13], [11])
    assert not {"repeats", "conflicting", "in_pool"} & set(out["task"])
    assert ("evaluate: extra: 2 rows (ids 12, 13) repeating an earlier row's question; 1 question whose rows "
            "give ground truths that exact_match does not take for one answer (first rows' ids 11): "
            "scored as the file has them") in capsys.readouterr().out


def test_dots_evaluate_data_names_the_questions_also_in_the_workspace_pool(tiny_pipeline, tmp_path, capsys):
    """`dots evaluate --data FILE` in a prepared workspace: the file's questions that are also in its
    training pool are named before the model loads, and listed in the JSON (`in_pool`)."""
    from dots.cli import main

    from .conftest import default_params, tiny_overrides

    pool, _ = stages.load_data(tiny_config(tiny_pipeline.root))
    rows = [{"q": pool[5].prompt, "a": pool[5].answer, "i": 0}, {"q": "1+2+3+4=", "a": "01", "i": 1},
            {"q": "1+2+3+4=", "a": "01", "i": 2}]  # a repeat, scored as the file has it
    data = tmp_path / "mixed.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["evaluate", "-p", default_params(tmp_path), "--data", str(data), "--question", "q",
            "--answer", "a", "--id", "i"]
    for o in tiny_overrides(tiny_pipeline.root):
        argv += ["-S", o]
    assert main(argv) == 0
    out = capsys.readouterr().out
    said = "evaluate: mixed.jsonl: 1 of 3 questions are also in the training pool (ids 0): their scores"
    assert said in out
    assert "evaluate: mixed.jsonl: 1 row (ids 2) repeating an earlier row's question: scored as" in out
    result = json.loads(out[out.index("{"):])
    assert (result["in_pool"], result["repeats"], result["questions"]) == ([0], [2], 3)
    assert "conflicting" not in result


def test_evaluate_data_where_prepare_has_not_run_makes_the_pool_as_it_would(tiny_pipeline, tmp_path, capsys):
    """An exported policy evaluated in another checkout, where prepare has not run: the training pool is
    made as prepare makes it (nothing written), so a question trained on is still named; before, the
    check was skipped without a word. A training dataset that cannot be read there is one line, and the
    set is still scored."""
    from dots.cli import main

    from .conftest import default_params, tiny_overrides

    pool, _ = stages.load_data(tiny_config(tiny_pipeline.root))
    rows = [{"q": "1+2+3+4=", "a": "01", "i": 0}, {"q": pool[7].prompt, "a": pool[7].answer, "i": 1}]
    data = tmp_path / "set.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elsewhere = tmp_path / "elsewhere" / "artifacts"
    argv = ["evaluate", "-p", default_params(tmp_path), "--data", str(data), "--question", "q",
            "--answer", "a", "--id", "i", "--policy", str(stages.paths(tiny_pipeline).policy)]
    for o in tiny_overrides(elsewhere):  # the same task under another root
        argv += ["-S", o]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert ("is not there (prepare has not run in this workspace): making the training pool from the "
            "synthetic task as prepare would") in out
    assert "evaluate: set.jsonl: 1 of 2 questions are also in the training pool (ids 1): their scores" in out
    assert json.loads(out[out.index("{"):])["in_pool"] == [1]
    assert not (elsewhere / "data").exists()
    gone = tmp_path / "gone.jsonl"
    assert main(argv + ["-S", "task.source=dataset", "-S", f"task.dataset.path={gone}"]) == 0
    out = capsys.readouterr().out
    assert f"evaluate: task.dataset {gone}: cannot be read here (" in out
    assert "so the set is not checked against the training pool" in out
    result = json.loads(out[out.index("{"):])
    assert "in_pool" not in result and result["questions"] == 2 and "greedy_accuracy" in result


def _evaluate_argv(tiny_pipeline, tmp_path, rows, *extra):
    from .conftest import default_params, tiny_overrides

    data = tmp_path / "set.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["evaluate", "-p", default_params(tmp_path), "--data", str(data), "--question", "q",
            "--answer", "a", "--id", "i", "--policy", str(stages.paths(tiny_pipeline).policy), *extra]
    for o in tiny_overrides(tiny_pipeline.root):
        argv += ["-S", o]
    return argv


def test_dots_evaluate_scores_the_checkpoint_file_it_names(tiny_pipeline, tmp_path, capsys, monkeypatch):
    """`--checkpoint FILE.pt` loaded its folder's checkpoint.pt: the JSON named a set-aside file
    and reported another's step. Another model's weights were a traceback of every key; a missing
    checkpoint was named after the policy had loaded (on a GPU profile, a 1.5B model)."""
    import torch

    from dots import heldout
    from dots.cli import main
    from dots.models import load_policy

    weights = load_policy(stages.paths(tiny_pipeline).policy)[0].state_dict()
    folder = tmp_path / "ck"
    folder.mkdir()
    torch.save({"model": weights, "step": 4}, folder / "checkpoint.pt")
    torch.save({"model": weights, "step": 2}, folder / "checkpoint.0123456789abcdef.step2.pt")
    torch.save({"model": {"wte.weight": torch.zeros(3, 3)}, "step": 1}, tmp_path / "other.pt")
    argv = _evaluate_argv(tiny_pipeline, tmp_path, [{"q": "1+2=", "a": "3", "i": 0}])
    for named, step in ((folder / "checkpoint.0123456789abcdef.step2.pt", 2), (folder, 4)):
        assert main(argv + ["--checkpoint", str(named)]) == 0
        out = capsys.readouterr().out
        assert json.loads(out[out.index("{"):])["step"] == step
    assert main(argv + ["--checkpoint", str(tmp_path / "other.pt")]) == 1
    err = capsys.readouterr().err
    assert f"--checkpoint {tmp_path / 'other.pt'}: its weights are not " in err and "Traceback" not in err
    loaded = []
    monkeypatch.setattr(heldout, "load_policy", lambda *a, **k: loaded.append(a))
    assert main(argv + ["--checkpoint", str(tmp_path / "none")]) == 1
    assert f"--checkpoint {tmp_path / 'none'}: no training checkpoint here" in capsys.readouterr().err
    assert loaded == []


def test_dots_evaluate_can_drop_the_rows_its_reward_cannot_read(tiny_pipeline, tmp_path, capsys):
    """The refusal said to set `unparseable: drop` in the dataset spec, which `dots evaluate --data`
    has none of (its -S task.dataset.unparseable was accepted and did nothing)."""
    from dots.cli import main

    rows = [{"q": "1+2=", "a": "3", "i": 0}, {"q": "2+2=", "a": "null", "i": 1}]
    argv = _evaluate_argv(tiny_pipeline, tmp_path, rows)
    assert main(argv) == 1
    assert "--unparseable drop for `dots evaluate --data`" in capsys.readouterr().err
    assert main(argv + ["--unparseable", "drop"]) == 0
    out = capsys.readouterr().out
    assert "dropped 1 row" in out and json.loads(out[out.index("{"):])["questions"] == 1


def test_evaluate_refuses_a_method_without_an_export(trained):
    cfg, _ = trained
    with pytest.raises(FileNotFoundError, match="dots train --method dots"):
        stages.evaluate(cfg, "dots")


def test_evaluate_refuses_a_set_whose_prompts_overrun_the_policy_before_any_rollout(tiny_pipeline, tmp_path,
                                                                                      capsys):
    """The embedded GPT-2 holds 64 positions; a math set's long prompts crashed inside its position
    embedding. Now the set is refused naming how many prompts, the first one's id and length."""
    from dots.cli import main

    from .conftest import default_params, tiny_overrides

    data = tmp_path / "long.jsonl"
    rows = [{"q": "1+2=", "a": "3", "i": 0}, {"q": "1+" * 40 + "1=", "a": "41", "i": 7}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["evaluate", "-p", default_params(tmp_path), "--data", str(data), "--question", "q",
            "--answer", "a", "--id", "i"]
    for o in tiny_overrides(tiny_pipeline.root):
        argv += ["-S", o]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "long.jsonl: 1 of 2 prompts do not fit the policy's 64 positions with rollout.max_new_tokens=" in err
    assert "(the first: id 7, 83 prompt tokens)" in err and "IndexError" not in err
