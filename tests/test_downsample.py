"""Max-variance down-sampling (`train.downsample`, dots.downsample): the subset it keeps has the
largest reward variance of any subset of that size (checked against every subset), its rows
stay together, and the update with it set is the update on the down-sampled groups, replay
ratios included, for one batch and for micro-batches."""

from __future__ import annotations

import itertools

import pytest
import torch

from dots.config import load_config
from dots.downsample import downsample_group, downsample_groups, max_variance_rows
from dots.update import forwarded_groups
from tests.test_microbatch import gpt2, make_groups, run_update


@pytest.mark.parametrize("seed", range(6))
def test_the_kept_rows_have_the_largest_variance_of_any_subset(seed):
    gen = torch.Generator().manual_seed(seed)
    binary = seed % 2 == 0  # exact-match rewards, and real-valued ones
    rewards = (torch.rand(8, generator=gen) < 0.4).float() if binary else torch.rand(8, generator=gen)
    for m in range(2, 8):
        keep = max_variance_rows(rewards, m)
        assert keep.tolist() == sorted(set(keep.tolist())) and len(keep) == m
        best = max(float(rewards[list(c)].double().var(unbiased=False)) for c in itertools.combinations(range(8), m))
        assert float(rewards[keep].double().var(unbiased=False)) == pytest.approx(best, abs=1e-12), (rewards, m)


def test_binary_groups_keep_right_and_wrong_as_evenly_as_they_can():
    for right, want in ((1, 1), (2, 2), (4, 2), (6, 2), (7, 3)):
        rewards = torch.tensor([1.0] * right + [0.0] * (8 - right))
        kept = rewards[max_variance_rows(rewards, 4)]
        assert int(kept.sum()) == want, right  # 1 of 1 right, 2 and 2, ..., 3 right and the 1 wrong


def test_a_down_sampled_group_keeps_its_rows_together():
    group = make_groups(50, n_groups=1, g=4)[0]
    group.rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    cut = downsample_group(group, 2)
    assert cut.size == 2 and cut.question_id == group.question_id and cut.version == group.version
    assert sorted(cut.rewards.tolist()) == [0.0, 1.0]
    for i, row in zip(max_variance_rows(group.rewards, 2).tolist(), range(2)):
        assert torch.equal(cut.response_ids[row], group.response_ids[i])
        assert torch.equal(cut.response_mask[row], group.response_mask[i])
        assert torch.equal(cut.logprobs[row], group.logprobs[i])
    assert downsample_group(group, None) is group and downsample_group(group, 4) is group
    assert downsample_group(cut, 2).rewards.tolist() == cut.rewards.tolist()  # the same rows again


@pytest.mark.parametrize("budget", [None, 1], ids=["one-batch", "one-row-micro-batches"])
def test_the_update_trains_on_the_down_sampled_groups_with_their_replay_flags(budget):
    model = gpt2()
    groups = make_groups(model.config.vocab_size)
    for g, r in zip(groups, ([1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0], [1.0] * 4, [1.0, 1.0, 1.0, 0.0],
                             [0.0, 0.0, 0.0, 1.0])):
        g.rewards = torch.tensor(r)
    replayed = [groups[0], groups[3]]
    loss, stats, grads = run_update(model, groups, replayed, budget, 8192, False, "train.downsample=2")
    # by hand: the same groups cut to their two most varied rows, the same two replayed
    cut = [downsample_group(g, 2) for g in groups]
    loss0, stats0, grads0 = run_update(model, cut, [cut[0], cut[3]], budget)
    full_loss, _, _ = run_update(model, groups, replayed, budget)
    assert loss == pytest.approx(loss0, rel=1e-12, abs=1e-14) and loss != pytest.approx(full_loss, rel=1e-6)
    assert stats["replay_ratio_mean"] == pytest.approx(stats0["replay_ratio_mean"], rel=1e-12)
    assert stats["replay_ratio_max"] == pytest.approx(stats0["replay_ratio_max"], rel=1e-12)
    for a, b in zip(grads, grads0):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
    cfg = load_config(None, ["train.downsample=2"])
    assert [g.size for g in forwarded_groups(groups, cfg)] == [2, 2, 2, 2]  # the degenerate group is skipped
    assert downsample_groups(groups, None) is groups


def test_config_refuses_a_subset_larger_than_the_group_or_too_small_to_vary():
    with pytest.raises(ValueError, match="train.downsample"):
        load_config(None, ["train.downsample=9"])  # G = 8
    with pytest.raises(ValueError, match="downsample"):
        load_config(None, ["train.downsample=1"])  # one rollout has no advantage
    assert load_config(None, ["train.downsample=8"]).train.downsample == 8


def test_a_run_counts_the_tokens_it_trains_not_the_ones_it_sampled(tiny_pipeline, pipeline_data, tmp_path):
    """With train.downsample the step samples G rollouts a question and trains on m: tokens/trained
    is the kept rows' tokens, the sampled count and the groups trained stay the full run's."""
    from tests.conftest import spy_rollouts
    from tests.test_trainer import _trainer

    extra = ("train.steps=1", "eval.every=1", "train.checkpoint_every=1", "eval.probe_size=0")
    cfg, full = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "full", *extra)
    _, cut = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "cut", *extra, "train.downsample=2")
    seen = spy_rollouts(cut)
    a, b = full.train_step(), cut.train_step()
    assert a["tokens/sampled"] == b["tokens/sampled"] and a["train/groups_trained"] == b["train/groups_trained"] > 0
    kept = [downsample_group(g, 2) for g in seen[0] if g.informative]
    assert b["tokens/trained"] == sum(int(g.response_mask.sum()) for g in kept) < a["tokens/trained"]
    assert cfg.rollout.group_size > 2
