"""The switches that go beyond the paper (all off by default): replay that prefers fresher
groups, and a predictor whose calibration is refitted online from each round's outcomes."""

from __future__ import annotations

import json

import numpy as np
import torch

from dots.predictor import DifficultyPredictor
from dots.replay import ReplayBuffer
from dots.rollout import Group

from .test_trainer import _trainer


def _group(version: int) -> Group:
    g = Group(question_id=version, prompt_ids=torch.tensor([1]), response_ids=torch.ones(2, 2, dtype=torch.long),
              response_mask=torch.ones(2, 2, dtype=torch.bool), logprobs=torch.zeros(2, 2), texts=["a", "b"])
    g.rewards, g.version = torch.tensor([0.0, 1.0]), version
    return g


def test_recency_leans_replay_to_fresher_groups():
    buf = ReplayBuffer(100)
    for v in range(100):
        buf.add(_group(v))
    rng = np.random.default_rng(0)
    uniform = [99 - g.version for _ in range(200) for g in buf.sample(10, rng)]
    fresh = [99 - g.version for _ in range(200) for g in buf.sample(10, rng, recency=0.2)]
    assert np.mean(uniform) > 40 and np.mean(fresh) < 12
    assert len({id(g) for g in buf.sample(10, rng, recency=0.2)}) == 10  # still without replacement


def test_online_refit_moves_a_biased_calibration_towards_what_was_observed():
    torch.manual_seed(0)
    n, k = 400, 32
    pred = DifficultyPredictor(8, hidden=16).eval()
    proj = pred.project_pool(torch.randn(n, 8))
    rng = np.random.default_rng(0)
    refs, labels = rng.choice(n, k, replace=False), rng.uniform(0.2, 0.8, k)
    towers = {k: v.clone() for k, v in pred.state_dict().items() if not k.startswith("calibration")}
    before = pred.predict_projected(proj, refs, labels)
    queries = rng.choice(n, 64, replace=False)
    observed = np.clip(before[queries] + 0.3, 0, 1)  # the policy moved: everything is harder than predicted
    pred.refit_calibration(proj, refs, labels, queries, observed)
    after = pred.predict_projected(proj, refs, labels)
    assert np.abs(after[queries] - observed).mean() < 0.5 * np.abs(before[queries] - observed).mean()
    # the towers did not move: the cached projections stay valid
    assert all(torch.equal(v, pred.state_dict()[k]) for k, v in towers.items())


def test_dots_rr_with_every_switch_trains_and_resumes_exactly(tiny_pipeline, pipeline_data, tmp_path):
    extra = ("train.steps=6", "train.checkpoint_every=3", "eval.every=3", "selection.online_calibration=true",
             "replay.recency=0.1", "replay.fill=true")
    calibration = pipeline_data[3].calibration.state_dict()
    _, whole = _trainer(tiny_pipeline, pipeline_data, "dots_rr", tmp_path / "whole", *extra)
    full = whole.run()
    assert any("dots/calibration_bce" in r for r in full.records)
    for key, value in pipeline_data[3].calibration.state_dict().items():  # the shared predictor is untouched
        assert torch.equal(value, calibration[key])
    _, first = _trainer(tiny_pipeline, pipeline_data, "dots_rr", tmp_path / "split", *extra)
    first.run(stop_after=3)
    del first
    _, second = _trainer(tiny_pipeline, pipeline_data, "dots_rr", tmp_path / "split", *extra, resume=True)
    resumed = second.run()
    assert [r["train/loss"] for r in full.records] == [r["train/loss"] for r in resumed.records]
    # the resumed run says where it went on (its seconds span two sittings); the whole one does not
    assert full.summary["resumed_at"] == [] and resumed.summary["resumed_at"] == [3]
    assert json.loads((tmp_path / "split" / "summary.json").read_text())["resumed_at"] == [3]
    _, third = _trainer(tiny_pipeline, pipeline_data, "dots_rr", tmp_path / "split", *extra, resume=True)
    assert third.step == 6 and third.run().summary["resumed_at"] == [3]  # a finished run trains nothing more
    for key, value in whole.predictor.calibration.state_dict().items():
        assert torch.equal(value, second.predictor.calibration.state_dict()[key])
    for key, value in whole.model.state_dict().items():
        assert torch.equal(value, second.model.state_dict()[key])
