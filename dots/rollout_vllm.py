"""vLLM rollout engine for the GPU profile, behind the same `RolloutEngine` protocol as
`HFEngine` (optional extra `dots[gpu]`; imported only when `rollout.engine: vllm`).

UNTESTED HERE: no GPU and no vLLM wheel on the development machines. It is written against
vLLM's documented offline API (`LLM`, `SamplingParams`, `TokensPrompt`, sleep mode,
`collective_rpc` with a `worker_extension_cls`, as in vLLM's RLHF colocation example).

Design:
- colocated with the trainer on the same GPU; `gpu_memory_utilization` and sleep mode come
  from params (`rollout.vllm_gpu_memory_utilization`, `rollout.vllm_sleep_mode`);
- after each optimizer step the trainer calls `sync_weights(model)`, which loads the
  policy's current tensors into vLLM's model (`load_weights`) through the worker extension;
- under torchrun (`dots.distributed`) each rank runs its own engine on its GPU with vLLM's
  `external_launcher` executor (one worker per process, as TRL's colocate mode does), and
  generates its shard of the step's prompts;
- behaviour log-probs are NOT taken from vLLM: they are recomputed by the trainer's own
  forward pass (`dots.loss.token_logprobs`), so the importance ratio compares like with like
  (vLLM's sampler and the training forward differ in kernels and precision).
"""

from __future__ import annotations

import os

import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # same process: weights pass by reference

from vllm import LLM, SamplingParams  # noqa: E402  (imported only when rollout.engine is vllm)
from vllm.inputs import TokensPrompt  # noqa: E402

from .loss import collate, token_logprobs  # noqa: E402
from .rollout import Group, decode_responses  # noqa: E402


class DotsWorkerExtension:
    """Mixed into vLLM's GPU worker (`worker_extension_cls`): receives the trainer's weights."""

    def dots_load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        self.model_runner.model.load_weights(weights=named_tensors)  # type: ignore[attr-defined]


class VLLMEngine:
    def __init__(self, model: torch.nn.Module, tokenizer, batch_size: int = 1024, *,
                 gpu_memory_utilization: float = 0.35, sleep_mode: bool = True, dtype: str = "bfloat16",
                 seed: int = 0):

        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.sleep_mode = sleep_mode
        self._eos = int(tokenizer.eos_token_id)
        self._pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
        per_rank = {}
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            per_rank["distributed_executor_backend"] = "external_launcher"  # one engine per torchrun rank
        self.llm = LLM(model=model.name_or_path, tokenizer=model.name_or_path, dtype=dtype, seed=seed,
                       gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=sleep_mode,
                       worker_extension_cls="dots.rollout_vllm.DotsWorkerExtension", **per_rank)
        self._asleep = False

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load the policy's current weights into vLLM (after every optimizer step)."""
        self.model = model
        if self._asleep:
            self.llm.wake_up(tags=["weights"])  # weights first, so the KV cache is not allocated yet
        named = [(name, p.detach()) for name, p in model.state_dict().items()]
        self.llm.collective_rpc("dots_load_weights", args=(named,))
        if self._asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = False

    def release(self) -> None:
        """Free vLLM's GPU memory for the update (sleep level 1 keeps weights in host memory)."""
        if self.sleep_mode and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def generate(self, prompts: list[list[int]], n: int, *, temperature: float = 1.0, max_new_tokens: int = 16,
                 greedy: bool = False, generator: torch.Generator | None = None) -> list[Group]:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator)) if generator is not None else None
        params = SamplingParams(n=n, temperature=0.0 if greedy else temperature, max_tokens=max_new_tokens,
                                seed=seed, stop_token_ids=[self._eos])
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        groups = []
        for q, (prompt, out) in enumerate(zip(prompts, outputs)):
            seqs = [list(c.token_ids) for c in out.outputs]
            width = max(1, max(len(s) for s in seqs))
            ids = torch.full((n, width), self._pad, dtype=torch.long)
            mask = torch.zeros((n, width), dtype=torch.bool)
            for i, s in enumerate(seqs):
                ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
                mask[i, : len(s)] = True
            groups.append(Group(question_id=q, prompt_ids=torch.tensor(prompt, dtype=torch.long), response_ids=ids,
                                response_mask=mask, logprobs=torch.zeros((n, width)),
                                texts=decode_responses(self.tokenizer, ids, mask, self._eos)))
        self._behaviour_logprobs(groups, temperature)
        return groups

    @torch.no_grad()
    def _behaviour_logprobs(self, groups: list[Group], temperature: float) -> None:
        """Per-token log-probs of the sampled tokens under the trainer's policy (its own forward)."""
        device = next(self.model.parameters()).device
        for start in range(0, len(groups), max(1, self.batch_size // max(1, groups[0].size))):
            part = groups[start:start + max(1, self.batch_size // max(1, groups[0].size))]
            for g in part:
                g.rewards = torch.zeros(g.size)  # collate needs rewards; the real ones are scored later
            batch = collate(part, self._pad)
            for name in ("input_ids", "attention_mask", "position_ids", "response_ids"):
                setattr(batch, name, getattr(batch, name).to(device))
            logp = token_logprobs(self.model, batch, temperature).float().cpu()
            row = 0
            for g in part:
                g.logprobs = (logp[row:row + g.size] * g.response_mask).contiguous()
                g.rewards = None
                row += g.size
