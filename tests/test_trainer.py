"""The GRPO loop for the four methods, its DESIGN §4 records, and exact resume."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import numpy as np
import pytest
import torch

from dots import runfiles, stages
from dots.checkpoints import SET_ASIDE_KEPT, run_key, set_aside_path, set_asides
from dots.models import build_tokenizer, load_policy
from dots.trainer import Trainer, time_to_target

from .conftest import spy_rollouts, tiny_config

BASE_NAMES = ("train/reward_mean", "train/loss", "train/effective_ratio", "train/policy_version", "time/step_s",
              "time/rollout_s", "time/update_s", "time/select_s", "time/elapsed_s")
REPLAY_NAMES = ("replay/size", "replay/fraction", "replay/staleness_mean", "replay/staleness_max",
                "replay/ratio_mean", "replay/ratio_max")


def _trainer(pipeline_cfg, pipeline_data, method, run_dir, *extra, resume=False):
    cfg = tiny_config(pipeline_cfg.root, *extra)
    pool, held, emb, predictor = pipeline_data
    dots = method in ("dots", "dots_rr")
    return cfg, Trainer(cfg, method, stages.paths(cfg).policy, pool, held, run_dir,
                        predictor if dots else None, emb if dots else None, resume=resume)


@pytest.mark.parametrize("method", ["grpo", "dots", "rr", "dots_rr"])
def test_three_steps_change_the_policy_and_record_section4_names(tiny_pipeline, pipeline_data, tmp_path, method):
    cfg, trainer = _trainer(tiny_pipeline, pipeline_data, method, tmp_path / method, "train.steps=3",
                            "eval.every=3", "train.checkpoint_every=3")
    before = {k: v.clone() for k, v in load_policy(stages.paths(cfg).policy)[0].state_dict().items()}
    outside = []  # each step's wall-clock, timed around train_step from outside the trainer
    step = trainer.train_step

    def timed_step():
        start = time.perf_counter()
        rec = step()
        outside.append(time.perf_counter() - start)
        return rec

    trainer.train_step = timed_step
    result = trainer.run()
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "the policy did not move"

    records = result.records
    assert [r["step"] for r in records] == [1, 2, 3]
    elapsed = [r["time/elapsed_s"] for r in records]
    steps = [r["time/step_s"] for r in records]
    # the training clock is the sum of the steps (evaluations stand outside it) ...
    assert elapsed == pytest.approx([sum(steps[: k + 1]) for k in range(len(steps))])
    # ... and a step's time is the time train_step took, not a part of it nor more than it
    assert len(outside) == 3
    for inner, outer in zip(steps, outside):
        assert 0.5 * outer < inner <= outer, (inner, outer)
    for rec in records:
        for name in BASE_NAMES:
            assert name in rec and rec[name] is not None, (method, rec["step"], name)
            assert math.isfinite(rec[name]), (method, name)
        assert rec["train/policy_version"] == rec["step"]
        assert 0.0 <= rec["train/effective_ratio"] <= 1.0
        assert 0.0 <= rec["train/reward_mean"] <= 1.0
        # rollout, update and selection are disjoint spans inside the step, each measured
        parts = rec["time/rollout_s"] + rec["time/update_s"] + rec["time/select_s"]
        assert rec["time/step_s"] >= parts and rec["time/rollout_s"] > 0 and rec["time/update_s"] > 0, rec
        has_replay = any(k.startswith("replay/") for k in rec)
        has_dots = any(k.startswith("dots/") for k in rec)
        assert has_replay == (method in ("rr", "dots_rr"))
        if method in ("rr", "dots_rr"):
            for name in REPLAY_NAMES:
                assert name in rec, (method, rec["step"], name)
            assert 0.0 <= rec["replay/fraction"] < 1.0
        if method not in ("dots", "dots_rr"):
            assert not has_dots
            assert rec["time/select_s"] == 0.0
    if method in ("dots", "dots_rr"):
        every = cfg.selection.every
        for rec in records:
            if (rec["step"] - 1) % every == 0:  # a selection round starts
                assert "dots/ref_difficulty_mean" in rec
                assert 0.0 <= rec["dots/ref_difficulty_mean"] <= 1.0
            assert rec["time/select_s"] > 0
        assert any("dots/pearson" in r and "dots/mae" in r for r in records)
        assert all(0.0 <= r["dots/mae"] <= 1.0 for r in records if "dots/mae" in r)

    # held-out evaluation: at the start and at the last step, outside the training clock
    assert [e["step"] for e in result.evals] == [0, 3]
    assert records[-1]["eval/accuracy"] == result.evals[-1]["accuracy"] == result.final_accuracy
    assert (tmp_path / method / "records.jsonl").exists()
    summary = json.loads((tmp_path / method / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["method"] == method


def test_dots_needs_predictor_and_embeddings(tiny_pipeline, pipeline_data, tmp_path):
    cfg = tiny_config(tiny_pipeline.root)
    pool, held, emb, predictor = pipeline_data
    with pytest.raises(ValueError, match="predictor"):
        Trainer(cfg, "dots", stages.paths(cfg).policy, pool, held, tmp_path / "x", None, None, resume=False)
    with pytest.raises(ValueError, match="embeddings"):
        Trainer(cfg, "dots", stages.paths(cfg).policy, pool, held, tmp_path / "x", predictor, emb[:10],
                resume=False)


@pytest.mark.parametrize("method", ["dots_rr", "grpo"])
def test_resume_is_exact(tiny_pipeline, pipeline_data, tmp_path, method):
    extra = ("train.steps=6", "train.checkpoint_every=3", "eval.every=3")
    _, whole = _trainer(tiny_pipeline, pipeline_data, method, tmp_path / "whole", *extra)
    full = whole.run()

    _, first = _trainer(tiny_pipeline, pipeline_data, method, tmp_path / "split", *extra)
    first.run(stop_after=3)
    assert first.step == 3 and (tmp_path / "split" / "checkpoint.pt").exists()
    del first
    _, second = _trainer(tiny_pipeline, pipeline_data, method, tmp_path / "split", *extra, resume=True)
    assert second.step == 3
    resumed = second.run()

    assert len(full.records) == len(resumed.records) == 6
    for a, b in zip(full.records, resumed.records):
        assert a["step"] == b["step"]
        assert a["train/reward_mean"] == b["train/reward_mean"], a["step"]
        assert a["train/loss"] == b["train/loss"], a["step"]
        assert a["train/effective_ratio"] == b["train/effective_ratio"], a["step"]
        for key in ("replay/size", "replay/fraction", "replay/staleness_max", "dots/ref_difficulty_mean"):
            assert a.get(key) == b.get(key), (a["step"], key)
    assert [e["accuracy"] for e in full.evals] == [e["accuracy"] for e in resumed.evals]
    sa, sb = whole.model.state_dict(), second.model.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    # the run did learn something, so equality is not trivially of untouched weights
    assert any(r["train/loss"] != 0.0 for r in full.records)


def test_resume_refuses_another_method(tiny_pipeline, pipeline_data, tmp_path):
    extra = ("train.steps=2", "train.checkpoint_every=1", "eval.every=2")
    _, trainer = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "run", *extra)
    trainer.run(stop_after=1)
    with pytest.raises(ValueError, match="grpo"):
        _trainer(tiny_pipeline, pipeline_data, "rr", tmp_path / "run", *extra, resume=True)


EVALS = [
    {"step": 0, "elapsed_s": 0.0, "accuracy": 0.10},
    {"step": 10, "elapsed_s": 5.0, "accuracy": 0.30},
    {"step": 20, "elapsed_s": 9.5, "accuracy": 0.50},
    {"step": 30, "elapsed_s": 12.0, "accuracy": 0.45},
    {"step": 40, "elapsed_s": 15.0, "accuracy": 0.55},
]


@pytest.mark.parametrize("target,expected", [
    (0.05, (0.0, 0)),
    (0.10, (0.0, 0)),
    (0.2, (2.5, 5)),  # halfway from 0.1 (step 0) to 0.3 (step 10): read between the evaluations
    (0.30, (5.0, 10)),  # met at an evaluation: that evaluation's seconds and step
    (0.45, (8.375, 17.5)),  # the first crossing (0.3 -> 0.5), not a later one (0.45 at step 30)
    (0.52, (14.1, 37)),  # from the last evaluation below (0.45 at step 30) to the first above
    (0.6, (None, None)),
    (None, (None, None)),
])
def test_time_to_target(target, expected):
    got = time_to_target(EVALS, target)
    assert got == (None, None) if expected[0] is None else got == pytest.approx(expected)


def test_time_to_target_reads_every_cumulative_figure_at_the_same_point():
    from dots.runfiles import crossing

    evals = [dict(e, tokens_sampled=100 * e["step"] ** 2) for e in EVALS]
    hit = crossing(evals, 0.2)
    assert hit.before is evals[0] and hit.hit is evals[1] and hit.fraction == pytest.approx(0.5)
    assert hit.steps == (0, 10)
    # linear between the two evaluations, whatever the figure's own curve: 0 -> 10,000 tokens
    assert hit.of("tokens_sampled") == pytest.approx(5000.0)
    assert hit.of("missing") is None
    first = crossing(evals, 0.1)
    assert first.before is None and first.of("elapsed_s") == 0.0 and first.of("step") == 0
    assert first.steps == (0, 0)


def test_time_to_target_empty():
    assert time_to_target([], 0.1) == (None, None)


def test_dots_round_questions_are_distinct_and_exclude_references(tiny_pipeline, pipeline_data, tmp_path):
    cfg, trainer = _trainer(tiny_pipeline, pipeline_data, "dots", tmp_path / "dots", "train.steps=4",
                            "eval.every=4", "train.checkpoint_every=4", "selection.every=2")
    rollouts = []
    rollout = trainer._rollout

    def spy(idx):
        rollouts.append((trainer.step, [int(i) for i in idx]))
        return rollout(idx)

    trainer._rollout = spy
    for _ in range(4):
        trainer.train_step()
    k, b = cfg.selection.ref_size, cfg.train.batch_size
    # step 0: references then selected; step 1: selected; step 2: new round; step 3: selected
    rounds = {0: [], 2: []}
    refs = {}
    for step, idx in rollouts:
        start = step - step % cfg.selection.every
        if step == start and start not in refs:
            assert len(idx) == k
            refs[start] = idx
        else:
            rounds[start].extend(idx)
    for start, picked in rounds.items():
        assert len(picked) == len(set(picked)), "a question drawn twice in one round"
        assert not set(picked) & set(refs[start]), "a reference question drawn again"
        assert 0 < len(picked) <= cfg.selection.every * b
    assert len(set(refs[0])) == k


def test_dots_fresh_group_counts_take_in_every_reference_the_degenerate_ones_too(tiny_pipeline, pipeline_data,
                                                                                   tmp_path):
    """`train/effective_ratio` reads the groups a step trains on: a round's degenerate references never
    get there. The fresh counts (the bench's informative-share goal) count every group generated."""
    cfg, trainer = _trainer(tiny_pipeline, pipeline_data, "dots", tmp_path / "dots", "train.steps=4",
                            "eval.every=4", "train.checkpoint_every=4", "selection.every=2")
    rolled: dict[int, list] = {}
    rollout = trainer._rollout

    def spy(idx):
        groups = rollout(idx)
        rolled.setdefault(trainer.step, []).extend(groups)
        return groups

    trainer._rollout = spy
    records = [trainer.train_step() for _ in range(4)]
    k = cfg.selection.ref_size
    for rec in records:
        groups = rolled[rec["step"] - 1]
        assert rec["train/fresh_groups"] == len(groups)
        assert rec["train/fresh_informative"] == sum(g.informative for g in groups)
        share = rec["train/fresh_informative"] / len(groups)
        assert rec["train/fresh_effective_ratio"] == pytest.approx(share)
    round_steps = [r for r in records if (r["step"] - 1) % cfg.selection.every == 0]
    assert all(r["train/fresh_groups"] > k for r in round_steps)  # the K references and selected questions
    degenerate_refs = sum(k - sum(g.informative for g in rolled[r["step"] - 1][:k]) for r in round_steps)
    assert degenerate_refs > 0, "no degenerate reference: the test shows nothing"
    share = runfiles.fresh_share(records)
    assert share["train/fresh_groups_total"] == sum(len(v) for v in rolled.values())
    assert share["train/fresh_informative_total"] == sum(g.informative for v in rolled.values() for g in v)
    # trained groups: every group in a step's batch (informative references queued, degenerate ones dropped)
    trained = sum(round(r["train/effective_ratio"] * cfg.train.batch_size) for r in records)
    assert share["train/fresh_informative_total"] == trained  # dots trains each informative group it makes
    assert share["train/fresh_groups_total"] == 4 * cfg.train.batch_size + degenerate_refs
    assert runfiles.fresh_share(records[:1] + [{"step": 2}])["fresh_effective_ratio"] is None  # older records


def test_kl_and_group_scaling_variant_trains(tiny_pipeline, pipeline_data, tmp_path):
    _, trainer = _trainer(tiny_pipeline, pipeline_data, "rr", tmp_path / "kl", "train.steps=2", "eval.every=2",
                          "train.checkpoint_every=2", "loss.beta=0.05", "loss.scale_rewards=group")
    assert trainer.ref_model is not None
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    result = trainer.run()
    assert all(math.isfinite(r["train/loss"]) for r in result.records)
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    # the frozen reference does not move
    ref = load_policy(stages.paths(tiny_pipeline).policy)[0].state_dict()
    for k, v in trainer.ref_model.state_dict().items():
        assert torch.equal(ref[k], v), k


def _set_aside(run_dir) -> dict[int, set[str]]:
    """The set-aside checkpoints of a run folder: {step: {run key, ...}}."""
    out: dict[int, set[str]] = {}
    for a in set_asides(run_dir):
        out.setdefault(a.step, set()).add(a.path.name.split(".")[1])
    return out


def test_a_checkpoint_made_with_other_params_is_not_resumed_but_kept(tiny_pipeline, pipeline_data, tmp_path,
                                                                     capsys):
    extra = ("train.steps=2", "train.checkpoint_every=1", "eval.every=2")
    _, trainer = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "run", *extra)
    trainer.run(stop_after=1)
    capsys.readouterr()
    _, other = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "run", *extra, "train.lr=0.002",
                        resume=True)
    assert other.step == 0 and other.records == []  # started over: two runs are never mixed
    kept = set_aside_path(tmp_path / "run", trainer._run_fingerprint(), 1)
    assert torch.load(kept, weights_only=False)["step"] == 1  # nothing lost, named by its run and step
    out = capsys.readouterr().out
    assert f"was made with other params; starting over, old state kept as {kept.name}" in out
    other.run(stop_after=1)  # its own checkpoint replaces the moved one
    # a longer budget is the same run continued
    _, longer = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "run", "train.steps=3",
                         "train.checkpoint_every=1", "eval.every=2", "train.lr=0.002", resume=True)
    assert longer.step == 1


@pytest.mark.parametrize("change, why", [
    ("code", "by other dots code (update.py changed since)"), ("data", "on other data")])
def test_a_checkpoint_of_other_code_or_data_is_not_resumed_but_kept(tiny_pipeline, pipeline_data, tmp_path,
                                                                   monkeypatch, capsys, change, why):
    """Params alone do not make the same run: `dvc repro` re-runs a training stage whose module
    changed, and the trainer went on from the old code's checkpoint at the last step, training
    nothing (stop 67); a dataset file changed under the same params went the same way. The line
    names the module that changed (since stop 68)."""
    import dots.trainer

    extra = ("train.steps=2", "train.checkpoint_every=1", "eval.every=2")
    _, trainer = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "run", *extra)
    trainer.run()
    kept, made = set_aside_path(tmp_path / "run", trainer._run_fingerprint(), 2), trainer._run_identity()
    pool, held, _, _ = pipeline_data
    if change == "code":
        hashes = dots.trainer.module_hashes("training")
        monkeypatch.setattr(dots.trainer, "code_identity", lambda part: "edited")
        monkeypatch.setattr(dots.trainer, "module_hashes", lambda part: {**hashes, "update.py": "edited"})
    else:
        pool = [*pool[:-1], dataclasses.replace(pool[-1], answer=pool[-1].answer + "0")]
    capsys.readouterr()
    cfg = tiny_config(tiny_pipeline.root, *extra)
    again = Trainer(cfg, "grpo", stages.paths(cfg).policy, pool, held, tmp_path / "run", resume=True)
    assert again.step == 0 and again.records == []
    assert f"was made {why}; starting over, old state kept as {kept.name}" in capsys.readouterr().out
    assert torch.load(kept, weights_only=True)["identity"] == made  # nothing lost


def test_a_param_the_method_never_reads_keeps_its_finished_checkpoint(tiny_pipeline, pipeline_data, tmp_path):
    """`dvc exp run -S selection.tau=...` re-runs every `train@` stage (one params list for all):
    grpo's goes on from its finished checkpoint and trains nothing (it trained grpo again from
    step 0 before stop 67: on the GPU profile, hours for the same run); dots_rr's starts over."""
    extra = ("train.steps=2", "train.checkpoint_every=1", "eval.every=2")
    for method in ("grpo", "dots_rr"):
        _trainer(tiny_pipeline, pipeline_data, method, tmp_path / method, *extra)[1].run()
        other = ("selection.tau=0.3", "replay.capacity=64" if method == "grpo" else "selection.every=2")
        _, again = _trainer(tiny_pipeline, pipeline_data, method, tmp_path / method, *extra, *other,
                            resume=True)
        assert again.step == (2 if method == "grpo" else 0), method


def test_a_run_in_a_dvc_experiment_copy_goes_on_from_the_repositorys_checkpoint(tiny_pipeline, pipeline_data,
                                                                              tmp_path, monkeypatch, capsys):
    """`dvc exp run --queue` / `--temp` run a stage in a copy of the repository that holds no
    checkpoints: a queued sweep of `selection.tau` trained grpo from step 0 in every copy (stop 68).
    Now a run with no checkpoint of its own goes on from the repository's, read where it lies; one
    with other params, and any run outside such a copy, starts over."""
    extra = ("train.steps=2", "train.checkpoint_every=1", "eval.every=2")
    repo = tmp_path / "repo"
    copy = repo / ".dvc" / "tmp" / "exps" / "tmpabc"
    theirs, mine = repo / "ck" / "grpo", copy / "ck" / "grpo"
    _, made = _trainer(tiny_pipeline, pipeline_data, "grpo", theirs, *extra)
    made.run()
    kept = (theirs / "checkpoint.pt").read_bytes()
    copy.mkdir(parents=True)
    monkeypatch.chdir(copy)
    monkeypatch.setenv("DVC_ROOT", str(repo))
    capsys.readouterr()
    _, again = _trainer(tiny_pipeline, pipeline_data, "grpo", mine, *extra, "selection.tau=0.3", resume=True)
    assert again.step == 2 and again.records == made.records
    assert f"going on from the repository's {theirs / 'checkpoint.pt'} (step 2)" in capsys.readouterr().out
    assert (theirs / "checkpoint.pt").read_bytes() == kept and not set_asides(theirs)  # read where it lies
    _, other = _trainer(tiny_pipeline, pipeline_data, "grpo", mine, *extra, "train.lr=0.002", resume=True)
    assert other.step == 0
    monkeypatch.setenv("DVC_ROOT", str(copy))  # `dvc repro` in the copy itself: nothing to look up
    assert _trainer(tiny_pipeline, pipeline_data, "grpo", mine, *extra, resume=True)[1].step == 0


def test_in_repository_maps_a_path_of_a_dvc_copy_to_the_repository(tmp_path, monkeypatch):
    from dots.experiment_copy import in_repository

    copy = tmp_path / "repo" / ".dvc" / "tmp" / "exps" / "tmpabc"
    copy.mkdir(parents=True)
    monkeypatch.chdir(copy)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert in_repository("artifacts") is None  # not run by DVC
    monkeypatch.setenv("DVC_ROOT", str(copy))
    assert in_repository("artifacts") is None  # `dvc repro`: the repository itself
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "repo"))
    assert in_repository("artifacts/checkpoints") == tmp_path / "repo" / "artifacts" / "checkpoints"
    assert in_repository(tmp_path / "elsewhere") is None  # outside the copy


def test_params_changed_back_go_on_from_their_set_aside_checkpoint(tiny_pipeline, pipeline_data, tmp_path,
                                                                    capsys):
    """A params change reverted: the first run goes on from where it was set aside instead of
    starting over (on the GPU profile, hours), and ends as the run never interrupted does."""
    extra = ("train.steps=4", "train.checkpoint_every=1", "eval.every=2")
    _, whole = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "whole", *extra)
    full = whole.run()
    _, first = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "run", *extra)
    first.run(stop_after=2)
    _, other = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "run", *extra, "train.lr=0.002",
                        resume=True)
    other.run(stop_after=1)
    capsys.readouterr()
    _, back = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "run", *extra, resume=True)
    out = capsys.readouterr().out
    assert back.step == 2  # not 0
    mine, theirs = set_aside_path(tmp_path / "run", first._run_fingerprint(), 2), \
        set_aside_path(tmp_path / "run", other._run_fingerprint(), 1)
    assert f"going on from {mine.name} (step 2), set aside earlier by a run with these params" in out
    assert f"old state kept as {theirs.name}" in out
    assert not mine.exists() and torch.load(theirs, weights_only=False)["step"] == 1  # swapped, nothing lost
    resumed = back.run()
    assert [r["train/loss"] for r in resumed.records] == [r["train/loss"] for r in full.records]
    assert [e["accuracy"] for e in resumed.evals] == [e["accuracy"] for e in full.evals]
    assert resumed.resumed_at == [2]


def test_a_set_aside_checkpoint_named_for_another_run_is_refused_by_name(tiny_pipeline, pipeline_data,
                                                                        tmp_path):
    """A file renamed by hand to this run's key and step is not loaded as this run's state."""
    extra = ("train.steps=2", "train.checkpoint_every=1", "eval.every=2")
    _, other = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "run", *extra, "train.lr=0.002")
    other.run(stop_after=1)
    _, mine = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "other", *extra)
    fake = set_aside_path(tmp_path / "run", mine._run_fingerprint(), 1)
    (tmp_path / "run" / "checkpoint.pt").rename(fake)
    with pytest.raises(ValueError, match=rf"{fake.name}: its name says it is this grpo run's state, and it "
                                         r"holds another run's \(method 'grpo', other params\)"):
        _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "run", *extra, resume=True)
    assert fake.exists()  # nothing moved


def test_a_checkpoint_past_a_shorter_budget_is_not_resumed_but_kept(tiny_pipeline, pipeline_data, tmp_path):
    """`train.steps=2` after a 3-step run: resuming returned the 3-step policy, records and
    evaluations as the 2-step run's (and the DVC stage recorded them under train.steps 2). The
    3-step budget again goes on from the 3-step state, set aside meanwhile."""
    extra = ("train.checkpoint_every=1", "eval.every=1")
    _, full = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "run", "train.steps=3", *extra)
    full.run()
    _, shorter = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "run", "train.steps=2", *extra,
                          resume=True)
    assert shorter.step == 0 and shorter.records == []  # started over
    kept = set_aside_path(tmp_path / "run", full._run_fingerprint(), 3)
    assert torch.load(kept, weights_only=False)["step"] == 3  # nothing lost
    result = shorter.run()
    assert [r["step"] for r in result.records] == [1, 2] and shorter.step == 2
    # the same budget again resumes as before
    _, again = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "run", "train.steps=2", *extra,
                        resume=True)
    assert again.step == 2
    # the longer budget again: the 3-step state, not 2 steps on from the 2-step one
    _, longer = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "run", "train.steps=3", *extra,
                         resume=True)
    assert longer.step == 3 and not kept.exists()
    assert _set_aside(tmp_path / "run") == {2: {run_key(full._run_fingerprint())}}


def test_a_longer_budget_ends_as_the_uninterrupted_run_without_the_old_last_evaluation(
        tiny_pipeline, pipeline_data, tmp_path):
    """A 3-step run taken to 6 (eval.every 2) kept the evaluation its old last step had: evaluations
    at 0, 2, 3, 4, 6 against the uninterrupted run's 0, 2, 4, 6, and another smoothed end point."""
    extra = ("train.checkpoint_every=1", "eval.every=2")
    _, short = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "run", "train.steps=3", *extra)
    short.run()
    _, longer = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "run", "train.steps=6", *extra,
                         resume=True)
    gone_on = longer.run()
    _, whole = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "whole", "train.steps=6", *extra)
    straight = whole.run()
    assert [e["step"] for e in gone_on.evals] == [e["step"] for e in straight.evals] == [0, 2, 4, 6]
    assert [e["accuracy"] for e in gone_on.evals] == [e["accuracy"] for e in straight.evals]
    for a, b in zip(gone_on.records, straight.records):
        assert {k: v for k, v in a.items() if not k.startswith("time/")} == \
            {k: v for k, v in b.items() if not k.startswith("time/")}, a["step"]


def test_at_most_two_set_aside_checkpoints_are_kept(tiny_pipeline, pipeline_data, tmp_path, capsys):
    """Every params change sets a checkpoint aside (about 9 GB on the GPU profile): the newest
    SET_ASIDE_KEPT stay, an older one is removed with a line naming it."""
    extra = ("train.steps=2", "train.checkpoint_every=1", "eval.every=2")
    keys = []
    for lr in ("0.001", "0.002", "0.003", "0.004"):
        _, t = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "run", *extra, f"train.lr={lr}",
                        resume=True)
        t.run(stop_after=1)
        keys.append(run_key(t._run_fingerprint()))
    out = capsys.readouterr().out
    assert SET_ASIDE_KEPT == 2 and _set_aside(tmp_path / "run") == {1: {keys[1], keys[2]}}
    assert f"removed checkpoint.{keys[0]}.step1.pt (step 1, set aside " in out
    assert "the oldest set-aside checkpoint: at most 2 are kept" in out
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["step"] == 1  # lr 0.004's own


def test_other_threads_are_another_run_other_checkpoint_spacing_is_not(tiny_pipeline, pipeline_data,
                                                                        tmp_path):
    """torch's sums run in another order on other threads: `-S train.threads=1` went on from a run
    trained on 2 (and dvc.lock recorded 1 thread for its weights)."""
    ident = {extra: _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / extra, extra)[1]._run_identity()
             for extra in ("train.threads=1", "train.threads=2", "train.checkpoint_every=7")}
    assert ident["train.threads=1"]["params"] != ident["train.threads=2"]["params"]
    # the fixture trains on 2 threads: a checkpoint spacing alone is the same run
    assert ident["train.threads=2"]["params"] == ident["train.checkpoint_every=7"]["params"]


# ---- smoothing: one noisy evaluation can neither set the target nor reach it ------------------

SPIKY = [
    {"step": 0, "elapsed_s": 0.0, "accuracy": 0.10},
    {"step": 10, "elapsed_s": 5.0, "accuracy": 0.20},
    {"step": 20, "elapsed_s": 10.0, "accuracy": 0.90},  # a lucky evaluation
    {"step": 30, "elapsed_s": 15.0, "accuracy": 0.20},
    {"step": 40, "elapsed_s": 20.0, "accuracy": 0.30},
    {"step": 50, "elapsed_s": 25.0, "accuracy": 0.50},
    {"step": 60, "elapsed_s": 30.0, "accuracy": 0.55},
    {"step": 70, "elapsed_s": 35.0, "accuracy": 0.60},
]


def test_smoothed_is_the_trailing_mean_with_a_shorter_window_at_the_start():
    from dots.trainer import smoothed

    s = smoothed(SPIKY, 3)
    assert len(s) == len(SPIKY)
    assert s[0] == pytest.approx(0.10)
    assert s[1] == pytest.approx(0.15)
    assert s[2] == pytest.approx((0.10 + 0.20 + 0.90) / 3)
    assert s[5] == pytest.approx((0.20 + 0.30 + 0.50) / 3)
    assert s[7] == pytest.approx((0.50 + 0.55 + 0.60) / 3)
    assert smoothed(SPIKY, 1) == pytest.approx([e["accuracy"] for e in SPIKY])
    assert smoothed([], 3) == []


def test_final_smoothed_is_the_mean_of_the_last_window():
    from dots.trainer import final_smoothed

    assert final_smoothed(SPIKY, 3) == pytest.approx((0.50 + 0.55 + 0.60) / 3)
    assert final_smoothed(SPIKY, 1) == pytest.approx(0.60)
    assert final_smoothed(SPIKY[:2], 3) == pytest.approx(0.15)  # fewer evaluations than the window
    assert final_smoothed([], 3) is None


def test_a_single_spike_above_the_target_does_not_count_with_window_3():
    from dots.trainer import final_smoothed, target_eval

    target = final_smoothed(SPIKY, 3)  # 0.55
    # unsmoothed, the lucky evaluation at step 20 reaches the target
    assert time_to_target(SPIKY, target) == pytest.approx((7.5, 15))  # halfway up 0.2 -> 0.9, steps 10 to 20
    # smoothed over 3, it does not: the trailing mean first reaches 0.55 at the last evaluation
    assert time_to_target(SPIKY, target, 3) == pytest.approx((35.0, 70))
    hit = target_eval(SPIKY, target, 3)
    assert hit is SPIKY[-1]
    assert target_eval(SPIKY, 0.61, 3) is None and target_eval(SPIKY, None, 3) is None
    # a run reaches its own smoothed end point: grpo's paired ratio is 1 by construction
    for w in (1, 2, 3, 5):
        assert target_eval(SPIKY, final_smoothed(SPIKY, w), w) is not None


# ---- sampled evaluation with common random numbers -------------------------------------------

def test_sampled_evaluation_draws_the_same_dice_every_time(tiny_pipeline, pipeline_data, tmp_path):
    cfg, trainer = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "crn", "eval.metric=sampled",
                            "eval.samples=4", "eval.probe_size=64")
    first = trainer.evaluate()
    second = trainer.evaluate()  # no training in between: the same policy, the same dice
    for key in ("accuracy", "accuracy_se", "frontier", "probe_pass_rate"):
        assert first[key] == second[key], key
    assert 0.0 < first["accuracy"] < 1.0, "the tiny policy solves some held-out questions, not all"
    assert first["accuracy_se"] > 0
    assert 0.0 <= first["frontier"] <= 1.0 and 0.0 <= first["probe_pass_rate"] <= 1.0
    assert first["step"] == 0 and first["tokens_sampled"] == first["tokens_trained"] == 0
    # the seed is what holds the dice: another seed draws other samples
    a = trainer._rates(trainer.eval_set, 4, cfg.eval.seed)
    b = trainer._rates(trainer.eval_set, 4, cfg.eval.seed + 1)
    assert len(a) == len(trainer.eval_set) and first["accuracy"] == pytest.approx(float(a.mean()))
    assert not (a == b).all()


class _LengthyEngine:
    """An engine whose answers take `steps` decode steps: like HFEngine it draws G numbers a
    step from the generator until its batch has ended, and records the first it draws."""

    batch_size = 8

    def __init__(self, steps):
        self.steps, self.first = steps, []

    def generate(self, prompts, g, temperature, max_new_tokens, generator=None, need_logprobs=True):
        from dots.rollout import Group

        assert len(prompts) * g <= self.batch_size  # a paired chunk is at most one engine batch
        draws = torch.rand(self.steps, len(prompts) * g, generator=generator)
        self.first.append(float(draws[0, 0]))
        return [Group(question_id=0, prompt_ids=torch.tensor(p),
                      response_ids=torch.ones(g, 1, dtype=torch.long),
                      response_mask=torch.ones(g, 1, dtype=torch.bool), logprobs=torch.zeros(g, 1),
                      texts=["1"] * g) for p in prompts]


def test_paired_evaluation_gives_each_question_the_same_draws_whatever_the_policy_answered():
    """One generator shared by an evaluation's batches moved by the decode steps each batch took:
    two policies answering at other lengths drew other numbers from the second batch on (half of
    `grpo`'s and `dots_rr`'s held-out set). Paired, each chunk has its own seed, drawn first."""
    from dots.data import Question
    from dots.evaluation import pass_rates

    questions = [Question(id=i, prompt=f"{i}+1=", answer=str(i + 1)) for i in range(10)]
    tok = build_tokenizer()
    drawn = {}
    for paired in (False, True):
        for steps in (3, 7):  # two policies: short and long answers
            engine = _LengthyEngine(steps)
            pass_rates(engine, tok, questions, 2, 1.0, 10, torch.Generator().manual_seed(0), chunk=4,
                       paired=paired)
            drawn[paired, steps] = engine.first
    assert drawn[True, 3] == drawn[True, 7] and len(drawn[True, 3]) == 3  # 10 questions, 4 a chunk
    assert drawn[False, 3][0] == drawn[False, 7][0] and drawn[False, 3][1:] != drawn[False, 7][1:]


def test_evaluation_does_not_move_the_training_stream(tiny_pipeline, pipeline_data, tmp_path):
    extra = ("eval.samples=2", "eval.probe_size=32")
    _, plain = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "plain", *extra)
    _, evaluated = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "evaluated", *extra)
    a = [plain.train_step() for _ in range(2)]
    evaluated.evaluate()
    b = [evaluated.train_step()]
    evaluated.evaluate()
    b.append(evaluated.train_step())
    for x, y in zip(a, b):
        for key in ("train/reward_mean", "train/loss", "train/effective_ratio", "tokens/sampled"):
            assert x[key] == y[key], (x["step"], key)


def test_greedy_metric_is_per_question_exact_match(tiny_pipeline, pipeline_data, tmp_path):
    from dots.evaluation import greedy_accuracy

    _, trainer = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "greedy", "eval.metric=greedy",
                          "eval.probe_size=0")
    e = trainer.evaluate()
    assert "frontier" not in e  # probe off
    trainer.model.eval()
    per = greedy_accuracy(trainer.engine, trainer.tokenizer, trainer.eval_set, trainer.cfg.rollout.max_new_tokens,
                          trainer.cfg.eval.batch_size, trainer.io, per_question=True)
    assert set(per) <= {0.0, 1.0} and len(per) == len(trainer.eval_set)
    assert e["accuracy"] == pytest.approx(sum(per) / len(per))
    p = e["accuracy"]
    assert e["accuracy_se"] == pytest.approx(math.sqrt(p * (1 - p) / (len(per) - 1)))


# ---- machine-independent costs: tokens sampled and trained, groups trained -------------------

def _check_token_records(records, cfg, method):
    b, g, t = cfg.train.batch_size, cfg.rollout.group_size, cfg.rollout.max_new_tokens
    totals = {"tokens/sampled": 0, "tokens/trained": 0, "train/groups_trained": 0}
    for rec in records:
        for key, running in list(totals.items()):
            totals[key] = running + rec[key]
            assert rec[f"{key}_total"] == totals[key], (rec["step"], key)  # running sums of the per-step counts
        assert 0 <= rec["tokens/trained"] <= rec["tokens/sampled"], rec["step"]
        # every sampled response has between 1 and max_new_tokens tokens
        assert b * g <= rec["tokens/sampled"] <= b * g * t, rec["step"]
        if method == "grpo":  # no KL (beta=0): exactly the informative groups are trained
            assert rec["train/groups_trained"] == round(rec["train/effective_ratio"] * b), rec["step"]
            assert (rec["tokens/trained"] == 0) == (rec["train/groups_trained"] == 0)
            assert g * rec["train/groups_trained"] <= rec["tokens/trained"] <= g * t * rec["train/groups_trained"]
    assert totals["train/groups_trained"] > 0, "the tiny policy has informative groups"
    return totals


def test_token_counts_add_up_and_survive_a_resume(tiny_pipeline, pipeline_data, tmp_path):
    extra = ("train.steps=4", "train.checkpoint_every=2", "eval.every=2", "eval.samples=2",
             "eval.probe_size=32")
    cfg, whole = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "whole", *extra)
    full = whole.run()
    totals = _check_token_records(full.records, cfg, "grpo")
    # the evaluations carry the running totals at their step
    by_step = {r["step"]: r for r in full.records}
    assert [e["step"] for e in full.evals] == [0, 2, 4]
    assert full.evals[0]["tokens_sampled"] == 0 and full.evals[0]["groups_trained"] == 0
    for e in full.evals[1:]:
        assert e["tokens_sampled"] == by_step[e["step"]]["tokens/sampled_total"]
        assert e["tokens_trained"] == by_step[e["step"]]["tokens/trained_total"]
        assert e["groups_trained"] == by_step[e["step"]]["train/groups_trained_total"]
    summary = json.loads((tmp_path / "whole" / "summary.json").read_text())
    assert summary["tokens/sampled_total"] == totals["tokens/sampled"]
    assert summary["tokens/trained_total"] == totals["tokens/trained"]
    assert summary["train/groups_trained_total"] == totals["train/groups_trained"]
    assert summary["final_accuracy_smoothed"] == pytest.approx(
        sum(e["accuracy"] for e in full.evals[-3:]) / 3)
    assert summary["accuracy_se"] == full.evals[-1]["accuracy_se"]
    assert summary["frontier_min"] == min(e["frontier"] for e in full.evals)
    assert summary["frontier_final"] == full.evals[-1]["frontier"]

    _, first = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "split", *extra)
    first.run(stop_after=2)
    del first
    _, second = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "split", *extra, resume=True)
    assert second.step == 2
    resumed = second.run()
    names = [f"{k}{s}" for k in ("tokens/sampled", "tokens/trained", "train/groups_trained") for s in ("", "_total")]
    assert [[r[k] for k in names] for r in resumed.records] == [[r[k] for k in names] for r in full.records]
    # the evaluations agree too (their seconds are measured, so they may not)
    assert [{k: v for k, v in e.items() if k != "elapsed_s"} for e in resumed.evals] == [
        {k: v for k, v in e.items() if k != "elapsed_s"} for e in full.evals]


def test_token_counts_of_a_replaying_selecting_run(tiny_pipeline, pipeline_data, tmp_path):
    cfg, trainer = _trainer(tiny_pipeline, pipeline_data, "dots_rr", tmp_path / "dots_rr", "eval.probe_size=0")
    recs = [trainer.train_step() for _ in range(3)]
    totals = {"tokens/sampled": 0, "tokens/trained": 0, "train/groups_trained": 0}
    k, b, g, t = cfg.selection.ref_size, cfg.train.batch_size, cfg.rollout.group_size, cfg.rollout.max_new_tokens
    for rec in recs:
        for key, running in list(totals.items()):
            totals[key] = running + rec[key]
            assert rec[f"{key}_total"] == totals[key], (rec["step"], key)
        # a round's references are sampled tokens too; replayed groups are trained, not sampled again
        assert rec["tokens/sampled"] <= (b + k) * g * t
        assert rec["train/groups_trained"] <= b
    assert recs[0]["tokens/sampled"] >= k * g  # the first step rolls out the round's references


def test_dots_probe_pearson_is_the_rounds_prediction_on_the_probe_without_its_references(
        tiny_pipeline, pipeline_data, tmp_path):
    from dots.predictor_training import pearson

    cfg, trainer = _trainer(tiny_pipeline, pipeline_data, "dots", tmp_path / "probe", "eval.probe_size=64",
                            "eval.samples=2", "eval.metric=sampled")
    assert "probe_pearson" not in trainer.evaluate()  # no round yet: nothing predicted
    trainer.train_step()
    e = trainer.evaluate()
    probe = trainer.probe
    rates = trainer._rates([trainer.pool[i] for i in probe], cfg.rollout.group_size, cfg.eval.seed + 1)
    out = ~np.isin(probe, trainer.round_refs)
    assert out.sum() < len(probe) or not np.isin(trainer.round_refs, probe).any()
    assert e["probe_pearson"] == pytest.approx(pearson(trainer.round_pred[probe[out]], 1.0 - rates[out]))
    # a grpo run predicts nothing
    _, grpo = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "grpo", "eval.probe_size=64")
    grpo.train_step()
    assert "probe_pearson" not in grpo.evaluate()


def test_forwarding_every_group_trains_the_whole_batch_to_the_same_policy(tiny_pipeline, pipeline_data, tmp_path):
    """train.skip_degenerate=false is grpo as a plain trainer runs it: every group of the batch
    is trained (and counted), degenerate ones included, for the same policy up to float order."""
    extra = ("train.steps=3", "eval.every=3", "train.checkpoint_every=3", "eval.probe_size=0")
    cfg, skip = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "skip", *extra)
    _, full = _trainer(tiny_pipeline, pipeline_data, "grpo", tmp_path / "full", *extra, "train.skip_degenerate=false")
    skipped, forwarded = skip.run().records, full.run().records
    b = cfg.train.batch_size
    assert [r["train/groups_trained"] for r in forwarded] == [b] * 3
    assert [r["train/groups_trained"] for r in skipped] == [round(r["train/effective_ratio"] * b) for r in skipped]
    assert any(r["train/effective_ratio"] < 1 for r in skipped)  # there was a degenerate group to skip
    assert sum(r["tokens/trained"] for r in forwarded) > sum(r["tokens/trained"] for r in skipped)
    assert [r["tokens/sampled"] for r in forwarded] == [r["tokens/sampled"] for r in skipped]
    # the first step starts from the same policy: the same loss (the mean over every group)
    assert forwarded[0]["train/loss"] == pytest.approx(skipped[0]["train/loss"], rel=1e-5, abs=1e-7)
    # later steps differ only by float order, which AdamW can turn into at most ~lr per step on a
    # weight whose gradient is near zero
    for name, value in skip.model.state_dict().items():
        torch.testing.assert_close(full.model.state_dict()[name], value, rtol=0, atol=3 * cfg.train.rate_for("grpo"))


def test_dots_records_the_pearson_ceiling_of_its_fresh_labels(tiny_pipeline, pipeline_data, tmp_path):
    from dots.predictor_training import pearson_ceiling

    _, trainer = _trainer(tiny_pipeline, pipeline_data, "dots", tmp_path / "ceiling", "eval.probe_size=0",
                          "train.steps=4")
    seen = spy_rollouts(trainer)
    # a step whose batch the round's informative references fill (all but at most one of B) selects
    # too few questions to score; how many references are informative depends on the machine's
    # warm-up (an AVX2 machine's filled step 1), so step until one selects
    for _ in range(4):
        rec = trainer.train_step()
        if "dots/pearson" in rec:
            break
    assert "dots/pearson_ceiling" in rec  # recorded wherever the selected questions are scored
    fresh = seen[-1]  # the selected questions' rollouts come after the round's references
    ceiling = rec["dots/pearson_ceiling"]
    expected = pearson_ceiling([g.rewards.numpy() for g in fresh])
    assert ceiling == pytest.approx(expected, nan_ok=True)
    assert np.isnan(ceiling) or 0.0 <= ceiling <= 1.0
