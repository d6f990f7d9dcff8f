"""Training with `train.fsdp` (PyTorch FSDP2, `dots.sharding`) on CPU with gloo and 2 processes
(`tests/fsdp_train_worker.py`):

- one sharded `update_on_groups` step (float64) gives the single-process step's weights, loss and
  replay ratios, with one batch and with micro-batches where the ranks run different numbers of
  them, and when one rank's share of the informative groups is empty (it runs zero-loss passes so
  that both ranks run the same collectives);
- the Trainer with train.fsdp=true under torchrun trains (grpo, 3 steps), its checkpoint holds the
  full model (plain-model keys) and the full optimizer state, and a run stopped after step 1 and
  resumed from its checkpoint gives the uninterrupted run's records, evaluations and final weights.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from dots import stages
from dots.distributed import Dist
from dots.microbatch import pack
from dots.models import load_policy
from dots.rollout import Group
from dots.update import trained_groups

from .conftest import torchrun
from .fsdp_train_worker import BUDGETS, CHUNKS, one_update
from .test_distributed import _saved_batch


def _one_informative(batch: str, out) -> str:
    """The saved batch with only its first group informative: rank 1's share of the update is empty."""
    saved = torch.load(batch, weights_only=False)
    for i, g in enumerate(saved["groups"]):
        if i:
            g["rewards"] = torch.ones_like(g["rewards"])
    saved["replayed"] = [0]
    torch.save(saved, out)
    return str(out)


def _micro_batches(batch: str, budget: int | None) -> list[int]:
    """How many micro-batches each of the 2 ranks forwards on its own share."""
    groups = [Group(**g) for g in torch.load(batch, weights_only=False)["groups"]]
    used = trained_groups(groups, 0.0)
    return [len(pack(used[Dist(r, 2).shard(len(used))], budget)) for r in (0, 1)]


def test_two_process_fsdp_update_equals_single_process(tmp_path):
    policy, batch = _saved_batch(tmp_path)
    lone = _one_informative(batch, tmp_path / "lone.pt")
    batches = [batch, lone]
    # the cases: different micro-batch counts on the two ranks, and an empty share
    assert _micro_batches(batch, None) == [1, 1]
    counts = _micro_batches(batch, BUDGETS[1])
    assert counts[0] != counts[1] and min(counts) > 1, counts
    assert _micro_batches(lone, None) == [1, 0]
    assert _micro_batches(lone, BUDGETS[1])[0] > 1 and _micro_batches(lone, BUDGETS[1])[1] == 0

    proc = torchrun(["-m", "tests.fsdp_train_worker", "update", policy, str(tmp_path), *batches])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    before = load_policy(policy)[0].state_dict()
    for b, path in enumerate(batches):
        for budget, chunk in itertools.product(BUDGETS, CHUNKS):
            case = (b, budget, chunk)
            single, loss, stats = one_update(policy, path, budget, chunk=chunk)
            assert any(not torch.equal(before[k].double(), single[k]) for k in single), case
            for r in ranks:
                got = r[case]
                assert set(got["weights"]) == set(single), case
                for name, w in single.items():
                    assert torch.allclose(got["weights"][name], w, rtol=0, atol=1e-10), (case, name)
                assert got["loss"] == pytest.approx(loss, rel=1e-10, abs=1e-12), case
                assert set(got["stats"]) == set(stats) == {"replay_ratio_mean", "replay_ratio_max"}
                for k, v in stats.items():
                    assert got["stats"][k] == pytest.approx(v, rel=1e-10), (case, k)


def _same(a, b, path=""):
    """Records/evaluations equal, timings aside (they are the runs' own clocks)."""
    if isinstance(a, dict):
        keys = {k for k in a if not (str(k).startswith("time/") or k == "elapsed_s")}
        assert keys == {k for k in b if not (str(k).startswith("time/") or k == "elapsed_s")}, path
        for k in keys:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def test_fsdp_trainer_runs_and_resumes_like_an_uninterrupted_run(tiny_pipeline, tmp_path):
    proc = torchrun(["-m", "tests.fsdp_train_worker", "train", str(tiny_pipeline.root), str(tmp_path)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    plain = load_policy(stages.paths(tiny_pipeline).policy)[0]
    for r in ranks:
        assert r["sharded"].startswith("FSDP"), r["sharded"]
        assert r["resumed_from"] == 1
    assert ranks[0]["local_numel"] < 0.6 * (ranks[0]["local_numel"] + ranks[1]["local_numel"])
    whole, resumed = ranks[0]["whole"], ranks[0]["resumed"]
    assert [rec["step"] for rec in whole["records"]] == [1, 2, 3]
    assert sum(rec["train/groups_trained"] for rec in whole["records"]) > 0, "nothing was trained"
    assert len(whole["evals"]) == 2
    _same(whole["records"], resumed["records"])
    _same(whole["evals"], resumed["evals"])
    _same(ranks[1]["whole"]["records"], whole["records"])  # every rank returns the same records
    # rank 0 wrote the full state: plain-model keys, full tensors, and the full AdamW state
    ckpt, again = whole["checkpoint"], resumed["checkpoint"]
    assert ckpt["step"] == again["step"] == 3
    assert set(ckpt["model"]) == set(plain.state_dict())
    for k, v in plain.state_dict().items():
        assert ckpt["model"][k].shape == v.shape, k
    for k, v in ckpt["model"].items():
        assert torch.equal(v, again["model"][k]), k
    opt, opt_again = ckpt["optimizer"]["state"], again["optimizer"]["state"]
    assert set(opt) == set(opt_again) and len(opt) > 0
    for name, s in opt.items():
        assert s["exp_avg_sq"].shape == ckpt["model"][name].shape, name
        for key in s:
            assert torch.equal(torch.as_tensor(s[key]), torch.as_tensor(opt_again[name][key])), (name, key)
