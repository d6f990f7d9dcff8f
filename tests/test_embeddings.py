"""The embedding cache: versioned by backbone and pool, recomputed when stale, reused when current."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from dots import stages
from dots.config import ModelConfig
from dots.data import generate, load_questions, save_questions
from dots.embeddings import (StaleCacheError, backbone_identity, load_embeddings, masked_mean_embeddings,
                             save_embeddings)
from dots.models import build_model, build_tokenizer, load_policy, save_policy

from .conftest import tiny_config


@pytest.fixture()
def small_pool():
    cfg = tiny_config("unused", "task.pool_size=64", "task.eval_size=16", "label.num_questions=32",
                      "predictor.batch_size=16", "selection.ref_size=8", "train.batch_size=8")
    return generate(cfg.task)[0]


def test_load_refuses_another_backbone(tmp_path, small_pool):
    path = tmp_path / "pool.pt"
    emb = torch.randn(len(small_pool), 8)
    save_embeddings(path, emb, "backbone-a", small_pool)
    assert torch.equal(load_embeddings(path, "backbone-a", small_pool), emb)
    with pytest.raises(StaleCacheError, match="backbone"):
        load_embeddings(path, "backbone-b", small_pool)


def test_load_refuses_a_changed_pool(tmp_path, small_pool):
    path = tmp_path / "pool.pt"
    save_embeddings(path, torch.randn(len(small_pool), 8), "bb", small_pool)
    edited = list(small_pool)
    edited[3] = dataclasses.replace(edited[3], prompt="1+1=", answer="2")
    with pytest.raises(StaleCacheError, match="pool"):
        load_embeddings(path, "bb", edited)
    with pytest.raises(StaleCacheError, match="pool"):
        load_embeddings(path, "bb", small_pool[::-1])  # same questions, another order
    with pytest.raises(StaleCacheError, match="pool"):
        load_embeddings(path, "bb", small_pool[:-1])


def test_missing_cache_is_file_not_found(tmp_path, small_pool):
    with pytest.raises(FileNotFoundError, match="dots embed"):
        load_embeddings(tmp_path / "none.pt", "bb", small_pool)


@pytest.fixture()
def copied_root(tiny_pipeline, tmp_path):
    """A private copy of the pipeline's data, warm-up policy and embedding cache."""
    src = stages.paths(tiny_pipeline)
    root = tmp_path / "artifacts"
    cfg = tiny_config(root)
    dst = stages.paths(cfg)
    shutil.copytree(src.pool.parent, dst.pool.parent)
    shutil.copytree(src.policy, dst.policy)
    dst.embeddings.parent.mkdir(parents=True)
    shutil.copy2(src.embeddings, dst.embeddings)
    return cfg


def test_embed_reuses_a_current_cache(copied_root):
    cfg = copied_root
    p = stages.paths(cfg)
    before = p.embeddings.read_bytes()
    out = stages.embed(cfg)
    assert out["cached"] is True
    assert out["shape"] == [cfg.task.pool_size, cfg.model.n_embd * (2 if cfg.embed.pooling == "mean+last" else 1)]
    assert p.embeddings.read_bytes() == before


def test_embed_recomputes_after_the_pool_changes(copied_root):
    cfg = copied_root
    p = stages.paths(cfg)
    pool = load_questions(p.pool)
    old = load_embeddings(p.embeddings, stages._backbone(cfg), pool)
    pool[0], pool[1] = pool[1], pool[0]
    save_questions(pool, p.pool)
    with pytest.raises(StaleCacheError):
        load_embeddings(p.embeddings, stages._backbone(cfg), pool)
    out = stages.embed(cfg)
    assert out["cached"] is False
    new = load_embeddings(p.embeddings, stages._backbone(cfg), pool)  # current again
    assert torch.allclose(new[0], old[1], atol=1e-5) and torch.allclose(new[1], old[0], atol=1e-5)
    assert torch.allclose(new[2:], old[2:], atol=1e-5)
    assert stages.embed(cfg)["cached"] is True


def test_embed_recomputes_after_its_code_changes(copied_root, monkeypatch, capsys):
    """A cache is valid for the code that embedded it: a `dots embed` after an edit to the embedding
    code reused the old cache (keyed by backbone and pool) until stop 68, and so did training."""
    import dots.embeddings

    cfg = copied_root
    p = stages.paths(cfg)
    pool = load_questions(p.pool)
    old = load_embeddings(p.embeddings, stages._backbone(cfg), pool)
    monkeypatch.setattr(dots.embeddings, "code_identity", lambda part: f"edited {part}")
    with pytest.raises(StaleCacheError, match="made by other dots code"):
        load_embeddings(p.embeddings, stages._backbone(cfg), pool)
    capsys.readouterr()
    assert stages.embed(cfg)["cached"] is False
    assert "made by other dots code" in capsys.readouterr().out
    assert torch.allclose(load_embeddings(p.embeddings, stages._backbone(cfg), pool), old, atol=1e-5)
    assert stages.embed(cfg)["cached"] is True


def test_embed_recomputes_after_the_backbone_changes(copied_root):
    cfg = copied_root
    p = stages.paths(cfg)
    pool = load_questions(p.pool)
    ident = backbone_identity(p.policy)
    old = load_embeddings(p.embeddings, stages._backbone(cfg), pool)
    model, tok = load_policy(p.policy)
    with torch.no_grad():
        model.transformer.wte.weight.mul_(1.5)
    save_policy(model, tok, p.policy)
    assert backbone_identity(p.policy) != ident
    out = stages.embed(cfg)
    assert out["cached"] is False
    new = load_embeddings(p.embeddings, stages._backbone(cfg), pool)
    assert new.shape == old.shape and not torch.allclose(new, old)


@pytest.fixture(scope="module")
def random_backbone():
    tok = build_tokenizer()
    model = build_model(ModelConfig(n_layer=2, n_embd=32, n_head=4, n_positions=64), tok, seed=1)
    return model, tok


def test_masked_mean_ignores_padding(random_backbone):
    model, tok = random_backbone
    short, long = "1+2=", "123+456+789+1011="
    alone = masked_mean_embeddings(model, tok, [short])
    batched = masked_mean_embeddings(model, tok, [short, long, "77+8="])
    assert alone.shape == (1, 32) and batched.shape == (3, 32)
    assert torch.allclose(alone[0], batched[0], atol=1e-5)
    assert torch.allclose(masked_mean_embeddings(model, tok, [long])[0], batched[1], atol=1e-5)
    assert not torch.allclose(batched[0], batched[1], atol=1e-3)


def test_masked_mean_independent_of_batch_size(random_backbone):
    model, tok = random_backbone
    texts = ["1+2=", "123+456=", "9+9+9=", "5000+1=", "44+4="]
    whole = masked_mean_embeddings(model, tok, texts, batch_size=5)
    chunked = masked_mean_embeddings(model, tok, texts, batch_size=2)
    assert torch.allclose(whole, chunked, atol=1e-5)


def test_masked_mean_is_the_mean_of_hidden_states(random_backbone):
    model, tok = random_backbone
    text = "12+34="
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
    assert torch.allclose(masked_mean_embeddings(model, tok, [text])[0], hidden[0].mean(0), atol=1e-5)


def test_mean_plus_last_pooling_is_the_mean_beside_the_last_prompt_token(tiny_pipeline):
    from dots import stages
    from dots.models import load_policy

    model, tok = load_policy(stages.paths(tiny_pipeline).policy)
    texts = ["7+8=", "372+45=", "12+3+4="]
    both = masked_mean_embeddings(model, tok, texts, pooling="mean+last")
    mean = masked_mean_embeddings(model, tok, texts)
    d = mean.shape[1]
    assert both.shape == (3, 2 * d) and torch.allclose(both[:, :d], mean, atol=1e-6)
    for i, text in enumerate(texts):  # the last token's state, however the batch was padded
        enc = tok([text], return_tensors="pt")
        hidden = model(**enc, output_hidden_states=True).hidden_states[-1]
        assert torch.allclose(both[i, d:], hidden[0, -1], atol=1e-5)
    with pytest.raises(ValueError, match="embed.pooling"):
        masked_mean_embeddings(model, tok, texts, pooling="max")
