"""The micro-batched update (dots.microbatch, dots.update) and the chunked log-probs
(dots.loss.selective_logprobs) compute what the one-batch update computes: in float64, the
same gradient, loss and replay ratios for token budgets from everything-in-one down to one
sequence per micro-batch, on the embedded GPT-2 (shared-prompt path) and on a Qwen2-layout
model (transformers' own forward), with and without activation checkpointing."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from dots.config import ModelConfig, load_config
from dots.loss import collate, token_logprobs
from dots.microbatch import collate_rows, pack
from dots.models import build_model, build_tokenizer, enable_activation_checkpointing
from dots.rollout import Group
from dots.update import trained_groups, update_on_groups

PAD = 0


class GradientRecorder(torch.optim.Optimizer):
    """An optimizer whose step only records the (accumulated, clipped) gradients."""

    def __init__(self, params):
        super().__init__(params, {})
        self.grads: list[torch.Tensor] = []

    def step(self, closure=None):
        self.grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                      for g in self.param_groups for p in g["params"]]


def gpt2():
    tok = build_tokenizer()
    return build_model(ModelConfig(n_layer=2, n_embd=32, n_head=2, n_positions=48), tok, seed=1).double()


def qwen2():
    torch.manual_seed(2)
    cfg = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True, pad_token_id=PAD)
    return Qwen2ForCausalLM(cfg).double()


def make_groups(vocab: int, n_groups: int = 5, g: int = 4, seed: int = 0) -> list[Group]:
    """Hand-made groups: prompts and answers of different lengths, informative and degenerate
    groups, behaviour log-probs that differ from the policy's (so ratios and clipping act)."""
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for q in range(n_groups):
        p = 3 + q % 4
        width = 2 + (q * 3) % 6
        ids = torch.randint(3, vocab, (g, width), generator=gen)
        lengths = torch.randint(1, width + 1, (g,), generator=gen)
        mask = torch.arange(width)[None, :] < lengths[:, None]
        rewards = torch.tensor([1.0, 0.0, 1.0, 1.0][:g]) if q != 2 else torch.ones(g)  # group 2 degenerate
        groups.append(Group(question_id=q, prompt_ids=torch.randint(3, vocab, (p,), generator=gen),
                            response_ids=torch.where(mask, ids, PAD), response_mask=mask,
                            logprobs=(-torch.rand((g, width), generator=gen, dtype=torch.float64) * 3) * mask,
                            texts=[""] * g, rewards=rewards, version=0))
    return groups


def run_update(model, groups, replayed, budget, chunk=8192, checkpointing=False, *extra):
    cfg = load_config(None, [f"train.micro_batch_tokens={'null' if budget is None else budget}",
                             f"train.logprob_chunk_tokens={chunk}", "train.max_grad_norm=1e9",
                             "rollout.temperature=0.7", *extra])
    model.train()
    if checkpointing:
        enable_activation_checkpointing(model)  # as the trainer does
    opt = GradientRecorder(model.parameters())
    try:
        loss, stats = update_on_groups(model, opt, groups, cfg, PAD, replayed=replayed)
    finally:
        if checkpointing:
            model.activation_checkpointing_disable()
    return loss, stats, opt.grads


@pytest.mark.parametrize("build", [gpt2, qwen2], ids=["gpt2-shared-prompts", "qwen2-hf-forward"])
def test_micro_batched_gradient_equals_one_batch(build):
    model = build()
    groups = make_groups(model.config.vocab_size)
    replayed = [groups[0], groups[3]]
    loss0, stats0, grads0 = run_update(model, groups, replayed, None)
    assert any(float(g.abs().sum()) > 0 for g in grads0)
    one_group = len(groups[0].prompt_ids) + groups[0].response_ids.shape[1]
    for budget in (10**6, 3 * one_group, one_group - 1, 1):  # all, under one group, under one sequence
        loss, stats, grads = run_update(model, groups, replayed, budget)
        assert loss == pytest.approx(loss0, rel=1e-12, abs=1e-14), budget
        assert stats["replay_ratio_mean"] == pytest.approx(stats0["replay_ratio_mean"], rel=1e-12)
        assert stats["replay_ratio_max"] == pytest.approx(stats0["replay_ratio_max"], rel=1e-12)
        for a, b in zip(grads, grads0):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("budget", [None, 1], ids=["one-batch", "one-row-micro-batches"])
def test_forwarding_degenerate_groups_changes_the_cost_not_the_gradient(budget):
    """train.skip_degenerate=false (a plain GRPO trainer's update, the paper's baseline cost)
    forwards every group; the all-equal group adds zero, so loss and gradient are the skipping
    update's."""
    model = gpt2()
    groups = make_groups(model.config.vocab_size)
    assert trained_groups(groups, 0.0) == [g for g in groups if g.informative] != groups
    assert trained_groups(groups, 0.0, skip_degenerate=False) == groups
    rows = []
    hook = model.transformer.wte.register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[0]))
    try:
        loss0, _, grads0 = run_update(model, groups, [], budget)
        skipped = sum(rows)
        rows.clear()
        loss, _, grads = run_update(model, groups, [], budget, 8192, False, "train.skip_degenerate=false")
    finally:
        hook.remove()
    assert sum(rows) > skipped  # the degenerate group was forwarded too
    assert loss == pytest.approx(loss0, rel=1e-12, abs=1e-14)
    for a, b in zip(grads, grads0):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("build", [gpt2, qwen2], ids=["gpt2-shared-prompts", "qwen2-hf-forward"])
def test_chunked_logprobs_and_checkpointing_keep_the_gradient(build):
    model = build()
    groups = make_groups(model.config.vocab_size, seed=5)
    _, _, grads0 = run_update(model, groups, [], 40)
    for chunk, ckpt in ((3, False), (1, False), (8192, True), (5, True)):
        _, _, grads = run_update(model, groups, [], 40, chunk=chunk, checkpointing=ckpt)
        for a, b in zip(grads, grads0):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("build", [gpt2, qwen2], ids=["gpt2-shared-prompts", "qwen2-hf-forward"])
def test_chunked_logprobs_equal_full_log_softmax(build):
    model = build().eval()
    groups = make_groups(model.config.vocab_size, seed=7)
    batch = collate(groups, PAD)
    with torch.no_grad():
        full = token_logprobs(model, batch, 0.6)
        for chunk in (1, 7, 64):
            chunked = token_logprobs(model, batch, 0.6, chunk_tokens=chunk)
            torch.testing.assert_close(chunked[batch.response_mask], full[batch.response_mask], rtol=1e-12,
                                       atol=1e-12)
            assert (chunked[~batch.response_mask] == 0).all()


def test_pack_covers_every_row_once_within_the_budget():
    groups = make_groups(40, n_groups=7, g=4, seed=3)
    for budget in (1, 9, 20, 55, 10**6):
        batches = pack(groups, budget)
        seen = [(id(p.group), i) for parts in batches for p in parts for i in range(p.start, p.stop)]
        assert seen == [(id(g), i) for g in groups for i in range(g.size)]  # in order, each once
        for parts in batches:
            b = collate_rows(parts, PAD, len(groups))
            rows = b.input_ids.shape[0]
            assert rows == 1 or b.input_ids.numel() <= budget, (budget, b.input_ids.shape)
    assert len(pack(groups, 10**6)) == 1
    assert len(pack(groups, 1)) == sum(g.size for g in groups)


def test_micro_batch_weights_sum_to_the_step_share():
    """Rows of the step's groups weigh 1 / (G x groups): a full step's weights sum to 1."""
    groups = make_groups(40, n_groups=4, g=4)
    total = sum(float(collate_rows(parts, PAD, len(groups)).weights.sum()) for parts in pack(groups, 13))
    assert total == pytest.approx(1.0)
