"""What the vLLM engine asks of vLLM, checked against a stand-in for vLLM's offline API.

vLLM cannot run here (no GPU, and its wheel is not installed), so `FakeLLM` records the
calls `dots.rollout_vllm` makes and answers with made-up tokens. These tests prove the
calls and their order (dtype and seed reach the engine, each prompt its own seed, sleep
level 2, weights reloaded and the prefix cache reset after every load, behaviour
log-probs from the right source and never on evaluation); they do NOT test vLLM itself.
The trainer's side (the engine is synced after a resume) runs on the real HF engine."""

from __future__ import annotations

import importlib
import random
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from dots import stages
from dots.config import ModelConfig, load_config
from dots.loss import collate, token_logprobs
from dots.models import build_model, build_tokenizer
from dots.rollout import HFEngine

from .conftest import tiny_config


class FakeSamplingParams:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class FakeLLM:
    """Records every call; generates tokens from each prompt's seed (ids of the char tokenizer)."""

    last: "FakeLLM | None" = None

    def __init__(self, **kw):
        self.kw, self.calls, self.params = kw, [], []
        FakeLLM.last = self

    def generate(self, prompts, params, use_tqdm=False):
        assert isinstance(params, list) and len(params) == len(prompts), "one SamplingParams per prompt"
        self.params = params
        self.calls.append(("generate",))
        outs = []
        for sp in params:
            rng = random.Random(sp.seed)
            completions = []
            for _ in range(sp.n):
                toks = [rng.randrange(3, 15) for _ in range(rng.randint(1, sp.max_tokens))]
                lps = None
                if sp.logprobs is not None:
                    lps = [{t: SimpleNamespace(logprob=-0.01 * (j + 1) - t / 100)} for j, t in enumerate(toks)]
                completions.append(SimpleNamespace(token_ids=toks, logprobs=lps))
            outs.append(SimpleNamespace(outputs=completions))
        return outs

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags) if tags else None))

    def collective_rpc(self, name, args=()):
        self.calls.append(("rpc", name))
        self.loaded = dict(args[0])

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


@pytest.fixture
def vllm_engine(monkeypatch):
    """dots.rollout_vllm imported against the stand-in; returns its VLLMEngine class."""
    fake = types.ModuleType("vllm")
    fake.LLM, fake.SamplingParams = FakeLLM, FakeSamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    fake.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    monkeypatch.delitem(sys.modules, "dots.rollout_vllm", raising=False)
    module = importlib.import_module("dots.rollout_vllm")
    yield module.VLLMEngine
    sys.modules.pop("dots.rollout_vllm", None)


@pytest.fixture(scope="module")
def policy():
    tok = build_tokenizer()
    model = build_model(ModelConfig(n_layer=1, n_embd=16, n_head=2, n_positions=32), tok, seed=0).eval()
    return model, tok


PROMPTS = [[1, 4, 5, 13], [1, 6, 13], [1, 7, 8, 9, 13]]


def test_engine_for_passes_dtype_seed_and_logprob_source(vllm_engine, policy):
    from dots.engines import engine_for

    model, tok = policy
    cfg = load_config(None, ["rollout.engine=vllm", "model.dtype=float16", "rollout.behaviour_logprobs=vllm",
                             "rollout.vllm_gpu_memory_utilization=0.4"])
    engine = engine_for(cfg, model, tok, seed=11)
    assert type(engine).__name__ == "VLLMEngine"
    kw = FakeLLM.last.kw
    assert kw["dtype"] == "float16" and kw["seed"] == 11 and kw["gpu_memory_utilization"] == 0.4
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["enable_sleep_mode"] is True
    engine_for(load_config(None, ["rollout.engine=vllm"]), model, tok)
    assert "logprobs_mode" not in FakeLLM.last.kw and FakeLLM.last.kw["dtype"] == "float32"


def test_each_prompt_draws_its_own_seed_reproducibly(vllm_engine, policy):
    model, tok = policy
    engine = vllm_engine(model, tok, sleep_mode=False)
    engine.generate(PROMPTS, 2, generator=torch.Generator().manual_seed(5), need_logprobs=False)
    seeds = [p.seed for p in FakeLLM.last.params]
    assert len(set(seeds)) == len(PROMPTS)
    engine.generate(PROMPTS, 2, generator=torch.Generator().manual_seed(5), need_logprobs=False)
    assert [p.seed for p in FakeLLM.last.params] == seeds  # the same generator state, the same draws


def test_sleep_is_level_2_and_every_wake_reloads_weights_then_resets_the_prefix_cache(vllm_engine, policy):
    model, tok = policy
    engine = vllm_engine(model, tok, sleep_mode=True)
    llm = FakeLLM.last
    engine.release()
    assert llm.calls == [("sleep", 2)]
    engine.sync_weights(model)
    assert llm.calls[1:] == [("wake_up", ("weights",)), ("rpc", "dots_load_weights"), ("reset_prefix_cache",),
                             ("wake_up", ("kv_cache",))]
    assert set(llm.loaded) == set(model.state_dict())
    llm.calls.clear()
    engine.release()
    engine.generate(PROMPTS, 2, need_logprobs=False)  # woken by a generate: weights reloaded first
    assert llm.calls[:5] == [("sleep", 2), ("wake_up", ("weights",)), ("rpc", "dots_load_weights"),
                             ("reset_prefix_cache",), ("wake_up", ("kv_cache",))]


def test_without_sleep_a_weight_load_still_resets_the_prefix_cache(vllm_engine, policy):
    model, tok = policy
    engine = vllm_engine(model, tok, sleep_mode=False)
    engine.release()
    engine.sync_weights(model)
    assert FakeLLM.last.calls == [("rpc", "dots_load_weights"), ("reset_prefix_cache",)]


@pytest.mark.parametrize("budget", [None, 7])
def test_trainer_behaviour_logprobs_come_after_sleep_from_the_training_forward(vllm_engine, policy, budget):
    model, tok = policy
    engine = vllm_engine(model, tok, batch_size=4, sleep_mode=True, micro_batch_tokens=budget)
    groups = engine.generate(PROMPTS, 3, temperature=0.7, max_new_tokens=6,
                             generator=torch.Generator().manual_seed(1))
    assert FakeLLM.last.calls == [("generate",), ("sleep", 2)]  # asleep before the trainer's forward
    assert all(p.logprobs is None for p in FakeLLM.last.params)
    for g in groups:
        g.rewards = torch.zeros(g.size)
    with torch.no_grad():
        expected = token_logprobs(model, collate(groups, tok.pad_token_id), 0.7)
    row = 0
    for g in groups:
        width = g.response_ids.shape[1]
        torch.testing.assert_close(g.logprobs, expected[row:row + g.size, :width] * g.response_mask)
        assert (g.logprobs[g.response_mask] < 0).all()
        row += g.size


def test_vllm_behaviour_logprobs_are_vllms_own(vllm_engine, policy):
    model, tok = policy
    engine = vllm_engine(model, tok, sleep_mode=True, behaviour_logprobs="vllm")
    groups = engine.generate(PROMPTS, 2, temperature=0.7, max_new_tokens=5,
                             generator=torch.Generator().manual_seed(2))
    assert FakeLLM.last.calls == [("generate",)]  # no sleep, no forward
    assert all(p.logprobs == 0 for p in FakeLLM.last.params)
    for g in groups:
        for i in range(g.size):
            toks = g.response_ids[i][g.response_mask[i]].tolist()
            want = [-0.01 * (j + 1) - t / 100 for j, t in enumerate(toks)]
            assert g.logprobs[i][g.response_mask[i]].tolist() == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("source", ["trainer", "vllm"])
def test_no_behaviour_logprobs_on_evaluation(vllm_engine, policy, source):
    model, tok = policy
    engine = vllm_engine(model, tok, sleep_mode=True, behaviour_logprobs=source)
    for kwargs in ({"greedy": True}, {"need_logprobs": False}):
        FakeLLM.last.calls.clear()
        groups = engine.generate(PROMPTS, 1, max_new_tokens=4, **kwargs)
        assert FakeLLM.last.calls == [("generate",)]
        assert all(p.logprobs is None for p in FakeLLM.last.params)
        assert all(float(g.logprobs.abs().sum()) == 0.0 for g in groups)
    assert FakeLLM.last.params[0].temperature == 1.0 and FakeLLM.last.params[0].n == 1


class RecordingEngine(HFEngine):
    synced: list[dict] = []

    def sync_weights(self, model):
        RecordingEngine.synced.append({k: v.clone() for k, v in model.state_dict().items()})
        super().sync_weights(model)


def test_trainer_syncs_the_engine_with_the_restored_weights(tiny_pipeline, pipeline_data, tmp_path, monkeypatch):
    import dots.trainer as trainer_module

    cfg = tiny_config(tiny_pipeline.root, "train.steps=2", "train.checkpoint_every=1", "eval.every=2")
    pool, held, _, _ = pipeline_data
    policy_dir = stages.paths(cfg).policy
    first = trainer_module.Trainer(cfg, "grpo", policy_dir, pool, held, tmp_path / "run", resume=False)
    first.run(stop_after=1)
    trained = {k: v.clone() for k, v in first.model.state_dict().items()}
    monkeypatch.setattr(trainer_module, "engine_for",
                        lambda cfg, model, tok, **kw: RecordingEngine(model, tok, cfg.rollout.batch_size))
    RecordingEngine.synced.clear()
    second = trainer_module.Trainer(cfg, "grpo", policy_dir, pool, held, tmp_path / "run", resume=True)
    assert second.step == 1 and RecordingEngine.synced, "the engine was not synced after the resume"
    for k, v in RecordingEngine.synced[-1].items():
        assert torch.equal(v, trained[k]), k
