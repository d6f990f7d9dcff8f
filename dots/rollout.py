"""Rollout engines: sample G responses per prompt and return them with the per-token
log-probs of the sampling policy (the behaviour log-probs that replay's importance
ratio needs).

`RolloutEngine` is the protocol; `HFEngine` runs a transformers causal LM with its own
KV-cached sampling loop (batched, left-padded prompts, no per-token host copies);
`dots.rollout_vllm` (optional `gpu` extra) serves the GPU profile behind the same
protocol; `dots.engines` picks between them, so this module never imports vLLM's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from .fast_decode import GPT2Decoder, supports

@dataclass
class Group:
    """G sampled responses to one question: the unit that selection, replay and loss share."""

    question_id: int
    prompt_ids: torch.Tensor          # (P,) long
    response_ids: torch.Tensor        # (G, L) long, right-padded with the pad id
    response_mask: torch.Tensor       # (G, L) bool, True on generated tokens (eos included)
    logprobs: torch.Tensor            # (G, L) float, behaviour log-probs, 0 on padding
    texts: list[str]
    rewards: torch.Tensor | None = None   # (G,) float in [0, 1]
    version: int = 0                  # policy version (step) that generated it

    @property
    def size(self) -> int:
        return int(self.response_ids.shape[0])

    @property
    def mean_reward(self) -> float:
        assert self.rewards is not None, "rewards not scored yet"
        return float(self.rewards.mean())

    @property
    def informative(self) -> bool:
        """0 < mean reward < 1: the group has a non-zero advantage somewhere."""
        m = self.mean_reward
        return 0.0 < m < 1.0


class RolloutEngine(Protocol):
    """What the trainer needs from a generator."""

    def generate(self, prompts: list[list[int]], n: int, *, temperature: float, max_new_tokens: int,
                 greedy: bool = False, generator: torch.Generator | None = None,
                 need_logprobs: bool = True) -> list[Group]:
        """n samples for each prompt, one Group per prompt (question_id = index in `prompts`).
        `need_logprobs=False` (evaluation, labelling): behaviour log-probs may be left at 0."""
        ...

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the engine sample from `model`'s current weights."""
        ...


class _TransformersDecoder:
    """Incremental decoding through the model's own `forward` and KV cache: any causal LM."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def prefill(self, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        if rows is not None:
            ids, attn, pos = ids[rows], attn[rows], pos[rows]
        self.attn = attn
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1)
        # transformers >= 5.24 names the KV cache `cache`; earlier releases `past_key_values`
        self.cache_key = "cache" if hasattr(out, "cache") else "past_key_values"
        self.cache = getattr(out, self.cache_key)
        return out.logits[:, -1, :]

    def step(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.attn = torch.cat([self.attn, torch.ones((tok.shape[0], 1), dtype=self.attn.dtype,
                                                     device=self.attn.device)], dim=1)
        out = self.model(input_ids=tok[:, None], attention_mask=self.attn, position_ids=pos,
                         use_cache=True, logits_to_keep=1, **{self.cache_key: self.cache})
        self.cache = getattr(out, self.cache_key)
        return out.logits[:, -1, :]

    def keep_rows(self, keep: torch.Tensor) -> bool:
        """Drop every row but `keep` from the cache; False (nothing dropped) where the cache
        cannot select rows."""
        select = getattr(self.cache, "batch_select_indices", None)
        if select is None:
            return False
        select(keep)
        self.attn = self.attn[keep]
        return True


@dataclass
class HFEngine:
    """Batched sampling with a KV cache on a transformers causal LM (CPU or one GPU)."""

    model: torch.nn.Module
    tokenizer: object
    batch_size: int = 1024
    fast: bool = True  # the lean GPT-2 decoder (dots.fast_decode) where the model allows it
    drop_finished: bool = True  # decode only the rows still running (see `_sample_batch`)
    _pad: int = field(init=False)
    _eos: int = field(init=False)

    def __post_init__(self):
        self._pad = int(self.tokenizer.pad_token_id)
        self._eos = int(self.tokenizer.eos_token_id)

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.model = model  # same process, same tensors: nothing to copy

    @torch.inference_mode()
    def _sample_batch(self, prompts: list[list[int]], temperature: float, max_new_tokens: int, greedy: bool,
                      generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample every row to its eos or `max_new_tokens`: ids, mask and log-probs, (n, L) each.

        Why finished rows leave the batch (`drop_finished`): a batch runs until its longest answer
        ends, and on the embedded task a row's answer is 4.4 tokens against the 9-10 steps a batch
        of 512 runs, so most of each late step decoded rows already done (a step costs about in
        proportion to its rows here). Once a quarter of the rows the decoder holds have ended it
        keeps only the running ones (a copy of their keys and values); measured on 64 x 8 warm-up
        rollouts, one thread, side by side: 0.055 s to 0.039 s, identical tokens and log-probs.
        Sampling still draws over all n rows (the finished ones on zero logits, their tokens
        masked), so a seeded generator yields the same tokens with the drop as without.
        """
        device = next(self.model.parameters()).device
        unique, order = [], []  # a prompt sampled G times sits in G consecutive rows: run it once
        for p in prompts:
            if not unique or unique[-1] != p:
                unique.append(p)
            order.append(len(unique) - 1)
        rows = torch.tensor(order, dtype=torch.long, device=device)
        width = max(len(p) for p in unique)
        limit = context_positions(self.model)
        if limit is not None and width + max_new_tokens > limit:  # else an IndexError deep in the model
            raise ValueError(f"rollout: a prompt of {width} tokens and max_new_tokens={max_new_tokens} do "
                             f"not fit the policy's {limit} positions (model.n_positions, or a model of a "
                             "longer context)")
        n = len(prompts)
        ids = torch.full((len(unique), width), self._pad, dtype=torch.long)
        attn = torch.zeros((len(unique), width), dtype=torch.long)
        for i, p in enumerate(unique):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attn[i, width - len(p):] = 1
        ids, attn = ids.to(device), attn.to(device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        out_ids = torch.full((n, max_new_tokens), self._pad, dtype=torch.long, device=device)
        out_lp = torch.zeros((n, max_new_tokens), device=device)
        out_mask = torch.zeros((n, max_new_tokens), dtype=torch.bool, device=device)
        alive = torch.ones(n, dtype=torch.bool, device=device)
        decoder = (GPT2Decoder(self.model, max_new_tokens) if self.fast and supports(self.model)
                   else _TransformersDecoder(self.model))
        logits = decoder.prefill(ids, attn, pos, rows)
        step_pos = pos[rows, -1:]
        running = torch.arange(n, device=device)  # the rows the decoder still holds, in order
        for t in range(max_new_tokens):
            if running.shape[0] < n:  # the finished rows' logits: any values, their tokens are masked
                logits = logits.new_zeros((n, logits.shape[-1])).index_copy_(0, running, logits)
            logp = torch.log_softmax(logits.float() / temperature, dim=-1)
            if greedy:
                tok = logp.argmax(-1)
            else:
                tok = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
            tok = torch.where(alive, tok, torch.full_like(tok, self._pad))
            out_ids[:, t] = tok
            out_lp[:, t] = torch.where(alive, logp.gather(-1, tok[:, None]).squeeze(-1), 0.0)
            out_mask[:, t] = alive
            alive = alive & (tok != self._eos)
            if not alive.any():
                out_ids, out_lp, out_mask = out_ids[:, : t + 1], out_lp[:, : t + 1], out_mask[:, : t + 1]
                break
            if t + 1 < max_new_tokens:
                still = alive[running]
                if self.drop_finished and int(still.sum()) <= 3 * running.shape[0] // 4:
                    keep = still.nonzero().squeeze(-1)
                    if decoder.keep_rows(keep):
                        running, step_pos = running[keep], step_pos[keep]
                step_pos = step_pos + 1
                logits = decoder.step(tok[running], step_pos)
        return out_ids.cpu(), out_mask.cpu(), out_lp.cpu()

    def generate(self, prompts: list[list[int]], n: int, *, temperature: float = 1.0, max_new_tokens: int = 16,
                 greedy: bool = False, generator: torch.Generator | None = None,
                 need_logprobs: bool = True) -> list[Group]:
        """Sampling yields the log-probs for free here, so `need_logprobs` changes nothing."""
        device = next(self.model.parameters()).device
        if generator is not None and generator.device != device:
            # a seeded generator on the policy's device, drawn from the caller's (checkpointed) one
            seed = int(torch.randint(0, 2**62, (1,), generator=generator))
            generator = torch.Generator(device=device).manual_seed(seed)
        flat = [p for p in prompts for _ in range(n)]
        chunks = []
        for start in range(0, len(flat), self.batch_size):
            chunks.append(self._sample_batch(flat[start:start + self.batch_size], temperature, max_new_tokens,
                                             greedy, generator))
        width = max(c[0].shape[1] for c in chunks)
        ids = torch.cat([_pad_to(c[0], width, self._pad) for c in chunks])
        mask = torch.cat([_pad_to(c[1], width, False) for c in chunks])
        lp = torch.cat([_pad_to(c[2], width, 0.0) for c in chunks])
        texts = decode_responses(self.tokenizer, ids, mask, self._eos)
        groups = []
        for q, prompt in enumerate(prompts):
            sl = slice(q * n, (q + 1) * n)
            groups.append(Group(question_id=q, prompt_ids=torch.tensor(prompt, dtype=torch.long),
                                response_ids=ids[sl], response_mask=mask[sl], logprobs=lp[sl], texts=texts[sl]))
        return groups


def context_positions(model) -> int | None:
    """How many positions the policy can attend over (GPT-2's n_positions, most others'
    max_position_embeddings); None when its config says neither."""
    cfg = getattr(model, "config", None)
    for key in ("n_positions", "max_position_embeddings"):
        if isinstance(getattr(cfg, key, None), int):
            return getattr(cfg, key)
    return None


def decode_responses(tokenizer, ids: torch.Tensor, mask: torch.Tensor, eos: int) -> list[str]:
    """Text of each response up to (not including) its eos. Other special tokens stay in the
    text, so a pad or bos sampled mid-answer cannot vanish and turn a wrong answer right."""
    rows = []
    for row, m in zip(ids.tolist(), mask.tolist()):
        toks = [t for t, keep in zip(row, m) if keep]
        if toks and toks[-1] == eos:
            toks = toks[:-1]
        rows.append(toks)
    return tokenizer.batch_decode(rows, skip_special_tokens=False)


def _pad_to(t: torch.Tensor, width: int, value) -> torch.Tensor:
    if t.shape[1] == width:
        return t
    fill = torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype)
    return torch.cat([t, fill], dim=1)
