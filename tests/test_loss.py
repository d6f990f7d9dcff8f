"""GRPO loss with behaviour-policy importance sampling (dots.loss) against independent
computations, and the HF engine's behaviour log-probs against a teacher-forced pass."""

from __future__ import annotations

import pytest
import torch

from dots.config import ModelConfig
from dots.loss import collate, group_advantages, grpo_loss, token_logprobs
from dots.models import build_model, build_tokenizer
from dots.rollout import Group, HFEngine

PROMPTS = ["1+2=", "123+45=", "9+9+9=", "70+8="]
TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    model = build_model(ModelConfig(n_layer=1, n_embd=32, n_head=2, n_positions=32), tok, seed=3)
    model.eval()
    return model, tok


def _groups(model, tok, n=4, max_new_tokens=6, batch_size=7, seed=0, temperature=TEMPERATURE):
    engine = HFEngine(model, tok, batch_size=batch_size)
    prompts = tok(PROMPTS)["input_ids"]
    groups = engine.generate(prompts, n, temperature=temperature, max_new_tokens=max_new_tokens,
                             generator=torch.Generator().manual_seed(seed))
    rewards = torch.Generator().manual_seed(seed + 1)
    for g in groups:
        r = torch.bernoulli(torch.full((g.size,), 0.5), generator=rewards)
        r[0], r[1] = 1.0, 0.0  # every group informative
        g.rewards = r
    return groups


def _params(model):
    return [p for p in model.parameters() if p.requires_grad]


def _grads(loss, model):
    params = _params(model)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def _on_policy(model, tok):
    """Groups whose behaviour log-probs are exactly the current policy's, and their batch."""
    groups = _groups(model, tok)
    batch = collate(groups, tok.pad_token_id)
    with torch.no_grad():
        lp = token_logprobs(model, batch, TEMPERATURE)
    row = 0
    for g in groups:
        width = g.response_ids.shape[1]
        g.logprobs = (lp[row:row + g.size, :width] * g.response_mask).clone()
        row += g.size
    return groups, collate(groups, tok.pad_token_id)


def test_on_policy_loss_is_plain_grpo(tiny):
    model, tok = tiny
    groups, batch = _on_policy(model, tok)
    logp = token_logprobs(model, batch, TEMPERATURE)
    loss, stats = grpo_loss(logp, batch, clip_eps=0.2)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert stats["ratio_max"] == pytest.approx(1.0, abs=1e-6)
    assert stats["clip_fraction"] == 0.0

    # independent: Â_i = r_i − mean_group(r); −mean_i 1/|o_i| Σ_t Â_i · logπ(o_t), ratio value 1
    adv = torch.cat([g.rewards - g.rewards.mean() for g in groups])
    assert torch.allclose(batch.advantages, adv)
    mask = batch.response_mask.float()
    lengths = mask.sum(-1)
    assert (lengths > 0).all()
    value = -(adv * (mask.sum(-1) / lengths)).mean()  # ratio 1 everywhere
    assert loss.item() == pytest.approx(float(value), abs=1e-6)

    logp2 = token_logprobs(model, batch, TEMPERATURE)
    reference = -((adv[:, None] * logp2 * mask).sum(-1) / lengths).mean()
    ours, theirs = _grads(loss, model), _grads(reference, model)
    assert any(g.abs().sum() > 0 for g in theirs)
    for name_param, g1, g2 in zip(model.named_parameters(), ours, theirs):
        assert torch.allclose(g1, g2, atol=1e-6, rtol=1e-4), name_param[0]


def test_stale_behaviour_policy_engages_the_clip(tiny):
    model, tok = tiny
    groups, batch = _on_policy(model, tok)
    logp = token_logprobs(model, batch, TEMPERATURE)
    fresh_loss, _ = grpo_loss(logp, batch, clip_eps=0.2)

    shift = torch.randn(batch.old_logprobs.shape, generator=torch.Generator().manual_seed(5)) * 0.5
    batch.old_logprobs = (batch.old_logprobs + shift) * batch.response_mask
    stale_loss, stats = grpo_loss(logp, batch, clip_eps=0.2)
    assert stats["clip_fraction"] > 0
    assert abs(stats["ratio_mean"] - 1.0) > 1e-3
    assert not torch.isclose(stale_loss, fresh_loss)

    # independent PPO-clip objective
    mask = batch.response_mask.float()
    ratio = torch.exp(logp.detach() - batch.old_logprobs)
    adv = batch.advantages[:, None]
    per_token = torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    expected = -((per_token * mask).sum(-1) / mask.sum(-1)).mean()
    assert stale_loss.item() == pytest.approx(float(expected), abs=1e-6)
    outside = ((ratio < 0.8) | (ratio > 1.2)) & batch.response_mask
    assert stats["clip_fraction"] <= float(outside.float().sum() / mask.sum()) + 1e-6


def test_clip_cuts_the_gradient_where_it_binds(tiny):
    """Behaviour log-probs one nat lower: r̃ = e > 1 + ε everywhere, so the clip binds on the
    positive-advantage samples (gradient 0) and leaves the negative ones unclipped."""
    model, tok = tiny
    groups, batch = _on_policy(model, tok)
    batch.old_logprobs = (batch.old_logprobs - 1.0) * batch.response_mask
    logp = token_logprobs(model, batch, TEMPERATURE)
    loss, stats = grpo_loss(logp, batch, clip_eps=0.2)
    positive = batch.advantages > 0
    mask = batch.response_mask.float()
    assert stats["clip_fraction"] >= float(mask[positive].sum() / mask.sum()) - 1e-6 > 0

    logp2 = token_logprobs(model, batch, TEMPERATURE)
    ratio = torch.exp(logp2 - batch.old_logprobs)
    keep = (~positive).float()[:, None]
    reference = -((keep * ratio * batch.advantages[:, None] * mask).sum(-1) / mask.sum(-1)).mean()
    for g1, g2 in zip(_grads(loss, model), _grads(reference, model)):
        assert torch.allclose(g1, g2, atol=1e-6, rtol=1e-4)


def test_kl_term_needs_reference_and_is_zero_at_reference(tiny):
    model, tok = tiny
    _, batch = _on_policy(model, tok)
    logp = token_logprobs(model, batch, TEMPERATURE)
    with pytest.raises(ValueError, match="beta"):
        grpo_loss(logp, batch, beta=0.1)
    plain, _ = grpo_loss(logp, batch)
    with_kl, _ = grpo_loss(logp, batch, beta=0.1, ref_logprobs=logp.detach())
    assert with_kl.item() == pytest.approx(plain.item(), abs=1e-7)
    moved, _ = grpo_loss(logp, batch, beta=0.1, ref_logprobs=logp.detach() - 0.5)
    assert moved.item() > plain.item()  # KL ≥ 0 is subtracted from J, so −J grows


def test_kl_term_ignores_padding_positions_however_far_their_log_probs_lie(tiny):
    """A padding position's log-probs are arbitrary (a pad token's under a drifted policy): with the KL
    difference unmasked, exp(100) is inf, inf * 0 a NaN loss and NaN gradients."""
    model, tok = tiny
    _, batch = _on_policy(model, tok)
    assert not batch.response_mask.all()  # there are padding positions to test
    logp = token_logprobs(model, batch, TEMPERATURE)
    ref = logp.detach() - 0.5
    far = torch.where(batch.response_mask, ref, ref + 100.0)  # only padding positions move
    near, _ = grpo_loss(logp, batch, beta=0.1, ref_logprobs=ref)
    loss, _ = grpo_loss(logp, batch, beta=0.1, ref_logprobs=far)
    assert torch.isfinite(loss) and loss.item() == pytest.approx(near.item(), rel=1e-6)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in _params(model) if p.grad is not None)
    model.zero_grad()


def test_group_advantages_no_std_by_default():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    adv = group_advantages(rewards)
    expected = rewards - rewards.mean(dim=1, keepdim=True)
    assert torch.allclose(adv, expected)
    assert torch.allclose(adv[1], torch.tensor([0.25, 0.25, 0.25, -0.75]))
    assert torch.equal(group_advantages(rewards, "none"), adv)


def test_group_advantages_group_scaling():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    adv = group_advantages(rewards, "group")
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    assert torch.allclose(adv[:2], centred[:2] / std[:2], atol=1e-5)
    assert torch.equal(adv[2], torch.zeros(4))  # degenerate group: 0, not NaN
    assert not torch.allclose(adv[1], centred[1])
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages(rewards, "batch")


def _collate_row_by_row(groups, pad_id, scale_rewards):
    """The batch laid out one row at a time: what `collate` builds with whole-batch operations."""
    width = max(len(g.prompt_ids) for g in groups)
    length = max(g.response_ids.shape[1] for g in groups)
    rows = []
    for g in groups:
        adv = group_advantages(g.rewards[None, :], scale_rewards)[0]
        for i in range(g.size):
            p, w = g.prompt_ids.tolist(), g.response_ids.shape[1]
            fill = length - w
            rows.append(([pad_id] * (width - len(p)) + p + g.response_ids[i].tolist() + [pad_id] * fill,
                         [0] * (width - len(p)) + [1] * len(p) + g.response_mask[i].long().tolist() + [0] * fill,
                         g.logprobs[i].tolist() + [0.0] * fill, float(adv[i])))
    return rows


@pytest.mark.parametrize("sizes", [(4, 4, 4), (3, 1, 4, 2)], ids=["one-size", "mixed-sizes"])
@pytest.mark.parametrize("scale", ["none", "group"])
def test_collate_lays_out_every_row_as_a_row_by_row_copy_would(tiny, sizes, scale):
    _, tok = tiny
    gen = torch.Generator().manual_seed(5)
    groups = []
    for j, n in enumerate(sizes):  # prompts and answers of different lengths
        p, w = len(PROMPTS[j]) + 1, 2 + 3 * j % 5
        mask = torch.rand(n, w, generator=gen) < 0.8
        mask[:, 0] = True
        groups.append(Group(question_id=j, prompt_ids=torch.randint(3, 15, (p,), generator=gen),
                            response_ids=torch.randint(3, 15, (n, w), generator=gen), response_mask=mask,
                            logprobs=-torch.rand(n, w, generator=gen) * mask, texts=[""] * n,
                            rewards=torch.tensor([1.0, 0.0, 1.0, 1.0][:n])))
    batch = collate(groups, tok.pad_token_id, scale)
    want = _collate_row_by_row(groups, tok.pad_token_id, scale)
    width = batch.prompt_width
    assert batch.input_ids.shape[0] == len(want) == sum(sizes)
    for i, (ids, attn, old, adv) in enumerate(want):
        assert batch.input_ids[i].tolist() == ids and batch.attention_mask[i].tolist() == attn
        assert batch.response_ids[i].tolist() == ids[width:]
        assert batch.response_mask[i].long().tolist() == attn[width:]
        assert batch.old_logprobs[i].tolist() == old
        assert float(batch.advantages[i]) == pytest.approx(adv, abs=1e-6, nan_ok=True)
    assert torch.equal(batch.position_ids, (batch.attention_mask.cumsum(-1) - 1).clamp(min=0))


def test_collate_uses_scaling(tiny):
    model, tok = tiny
    groups = _groups(model, tok)
    plain = collate(groups, tok.pad_token_id).advantages
    scaled = collate(groups, tok.pad_token_id, "group").advantages
    expected = torch.cat([group_advantages(g.rewards[None], "group")[0] for g in groups])
    assert torch.allclose(scaled, expected)
    assert not torch.allclose(plain, scaled)


@pytest.mark.parametrize("temperature,batch_size", [(1.0, 64), (0.7, 5)])
def test_engine_logprobs_match_teacher_forcing(tiny, temperature, batch_size):
    model, tok = tiny
    groups = _groups(model, tok, n=6, max_new_tokens=8, batch_size=batch_size, seed=11, temperature=temperature)
    batch = collate(groups, tok.pad_token_id)
    with torch.no_grad():
        lp = token_logprobs(model, batch, temperature)
    mask = batch.response_mask
    assert torch.allclose(lp[mask], batch.old_logprobs[mask], atol=1e-4)
    assert (batch.old_logprobs[~mask] == 0).all()


def test_engine_masks_end_at_and_include_eos(tiny):
    model, tok = tiny
    eos, pad = tok.eos_token_id, tok.pad_token_id
    groups = _groups(model, tok, n=16, max_new_tokens=8, seed=2)
    saw_eos = 0
    for g in groups:
        assert g.response_ids.shape == g.response_mask.shape == g.logprobs.shape
        for ids, mask in zip(g.response_ids, g.response_mask):
            n = int(mask.sum())
            assert mask[:n].all() and not mask[n:].any(), "mask must be a prefix"
            hits = (ids[:n] == eos).nonzero().flatten()
            if len(hits):
                saw_eos += 1
                assert int(hits[0]) == n - 1, "eos is the last masked token"
            else:
                assert n == ids.shape[0], "without eos the response runs to the end"
            assert (ids[n:] == pad).all()
        assert len(g.texts) == g.size
    assert saw_eos > 0  # the random policy emits eos within 8 tokens often enough
