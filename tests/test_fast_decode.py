"""The lean GPT-2 decoder must be the same policy as transformers' forward: same logits at
every decoding step, same greedy answers, same behaviour log-probs for replay."""

import itertools

import pytest
import torch

from dots.config import ModelConfig
from dots.fast_decode import GPT2Decoder, activation_checkpointing_on, supports
from dots.models import build_model, build_tokenizer, set_training
from dots.loss import collate, grpo_loss, token_logprobs
from dots.rollout import HFEngine, _TransformersDecoder


@pytest.fixture(scope="module")
def policy():
    tok = build_tokenizer()
    model = build_model(ModelConfig(n_layer=2, n_embd=32, n_head=4, n_positions=48), tok, seed=3)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # spread the weights so logits are far from uniform and differences show
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    # float64: the two paths order their sums differently, and in float32 these large logits
    # differ by up to ~1e-5 from run to run; in float64 any real difference still shows
    return model.double().eval(), tok


def _batch(tok, prompts):
    ids = tok(prompts, padding=True, return_tensors="pt")
    attn = ids["attention_mask"]
    return ids["input_ids"], attn, (attn.cumsum(-1) - 1).clamp(min=0)


def test_supports_only_the_layout_it_reproduces(policy):
    model, _ = policy
    assert supports(model)
    assert not supports(torch.nn.Linear(2, 2))


@torch.inference_mode()
def test_logits_match_transformers_at_every_step(policy):
    model, tok = policy
    ids, attn, pos = _batch(tok, ["1+2=", "0345+0067=", "12+3+456=", "9="])
    fast, ref = GPT2Decoder(model, max_new_tokens=6), _TransformersDecoder(model)
    a, b = fast.prefill(ids, attn, pos), ref.prefill(ids, attn, pos)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    step_pos = pos[:, -1:]
    g = torch.Generator().manual_seed(1)
    for _ in range(5):  # feed both the same (sampled) tokens
        t = torch.multinomial(torch.softmax(b, -1), 1, generator=g).squeeze(-1)
        step_pos = step_pos + 1
        a, b = fast.step(t, step_pos), ref.step(t, step_pos)
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_engine_rollouts_agree_with_and_without_the_fast_path(policy):
    model, tok = policy
    prompts = [tok(p)["input_ids"] for p in ["1+2=", "0345+0067=", "12+3+456=", "77+8="]]
    fast, ref = HFEngine(model, tok, fast=True), HFEngine(model, tok, fast=False)
    greedy_fast = fast.generate(prompts, 1, max_new_tokens=8, greedy=True)
    greedy_ref = ref.generate(prompts, 1, max_new_tokens=8, greedy=True)
    assert [g.texts for g in greedy_fast] == [g.texts for g in greedy_ref]
    sampled_fast = fast.generate(prompts, 16, max_new_tokens=8, generator=torch.Generator().manual_seed(5))
    sampled_ref = ref.generate(prompts, 16, max_new_tokens=8, generator=torch.Generator().manual_seed(5))
    for f, r in zip(sampled_fast, sampled_ref):
        assert torch.equal(f.response_ids, r.response_ids) and torch.equal(f.response_mask, r.response_mask)
        torch.testing.assert_close(f.logprobs, r.logprobs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fast", [True, False], ids=["gpt2-decoder", "transformers-cache"])
def test_a_prompt_beyond_the_policys_positions_is_refused_by_name(policy, fast):
    """48 positions: a 40-token prompt leaves room for 8 new tokens, not 9. Past that the position
    embedding raised a bare IndexError (GPT-2) from deep inside the model."""
    model, tok = policy
    prompt = tok("1+" * 19 + "=")["input_ids"]  # bos + 39 characters
    assert len(prompt) == 40
    engine = HFEngine(model, tok, fast=fast)
    assert len(engine.generate([prompt], 1, max_new_tokens=8, greedy=True)) == 1
    with pytest.raises(ValueError, match="a prompt of 40 tokens and max_new_tokens=9 do not fit the policy's 48"):
        engine.generate([prompt], 1, max_new_tokens=9, greedy=True)


@pytest.mark.parametrize("fast", [True, False], ids=["gpt2-decoder", "transformers-cache"])
def test_dropping_finished_rows_samples_the_same_rollouts(policy, monkeypatch, fast):
    """Rows that reached their eos leave the decode batch (`HFEngine.drop_finished`): the same
    seeded generator must give the same tokens and log-probs as decoding every row to the end,
    and rows must really have been dropped (else the test proves nothing)."""
    model, tok = policy
    decoder = GPT2Decoder if fast else _TransformersDecoder
    kept = []
    original = decoder.keep_rows
    monkeypatch.setattr(decoder, "keep_rows", lambda self, keep: kept.append(len(keep)) or original(self, keep))
    prompts = [tok(p)["input_ids"] for p in ["1+2=", "0345+0067=", "12+3+456=", "77+8=", "5+5="]]
    for greedy, n in ((True, 1), (False, 16)):
        def sample(drop):
            engine = HFEngine(model, tok, fast=fast, drop_finished=drop)
            return engine.generate(prompts, n, max_new_tokens=12, greedy=greedy,
                                   generator=torch.Generator().manual_seed(7))
        full = sample(False)
        kept.clear()
        dropped = sample(True)
        for f, d in zip(full, dropped):
            assert torch.equal(f.response_ids, d.response_ids) and torch.equal(f.response_mask, d.response_mask)
            torch.testing.assert_close(f.logprobs, d.logprobs, atol=1e-9, rtol=1e-9)
        if not greedy:  # answers of different lengths, so this batch really shrank
            lengths = torch.cat([g.response_mask.sum(1) for g in dropped])
            assert lengths.min() < lengths.max()
            assert kept and min(kept) < len(prompts) * n


def _groups(model, tok, sizes=(6, 6, 6, 6)):
    """One group a prompt, `sizes[i]` rollouts for prompt i; prompts of equal size in a row are sampled
    in one call (all of them by default)."""
    prompts = [tok(p)["input_ids"] for p in ["1+2=", "0345+0067=", "12+3+456=", "77+8="]]
    engine, gen = HFEngine(model, tok, fast=False), torch.Generator().manual_seed(2)
    groups, i = [], 0
    for size, run in itertools.groupby(sizes):
        n = len(list(run))
        groups += engine.generate(prompts[i:i + n], size, max_new_tokens=7, generator=gen)
        i += n
    for i, g in enumerate(groups):  # any rewards with a spread: the loss needs non-zero advantages
        g.rewards = torch.tensor([float((i + j) % 2) for j in range(g.size)])
    return groups


def test_shared_prompt_logprobs_and_gradients_match_the_plain_forward(policy):
    """The update's one-prompt-per-group forward gives the same log-probs and the same
    gradient as the model's forward over every row."""
    model, tok = policy
    batch = collate(_groups(model, tok), tok.pad_token_id)
    lengths = batch.response_mask.sum(-1)
    # answers of several lengths: the shared forward runs only the positions that predict a real
    # token, so the rows that end early (padding after them) are the case to check
    assert lengths.min() < lengths.max() == batch.response_mask.shape[1]
    grads = []
    for shared in (True, False):
        model.zero_grad(set_to_none=True)
        logp = token_logprobs(model, batch, 0.7, shared_prompts=shared)
        loss, _ = grpo_loss(logp, batch)
        loss.backward()
        grads.append((logp.detach(), [p.grad.clone() for p in model.parameters()]))
    (a, ga), (b, gb) = grads
    mask = batch.response_mask
    torch.testing.assert_close(a[mask], b[mask], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(a).all()
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("layout", ["uniform", "uneven", "uniform, per-row keys"])
def test_the_grouped_prompt_attention_and_its_fallback_match_the_plain_forward(policy, monkeypatch, layout):
    """Equal groups score a prompt's rows in one matmul (`_prompt_scores`); uneven ones, and the
    per-row path forced on equal ones, copy the prompt's keys to each row: all three give the plain
    forward's log-probs and gradient."""
    from dots import fast_decode

    model, tok = policy
    # uneven: two groups of 6 and two of 3 (a down-sampled or partly replayed batch), no uniform size
    groups = _groups(model, tok, (6, 6, 3, 3) if layout == "uneven" else (6, 6, 6, 6))
    batch = collate(groups, tok.pad_token_id)
    sizes, real = [], fast_decode._uniform_group_size

    def group_size(rows, n_prompts):  # records the path taken; "per-row keys" forces the fallback
        sizes.append(0 if "per-row" in layout else real(rows, n_prompts))
        return sizes[-1]

    monkeypatch.setattr(fast_decode, "_uniform_group_size", group_size)
    grads = []
    for shared in (True, False):
        model.zero_grad(set_to_none=True)
        logp = token_logprobs(model, batch, 0.7, shared_prompts=shared)
        grpo_loss(logp, batch)[0].backward()
        grads.append((logp.detach(), [p.grad.clone() for p in model.parameters()]))
    assert sizes == [6 if layout == "uniform" else 0]  # the shared forward ran once, on the path named
    (a, ga), (b, gb) = grads
    torch.testing.assert_close(a[batch.response_mask], b[batch.response_mask], atol=1e-10, rtol=1e-10)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, atol=1e-10, rtol=1e-9)
    model.zero_grad(set_to_none=True)


def test_a_uniform_group_size_needs_every_prompt_to_have_as_many_consecutive_rows():
    from dots.fast_decode import _uniform_group_size

    assert _uniform_group_size(torch.tensor([0, 0, 0, 1, 1, 1]), 2) == 3
    assert _uniform_group_size(torch.tensor([0, 1, 2]), 3) == 1
    assert _uniform_group_size(torch.tensor([0, 0, 1]), 2) == 0  # 3 rows, 2 prompts
    assert _uniform_group_size(torch.tensor([0, 0, 0, 1]), 2) == 0  # 4 rows, 2 prompts, but 3 + 1
    assert _uniform_group_size(torch.tensor([0, 1, 1, 2, 2, 2]), 3) == 0


def test_shared_prompt_forward_recomputes_each_block_to_the_same_gradient(policy):
    """With activation checkpointing on (`train.gradient_checkpointing`), the shared-prompt forward
    recomputes each block in the backward pass, the last one (prompts cut to their last position)
    included, and gives the log-probs and gradient of the forward that keeps everything."""
    from dots.models import enable_activation_checkpointing

    model, tok = policy
    copy = type(model)(model.config).to(torch.float64)
    copy.load_state_dict(model.state_dict())
    enable_activation_checkpointing(copy)
    batch = collate(_groups(model, tok), tok.pad_token_id)
    results = []
    for m in (model, copy):
        m.train()
        m.zero_grad(set_to_none=True)
        logp = token_logprobs(m, batch, 0.7)
        grpo_loss(logp, batch)[0].backward()
        results.append((logp.detach(), [p.grad.clone() for p in m.parameters()]))
    (a, ga), (b, gb) = results
    assert activation_checkpointing_on(copy) and not activation_checkpointing_on(model)
    torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, atol=1e-12, rtol=1e-10)
    model.zero_grad(set_to_none=True)



def test_activation_checkpointing_under_both_transformers_names():
    """train.gradient_checkpointing works with transformers releases that only know the old name
    (gradient_checkpointing_enable / is_gradient_checkpointing, e.g. the GPU image's 5.17)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from dots.fast_decode import activation_checkpointing_on
    from dots.models import enable_activation_checkpointing

    model = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=16, n_embd=8, n_layer=1, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    assert not activation_checkpointing_on(model)
    enable_activation_checkpointing(model)  # this release's name
    assert activation_checkpointing_on(model) and model.is_activation_checkpointing

    class OlderTransformersModel:  # the old API only, as a release before 5.2x has it
        is_gradient_checkpointing = False

        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            self.kwargs, self.is_gradient_checkpointing = gradient_checkpointing_kwargs, True

    old = OlderTransformersModel()
    assert not activation_checkpointing_on(old)
    enable_activation_checkpointing(old)
    assert activation_checkpointing_on(old) and old.kwargs == {"use_reentrant": False}


def test_a_rollout_switches_modes_without_transformers_re_kernelizing(monkeypatch):
    """`set_training` flips every module's flag (dropout and the like follow it) and leaves
    transformers' `train()`, which re-kernelizes the model on every switch, uncalled."""
    tok = build_tokenizer()
    model = build_model(ModelConfig(n_layer=1, n_embd=32, n_head=2, n_positions=32), tok, seed=0)
    calls = []
    monkeypatch.setattr(type(model), "train", lambda self, mode=True: calls.append(mode))
    for mode in (False, True, False):
        set_training(model, mode)
        assert all(m.training is mode for m in model.modules())
    assert calls == []
