"""One optimizer step on a step's groups (the loss of DESIGN §1), micro-batched.

Degenerate groups (all rewards equal) have zero advantage; with β = 0 they contribute
nothing to the gradient, so only the informative ones are forwarded and the mean over
*all* groups is kept by scaling: the gradient is the same, the cost is not.

With `train.micro_batch_tokens` set, the forwarded rows are cut into micro-batches under
that token budget (`dots.microbatch`), each micro-batch's loss is weighted so the sum is
the one-batch loss, and gradients accumulate before the one clip and optimizer step. Null
keeps the one-batch path (the embedded default, whose published figures it reproduces
bit for bit).
"""

from __future__ import annotations

import torch

from .config import Config
from .distributed import SINGLE, Dist, fsdp_sharded
from .downsample import downsample_groups
from .faults import fault_point
from .loss import Batch, collate, grpo_loss, token_logprobs
from .microbatch import Rows, collate_rows, pack
from .rollout import Group


def trained_groups(groups: list[Group], beta: float, skip_degenerate: bool = True) -> list[Group]:
    """The groups the update forwards: all of them with a KL term, else only the informative
    ones (a degenerate group has zero advantage and, with β = 0, zero gradient). With
    `skip_degenerate` off (`train.skip_degenerate`), all of them: the same gradient at the cost
    a plain GRPO trainer pays, which is the baseline the paper's savings are measured against."""
    return groups if beta > 0 or not skip_degenerate else [g for g in groups if g.informative]


def forwarded_groups(groups: list[Group], cfg: Config, method: str | None = None) -> list[Group]:
    """What the update forwards: the trained groups (`trained_groups`), each cut to its
    max-variance rollouts when `method` down-samples (`train.downsample_for`, `dots.downsample`;
    no method: `train.downsample` alone), in order."""
    return cut_for_method(trained_groups(groups, cfg.loss.beta, cfg.train.skip_degenerate), cfg, method)


def cut_for_method(trained: list[Group], cfg: Config, method: str | None) -> list[Group]:
    """`trained` cut to `method`'s m rollouts a group, ties broken by `train.downsample_ties`: the one
    place the update and the token count (`forwarded_groups`) read both settings, so they cannot part."""
    return downsample_groups(trained, cfg.train.downsample_for(method), cfg.train.downsample_ties)


def update_on_groups(model: torch.nn.Module, opt: torch.optim.Optimizer, groups: list[Group], cfg: Config,
                     pad_id: int, *, ref_model: torch.nn.Module | None = None, replayed: list[Group] = (),
                     dist: Dist = SINGLE, method: str | None = None) -> tuple[float, dict]:
    """One optimizer step on a step's groups: the loss is −J averaged over *all* `groups`
    (degenerate ones add nothing with β = 0, so only the informative ones are forwarded),
    each cut to `method`'s down-sampled rollouts (`forwarded_groups`).

    Under torch.distributed each rank forwards a contiguous shard of the used groups, scaled
    by shard/len(groups), so the ranks' losses — and their gradients, summed by all-reduce
    before clipping — add up to the single-process ones. Returns (loss, stats), the same on
    every rank; stats has the replayed groups' importance ratios when there are any.
    Gradients are freed after the step, so rollouts do not share the GPU with them.

    A model sharded with FSDP2 (`train.fsdp`, `dots.sharding`) reduce-scatters its gradients in
    each backward, so there is no all-reduce; and since each of its forwards and backwards is a
    collective, every rank runs as many (micro-)batches as the rank with the most: the others
    (an empty share included) add passes on one row whose loss is multiplied by 0.0."""
    trained = trained_groups(groups, cfg.loss.beta, cfg.train.skip_degenerate)
    used = cut_for_method(trained, cfg, method)  # = forwarded_groups(groups, cfg, method)
    if not used:
        return 0.0, {}
    mine = used[dist.shard(len(used))]
    opt.zero_grad(set_to_none=True)
    loss_value, ratio_sum, ratio_n, ratio_max = 0.0, 0.0, 0, float("-inf")
    # a down-sampled group is a new object: its replay flag follows it from the group it was cut from
    was_replayed = {id(g) for g in replayed}
    replayed_ids = {id(u) for g, u in zip(trained, used) if id(g) in was_replayed}
    device = next(model.parameters()).device
    budget = cfg.train.micro_batch_tokens

    def flags(spans: list[tuple[Group, int]]) -> torch.Tensor:
        """Which rows of a batch are replayed (spans: each owner group and its row count)."""
        return torch.cat([torch.full((n,), id(g) in replayed_ids) for g, n in spans])

    if budget is None and mine:  # one batch: the path the embedded default's figures were measured on
        batches = [(collate(mine, pad_id, cfg.loss.scale_rewards), flags([(g, g.size) for g in mine]),
                    len(mine) / len(groups))]
    else:
        batches = [(collate_rows(parts, pad_id, len(groups), cfg.loss.scale_rewards),
                    flags([(p.group, p.n) for p in parts]), None) for parts in pack(mine, budget)]
    sharded = fsdp_sharded(model)
    if sharded and dist.enabled:
        most = max(dist.gather([len(batches)]))
        if len(batches) < most:  # zero-gradient passes: one row of the step's first used group
            pad = (collate_rows([Rows(used[0], 0, 1)], pad_id, len(groups), cfg.loss.scale_rewards),
                   torch.zeros(1, dtype=torch.bool), 0.0)
            batches += [pad] * (most - len(batches))
    for batch, rows, scale in batches:
        loss, logp, batch = _backward(model, batch, cfg, ref_model, scale, device)
        loss_value += loss
        rows = rows.to(device)
        if rows.any():
            with torch.no_grad():
                ratio = torch.exp(logp - batch.old_logprobs)[rows][batch.response_mask[rows]]
            ratio_sum += float(ratio.double().sum())
            ratio_n += ratio.numel()
            ratio_max = max(ratio_max, float(ratio.max()))
    if not sharded:
        dist.all_reduce_grads(model)  # FSDP2 reduce-scattered them in each backward
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.max_grad_norm)
    fault_point("update")  # the reliability suite kills runs here (gradients computed, weights not yet stepped)
    opt.step()
    opt.zero_grad(set_to_none=True)
    parts = dist.gather([(loss_value, ratio_sum, ratio_n, ratio_max)])
    stats = {}
    n = sum(p[2] for p in parts)
    if n:
        stats["replay_ratio_mean"] = sum(p[1] for p in parts) / n
        stats["replay_ratio_max"] = max(p[3] for p in parts)
    return sum(p[0] for p in parts), stats


def _backward(model: torch.nn.Module, batch: Batch, cfg: Config, ref_model: torch.nn.Module | None,
              scale: float | None, device: torch.device) -> tuple[float, torch.Tensor, Batch]:
    """Forward and backward of one (micro-)batch; returns its loss, its detached log-probs and
    the batch on `device`. `scale` (one-batch path) turns the batch's mean into its share of the
    step's mean; micro-batches carry that share in their row weights instead."""
    batch = batch.to(device)
    chunk = cfg.train.logprob_chunk_tokens
    logp = token_logprobs(model, batch, cfg.rollout.temperature, chunk_tokens=chunk)
    ref_logp = None
    if ref_model is not None:
        with torch.no_grad():
            ref_logp = token_logprobs(ref_model, batch, cfg.rollout.temperature, chunk_tokens=chunk)
    loss, _ = grpo_loss(logp, batch, cfg.loss.clip_eps, cfg.loss.beta, ref_logp)
    if scale is not None:
        loss = loss * scale  # mean over every group of the step
    loss.backward()
    return float(loss.detach()), logp.detach(), batch
