"""vLLM rollout engine for the GPU profile, behind the same `RolloutEngine` protocol as
`HFEngine` (optional extra `dots[gpu]`; imported only when `rollout.engine: vllm`).

UNTESTED ON vLLM: no GPU and no vLLM wheel on the development machines, and vLLM's wheel is
too large to carry to the lent GPU machine. It is written against vLLM's documented offline
API (`LLM`, `SamplingParams`, `TokensPrompt`, sleep mode, `reset_prefix_cache`,
`collective_rpc` with a `worker_extension_cls`, as in vLLM's RLHF colocation example).
`tests/test_rollout_vllm.py` checks the calls it makes against a stand-in for that API,
which proves what dots asks of vLLM, not what vLLM does with it.

Design:
- colocated with the trainer on the same GPU; `gpu_memory_utilization` and sleep mode come
  from params (`rollout.vllm_gpu_memory_utilization`, `rollout.vllm_sleep_mode`), the dtype
  from `model.dtype`;
- during each update vLLM sleeps at level 2 (weights and KV cache discarded: the weights are
  about to change, so keeping a host copy, as level 1 does, would be wasted); waking always
  reloads the trainer's current weights, and every weight load resets the prefix cache, so a
  shared system prompt never reuses keys and values computed by older weights;
- each prompt gets its own seed (drawn from the trainer's checkpointed generator, plus its
  index), so prompts draw independent noise and a resumed run samples what an uninterrupted
  one would;
- under torchrun (`dots.distributed`) each rank runs its own engine on its GPU with vLLM's
  `external_launcher` executor (one worker per process, as TRL's colocate mode does), and
  generates its shard of the step's prompts; with `train.fsdp` the weights it loads are the
  sharded policy's, gathered whole (`dots.sharding.full_state_dict`, on every rank at once);
- behaviour log-probs (`rollout.behaviour_logprobs`): 'trainer' recomputes them with the
  training forward (`dots.loss.token_logprobs`) in the update's micro-batches, after vLLM
  has gone to sleep, so the importance ratio compares like with like; 'vllm' takes vLLM's
  own log-probs of the sampled tokens after temperature (`logprobs_mode="processed_logprobs"`),
  which saves that forward but mixes two kernels' numerics into the ratio. Neither runs
  when the caller does not need them (evaluation, labelling).
"""

from __future__ import annotations

import gc
import os

import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # same process: weights pass by reference

from vllm import LLM, SamplingParams  # noqa: E402  (imported only when rollout.engine is vllm)
from vllm.inputs import TokensPrompt  # noqa: E402

from .distributed import fsdp_sharded  # noqa: E402
from .loss import collate, token_logprobs  # noqa: E402
from .microbatch import collate_rows, pack  # noqa: E402
from .rollout import Group, decode_responses  # noqa: E402


class DotsWorkerExtension:
    """Mixed into vLLM's GPU worker (`worker_extension_cls`): receives the trainer's weights."""

    def dots_load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        self.model_runner.model.load_weights(weights=named_tensors)  # type: ignore[attr-defined]


class VLLMEngine:
    def __init__(self, model: torch.nn.Module, tokenizer, batch_size: int = 1024, *,
                 gpu_memory_utilization: float = 0.35, sleep_mode: bool = True, dtype: str = "bfloat16",
                 seed: int = 0, behaviour_logprobs: str = "trainer", micro_batch_tokens: int | None = None,
                 logprob_chunk_tokens: int = 8192):
        if behaviour_logprobs not in ("trainer", "vllm"):
            raise ValueError(f"rollout.behaviour_logprobs: {behaviour_logprobs!r}; allowed: trainer, vllm")
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.sleep_mode, self.behaviour = sleep_mode, behaviour_logprobs
        self.micro_batch_tokens, self.chunk_tokens = micro_batch_tokens, logprob_chunk_tokens
        self._eos = int(tokenizer.eos_token_id)
        self._pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
        options = {}
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            options["distributed_executor_backend"] = "external_launcher"  # one engine per torchrun rank
        if behaviour_logprobs == "vllm":
            options["logprobs_mode"] = "processed_logprobs"  # after temperature, as the trainer's are
        self.llm = LLM(model=model.name_or_path, tokenizer=model.name_or_path, dtype=dtype, seed=seed,
                       gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=sleep_mode,
                       worker_extension_cls="dots.rollout_vllm.DotsWorkerExtension", **options)
        self._asleep = False

    # ---- weights and memory --------------------------------------------------------------
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Sample from `model`'s current weights from now on (after every optimizer step and
        after a resume)."""
        self.model = model
        if self._asleep:
            self._wake()  # loads self.model's weights
        else:
            self._load_weights()

    def _load_weights(self) -> None:
        if fsdp_sharded(self.model):  # train.fsdp: the whole weights, gathered (a collective: every rank
            from .sharding import full_state_dict  # loads its engine at the same point)

            state = full_state_dict(self.model)
        else:
            state = self.model.state_dict()
        named = [(name, p.detach()) for name, p in state.items()]
        self.llm.collective_rpc("dots_load_weights", args=(named,))
        self.llm.reset_prefix_cache()  # cached prefixes hold keys/values of the old weights

    def _wake(self) -> None:
        """Level 2 discarded the weights: allocate them, load the trainer's, then the KV cache."""
        self.llm.wake_up(tags=["weights"])  # weights first, so the KV cache is not allocated yet
        self._load_weights()
        self.llm.wake_up(tags=["kv_cache"])
        self._asleep = False

    def wake(self) -> None:
        """Wake a sleeping engine now (reloading the trainer's weights) rather than in the next
        `generate`: under train.fsdp the reload gathers the sharded weights, a collective that the
        trainer runs on every rank before any rank generates."""
        if self._asleep:
            self._wake()

    def release(self) -> None:
        """Free vLLM's GPU memory for the trainer's forward and backward (sleep level 2)."""
        if self.sleep_mode and not self._asleep:
            self.llm.sleep(level=2)
            self._asleep = True

    def close(self) -> None:
        """Drop the engine (a stage that rolled out with a policy it no longer needs)."""
        self.llm = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # ---- sampling ------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], n: int, *, temperature: float = 1.0, max_new_tokens: int = 16,
                 greedy: bool = False, generator: torch.Generator | None = None,
                 need_logprobs: bool = True) -> list[Group]:
        if self._asleep:
            self._wake()
        need_logprobs = need_logprobs and not greedy
        base = int(torch.randint(0, 2**31 - 1, (1,), generator=generator)) if generator is not None else None
        from_vllm = need_logprobs and self.behaviour == "vllm"
        params = [SamplingParams(n=n, temperature=0.0 if greedy else temperature, max_tokens=max_new_tokens,
                                 seed=None if base is None else (base + i) % 2**31, stop_token_ids=[self._eos],
                                 logprobs=0 if from_vllm else None)
                  for i in range(len(prompts))]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        groups = []
        for q, (prompt, out) in enumerate(zip(prompts, outputs)):
            seqs = [list(c.token_ids) for c in out.outputs]
            width = max(1, max(len(s) for s in seqs))
            ids = torch.full((n, width), self._pad, dtype=torch.long)
            mask = torch.zeros((n, width), dtype=torch.bool)
            logprobs = torch.zeros((n, width))
            for i, (s, c) in enumerate(zip(seqs, out.outputs)):
                ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
                mask[i, : len(s)] = True
                if from_vllm:
                    logprobs[i, : len(s)] = torch.tensor([step[t].logprob for t, step in zip(s, c.logprobs)])
            groups.append(Group(question_id=q, prompt_ids=torch.tensor(prompt, dtype=torch.long), response_ids=ids,
                                response_mask=mask, logprobs=logprobs,
                                texts=decode_responses(self.tokenizer, ids, mask, self._eos)))
        if need_logprobs and self.behaviour == "trainer":
            self.release()  # the trainer's forward gets the GPU; the next generate or sync wakes vLLM
            self._behaviour_logprobs(groups, temperature)
        return groups

    @torch.no_grad()
    def _behaviour_logprobs(self, groups: list[Group], temperature: float) -> None:
        """Per-token log-probs of the sampled tokens under the trainer's policy (its own forward),
        in the update's micro-batches (`train.micro_batch_tokens`; null: rollout.batch_size rows)."""
        device = next(self.model.parameters()).device
        for g in groups:
            g.rewards = torch.zeros(g.size)  # collate needs rewards; the real ones are scored later
        if self.micro_batch_tokens is None:
            per = max(1, self.batch_size // max(1, groups[0].size))
            batches = [(collate(groups[s:s + per], self._pad), [(g, 0, g.size) for g in groups[s:s + per]])
                       for s in range(0, len(groups), per)]
        else:
            batches = [(collate_rows(parts, self._pad, len(groups)), [(p.group, p.start, p.stop) for p in parts])
                       for parts in pack(groups, self.micro_batch_tokens)]
        for batch, spans in batches:
            logp = token_logprobs(self.model, batch.to(device), temperature,
                                  chunk_tokens=self.chunk_tokens).float().cpu()
            row = 0
            for g, start, stop in spans:
                width = min(logp.shape[1], g.logprobs.shape[1])
                g.logprobs[start:stop, :width] = logp[row:row + stop - start, :width]
                row += stop - start
        for g in groups:
            g.logprobs = (g.logprobs * g.response_mask).contiguous()
            g.rewards = None
