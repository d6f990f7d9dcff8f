"""The memory plan (dots.memory_plan, `dots plan`): the GPU profile as shipped fits one 80 GB
GPU, a config that cannot fit is refused naming the key to change, and `dots train`
refuses it before any model or data loads. (How close the estimate comes to a measured
peak is printed by scripts/memory_probe.py, not asserted here.)"""

from __future__ import annotations

import pytest

from dots import stages
from dots.cli import main
from dots.config import load_config
from dots.memory_plan import GiB, PlanError, estimate, plan_for, policy_shape

PROFILE = "configs/qwen2.5-math-1.5b-deepscaler.yaml"


def test_the_gpu_profile_fits_one_80gb_gpu_and_not_a_16gb_one():
    plan, shape = plan_for(load_config(PROFILE, ["train.memory_gb=80"]))
    assert 1.5e9 < shape.params < 1.6e9  # Qwen2.5-Math-1.5B from the shipped config.json, tied embeddings
    assert plan.peak < 0.95 * 80 * GiB
    with pytest.raises(PlanError, match=r"update peak .* largest term is adamw_states .* change train.fsdp"):
        plan_for(load_config(PROFILE, ["train.memory_gb=16"]))


def test_one_batch_per_step_is_refused_naming_the_micro_batch_budget():
    cfg = load_config(PROFILE, ["train.memory_gb=80", "train.micro_batch_tokens=null",
                                "train.gradient_checkpointing=false"])
    with pytest.raises(PlanError, match=r"update peak .* activations .* train.micro_batch_tokens"):
        plan_for(cfg)


def test_logits_chunk_too_large_is_refused_naming_its_key():
    cfg = load_config(PROFILE, ["train.memory_gb=80", "train.logprob_chunk_tokens=100000",
                                "train.micro_batch_tokens=65536"])
    with pytest.raises(PlanError, match="train.logprob_chunk_tokens"):
        plan_for(cfg)


def test_a_vllm_share_too_small_for_its_weights_is_refused():
    cfg = load_config(PROFILE, ["train.memory_gb=80", "rollout.vllm_gpu_memory_utilization=0.03"])
    with pytest.raises(PlanError, match="rollout.vllm_gpu_memory_utilization: 0.03"):
        plan_for(cfg)


def test_peak_is_flat_in_the_batch_and_grows_with_the_budget():
    shape = policy_shape(load_config(PROFILE))
    peak = lambda *o: estimate(load_config(PROFILE, list(o)), shape, device_bytes=80 * GiB).update  # noqa: E731
    small, large = peak("train.batch_size=64"), peak("train.batch_size=512")
    assert sum(small.values()) == sum(large.values())
    assert sum(peak("train.micro_batch_tokens=8192").values()) < sum(peak("train.micro_batch_tokens=32768").values())
    assert peak("train.gradient_checkpointing=false")["activations"] > 5 * large["activations"]


def test_dots_plan_command(capsys):
    assert main(["plan", "-p", PROFILE, "-S", "train.memory_gb=80"]) == 0
    out = capsys.readouterr().out
    assert "1,543.7M parameters" in out and "fits" in out and "logits_chunk" in out
    assert main(["plan", "-p", PROFILE, "-S", "train.memory_gb=80", "-S", "train.micro_batch_tokens=null"]) == 1
    assert "train.micro_batch_tokens" in capsys.readouterr().err
    assert main(["plan"]) == 0  # the embedded default on this machine: nothing to check against
    assert "no GPU memory to check against" in capsys.readouterr().out


def test_train_refuses_before_anything_loads(tmp_path):
    cfg = load_config(None, [f"paths.root={tmp_path / 'artifacts'}", "train.memory_gb=0.0001"])
    with pytest.raises(PlanError, match="memory plan"):
        stages.train(cfg, "grpo")  # no prepared data exists: the plan is refused before it is looked for
    assert not (tmp_path / "artifacts").exists()


@pytest.mark.parametrize("content,said", [
    ('{"hidden_size": 64}', "needs a model_type"),
    ("not json", "is not JSON"),
    ('{"model_type": "qwen2", "num_attention_heads": "many"}', "model.plan_config: "),
])
def test_a_bad_plan_config_is_one_line_naming_its_key(tmp_path, capsys, content, said):
    """A plan_config without model_type was a KeyError traceback, a field transformers refuses
    another, and a file that is not JSON a JSON error that named neither key nor file."""
    plan = tmp_path / "plan.json"
    plan.write_text(content)
    argv = ["plan", "-S", f"model.pretrained={tmp_path / 'no-model'}", "-S", f"model.plan_config={plan}",
            "-S", "embed.backbone=hf:x", "-S", "label.policies=[final]"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert said in err and "model.plan_config" in err and "Traceback" not in err

