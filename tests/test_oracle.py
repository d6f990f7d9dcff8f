"""The oracle selection diagnostic: exact pass rates that match sampling, a config that refuses
it where the formula does not hold, and an arm whose rounds pick only from its scored candidates
with the scoring kept off the training clock."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from dots import stages
from dots.config import ConfigError, load_config
from dots.engines import engine_for
from dots.evaluation import pass_rates, task_io
from dots.models import load_policy
from dots.oracle import answer_ids, exact_pass_rates

from .test_trainer import _trainer


def test_exact_pass_rates_match_what_sampling_observes(tiny_pipeline, pipeline_data):
    cfg = tiny_pipeline
    pool = pipeline_data[0][:40]
    model, tok = load_policy(stages.paths(cfg).policy)
    io = task_io(cfg)
    exact = exact_pass_rates(model, io.encode(tok, pool), answer_ids(tok, pool), tok.eos_token_id,
                             tok.pad_token_id, cfg.rollout.max_new_tokens, batch_size=16)
    assert exact.shape == (40,) and np.all((exact >= 0) & (exact <= 1))
    n = 400
    engine = engine_for(cfg, model, tok, seed=0)
    sampled = pass_rates(engine, tok, pool, n, 1.0, cfg.rollout.max_new_tokens, torch.Generator().manual_seed(0),
                         io=io)
    se = np.sqrt(np.clip(exact * (1 - exact), 1e-4, None) / n)
    assert np.all(np.abs(sampled - exact) < 5 * se + 1e-9), np.c_[exact, sampled]
    assert exact.std() > 0.01  # the tiny policy has questions it solves and questions it does not
    # an answer the policy would never write scores (near) zero
    wrong = [tok("9999999", add_special_tokens=False)["input_ids"]] * 3
    assert exact_pass_rates(model, io.encode(tok, pool[:3]), wrong, tok.eos_token_id, tok.pad_token_id,
                            cfg.rollout.max_new_tokens).max() < 1e-3
    # an answer longer than max_new_tokens can never be written: rate 0, not its cut prefix's
    answers = answer_ids(tok, pool[:8])
    short = min(len(a) for a in answers) - 1
    cut = exact_pass_rates(model, io.encode(tok, pool[:8]), answers, tok.eos_token_id, tok.pad_token_id,
                           short)
    assert (cut == 0).all() and exact[:8].max() > 0


def test_the_oracle_is_refused_where_the_formula_does_not_hold():
    with pytest.raises(ConfigError, match="selection.oracle"):
        load_config(None, ["selection.oracle=64", "rollout.temperature=0.6"])
    with pytest.raises(ConfigError, match="selection.oracle"):
        load_config(None, ["selection.oracle=64", "reward.name=math_verify"])
    with pytest.raises(ConfigError, match="selection.oracle"):
        load_config(None, ["selection.oracle=99999999"])
    assert load_config(None, ["selection.oracle=64"]).selection.oracle == 64


def test_an_oracle_round_picks_from_its_candidates_off_the_clock(tiny_pipeline, pipeline_data, tmp_path):
    _, trainer = _trainer(tiny_pipeline, pipeline_data, "dots", tmp_path / "oracle", "train.steps=2",
                          "eval.every=2", "train.checkpoint_every=2", "selection.oracle=96")
    start = time.perf_counter()
    rec = trainer.train_step()
    outside = time.perf_counter() - start
    assert rec["time/oracle_s"] > 0
    predicted = trainer.predictor.predict_projected(trainer.projections, trainer.round_refs,
                                                    trainer.round_ref_labels)
    candidates = np.flatnonzero(trainer.round_pred != predicted)  # where the exact rates replaced d̂
    assert 0 < len(candidates) <= 96
    rest = np.setdiff1d(np.arange(len(trainer.pool)), candidates)
    assert not trainer.round_available[rest].any()  # the rest of the pool sits the round out
    assert trainer.round_available.sum() < len(candidates)  # the step's picks came from the candidates
    # the step's clock leaves the oracle's forward pass out, and only it
    assert rec["time/step_s"] == pytest.approx(outside - rec["time/oracle_s"], abs=0.05)
    assert rec["time/elapsed_s"] == rec["time/step_s"]
    assert rec["time/select_s"] >= 0
