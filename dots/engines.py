"""Which rollout engine a stage gets: `rollout.engine` (hf or vllm) with all its params.

Kept apart from `dots.rollout` so the layers stay one-way: the HF engine and the `Group`
rows sit below the loss and micro-batching, and vLLM's engine (which needs those) sits above
them; only this module knows both. vLLM is imported only when a config asks for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .rollout import HFEngine, RolloutEngine

if TYPE_CHECKING:
    from .config import Config


VLLM_MISSING = "rollout.engine: 'vllm' needs the gpu extra (pip install 'dots[gpu]') and a GPU"


def require_engine(name: str) -> None:
    """Refuse `rollout.engine: vllm` where vLLM is not installed, before a command's work (the CLI
    checks it first: the engine starts only after the data step and the policy load)."""
    import importlib.util  # noqa: PLC0415

    if name == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ValueError(f"{VLLM_MISSING}; vllm is not installed")


def make_engine(name: str, model, tokenizer, batch_size: int, **vllm_options) -> RolloutEngine:
    """The engine named in `rollout.engine`; vLLM is imported only when asked for."""
    if name == "hf":
        return HFEngine(model, tokenizer, batch_size=batch_size)
    if name == "vllm":
        try:
            from .rollout_vllm import VLLMEngine  # noqa: PLC0415  (optional gpu extra)
        except ImportError as exc:
            raise ValueError(f"{VLLM_MISSING}; import failed: {exc}") from None
        return VLLMEngine(model, tokenizer, batch_size=batch_size, **vllm_options)
    raise ValueError(f"rollout.engine: unknown engine {name!r}; allowed: hf, vllm")


def engine_for(cfg: Config, model, tokenizer, *, seed: int = 0, sleep_mode: bool | None = None) -> RolloutEngine:
    """The configured engine for `model`, for every stage that rolls out (warm-up spectrum,
    labelling, training, evaluation): `rollout.engine` with all its params. `sleep_mode`
    overrides `rollout.vllm_sleep_mode` (stages that never train have no reason to sleep)."""
    r = cfg.rollout
    if r.engine == "hf":
        return make_engine("hf", model, tokenizer, r.batch_size)
    return make_engine("vllm", model, tokenizer, r.batch_size, gpu_memory_utilization=r.vllm_gpu_memory_utilization,
                       sleep_mode=r.vllm_sleep_mode if sleep_mode is None else sleep_mode, dtype=cfg.model.dtype,
                       seed=seed, behaviour_logprobs=r.behaviour_logprobs,
                       micro_batch_tokens=cfg.train.micro_batch_tokens,
                       logprob_chunk_tokens=cfg.train.logprob_chunk_tokens)


def close_engine(engine: RolloutEngine) -> None:
    """Free what an engine holds beside the policy (a vLLM engine's GPU memory); hf: nothing."""
    close = getattr(engine, "close", None)
    if close is not None:
        close()
