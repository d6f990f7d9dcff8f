"""`scripts/gpu_check.sh` is run on a lent GPU machine whose image holds PyTorch, transformers,
numpy, scipy, pyarrow, rich and the like, but none of the project's services (a session's
15 device minutes cannot install them: nothing is reachable there). A change that made the
training path import MLflow, Prefect or DVC, or that renamed a key the script overrides,
would surface only there, after the machine's minutes-long start. This runs the script's own
`dots all` command line on the CPU, in a process where the packages the image lacks cannot be
imported, with the sizes shrunk by later overrides (the last `-S` of a key wins), and checks
the figures the script prints at the end are in each run's summary; and the script's first
step, the memory probe, for one small configuration with the same switches (activation
checkpointing, chunked log-probs, a rollout) on the CPU."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
# In pyproject's dependencies, not in the lent image's package list (/work/.library/device/KINDS.md);
# pydantic, the other one, the script installs from carried wheels.
NOT_ON_THE_IMAGE = ("mlflow", "prefect", "dvc", "dvc_s3", "boto3", "botocore", "math_verify",
                    "latex2sympy2_extended", "datasets")
BLOCKER = f'''
import importlib.abc, sys
MISSING = {set(NOT_ON_THE_IMAGE)!r}
class NotOnTheImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in MISSING:
            raise ImportError(f"{{name}} is not on the GPU machine's image")
        return None
sys.meta_path.insert(0, NotOnTheImage())
'''
# what makes the script's run a CPU one of seconds (its own sizes are for a GPU)
ON_THE_CPU = ["train.device=cpu", "model.dtype=float32", "train.deterministic=true", "warmup.steps=40",
              "warmup.checkpoints=[20,30]", "label.policies=[step20,step30,final]", "label.num_questions=128",
              "task.pool_size=1024", "task.eval_size=32", "eval.probe_size=32", "train.steps=4",
              "eval.every=2", "predictor.steps=50", "train.micro_batch_tokens=512"]


def script_overrides() -> list[str]:
    """The `-S` overrides of the script's `dots.cli all` command, its line continuations joined."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if "-m dots.cli all" in ln)
    words = shlex.split(line.split("-m dots.cli all", 1)[1].split('"$@"')[0])
    return [value for flag, value in zip(words, words[1:]) if flag == "-S"]


def test_the_scripts_own_overrides_make_a_valid_config():
    """Its sizes as the GPU run has them (the run below replaces some with CPU ones)."""
    from dots.config import load_config

    overrides = script_overrides()
    keys = [o.split("=", 1)[0] for o in overrides]
    assert {"paths.root", "train.device", "model.dtype", "train.micro_batch_tokens",
            "train.methods"} <= set(keys)
    cfg = load_config(ROOT / "params.yaml", overrides)
    assert cfg.train.device == "cuda" and cfg.train.micro_batch_tokens == 4096


def image_env(tmp_path) -> dict:
    """The environment of a process where the packages the image lacks cannot be imported."""
    blocker = tmp_path / "blocker"
    blocker.mkdir(exist_ok=True)
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), str(ROOT)]), "HF_HUB_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    refused = subprocess.run([sys.executable, "-c", "import mlflow"], env=env, capture_output=True, text=True)
    assert refused.returncode != 0 and "not on the GPU machine's image" in refused.stderr  # the blocker works
    return env


def test_the_memory_probe_runs_without_the_packages_the_gpu_image_lacks(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "memory_probe.py"), "--one", "--groups", "2",
                          "--group-size", "4", "--prompt", "16", "--response", "24", "--budget", "256",
                          "--chunk", "64", "--checkpointing", "--rollout", "8"],
                         cwd=tmp_path, env=image_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["measured_gib"] > 0 and row["planned_gib"] > 0 and row["rollout_rows"] == 8


@pytest.mark.slow
def test_the_gpu_checks_pipeline_runs_without_the_packages_the_gpu_image_lacks(tmp_path):
    env = image_env(tmp_path)

    root = tmp_path / "embedded"
    overrides = [o if not o.startswith("paths.root=") else f"paths.root={root}" for o in script_overrides()]
    args = [a for o in overrides + ON_THE_CPU for a in ("-S", o)]
    out = subprocess.run([sys.executable, "-m", "dots.cli", "all", "-p", str(ROOT / "params.yaml"), *args],
                         cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    methods = re.search(r"train\.methods=\[(.*?)\]", " ".join(script_overrides())).group(1).split(",")
    for m in methods:  # the figures the script's last lines print for each method
        summary = json.loads((root / "runs" / m / "summary.json").read_text())
        for key in ("mean:time/rollout_s", "mean:time/update_s", "mean:time/step_s", "final_accuracy"):
            assert isinstance(summary[key], float), (m, key)
