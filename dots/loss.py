"""GRPO loss with behaviour-policy importance sampling (DESIGN §1).

    r̃_{i,t} = π_θ(o_{i,t} | q, o_{i,<t}) / π_behaviour(o_{i,t} | q, o_{i,<t})
    Â_i     = r_i − mean_group(r)            (÷ std_group(r) when scale_rewards = "group")
    J       = mean_groups 1/G Σ_i 1/|o_i| Σ_t [ min(r̃ Â, clip(r̃, 1−ε, 1+ε) Â) − β KL ]

For a fresh on-policy group π_behaviour is the policy that just sampled it, r̃ = 1 and
this is plain GRPO; a replayed group carries the log-probs of the older policy that
generated it, so r̃ corrects for its staleness and the clip bounds the step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .fast_decode import shared_prompt_hidden, shared_prompt_logits, supports
from .rollout import Group


@dataclass
class Batch:
    """Groups flattened to sequences: one forward pass computes every log-prob a step needs."""

    input_ids: torch.Tensor       # (N, P+L)
    attention_mask: torch.Tensor  # (N, P+L)
    position_ids: torch.Tensor    # (N, P+L)
    response_ids: torch.Tensor    # (N, L)
    response_mask: torch.Tensor   # (N, L) bool
    old_logprobs: torch.Tensor    # (N, L) behaviour log-probs
    advantages: torch.Tensor      # (N,)
    prompt_width: int
    # (N,) each row's weight in J when the step is split into micro-batches (1 / (G x groups in
    # the step)); None: J is the mean over this batch's rows
    weights: torch.Tensor | None = None

    def to(self, device) -> "Batch":
        """The same batch on `device` (the policy's), for a GPU update."""
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.__dict__.items()}
        return Batch(**moved)


def group_advantages(rewards: torch.Tensor, scale_rewards: str = "none", eps: float = 1e-6) -> torch.Tensor:
    """(groups, G) rewards → advantages r − mean, optionally ÷ the group's std."""
    adv = rewards - rewards.mean(dim=-1, keepdim=True)
    if scale_rewards == "group":
        adv = adv / (rewards.std(dim=-1, keepdim=True) + eps)
    elif scale_rewards != "none":
        raise ValueError(f"loss.scale_rewards: unknown {scale_rewards!r}; allowed: none, group")
    return adv


def collate(groups: list[Group], pad_id: int, scale_rewards: str = "none") -> Batch:
    """Left-pad prompts and right-pad responses of every sample of every group into one batch.

    Built with a few whole-batch tensor operations rather than a few per row: on the embedded
    task a step's batch is hundreds of 20-token rows, and per-row copies cost as much as a
    tenth of the update's forward pass (most for `dots_rr`, whose steps hold twice the groups)."""
    sizes = torch.tensor([g.size for g in groups])
    prompt_lens = torch.tensor([len(g.prompt_ids) for g in groups])
    width = int(prompt_lens.max())
    length = max(int(g.response_ids.shape[1]) for g in groups)
    n = int(sizes.sum())
    # one left-padded prompt per group (its tokens fill the row's right end, in order), then one row per sample
    real = torch.arange(width)[None, :] >= (width - prompt_lens)[:, None]
    prompts = torch.full((len(groups), width), pad_id, dtype=torch.long)
    prompts[real] = torch.cat([g.prompt_ids for g in groups]).long()
    ids = torch.full((n, width + length), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width + length), dtype=torch.long)
    ids[:, :width] = prompts.repeat_interleave(sizes, dim=0)
    attn[:, :width] = real.long().repeat_interleave(sizes, dim=0)
    # each group's (G, L_g) block into the first L_g columns of its rows: row-major, as the mask's True cells
    widths = torch.tensor([int(g.response_ids.shape[1]) for g in groups]).repeat_interleave(sizes)
    filled = torch.arange(length)[None, :] < widths[:, None]

    def _cat(attr: str, fill) -> torch.Tensor:
        parts = [getattr(g, attr) for g in groups]
        out = torch.full((n, length), fill, dtype=parts[0].dtype)
        out[filled] = torch.cat([t.reshape(-1) for t in parts])
        return out

    resp, mask, old = _cat("response_ids", pad_id), _cat("response_mask", False), _cat("logprobs", 0.0)
    ids[:, width:] = resp
    attn[:, width:] = mask.long()
    if len(set(sizes.tolist())) == 1:  # one size (every step's groups): all advantages in one call
        adv = group_advantages(torch.stack([g.rewards for g in groups]), scale_rewards).reshape(-1)
    else:
        adv = torch.cat([group_advantages(g.rewards[None, :], scale_rewards)[0] for g in groups])
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return Batch(ids, attn, pos, resp, mask, old, adv, width)


def token_logprobs(model: torch.nn.Module, batch: Batch, temperature: float = 1.0,
                   shared_prompts: bool = True, chunk_tokens: int | None = None) -> torch.Tensor:
    """(N, L) log π(o_t | q, o_<t) under `model`, at the sampling temperature (0 on padding
    when chunked; padding is masked everywhere it is used).

    For the embedded GPT-2 each distinct prompt is run once (`dots.fast_decode`); any
    other model, or `shared_prompts=False`, takes the model's own forward over every row.

    Memory: the full path holds float32 logits of every position over the whole vocabulary
    (N x L x V; 4,096 x 3,072 x 151,936 for Qwen at the GPU profile's sizes). When the batch
    has more than `chunk_tokens` positions, the log-probs are taken only at response tokens,
    `chunk_tokens` at a time, from the final hidden states, and each chunk's logits are
    recomputed in the backward pass instead of kept (`selective_logprobs`): at most one
    chunk's logits exist at any moment."""
    length = batch.response_ids.shape[1]
    n_positions = batch.response_ids.numel()
    if chunk_tokens is None or n_positions <= chunk_tokens or not _plain_head(model):
        if shared_prompts and supports(model):
            logits = shared_prompt_logits(model, batch.input_ids, batch.attention_mask, batch.position_ids,
                                          batch.prompt_width)
        else:
            out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                        position_ids=batch.position_ids, use_cache=False,
                        logits_to_keep=length + 1)
            # logits_to_keep keeps the last L+1 positions; position P-1+t predicts response token t.
            logits = out.logits[:, :-1, :]
        logp = torch.log_softmax(_upcast(logits) / temperature, dim=-1)
        return logp.gather(-1, batch.response_ids[..., None]).squeeze(-1)
    if shared_prompts and supports(model):
        hidden = shared_prompt_hidden(model, batch.input_ids, batch.attention_mask, batch.position_ids,
                                      batch.prompt_width)
    elif _sharded(model):
        # FSDP2 gathers the root's parameters (embeddings, final norm, lm_head) in the root's forward:
        # `model.base_model` alone would meet them still sharded (DTensor) and fail. The root's forward
        # with every layer's hidden states, logits of one position only; its head stays gathered until
        # the backward (`dots.sharding`: reshard_after_forward=False on the root).
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids, use_cache=False, output_hidden_states=True,
                    logits_to_keep=1)
        hidden = out.hidden_states[-1][:, -length - 1:-1]
    else:
        out = model.base_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                               position_ids=batch.position_ids, use_cache=False)
        hidden = out.last_hidden_state[:, -length - 1:-1]
    head = model.get_output_embeddings()
    mask = batch.response_mask
    picked = selective_logprobs(hidden[mask], batch.response_ids[mask], head.weight, head.bias, temperature,
                                chunk_tokens)
    logp = torch.zeros(mask.shape, dtype=picked.dtype, device=picked.device)
    logp[mask] = picked
    return logp


def _sharded(model: torch.nn.Module) -> bool:
    """True for a model `dots.sharding.shard_model` sharded with FSDP2."""
    from torch.distributed.fsdp import FSDPModule  # noqa: PLC0415  (torch.distributed only when asked)

    return isinstance(model, FSDPModule)


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    """Log-softmax in float32 at least (bf16 logits lose the ratio's precision); float64 stays."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _plain_head(model: torch.nn.Module) -> bool:
    """True when logits are just the output projection of the base model's last hidden state
    (no logit scaling or soft-capping that the chunked path would miss)."""
    cfg = getattr(model, "config", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return (head is not None and isinstance(head, torch.nn.Linear) and hasattr(model, "base_model")
            and not getattr(cfg, "final_logit_softcapping", None) and getattr(cfg, "logit_scale", None) is None)


def _chunk_logprobs(hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    temperature: float) -> torch.Tensor:
    logits = _upcast(F.linear(hidden, weight, bias)) / temperature
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def selective_logprobs(hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       temperature: float, chunk_tokens: int) -> torch.Tensor:
    """log softmax(hidden @ weightᵀ + bias)/T at `targets`, for (T, E) hidden states, computed
    `chunk_tokens` rows at a time. With autograd each chunk is checkpointed: the backward pass
    recomputes its logits, so no more than one chunk's (chunk x V) float32 logits are alive."""
    parts = []
    for start in range(0, hidden.shape[0], chunk_tokens):
        h, t = hidden[start:start + chunk_tokens], targets[start:start + chunk_tokens]
        if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
            parts.append(checkpoint(_chunk_logprobs, h, t, weight, bias, temperature, use_reentrant=False))
        else:
            parts.append(_chunk_logprobs(h, t, weight, bias, temperature))
    return torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)


def grpo_loss(logprobs: torch.Tensor, batch: Batch, clip_eps: float = 0.2, beta: float = 0.0,
              ref_logprobs: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """−J and its diagnostics. Every group has G samples, so the mean over groups of the
    within-group mean equals the mean over all sequences."""
    mask = batch.response_mask.float()
    log_ratio = (logprobs - batch.old_logprobs) * mask
    ratio = torch.exp(log_ratio)
    adv = batch.advantages[:, None]
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    per_token = torch.minimum(unclipped, clipped)
    if beta > 0:
        if ref_logprobs is None:
            raise ValueError("loss.beta > 0 needs reference log-probs")
        d = (ref_logprobs - logprobs) * mask  # masked before exp, as the ratio: a padding position's
        # log-probs are arbitrary, and exp of a large one is inf, and inf * 0 a NaN loss
        per_token = per_token - beta * (torch.exp(d) - d - 1)  # k3 estimator of KL(π_θ || π_ref)
    lengths = mask.sum(-1).clamp(min=1)
    per_row = (per_token * mask).sum(-1) / lengths
    objective = per_row.mean() if batch.weights is None else (per_row * batch.weights).sum()
    with torch.no_grad():
        masked_ratio = ratio[batch.response_mask]
        binds = ((adv > 0) & (ratio > 1 + clip_eps)) | ((adv < 0) & (ratio < 1 - clip_eps))
        clipped_frac = (binds.float() * mask).sum() / mask.sum().clamp(min=1)
        stats = {
            "ratio_mean": float(masked_ratio.mean()) if masked_ratio.numel() else 1.0,
            "ratio_max": float(masked_ratio.max()) if masked_ratio.numel() else 1.0,
            "clip_fraction": float(clipped_frac),
        }
    return -objective, stats
