"""Live progress without Prefect: progress lines have one parseable form, `versioning.dvc`
streams a stage's output while the stage runs (and still fails with the output's tail), and a
flow's overrides leave the user's params.yaml as it was. The Prefect side (task logs and
progress artifacts on a real server) is in tests/test_deployments.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from dots import progress, versioning
from dots.config import ConfigError, load_config


def test_progress_lines_parse_back(capsys, monkeypatch):
    assert progress.parse(progress.line("train dots_rr", 40, 400, info="reward 0.300", seconds=12)) == \
        ("train dots_rr", 40, 400)
    assert progress.parse("label step20: 128/512 questions (25%)  3s") == ("label step20", 128, 512)
    for other in ("label: step20: never 50%, sometimes 40%", "fit-predictor: held-out Pearson 0.5",
                  "train grpo: final accuracy 0.3 (from 0.1) after 4 steps", "Running stage 'train@grpo':"):
        assert progress.parse(other) is None, other

    with progress.Progress("warm-up", 20) as bar:  # not a terminal here: plain lines, each tenth
        for step in range(1, 21):
            bar.update(step, loss=1.0 / step)
    lines = [progress.parse(x) for x in capsys.readouterr().out.splitlines()]
    assert all(lines) and [x[1] for x in lines] == list(range(1, 21, 2)) + [20]

    progress.report("evaluation", 5, 10, quiet_s=60)  # a short inner loop says nothing
    progress.report("evaluation", 10, 10, quiet_s=60)
    assert capsys.readouterr().out == ""
    progress.report("label final", 5, 10, quiet_s=0)
    progress.report("label final", 10, 10, quiet_s=0)
    assert [progress.parse(x) for x in capsys.readouterr().out.splitlines()] == \
        [("label final", 5, 10), ("label final", 10, 10)]


def _dvc_repo(path: Path, cmd: str) -> Path:
    """A DVC project (no git) with one always-running stage `slow` running `cmd`."""
    path.mkdir(parents=True)
    versioning.dvc(["init", "--no-scm", "-q"], path)
    (path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"slow": {"cmd": cmd, "always_changed": True}}}))
    return path


WAITS_FOR_GO = textwrap.dedent("""
    import pathlib, sys, time
    from dots.progress import line
    print(line("slow", 1, 2, unit="steps"), flush=True)
    print("waiting for go", flush=True)
    deadline = time.time() + 60
    while not pathlib.Path("go").exists():
        if time.time() > deadline:
            sys.exit("no go within 60 s: the caller did not see the line while the stage ran")
        time.sleep(0.05)
    print("stage done", flush=True)
""")


def test_dvc_streams_a_stage_line_by_line(tmp_path):
    (tmp_path / "stage.py").write_text(WAITS_FOR_GO)
    repo = _dvc_repo(tmp_path / "repo", f"{sys.executable} {tmp_path / 'stage.py'}")
    seen: list[tuple[float, str]] = []

    def on_line(text: str) -> None:
        seen.append((time.perf_counter(), text))
        if text == "waiting for go":
            (repo / "go").touch()  # the stage ends only once we have seen this line

    out = versioning.repro("slow", repo, on_line=on_line)
    texts = [t for _, t in seen]
    assert "waiting for go" in texts and "stage done" in texts, out
    assert texts.index("waiting for go") < texts.index("stage done")
    assert progress.parse(next(t for t in texts if t.startswith("slow:"))) == ("slow", 1, 2)
    assert "stage done" in out  # the whole output is still returned


def test_a_failing_stage_raises_with_the_tail_and_a_timeout_kills_it(tmp_path):
    repo = _dvc_repo(tmp_path / "repo", f"{sys.executable} -c \"print('boom here'); raise SystemExit(3)\"")
    lines: list[str] = []
    with pytest.raises(versioning.StageError, match="(?s)exit 255.*boom here.*exited with 3"):
        versioning.repro("slow", repo, on_line=lines.append)
    assert "boom here" in lines

    (tmp_path / "stage.py").write_text(WAITS_FOR_GO)  # never gets its file: killed by the timeout
    repo2 = _dvc_repo(tmp_path / "repo2", f"{sys.executable} {tmp_path / 'stage.py'}")
    start = time.perf_counter()
    with pytest.raises(subprocess.TimeoutExpired):
        versioning.dvc(["repro", "--single-item", "slow"], repo2, timeout=5)
    assert time.perf_counter() - start < 30  # the stage under dvc was killed too (it holds the pipe)


USER_PARAMS = b"# my notes: keep this comment and the layout\ntrain:\n  steps: 7      # seven\n  methods: [grpo, dots_rr]\n"


def test_overrides_apply_for_the_run_and_the_user_params_come_back(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_bytes(USER_PARAMS)
    with versioning.params_overridden(["train.steps=2", "train.methods=[grpo]"], tmp_path):
        cfg = load_config(params)
        assert cfg.train.steps == 2 and cfg.train.methods == ["grpo"]
    assert params.read_bytes() == USER_PARAMS

    with pytest.raises(RuntimeError, match="stage failed"), \
            versioning.params_overridden(["train.steps=3"], tmp_path):  # a failing run restores it too
        assert load_config(params).train.steps == 3
        raise RuntimeError("stage failed")
    assert params.read_bytes() == USER_PARAMS

    with pytest.raises(ConfigError, match="replay.delta"), \
            versioning.params_overridden(["replay.delta=2"], tmp_path):  # refused before the file is touched
        pass
    assert params.read_bytes() == USER_PARAMS

    with versioning.params_overridden(["train.steps=4"], tmp_path):  # the user edits it during the run
        params.write_bytes(USER_PARAMS.replace(b"steps: 7", b"steps: 9"))
    assert b"steps: 9" in params.read_bytes()  # their edit is kept, the original left beside it
    assert (tmp_path / "params.yaml.before-overrides").read_bytes() == USER_PARAMS
