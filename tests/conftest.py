"""Shared fixtures: a tiny but real pipeline (prepare → warm-up → embed → label → fit) built once
per session, small enough for two CPU cores.

The configuration is sized so that the warm-up breaks out of its loss plateau (measured on
two CPU cores: the 2-layer policy starts solving the 1-digit tier after ~450 steps and the
2-digit tier after ~650, at lr 3e-3 and batch 128, ~25 ms a step), and the tiers then spread.
Pass rates under G=8 on the labelled questions, step800 / final: 2-operand 1-digit 0.85 / 0.95,
2-digit 0.64 / 0.80, 3-digit 0.00 / 0.00, 3-operand 2-digit 0.01 / 0.02. The labels therefore
have spread and the predictor has something to learn (held-out Pearson 0.80 with the masked mean, 0.92 with
the default mean+last pooling). The whole
fixture takes ~30 s on an idle machine (much longer when other jobs share the two cores).
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before anything imports transformers
# DVC's usage report: the repository's .dvc/config turns it off, the repositories the tests make do not;
# on, every dvc command spawns a sender and, offline, leaves its report in /tmp
os.environ.setdefault("DVC_NO_ANALYTICS", "1")

import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(2)

REPO = Path(__file__).resolve().parents[1]


def torchrun(args: list[str], cwd: str | Path = REPO, timeout: float = 600):
    """`torchrun --standalone --nproc-per-node 2 ARGS` on the CPU (gloo), its output captured. Its
    elastic agent makes a folder for the ranks' logs under the temporary directory and leaves it
    there (torchelastic_*, five a suite run): TMPDIR points it at one removed afterwards."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="dots-torchrun-") as tmp:
        env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                   TMPDIR=tmp)
        env.pop("WORLD_SIZE", None)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
        return subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)

TIERS = ("[{operands: 2, digits: 1, weight: 4}, {operands: 2, digits: 2, weight: 2}, "
         "{operands: 2, digits: 3}, {operands: 3, digits: 2}]")


SHARED_DATA = REPO.parent / "shared" / "data"  # real data beside the repository (DeepScaleR)


def require_shared(path: str | Path) -> Path:
    """`path` (a file under ../shared/data), for a test that needs it. Missing, the test is skipped
    on a developer's machine but fails in CI (CI=true), where a silent skip would hide that the
    real-data checks never ran."""
    path = Path(path)
    if not path.exists():
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail(f"{path} is missing and CI=true: the real-data tests must run in CI "
                        f"(provide ../shared/data)", pytrace=False)
        pytest.skip(f"{path} not present")
    return path


def default_params(folder: str | Path) -> str:
    """An empty params file (every key at its default) for a test that gives `-p`: the CLI
    refuses a `-p` that names no file."""
    path = Path(folder) / "defaults.yaml"
    path.write_text("# every key at its default\n")
    return str(path)


def tiny_overrides(root: str | Path) -> list[str]:
    """`-S`-style overrides of a small but real configuration writing under `root`."""
    return [
        f"paths.root={root}",
        "task.seed=0",
        "task.pool_size=2048",
        "task.pad_width=0",  # the measurements above are of unpadded operands
        "task.eval_size=256",
        f"task.tiers={TIERS}",
        "model.n_layer=2",
        "model.n_embd=64",
        "model.n_head=4",
        "warmup.steps=1000",
        "warmup.lr=0.003",
        "warmup.batch_size=128",
        "warmup.checkpoints=[800]",
        "warmup.spectrum_questions=256",
        "embed.backbone=warmup",
        "embed.pooling=mean+last",
        "label.policies=[step800, final]",
        "label.num_questions=768",
        "predictor.steps=1000",
        "predictor.batch_size=128",
        "selection.ref_size=32",
        "selection.every=2",
        "selection.tau=0.1",
        "replay.capacity=64",
        "replay.delta=0.5",
        "rollout.group_size=8",
        "rollout.batch_size=512",
        "rollout.max_new_tokens=10",
        "train.batch_size=16",
        "train.steps=3",
        "train.checkpoint_every=3",
        "train.seed=0",
        "train.threads=2",
        "eval.every=3",
        "eval.batch_size=256",
        "eval.probe_size=32",  # the frontier probe: small, tests only check that it is measured
        "loss.beta=0.0",
        "loss.scale_rewards=none",
    ]


def tiny_config(root: str | Path, *extra: str):
    """The tiny configuration under `root`, with extra overrides applied last."""
    from dots.config import load_config

    return load_config(None, tiny_overrides(root) + list(extra))


def spy_rollouts(trainer) -> list:
    """Every rollout call's groups from now on, one list per call (a generation batch, a
    round's references, a step's selected questions), recorded as the trainer makes them."""
    calls: list = []
    inner = trainer._rollout

    def rollout(idx):
        groups = inner(idx)
        calls.append(groups)
        return groups

    trainer._rollout = rollout
    return calls


def refused(overrides, *needles) -> str:
    """The config error these overrides get, checked to name every needle (the field, its range)."""
    from dots.config import ConfigError, load_config

    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    msg = str(info.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    return msg


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory):
    """Run prepare, warm-up, embed, label and fit once; returns the Config (paths.root inside)."""
    from dots import stages

    root = tmp_path_factory.mktemp("tiny_pipeline") / "artifacts"
    cfg = tiny_config(root)
    start = time.perf_counter()
    stages.run_shared(cfg)
    print(f"\ntiny_pipeline built in {time.perf_counter() - start:.1f}s")
    torch.set_num_threads(2)
    return cfg


@pytest.fixture(scope="session")
def pipeline_data(tiny_pipeline):
    """(pool, eval set, embeddings, predictor) of the tiny pipeline."""
    from dots import stages
    from dots.embeddings import load_embeddings
    from dots.predictor import load_predictor

    cfg = tiny_pipeline
    p = stages.paths(cfg)
    pool, held = stages.load_data(cfg)
    emb = load_embeddings(p.embeddings, stages._backbone(cfg), pool)
    return pool, held, emb, load_predictor(p.predictor)


def mlflow_runs(db: str | Path):
    """(client, every run of the `dots` experiment) of a local sqlite MLflow store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("dots")
    return client, client.search_runs([exp.experiment_id])


@pytest.fixture(autouse=True)
def _tracking_uri_unchanged():
    """A test must not leave MLFLOW_TRACKING_URI behind (mlflow.set_tracking_uri exports it): every
    later stage process would log to that store, a server perhaps already stopped."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    after = os.environ.get("MLFLOW_TRACKING_URI")
    if after != before:
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before
        pytest.fail(f"the test left MLFLOW_TRACKING_URI={after!r} in the environment (was {before!r})")
