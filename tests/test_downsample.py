"""Max-variance down-sampling (`train.downsample`, dots.downsample): the subset it keeps has the
largest reward variance of any subset of that size (checked against every subset), its rows
stay together, and the update with it set is the update on the down-sampled groups, replay
ratios included, for one batch and for micro-batches. Each method has its own m
(`train.downsample_by_method`: dots_rr 3 of 8, the others all G), which `train.downsample` overrides.
A tie between equally varied subsets (an odd m) goes to the lower rewards by default
(`train.downsample_ties: low`: 1 right + 2 wrong of 3), to the higher ones with `high`."""

from __future__ import annotations

import itertools

import pytest
import torch

from dots.config import Config, load_config
from dots.downsample import downsample_group, downsample_groups, max_variance_rows, max_variance_rows_batch
from dots.update import forwarded_groups
from tests.test_microbatch import gpt2, make_groups, run_update


@pytest.mark.parametrize("seed", range(6))
def test_the_kept_rows_have_the_largest_variance_of_any_subset(seed):
    gen = torch.Generator().manual_seed(seed)
    binary = seed % 2 == 0  # exact-match rewards, and real-valued ones
    rewards = (torch.rand(8, generator=gen) < 0.4).float() if binary else torch.rand(8, generator=gen)
    for m in range(2, 8):
        for ties in ("low", "high"):
            keep = max_variance_rows(rewards, m, ties)
            assert keep.tolist() == sorted(set(keep.tolist())) and len(keep) == m
            best = max(float(rewards[list(c)].double().var(unbiased=False))
                       for c in itertools.combinations(range(8), m))
            kept = float(rewards[keep].double().var(unbiased=False))
            assert kept == pytest.approx(best, abs=1e-12), (rewards, m, ties)


@pytest.mark.parametrize("kind", ["binary", "graded", "real"])
def test_a_batch_of_groups_keeps_the_rows_each_group_keeps_alone(kind):
    """The batched rule (one call a step) picks, group by group, the rows of the max-variance subset,
    ties broken as the one-group rule breaks them (`high`: the first split tried): checked against every
    subset."""
    gen = torch.Generator().manual_seed(7)
    draw = {"binary": lambda: (torch.rand(50, 8, generator=gen) < 0.4).float(),
            "graded": lambda: torch.randint(0, 3, (50, 8), generator=gen).float() / 2,
            "real": lambda: torch.rand(50, 8, generator=gen)}[kind]
    rewards = draw()
    for m in range(2, 9):
        keeps = max_variance_rows_batch(rewards, m, "high")
        assert keeps.shape == (50, min(m, 8))
        for r, keep in zip(rewards, keeps):
            assert keep.tolist() == max_variance_rows(r, m, "high").tolist() == sorted(set(keep.tolist()))
            first_best = max(itertools.combinations(range(8), min(m, 8)),
                             key=lambda c: round(float(r[list(c)].double().var(unbiased=False)), 12))
            assert float(r[keep].double().var(unbiased=False)) == pytest.approx(
                float(r[list(first_best)].double().var(unbiased=False)), abs=1e-12)


@pytest.mark.parametrize("kind", ["binary", "real"])
def test_ties_low_keeps_a_max_variance_subset_and_the_lower_side_of_a_tie(kind):
    """`train.downsample_ties: low` (the default) keeps a max-variance subset too, batched as one group at a
    time, and where two subsets tie it keeps the one with more low rewards: the last split, not the first."""
    gen = torch.Generator().manual_seed(11)
    rewards = torch.rand(40, 8, generator=gen)
    if kind == "binary":
        rewards = (rewards < 0.5).float()
    for m in range(2, 8):
        keeps = max_variance_rows_batch(rewards, m, "low")
        for r, keep in zip(rewards, keeps):
            assert keep.tolist() == max_variance_rows(r, m, "low").tolist() == sorted(set(keep.tolist()))
            subsets = list(itertools.combinations(range(8), m))
            last_best = max(reversed(subsets),
                            key=lambda c: round(float(r[list(c)].double().var(unbiased=False)), 12))
            assert float(r[keep].double().var(unbiased=False)) == pytest.approx(
                float(r[list(last_best)].double().var(unbiased=False)), abs=1e-12)
            if kind == "binary":  # the tie rule is only about how many right answers are kept
                high = max_variance_rows(r, m, "high")
                assert int(r[keep].sum()) <= int(r[high].sum())


def test_an_odd_m_tie_keeps_more_wrong_with_low_and_more_right_with_high():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0])  # 4 right, 4 wrong
    for m, high_right, low_right in ((3, 2, 1), (5, 3, 2), (7, 4, 3)):
        assert int(rewards[max_variance_rows(rewards, m, "high")].sum()) == high_right
        assert int(rewards[max_variance_rows(rewards, m)].sum()) == low_right  # the default, "low"
    for m in (2, 4, 6):  # even m: the balanced cut is the one max-variance split, either rule
        assert max_variance_rows(rewards, m, "low").tolist() == max_variance_rows(rewards, m, "high").tolist()
    groups = make_groups(50, n_groups=3, g=8)
    for g in groups:
        g.rewards = rewards.clone()
    assert [int(g.rewards.sum()) for g in downsample_groups(groups, 3)] == [1, 1, 1]
    assert [int(g.rewards.sum()) for g in downsample_groups(groups, 3, "high")] == [2, 2, 2]
    with pytest.raises(ValueError, match="train.downsample_ties"):
        max_variance_rows(rewards, 3, "middle")


def test_the_update_cuts_with_the_configured_tie_rule():
    groups = make_groups(50, n_groups=2, g=8)
    for g in groups:
        g.rewards = torch.tensor([1.0, 0.0] * 4)
    low = forwarded_groups(groups, Config(), "dots_rr")  # the default: 3 of 8, ties to the wrong answers
    assert [int(g.rewards.sum()) for g in low] == [1, 1]
    high = load_config(None, ["train.downsample_ties=high"])
    assert [int(g.rewards.sum()) for g in forwarded_groups(groups, high, "dots_rr")] == [2, 2]
    with pytest.raises(ValueError, match="train.downsample_ties"):
        load_config(None, ["train.downsample_ties=middle"])


def test_the_tie_rule_is_part_of_a_down_sampling_runs_key_only():
    """Changing the tie rule makes a new dots_rr run, and leaves a grpo run (all G, no ties) valid."""
    base, high = Config(), load_config(None, ["train.downsample_ties=high"])
    assert base.fingerprint(method="grpo") == high.fingerprint(method="grpo")
    assert base.fingerprint(method="dots_rr") != high.fingerprint(method="dots_rr")


def test_groups_of_mixed_sizes_are_cut_as_one_at_a_time():
    groups = make_groups(50, n_groups=5, g=4) + make_groups(50, n_groups=2, g=2) + make_groups(50, n_groups=2, g=6)
    gen = torch.Generator().manual_seed(3)
    for g in groups:
        g.rewards = (torch.rand(g.size, generator=gen) < 0.5).float()
    for pick in (groups[:5], groups[:7], groups):  # one size; one size cut and one left whole; three sizes
        cut, alone = downsample_groups(pick, 3), [downsample_group(g, 3) for g in pick]
        for a, b, g in zip(cut, alone, pick):
            assert (a is g) == (b is g) == (g.size <= 3)
            assert a.texts == b.texts and all(torch.equal(getattr(a, k), getattr(b, k)) for k in
                                              ("response_ids", "response_mask", "logprobs", "rewards"))


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


def test_each_method_down_samples_by_its_own_m_unless_train_downsample_sets_every_one():
    cfg = Config()
    assert cfg.train.downsample is None
    assert {m: cfg.train.downsample_for(m) for m in ("grpo", "dots", "rr", "dots_rr", "dapo", "greso")} == \
        {"grpo": None, "dots": None, "rr": None, "dots_rr": 3, "dapo": None, "greso": None}
    every = load_config(None, ["train.downsample=8"]).train  # all G for every method, dots_rr included
    assert {every.downsample_for(m) for m in ("grpo", "dots_rr")} == {8}
    off = load_config(None, ["train.downsample_by_method.dots_rr=null"]).train
    assert off.downsample_for("dots_rr") is None
    more = load_config(None, ["train.downsample_by_method.rr=3"]).train  # a method not named keeps its m
    assert (more.downsample_for("rr"), more.downsample_for("dots_rr")) == (3, 3)
    with pytest.raises(ValueError, match="train.downsample_by_method: each must be null or at least 2"):
        load_config(None, ["train.downsample_by_method.dots_rr=1"])
    with pytest.raises(ValueError, match="train.downsample_by_method.ppo"):
        load_config(None, ["train.downsample_by_method.ppo=4"])
    # an m of at least G trains on all G: a small group_size does not trip on a default it never set
    assert load_config(None, ["rollout.group_size=2"]).train.downsample_for("dots_rr") == 3


def test_a_runs_fingerprint_holds_its_own_m_not_the_other_methods():
    """Changing dots_rr's m leaves a grpo run's key (and its checkpoints, its bench runs) valid."""
    base, other = Config(), load_config(None, ["train.downsample_by_method.dots_rr=2"])
    assert base.fingerprint(method="grpo") == other.fingerprint(method="grpo")
    assert base.fingerprint(method="dots_rr") != other.fingerprint(method="dots_rr")
    # the same m reached by the override or by the method's own entry is the same run
    same = load_config(None, ["train.downsample=3"])
    assert base.fingerprint(method="dots_rr") == same.fingerprint(method="dots_rr")


def test_the_update_cuts_groups_by_the_methods_own_m():
    model = gpt2()
    groups = make_groups(model.config.vocab_size, g=8)
    for g in groups:
        g.rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]) if g.question_id != 2 else torch.ones(8)
    cfg = Config()
    assert [g.size for g in forwarded_groups(groups, cfg, "dots_rr")] == [3, 3, 3, 3]
    assert [g.size for g in forwarded_groups(groups, cfg, "grpo")] == [8, 8, 8, 8]
    replayed = [groups[0]]
    loss = run_update_for(model, groups, replayed, "dots_rr")
    cut = [downsample_group(g, 3) for g in groups]
    assert loss == pytest.approx(run_update_for(model, cut, [cut[0]], None), rel=1e-12, abs=1e-14)
    assert run_update_for(model, groups, replayed, "grpo") == pytest.approx(
        run_update_for(model, groups, replayed, None), rel=1e-12, abs=1e-14)


def run_update_for(model, groups, replayed, method):
    """The update's loss as `method` trains it at the shipped defaults (float64, one batch)."""
    from dots.update import update_on_groups
    from tests.test_microbatch import PAD, GradientRecorder

    opt = GradientRecorder(model.parameters())
    return update_on_groups(model, opt, groups, Config(), PAD, replayed=replayed, method=method)[0]


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


def test_a_dots_rr_run_trains_three_of_its_eight_rollouts_by_default(tiny_pipeline, pipeline_data, tmp_path,
                                                                   monkeypatch):
    """The shipped default reaches the trainer: a dots_rr step's update is told its method, and
    tokens/trained counts the 3 kept rows of each informative group, not all 8."""
    import dots.trainer as trainer_module
    from tests.test_trainer import _trainer

    calls = []
    real = trainer_module.update_on_groups

    def spy(*args, **kwargs):
        calls.append((args[2], kwargs.get("method")))
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "update_on_groups", spy)
    extra = ("train.steps=1", "eval.every=1", "train.checkpoint_every=1", "eval.probe_size=0")
    cfg, trainer = _trainer(tiny_pipeline, pipeline_data, "dots_rr", tmp_path / "dots_rr", *extra)
    rec = trainer.train_step()
    (groups, method), = calls
    informative = [g for g in groups if g.informative]
    assert method == "dots_rr" and cfg.rollout.group_size == 8 and informative
    kept = sum(int(downsample_group(g, 3).response_mask.sum()) for g in informative)
    assert rec["tokens/trained"] == kept < sum(int(g.response_mask.sum()) for g in informative)
    assert rec["train/groups_trained"] == len(informative)
