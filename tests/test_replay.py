"""Rollout replay: the FIFO buffer, and the trainer's fresh/replay split with its shortfall rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from dots import stages
from dots.replay import ReplayBuffer
from dots.rollout import Group
from dots.trainer import Trainer

from .conftest import tiny_config


def make_group(rewards, qid=0, version=0, length=3) -> Group:
    g = 4 if rewards is None else len(rewards)
    gen = torch.Generator().manual_seed(qid)
    return Group(question_id=qid, prompt_ids=torch.tensor([1, 4, 13, 5, 14]),
                 response_ids=torch.randint(3, 15, (g, length), generator=gen),
                 response_mask=torch.ones(g, length, dtype=torch.bool),
                 logprobs=-torch.rand(g, length, generator=gen), texts=[""] * g,
                 rewards=None if rewards is None else torch.tensor(rewards, dtype=torch.float32), version=version)


INFORMATIVE = [1.0, 0.0, 0.0, 1.0]


def _qids(groups):
    return sorted(g.question_id for g in groups)


def test_fifo_eviction_at_capacity():
    buf = ReplayBuffer(3)
    for q in range(5):
        assert buf.add(make_group(INFORMATIVE, qid=q))
        assert len(buf) == min(q + 1, 3)
    assert _qids(buf.sample(10, np.random.default_rng(0))) == [2, 3, 4]
    buf.add(make_group(INFORMATIVE, qid=5))
    assert _qids(buf.sample(10, np.random.default_rng(0))) == [3, 4, 5]


def test_degenerate_groups_refused_informative_accepted():
    buf = ReplayBuffer(8)
    assert buf.add(make_group([0.0, 0.0, 0.0, 0.0], qid=1)) is False
    assert buf.add(make_group([1.0, 1.0, 1.0, 1.0], qid=2)) is False
    assert len(buf) == 0
    assert buf.add(make_group([0.0, 1.0, 0.0, 0.0], qid=3)) is True
    assert buf.add(make_group([1.0, 1.0, 0.5, 1.0], qid=4)) is True  # partial credit is informative too
    assert len(buf) == 2


def test_unscored_group_raises():
    with pytest.raises(ValueError, match="scored"):
        ReplayBuffer(4).add(make_group(None))


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="replay.capacity"):
        ReplayBuffer(0)


def test_sample_without_replacement():
    buf = ReplayBuffer(16)
    for q in range(10):
        buf.add(make_group(INFORMATIVE, qid=q))
    rng = np.random.default_rng(0)
    for k in (1, 4, 10, 20):
        out = buf.sample(k, rng)
        assert len(out) == min(k, 10)
        assert len({id(g) for g in out}) == len(out)
    assert buf.sample(0, rng) == []
    assert ReplayBuffer(4).sample(3, rng) == []
    assert len(buf) == 10  # sampling does not remove


def test_sample_is_uniform():
    buf = ReplayBuffer(16)
    for q in range(10):
        buf.add(make_group(INFORMATIVE, qid=q))
    rng = np.random.default_rng(1)
    counts = np.zeros(10)
    for _ in range(3000):
        for g in buf.sample(3, rng):
            counts[g.question_id] += 1
    assert stats.chisquare(counts).pvalue > 1e-3


def test_state_dict_round_trip(tmp_path):
    buf = ReplayBuffer(3)
    for q in range(4):
        buf.add(make_group(INFORMATIVE, qid=q, version=q))
    path = tmp_path / "buffer.pt"
    torch.save(buf.state_dict(), path)
    restored = ReplayBuffer(1)
    restored.load_state_dict(torch.load(path, weights_only=False))
    assert restored.capacity == 3 and len(restored) == 3
    a = buf.sample(3, np.random.default_rng(7))
    b = restored.sample(3, np.random.default_rng(7))
    for x, y in zip(a, b):
        assert x.question_id == y.question_id and x.version == y.version
        for field in ("prompt_ids", "response_ids", "response_mask", "logprobs", "rewards"):
            assert torch.equal(getattr(x, field), getattr(y, field)), field
    restored.add(make_group(INFORMATIVE, qid=9))  # capacity survives the round trip
    assert len(restored) == 3
    assert _qids(restored.sample(3, np.random.default_rng(0))) == [2, 3, 9]


# ---- the trainer's shortfall rule ---------------------------------------------------------------

def test_trainer_generates_the_shortfall_fresh(tiny_pipeline, tmp_path):
    cfg = tiny_config(tiny_pipeline.root, "train.steps=4", "train.checkpoint_every=4", "eval.every=4",
                      "replay.delta=0.5")
    p = stages.paths(cfg)
    pool, held = stages.load_data(cfg)
    b = cfg.train.batch_size
    trainer = Trainer(cfg, "rr", p.policy, pool, held, tmp_path / "rr", resume=False)
    seen = []
    update = trainer._update

    def spy(groups, replayed):
        seen.append((len(groups), len(replayed), [g.version for g in replayed]))
        return update(groups, replayed)

    trainer._update = spy
    records = []
    for _ in range(4):
        records.append(trainer.train_step())

    # step 1: empty buffer, so all B groups are fresh
    assert seen[0][:2] == (b, 0)
    assert records[0]["replay/fraction"] == 0.0
    assert records[0]["replay/staleness_max"] == 0
    # every step trains on B groups, at most (1 − δ)·B of them replayed
    n_replay = b - int(round(cfg.replay.delta * b))
    for (n_groups, n_replayed, _), rec in zip(seen, records):
        assert n_groups == b
        assert n_replayed <= n_replay
        assert rec["replay/fraction"] == pytest.approx(n_replayed / b)
        assert rec["replay/size"] <= cfg.replay.capacity
    # the buffer fills from informative fresh groups, then replay starts
    assert records[0]["replay/size"] > 0
    assert seen[1][1] == min(n_replay, records[0]["replay/size"]) > 0
    assert records[1]["replay/fraction"] > 0
    # replayed groups at step 2 come from step 1's policy (version 0): staleness 1
    assert seen[1][2] and set(seen[1][2]) == {0}
    assert records[1]["replay/staleness_max"] == 1
    assert max(r["replay/staleness_max"] for r in records) <= 3


def test_reported_staleness_counts_the_policy_versions_behind(tiny_pipeline, tmp_path):
    """Groups of known behaviour versions in the buffer of a trainer whose policy is at version 5
    (five updates done): the step's record must say how many versions each replayed group is behind
    the policy that generates this step's fresh groups."""
    cfg = tiny_config(tiny_pipeline.root, "replay.delta=0.5", "replay.recency=0")
    pool, held = stages.load_data(cfg)
    trainer = Trainer(cfg, "rr", stages.paths(cfg).policy, pool, held, tmp_path / "rr", resume=False)
    for qid, version in enumerate((1, 2, 4)):
        assert trainer.buffer.add(make_group(INFORMATIVE, qid=qid, version=version))
    trainer.step = 5
    seen = {}

    def no_update(groups, replayed):  # only the accounting is under test: skip the gradient step
        seen["fresh"] = [g.version for g in groups if all(g is not r for r in replayed)]
        seen["replayed"] = sorted(g.version for g in replayed)
        return 0.0, {}

    trainer._update = no_update
    rec = trainer.train_step()
    assert seen["replayed"] == [1, 2, 4]  # all three drawn (the step replays up to (1 − δ)·B)
    assert set(seen["fresh"]) == {5}  # this step's fresh groups come from policy version 5
    assert rec["replay/staleness_max"] == 5 - 1
    assert rec["replay/staleness_mean"] == pytest.approx(((5 - 1) + (5 - 2) + (5 - 4)) / 3)
    assert rec["train/policy_version"] == 6


def test_sample_never_returns_an_excluded_group():
    buf = ReplayBuffer(10)
    groups = [make_group(INFORMATIVE, qid=q) for q in range(6)]
    for g in groups:
        buf.add(g)
    rng = np.random.default_rng(0)
    for _ in range(20):
        first = buf.sample(4, rng)
        second = buf.sample(4, rng, exclude=first)
        assert len(second) == 2  # only 2 of the 6 are left to draw
        assert not {id(g) for g in first} & {id(g) for g in second}
    assert buf.sample(3, rng, recency=0.5, exclude=groups) == []


def test_a_steep_recency_draws_the_newest_groups_where_old_weights_underflow():
    """replay.recency = 200: exp(-200 x age) is 0.0 in float64 past 3 versions, and numpy's draw
    refused fewer non-zero weights than draws (ValueError, the run died); now it draws from the
    log-weights: distinct groups, the newest first in all but a vanishing share of draws."""
    buf = ReplayBuffer(64)
    for q in range(40):
        buf.add(make_group(INFORMATIVE, qid=q, version=q))
    rng = np.random.default_rng(0)
    for _ in range(5):
        drawn = buf.sample(8, rng, recency=200.0)
        assert _qids(drawn) == list(range(32, 40))
    assert len(buf.sample(8, rng, recency=0.1)) == 8  # the usual draw where the weights are all positive


def test_fill_gives_each_degenerate_fresh_slot_to_one_more_replayed_group(tiny_pipeline, tmp_path):
    """replay.fill: with 8 groups a step and delta 0.5, 4 are replayed and 4 fresh; when 3 of
    the fresh ones come back degenerate, 3 more distinct groups are replayed (never one of
    this step's fresh groups), so the update sees 4 + 3 replayed and 1 informative fresh: a batch
    of 8, each group weighing 1/8 in the loss's mean (the degenerate ones stayed in it, 1/11)."""
    cfg = tiny_config(tiny_pipeline.root, "train.batch_size=8", "replay.delta=0.5", "replay.fill=true")
    pool, held = stages.load_data(cfg)
    trainer = Trainer(cfg, "rr", stages.paths(cfg).policy, pool, held, tmp_path / "rr", resume=False)
    stored = [make_group(INFORMATIVE, qid=100 + q, version=0) for q in range(10)]
    for g in stored:
        trainer.buffer.add(g)
    fresh = [make_group(INFORMATIVE, qid=1, version=1)] + [make_group([1.0] * 4, qid=q, version=1) for q in (2, 3, 4)]
    trainer._fresh_groups = lambda n, rec, timers: fresh[:n]
    seen = {}

    def no_update(groups, replayed):  # only the batch composition is under test
        seen["groups"], seen["replayed"] = groups, replayed
        return 0.0, {}

    trainer._update = no_update
    rec = trainer.train_step()
    replayed = seen["replayed"]
    assert len(replayed) == 4 + 3 and rec["replay/filled"] == 3
    assert len({id(g) for g in replayed}) == 7 and all(any(g is s for s in stored) for g in replayed)
    assert len(seen["groups"]) == 1 + 7 and all(g.informative for g in seen["groups"])
    assert rec["replay/fraction"] == pytest.approx(7 / 8) and rec["train/effective_ratio"] == 1.0
    assert rec["train/fresh_groups"] == 0 or rec["train/fresh_informative"] <= rec["train/fresh_groups"]


def test_a_degenerate_group_the_buffer_cannot_replace_keeps_its_slot():
    from dots.trainer import given_slots

    fresh = [make_group([1.0] * 4, qid=1), make_group(INFORMATIVE, qid=2), make_group([0.0] * 4, qid=3)]
    assert given_slots(fresh, 1) == fresh[1:]  # one fill: the first degenerate group gave its slot
    assert given_slots(fresh, 2) == [fresh[1]] and given_slots(fresh, 0) == fresh


def test_fill_is_off_by_default_as_in_the_paper(tiny_pipeline, tmp_path):
    cfg = tiny_config(tiny_pipeline.root, "train.batch_size=8", "replay.delta=0.5")
    assert cfg.replay.fill is False
    pool, held = stages.load_data(cfg)
    trainer = Trainer(cfg, "rr", stages.paths(cfg).policy, pool, held, tmp_path / "rr", resume=False)
    for q in range(10):
        trainer.buffer.add(make_group(INFORMATIVE, qid=100 + q))
    trainer._fresh_groups = lambda n, rec, timers: [make_group([0.0] * 4, qid=q, version=1) for q in range(n)]
    trainer._update = lambda groups, replayed: (0.0, {})
    rec = trainer.train_step()
    assert rec["replay/fraction"] == pytest.approx(0.5) and "replay/filled" not in rec
