"""The attention-based difficulty predictor, on the tiny pipeline's artifacts."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from dots import stages
from dots.predictor import DifficultyPredictor, load_predictor, save_predictor
from dots.predictor_training import pearson, pearson_ceiling, split_labelled

from .conftest import tiny_config


def test_saved_metrics_reach_pearson(tiny_pipeline):
    metrics = json.loads(stages.paths(tiny_pipeline).predictor_metrics.read_text())
    assert metrics["pearson"] >= 0.7, metrics
    assert set(metrics["per_policy"]) == set(tiny_pipeline.label.policies)
    assert 0 < metrics["mae"] < 0.5
    assert metrics["holdout_questions"] + metrics["train_questions"] == tiny_pipeline.label.num_questions
    assert metrics["ref_size"] == tiny_pipeline.selection.ref_size


def test_labels_have_spread(tiny_pipeline):
    """The warm-up left solved, half-solved and unsolved questions (what the predictor needs)."""
    data = json.loads(stages.paths(tiny_pipeline).labels.read_text())
    final = np.asarray(data["policies"]["final"])
    assert (final == 0).mean() > 0.05  # always solved
    assert ((final > 0) & (final < 1)).mean() > 0.2  # sometimes
    assert (final == 1).mean() > 0.2  # never


def test_calibration_strictly_inside_unit_interval(pipeline_data):
    *_, predictor = pipeline_data
    raw = torch.tensor([0.0, 1e-30, 1e-6, 0.3, 0.5, 0.7, 1 - 1e-6, 1.0])
    label_sets = [torch.zeros(32), torch.ones(32), torch.full((32,), 0.5),
                  torch.rand(32, generator=torch.Generator().manual_seed(0)), torch.tensor([1.0])]
    with torch.no_grad():
        for labels in label_sets:
            out = predictor.calibrate(raw, labels)
            assert torch.isfinite(out).all()
            assert (out > 0).all() and (out < 1).all(), (labels[:3], out)
            assert (out.diff() >= 0).all()  # monotone in the raw prediction


def test_calibration_temperature_is_bounded_below():
    torch.manual_seed(0)
    calib = DifficultyPredictor(8, 8).calibration
    with torch.no_grad():
        for p in calib.parameters():
            p.copy_(torch.randn_like(p) * 30)
        for labels in (torch.zeros(16), torch.ones(16), torch.rand(16)):
            temperature, bias = calib(labels)
            assert torch.isfinite(temperature) and torch.isfinite(bias)
            assert temperature > 0.3


def test_fresh_calibration_is_identity():
    predictor = DifficultyPredictor(8, 8)
    raw = torch.tensor([0.1, 0.5, 0.9])
    with torch.no_grad():
        assert torch.allclose(predictor.calibrate(raw, torch.rand(5)), raw, atol=1e-6)


def _leak_setup(emb):
    queries = torch.arange(0, 20)
    refs = torch.arange(10, 42)  # queries 10..19 are also references
    exclude = queries[:, None] == refs[None, :]
    labels = torch.rand(len(refs), generator=torch.Generator().manual_seed(1))
    return queries, refs, exclude, labels


@pytest.mark.parametrize("which", ["trained_attention", "fresh_forward"])
def test_query_never_attends_to_itself(pipeline_data, which):
    *_, emb, trained = pipeline_data
    queries, refs, exclude, labels = _leak_setup(emb)
    own_query, own_slot = 15, 5  # query 15 is reference slot 5
    assert refs[own_slot] == own_query and exclude[own_query, own_slot]
    changed = labels.clone()
    changed[own_slot] = 1.0 - changed[own_slot]

    if which == "trained_attention":
        model = trained
        with torch.no_grad():
            q, k = model.query_tower(emb[queries]), model.ref_tower(emb[refs])

        def predict(lab, mask):
            with torch.no_grad():
                return model.attend(q, k, lab, mask)
    else:  # the full forward, with the fresh identity calibration so only attention can move it
        torch.manual_seed(0)
        model = DifficultyPredictor(emb.shape[1], 32, dropout=0.0).eval()

        def predict(lab, mask):
            with torch.no_grad():
                return model(emb[queries], emb[refs], lab, mask)

    masked_before, masked_after = predict(labels, exclude), predict(changed, exclude)
    assert masked_before[own_query] == masked_after[own_query]
    others = torch.arange(len(queries)) != own_query
    assert not torch.allclose(masked_before[others], masked_after[others])  # the others do see it
    open_before, open_after = predict(labels, None), predict(changed, None)
    assert not torch.isclose(open_before[own_query], open_after[own_query])


def test_predict_projected_equals_full_forward(pipeline_data):
    _, _, emb, predictor = pipeline_data
    rng = np.random.default_rng(0)
    refs = rng.choice(emb.shape[0], size=32, replace=False)
    labels = rng.random(32).astype(np.float32)
    proj = predictor.project_pool(emb)
    fast = predictor.predict_projected(proj, refs, labels)
    predictor.eval()
    with torch.no_grad():
        full = predictor(emb, emb[torch.as_tensor(refs)], torch.as_tensor(labels)).numpy()
    assert fast.shape == (emb.shape[0],)
    np.testing.assert_allclose(fast, full, atol=1e-6)
    assert np.isfinite(fast).all() and (fast > 0).all() and (fast < 1).all()
    assert fast.std() > 0.01  # not a constant


def test_project_pool_uses_eval_mode_and_restores_training():
    torch.manual_seed(0)
    model = DifficultyPredictor(16, 32, dropout=0.5)
    emb = torch.randn(50, 16)
    model.train()
    proj = model.project_pool(emb)
    assert model.training
    model.eval()
    with torch.no_grad():
        assert torch.allclose(proj.queries, model.query_tower(emb))
        assert torch.allclose(proj.keys, model.ref_tower(emb))
    refs = np.arange(10)
    labels = np.linspace(0, 1, 10)
    model.train()  # dropout on: predict_projected must still match the eval-mode forward
    a = model.predict_projected(proj, refs, labels)
    model.eval()
    with torch.no_grad():
        b = model(emb, emb[:10], torch.as_tensor(labels, dtype=torch.float32)).numpy()
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_save_load_round_trip(pipeline_data, tmp_path):
    _, _, emb, predictor = pipeline_data
    path = tmp_path / "p.pt"
    save_predictor(path, predictor, {"pearson": 0.5})
    loaded = load_predictor(path)
    assert not loaded.training
    refs, labels = np.arange(32), np.linspace(0, 1, 32)
    np.testing.assert_array_equal(loaded.predict_projected(loaded.project_pool(emb), refs, labels),
                                  predictor.predict_projected(predictor.project_pool(emb), refs, labels))


def test_predictions_track_observed_difficulty(tiny_pipeline, pipeline_data):
    """Held-out labelled questions: the round's prediction correlates with their observed d."""
    pool, _, emb, predictor = pipeline_data
    data = json.loads(stages.paths(tiny_pipeline).labels.read_text())
    idx = np.asarray(data["question_index"])
    d = np.asarray(data["policies"]["final"])
    train, hold = split_labelled(len(idx), tiny_pipeline.predictor.holdout_fraction, tiny_pipeline.task.seed)
    refs = np.random.default_rng(3).choice(train, size=32, replace=False)
    pred = predictor.predict_projected(predictor.project_pool(emb[idx]), refs, d[refs])
    assert pearson(pred[hold], d[hold]) > 0.5


def test_pearson_helper():
    assert pearson(np.array([1.0, 2.0, 3.0]), np.array([2.0, 4.0, 6.5])) > 0.99
    assert np.isnan(pearson(np.array([1.0, 1.0]), np.array([0.0, 1.0])))
    assert np.isnan(pearson(np.array([1.0]), np.array([0.0])))


def test_pearson_is_scipys_r():
    """numpy's corrcoef (cheap enough for every step's clock) gives scipy's Pearson r."""
    from scipy import stats  # noqa: PLC0415

    rng = np.random.default_rng(1)
    for n in (2, 3, 32, 400):
        a = rng.random(n)
        for b in (rng.random(n), 2.0 * a + 0.1 * rng.random(n), 1.0 - a):
            assert pearson(a, b) == pytest.approx(stats.pearsonr(a, b).statistic, abs=1e-12)


@pytest.mark.parametrize("spread", [(0.3, 0.7), (0.05, 0.95)], ids=["narrow", "wide"])
def test_pearson_ceiling_is_what_knowing_the_true_pass_rates_scores(spread):
    """A predictor equal to the true pass rates, scored against rates observed from G = 8
    samples, gets the ceiling the observed rewards alone estimate; a narrower spread of true
    rates (questions picked near 50%) leaves less to explain and a lower ceiling."""
    rng = np.random.default_rng(0)
    true = rng.uniform(*spread, size=4000)
    rewards = (rng.random((4000, 8)) < true[:, None]).astype(float)
    perfect = pearson(true, rewards.mean(axis=1))
    assert pearson_ceiling(list(rewards)) == pytest.approx(perfect, abs=0.02)


def test_pearson_ceiling_edges():
    assert pearson_ceiling([np.ones(8), np.zeros(8), np.ones(8)]) == 1.0  # no sampling noise at all
    assert np.isnan(pearson_ceiling([np.ones(8), np.ones(8)]))            # the rates do not vary
    assert np.isnan(pearson_ceiling([np.array([1.0, 0.0])]))              # one question
    # noise larger than the spread it should explain: no signal left to find, not a negative root
    assert pearson_ceiling([np.array([1.0, 0.0, 1.0, 0.0]), np.array([0.0, 1.0, 0.0, 0.0])]) == 0.0


def test_pearson_ceiling_of_groups_of_mixed_sizes_is_the_same_formula():
    """Rows of one size take the stacked path, mixed sizes the one-row-at-a-time path: both are
    sqrt(1 - mean(s²/G) / var(observed rates))."""
    rng = np.random.default_rng(2)
    rows = [(rng.random(g) < rng.random()).astype(float) for g in (8, 8, 4, 6, 8, 2, 8, 8)]

    def by_hand(rs):
        observed = np.array([r.mean() for r in rs])
        noise = np.mean([r.var(ddof=1) / len(r) for r in rs])
        return float(np.sqrt(max(0.0, 1.0 - noise / observed.var(ddof=1))))

    same = [r for r in rows if len(r) == 8]
    assert pearson_ceiling(same) == pytest.approx(by_hand(same), abs=1e-12)
    assert pearson_ceiling(rows) == pytest.approx(by_hand(rows), abs=1e-12)


def test_label_samples_sets_the_rollouts_per_labelled_question(tiny_pipeline, tmp_path):
    """`label.samples` labels each question from that many rollouts (here 16, against G = 8), so a
    pass rate can fall between the eighths; the file records the count. In a copy of the tiny
    workspace: the shared fixture's labels stay as they are."""
    root = tmp_path / "artifacts"
    shutil.copytree(stages.paths(tiny_pipeline).root, root)
    cfg = tiny_config(root, "label.samples=16", "label.num_questions=256", "label.policies=[final]")
    stages.label(cfg)
    data = json.loads(stages.paths(cfg).labels.read_text())
    rates = np.asarray(data["policies"]["final"])
    assert data["group_size"] == 16 and len(rates) == 256
    assert np.allclose(rates * 16, np.round(rates * 16))
    assert not np.allclose(rates * 8, np.round(rates * 8))  # some rate is an odd sixteenth
