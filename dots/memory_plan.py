"""Peak accelerator memory per rank, estimated from params before any model loads.

Why: the GPU profile's first hours are spent loading a model, starting vLLM and rolling
out before the first update runs out of memory. `dots plan` (and the first lines of
`dots train`) add up what one rank holds at its two peaks and refuse a config that cannot
fit, naming the key to change:

- **update**: weights, gradients (accumulated over micro-batches), AdamW's two states
  (all in the policy's dtype, as torch's AdamW keeps them; divided by the ranks under
  `train.fsdp`), the activations one micro-batch keeps for its backward pass, the logits
  of one log-prob chunk (forward, recompute and gradient), and what vLLM keeps while
  asleep (nothing at level 2 beyond its context; its whole share without sleep mode);
- **rollout**: weights (whole: under FSDP rollouts gather the policy on every rank) and
  AdamW states (gradients are freed after each step), plus
  vLLM's share of the device (`rollout.vllm_gpu_memory_utilization`: its weights and KV
  cache) or, on the `hf` engine, the KV cache and one step's logits of a rollout batch.

The counts are the standard ones (bytes per element times elements). Activations per
token and layer: the inputs each sub-layer saves for its backward pass — for a Llama/Qwen2
block about 8·hidden + 2·kv + 4·intermediate elements, for GPT-2 the same formula with
its 4·hidden MLP; with activation checkpointing only each block's input (hidden) plus one
block's full set. Attention is assumed fused (no seq² matrix: SDPA's flash or
memory-efficient kernels on GPU). `scripts/memory_probe.py` measures the real peak beside
this estimate (docs/gpu.md, "Memory").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .config import Config

GiB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
HEADROOM = 0.95  # the allocator's fragmentation and the CUDA context need the rest
CUDA_CONTEXT = 0.5 * GiB  # what a CUDA process holds before its first tensor (driver, cuBLAS workspace)
VLLM_ASLEEP = 1.0 * GiB  # vLLM at sleep level 2: its CUDA graphs, buffers and context


@dataclass(frozen=True)
class Shape:
    """What the estimate needs to know about the policy's architecture."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    kv_dim: int  # key (= value) width: kv heads x head dim
    vocab: int

    @property
    def per_token_layer(self) -> int:
        """Activation elements one token keeps per block for its backward pass."""
        return 8 * self.hidden + 2 * self.kv_dim + 4 * self.intermediate


def shape_from_hf_config(config) -> Shape:
    """The Shape of a transformers config (Llama/Qwen2-style or GPT-2), parameters counted on the meta device."""
    import torch  # noqa: PLC0415
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    hidden = getattr(config, "hidden_size", None) or config.n_embd
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    heads = getattr(config, "num_attention_heads", None) or config.n_head
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    inter = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
    return Shape(params, layers, hidden, inter, kv_heads * (hidden // heads), config.vocab_size)


def plan_config(path: Path):
    """model.plan_config read as transformers reads a config.json, every way it can be wrong one
    line naming the key: no such file, no `model_type`, not JSON, a field transformers refuses
    (each but the first was a traceback, or a JSON error that named no file)."""
    from transformers import AutoConfig  # noqa: PLC0415

    if not path.is_file():
        raise ValueError(f"model.plan_config: no file {path}")
    try:
        raw = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"model.plan_config: {path} is not JSON ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        raise ValueError(f"model.plan_config: {path} needs a model_type (e.g. \"qwen2\"), as a "
                         "config.json has")
    try:
        return AutoConfig.for_model(raw.pop("model_type"), **raw)
    except Exception as exc:  # noqa: BLE001  (transformers' own validation errors have no common base)
        raise ValueError(f"model.plan_config: {path}: {str(exc).splitlines()[0]}") from None


def policy_shape(cfg: Config) -> Shape:
    """The policy's Shape from params: the pretrained model's config.json (a local folder or the
    local hub cache; nothing is downloaded), or the embedded tiny GPT-2."""
    from transformers import AutoConfig, GPT2Config  # noqa: PLC0415

    if cfg.model.pretrained:
        try:
            config = AutoConfig.from_pretrained(cfg.model.pretrained)
        except OSError as exc:
            if not cfg.model.plan_config:
                raise ValueError(f"model.pretrained: cannot read {cfg.model.pretrained!r}'s config.json (a local "
                                 f"folder, or a model in the local hub cache), and model.plan_config is not set: "
                                 f"{str(exc).splitlines()[0]}") from None
            config = plan_config(Path(cfg.model.plan_config))
    else:
        from .models import build_tokenizer  # noqa: PLC0415

        m = cfg.model
        config = GPT2Config(vocab_size=len(build_tokenizer()), n_positions=m.n_positions, n_embd=m.n_embd,
                            n_layer=m.n_layer, n_head=m.n_head)
    return shape_from_hf_config(config)


@dataclass
class Plan:
    """Bytes per rank at the update peak and the rollout peak, term by term."""

    update: dict[str, float] = field(default_factory=dict)
    rollout: dict[str, float] = field(default_factory=dict)
    device_bytes: float | None = None
    device: str = "cpu"

    @property
    def peak(self) -> float:
        return max(sum(self.update.values()), sum(self.rollout.values()))

    def table(self) -> str:
        lines = [f"memory plan per rank ({self.device}; GiB)"]
        for phase, terms in (("update", self.update), ("rollout", self.rollout)):
            lines.append(f"  {phase}: {sum(terms.values()) / GiB:.2f}")
            lines += [f"    {k:<24} {v / GiB:8.2f}" for k, v in terms.items()]
        budget = "unknown (no check)" if self.device_bytes is None else f"{self.device_bytes / GiB:.1f}"
        lines.append(f"  peak {self.peak / GiB:.2f} of {budget}")
        return "\n".join(lines)


def micro_batch_tokens(cfg: Config, world: int, prompt: int) -> int:
    """Padded tokens one forward/backward holds: the budget, or (null) this rank's whole step."""
    step = -(-cfg.train.batch_size * cfg.rollout.group_size // world) * (prompt + cfg.rollout.max_new_tokens)
    return step if cfg.train.micro_batch_tokens is None else min(step, cfg.train.micro_batch_tokens)


def prompt_tokens(cfg: Config) -> int:
    """The longest prompt the plan assumes: the embedded model's context less its answers, or
    1,024 tokens for a pretrained model (the GPU profile's dataset filter)."""
    if cfg.model.pretrained:
        return 1024
    return max(1, cfg.model.n_positions - cfg.rollout.max_new_tokens)


def estimate(cfg: Config, shape: Shape, world: int = 1, device_bytes: float | None = None,
             device: str = "cuda", prompt: int | None = None) -> Plan:
    """The two peaks of one rank for `cfg` on a policy of `shape` (see the module docstring);
    `prompt` overrides the assumed longest prompt."""
    b = DTYPE_BYTES[cfg.model.dtype]
    shard = world if cfg.train.fsdp else 1
    weights = shape.params * b / shard
    prompt = prompt_tokens(cfg) if prompt is None else prompt
    tokens = micro_batch_tokens(cfg, world, prompt)
    answer_share = cfg.rollout.max_new_tokens / (prompt + cfg.rollout.max_new_tokens)
    response_tokens = max(1, int(tokens * answer_share))
    if cfg.train.gradient_checkpointing:
        acts = tokens * (shape.layers * shape.hidden + shape.per_token_layer) * b
    else:
        acts = tokens * shape.layers * shape.per_token_layer * b
    # per logit: the projection's output (b), its float32 copy when b < 4, then the ÷T and
    # log-softmax (or exp) float32 temporaries (8); a checkpointed chunk (more response tokens
    # than train.logprob_chunk_tokens) adds the float32 gradient of its recomputed logits (4)
    upcast = 4 if b < 4 else 0
    if response_tokens <= cfg.train.logprob_chunk_tokens:
        logits = response_tokens * shape.vocab * (b + upcast + 8)
    else:
        logits = cfg.train.logprob_chunk_tokens * shape.vocab * (b + upcast + 12)
    fixed = CUDA_CONTEXT if device == "cuda" else 0.0
    update = {"weights": weights, "gradients": weights, "adamw_states": 2 * weights,
              "activations": acts, "logits_chunk": logits}
    # rollouts run on the policy gathered whole on every rank, also under train.fsdp
    rollout = {"weights": shape.params * b, "adamw_states": 2 * weights}
    r = cfg.rollout
    if r.engine == "vllm":
        share = r.vllm_gpu_memory_utilization * (device_bytes or 0.0)
        update["vllm_" + ("asleep" if r.vllm_sleep_mode else "awake")] = VLLM_ASLEEP if r.vllm_sleep_mode else share
        rollout["vllm_share"] = share
    else:
        rows = min(r.batch_size, cfg.train.batch_size * r.group_size)
        length = prompt + r.max_new_tokens
        rollout["kv_cache"] = rows * length * shape.layers * 2 * shape.kv_dim * b
        rollout["step_logits"] = rows * shape.vocab * (b + 12)
    if fixed:
        update["cuda_context"] = rollout["cuda_context"] = fixed
    return Plan(update, rollout, device_bytes, device)


def device_memory(cfg: Config) -> tuple[float | None, str]:
    """(bytes per rank to plan against, device kind): `train.memory_gb`, else the visible GPU's,
    else None (a CPU run: nothing to check)."""
    import torch  # noqa: PLC0415

    on_gpu = cfg.train.device == "cuda" or (cfg.train.device == "auto" and torch.cuda.is_available())
    if cfg.train.memory_gb is not None:
        return cfg.train.memory_gb * GiB, "cuda"
    if on_gpu and torch.cuda.is_available():
        return float(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory), "cuda"
    return None, "cuda" if on_gpu else "cpu"


class PlanError(ValueError):
    """The config cannot fit the device; the message names the key to change."""


def check(plan: Plan, cfg: Config, shape: Shape) -> None:
    """Raise PlanError when a peak exceeds the device (less headroom), naming the key that
    moves the largest term; also when vLLM's share cannot hold its own weights, or the
    trainer's static memory leaves vLLM less than its share."""
    if plan.device_bytes is None:
        return
    limit = HEADROOM * plan.device_bytes
    gib = lambda x: f"{x / GiB:.1f} GiB"  # noqa: E731
    r = cfg.rollout
    if r.engine == "vllm":
        vllm_weights = shape.params * DTYPE_BYTES[cfg.model.dtype]
        share = r.vllm_gpu_memory_utilization * plan.device_bytes
        if share <= 1.2 * vllm_weights:
            raise PlanError(f"rollout.vllm_gpu_memory_utilization: {r.vllm_gpu_memory_utilization} gives vLLM "
                            f"{gib(share)}, too little for its weights ({gib(vllm_weights)}) and a KV cache; raise it")
    for phase, terms in (("update", plan.update), ("rollout", plan.rollout)):
        total = sum(terms.values())
        if total <= limit:
            continue
        movable = {k: v for k, v in terms.items() if k not in ("cuda_context",)}
        worst = max(movable, key=movable.get)
        advice = {
            "activations": "train.micro_batch_tokens (smaller), or train.gradient_checkpointing: true",
            "logits_chunk": "train.logprob_chunk_tokens (smaller)",
            "vllm_share": "rollout.vllm_gpu_memory_utilization (smaller)",
            "vllm_awake": "rollout.vllm_sleep_mode: true",
            "kv_cache": "rollout.batch_size (smaller)",
            "step_logits": "rollout.batch_size (smaller)",
        }.get(worst, "train.fsdp: true over more GPUs, or a smaller model")
        raise PlanError(f"memory plan: the {phase} peak needs {gib(total)} per rank, more than "
                        f"{HEADROOM:.0%} of the device's {gib(plan.device_bytes)}; its largest term is {worst} "
                        f"({gib(terms[worst])}): change {advice}\n{plan.table()}")


def plan_for(cfg: Config, world: int = 1) -> tuple[Plan, Shape]:
    """Estimate (and check) the config's memory on the device it will train on."""
    shape = policy_shape(cfg)
    device_bytes, device = device_memory(cfg)
    plan = estimate(cfg, shape, world, device_bytes, device)
    check(plan, cfg, shape)
    return plan, shape


def write_plan(plan: Plan, path: str | Path) -> None:
    Path(path).write_text(json.dumps({"update": plan.update, "rollout": plan.rollout, "peak": plan.peak,
                                      "device_bytes": plan.device_bytes, "device": plan.device}, indent=2))
