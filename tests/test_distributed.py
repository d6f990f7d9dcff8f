"""Multi-process training (dots.distributed) on CPU with gloo and 2 processes, and `dots evaluate`.

- one data-parallel update gives the single-process update's weights (float tolerance);
- `torchrun -m dots.cli train` runs dots_rr for 2 steps: rank 0 writes one checkpoint and the run
  files, the ranks end in sync (the trainer checks), and `dots evaluate` of that checkpoint on the
  held-out file reproduces the 2-rank sharded final accuracy.
"""

from __future__ import annotations

import json

import pytest
import torch

from dots.checkpoints import load_checkpoint
from dots.cli import main
from dots.config import ModelConfig
from dots.distributed import Dist
from dots.models import build_model, build_tokenizer, load_policy, save_policy
from dots.rollout import HFEngine

from .conftest import REPO, default_params, tiny_overrides, torchrun
from .dist_update_worker import one_update


def test_shards_cover_in_order():
    for n in range(8):
        for world in (1, 2, 3):
            parts = [list(range(n))[Dist(r, world).shard(n)] for r in range(world)]
            assert sum(parts, []) == list(range(n))
            assert max(map(len, parts)) - min(map(len, parts)) <= 1


def _saved_batch(tmp_path) -> tuple[str, str]:
    """A tiny random policy and a fixed batch of its groups: 5 informative of 7, two of them
    'replayed' (behaviour log-probs of another policy, so ratios move off 1 and some clip)."""
    tok = build_tokenizer()
    policy = tmp_path / "policy"
    save_policy(build_model(ModelConfig(n_layer=2, n_embd=32, n_head=2), tok, seed=0), tok, policy)
    model, tok = load_policy(policy)
    prompts = tok(["12+7=", "3+4=", "45+61=", "8+8=", "123+9=", "7+70=", "1+1="])["input_ids"]
    gen = torch.Generator().manual_seed(0)
    groups = HFEngine(model, tok).generate(prompts, 4, temperature=1.0, max_new_tokens=6, generator=gen)
    rewards = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 0], [0, 1, 0, 0], [1, 1, 1, 1], [0, 0, 1, 1], [1, 0, 1, 0]]
    for g, r in zip(groups, rewards):
        g.rewards = torch.tensor(r, dtype=torch.float32)
    for i in (2, 5):
        g = groups[i]
        g.logprobs = (g.logprobs + 0.3 * torch.randn(g.logprobs.shape, generator=gen)) * g.response_mask
    batch = tmp_path / "batch.pt"
    torch.save({"groups": [g.__dict__ for g in groups], "replayed": [2, 5]}, batch)
    return str(policy), str(batch)


def test_two_process_update_equals_single_process(tmp_path):
    policy, batch = _saved_batch(tmp_path)
    before = load_policy(policy)[0].state_dict()
    single, loss, stats = one_update(policy, batch)
    proc = torchrun(["-m", "tests.dist_update_worker", policy, batch, str(tmp_path)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    assert any(not torch.equal(before[k], single[k]) for k in single), "the update did not move the policy"
    for name, w in single.items():
        assert torch.equal(ranks[0]["weights"][name], ranks[1]["weights"][name]), name
        assert torch.allclose(ranks[0]["weights"][name], w, rtol=0, atol=1e-6), name
    for r in ranks:
        assert r["loss"] == pytest.approx(loss, abs=1e-6)
        assert r["stats"]["replay_ratio_mean"] == pytest.approx(stats["replay_ratio_mean"], abs=1e-6)
        assert r["stats"]["replay_ratio_max"] == pytest.approx(stats["replay_ratio_max"], abs=1e-6)


@pytest.mark.slow
def test_torchrun_train_writes_once_and_evaluate_reads_its_checkpoint(tiny_pipeline, tmp_path, capsys):
    root = tmp_path / "artifacts"
    root.mkdir()
    for part in ("data", "models", "embeddings", "predictor"):  # the fixture's inputs; outputs go here
        (root / part).symlink_to(tiny_pipeline.root / part)
    args = ["-m", "dots.cli", "train", "--method", "dots_rr", "-p", default_params(tmp_path)]
    # eval.metric=greedy: the run's final accuracy is then comparable with `dots evaluate`'s greedy one
    for o in tiny_overrides(root) + ["train.steps=2", "train.checkpoint_every=2", "eval.every=2",
                                     "train.threads=1", "tracking.enabled=false", "eval.metric=greedy",
                                     "eval.probe_size=64"]:
        args += ["-S", o]
    proc = torchrun(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("train dots_rr: final accuracy") == 1, proc.stdout  # rank 0 speaks

    ckpt_dir = root / "checkpoints" / "dots_rr"
    assert [p.name for p in ckpt_dir.iterdir()] == ["checkpoint.pt"]
    assert load_checkpoint(ckpt_dir)["step"] == 2
    run = root / "runs" / "dots_rr"
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    summary = json.loads((run / "summary.json").read_text())
    # the probe's frontier is gathered over both ranks' shares (a share of the 64 probe questions)
    assert 0.0 <= summary["frontier_final"] <= 1.0 and summary["frontier_final"] * 64 == pytest.approx(
        round(summary["frontier_final"] * 64))
    assert summary["accuracy_se"] > 0

    held = root / "data" / "eval.jsonl"
    argv = ["evaluate", "-p", default_params(tmp_path), "--data", str(held), "--question", "prompt",
            "--answer", "answer", "--id", "id", "--checkpoint", str(ckpt_dir), "--samples", "4"]
    for o in tiny_overrides(root):
        argv += ["-S", o]
    capsys.readouterr()
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["questions"] == 256 and out["step"] == 2
    assert out["greedy_accuracy"] == pytest.approx(summary["final_accuracy"], abs=1 / 256 + 1e-9)
    assert 0.0 <= out["mean@4"] <= out["pass@4"] <= 1.0


def test_only_train_runs_under_torchrun(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["prepare", "-p", str(REPO / "params.yaml")]) == 2
    assert "only `dots train` runs under torchrun" in capsys.readouterr().err
