"""Held out means held out, by construction (DESIGN §5): the warm-up never draws a pool or
held-out prompt, neither in `sample_batch` nor through the `warmup` stage, while the small tiers
(whose every sum the warm-up would otherwise meet many times) are still taught."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from dots import stages
from dots import warmup as warmup_mod
from dots.config import load_config
from dots.data import generate

from .conftest import REPO
from .test_cli import SMALL


@pytest.fixture(scope="module")
def default_split():
    cfg = load_config(REPO / "params.yaml")
    pool, held = generate(cfg.task)
    return cfg, pool, held


def _tier_of(prompt: str, cfg) -> tuple[int, int]:
    """(operands, digits) of a rendered prompt (operands are zero-padded to task.pad_width)."""
    numbers = [int(x) for x in prompt.rstrip("=").split("+")]
    return len(numbers), max(len(str(n)) for n in numbers)


def test_default_pool_and_heldout_are_disjoint(default_split):
    cfg, pool, held = default_split
    assert len(pool) == cfg.task.pool_size and len(held) == cfg.task.eval_size
    pool_prompts, held_prompts = {q.prompt for q in pool}, {q.prompt for q in held}
    assert len(pool_prompts) == len(pool) and len(held_prompts) == len(held)
    assert not pool_prompts & held_prompts


def test_sample_batch_never_yields_an_excluded_prompt_but_keeps_the_small_tiers(default_split):
    cfg, pool, held = default_split
    exclude = frozenset(q.prompt for q in pool) | frozenset(q.prompt for q in held)
    small = (2, 1)  # 2 operands of 1 digit: only 100 distinct sums, half of them in pool or held-out
    assert any(tuple(t) == small for t in ((t.operands, t.digits) for t in cfg.task.tiers))
    small_excluded = {p for p in exclude if _tier_of(p, cfg) == small}
    assert 0 < len(small_excluded) <= 50

    rng = np.random.default_rng(12345)
    drawn: Counter = Counter()
    for _ in range(200):
        batch = warmup_mod.sample_batch(rng, cfg, 128, exclude)
        assert len(batch) == 128
        drawn.update(p for p, _ in batch)
    assert not set(drawn) & exclude, sorted(set(drawn) & exclude)[:10]
    tiers = Counter(_tier_of(p, cfg) for p in drawn.elements())
    # every configured tier is still drawn, in roughly its configured share (1/7 each here)
    for t in cfg.task.tiers:
        share = tiers[(t.operands, t.digits)] / (200 * 128)
        assert share == pytest.approx(1 / len(cfg.task.tiers), abs=0.02), ((t.operands, t.digits), share)
    small_drawn = {p for p in drawn if _tier_of(p, cfg) == small}
    assert small_drawn and len(small_drawn) == 100 - len(small_excluded)  # every allowed small sum is taught

    # the exclusion is what keeps them out: without it the same stream meets pool and held-out sums
    rng = np.random.default_rng(12345)
    unfiltered = {p for _ in range(20) for p, _ in warmup_mod.sample_batch(rng, cfg, 128)}
    assert unfiltered & exclude


def test_sample_batch_answers_are_still_right(default_split):
    cfg, pool, held = default_split
    exclude = frozenset(q.prompt for q in pool + held)
    for prompt, answer in warmup_mod.sample_batch(np.random.default_rng(0), cfg, 512, exclude):
        assert answer == str(sum(int(x) for x in prompt.rstrip("=").split("+")))[::-1]
        assert all(len(x) == cfg.task.pad_width for x in prompt.rstrip("=").split("+"))


def test_the_warmup_stage_trains_on_no_pool_or_heldout_prompt(tmp_path, monkeypatch):
    root = tmp_path / "artifacts"
    cfg = load_config(REPO / "params.yaml", [*SMALL, f"paths.root={root}", "warmup.spectrum_questions=16",
                                              "train.threads=2"])
    stages.prepare(cfg)
    pool, held = stages.load_data(cfg)
    forbidden = {q.prompt for q in pool} | {q.prompt for q in held}

    seen: list[str] = []
    real = warmup_mod.sample_batch

    def spy(rng, c, n, exclude=frozenset()):
        batch = real(rng, c, n, exclude)
        seen.extend(p for p, _ in batch)
        return batch

    monkeypatch.setattr(warmup_mod, "sample_batch", spy)
    info = stages.run_warmup(cfg)
    assert info["steps"] == cfg.warmup.steps
    assert len(seen) == cfg.warmup.steps * cfg.warmup.batch_size
    leaked = set(seen) & forbidden
    assert not leaked, sorted(leaked)[:10]
    # the small tier (100 sums, many in pool or held-out) was drawn, so the check had something to catch
    assert any(_tier_of(p, cfg) == (2, 1) for p in seen)
    assert any(_tier_of(q.prompt, cfg) == (2, 1) for q in pool + held)


def test_a_checkpoint_past_the_warmup_is_for_labels_only_and_leaves_the_rl_start_as_it_was(tmp_path):
    """A labelling checkpoint beyond `warmup.steps` trains on after `final` is saved: `final` (the RL
    start) is bit for bit the model of a warm-up without it, and the later checkpoint is another model."""
    from safetensors.torch import load_file

    base = [*SMALL, "warmup.steps=12", "warmup.checkpoints=[6]", "label.policies=[final]"]
    plain = load_config(REPO / "params.yaml", [*base, f"paths.root={tmp_path / 'a'}"])
    longer = load_config(REPO / "params.yaml", [*base, f"paths.root={tmp_path / 'b'}",
                                                 "warmup.checkpoints=[6, 20]", "label.policies=[final, step20]"])
    a = warmup_mod.warmup(plain, tmp_path / "a")
    b = warmup_mod.warmup(longer, tmp_path / "b")
    assert a["steps"] == b["steps"] == 12 and a["final_loss"] == b["final_loss"]
    assert a["label_only_steps"] == 0 and b["label_only_steps"] == 8
    fa = load_file(tmp_path / "a" / "final" / "model.safetensors")
    fb = load_file(tmp_path / "b" / "final" / "model.safetensors")
    assert fa.keys() == fb.keys() and all(torch.equal(fa[k], fb[k]) for k in fa)
    later = load_file(tmp_path / "b" / "step20" / "model.safetensors")
    assert any(not torch.equal(later[k], fb[k]) for k in fb)
