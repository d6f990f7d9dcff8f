"""Supervised warm-up of the tiny policy, stopped early on purpose.

RL needs a policy that already solves some questions: a random model gets zero reward
everywhere. The warm-up teaches the answer format and the easy tiers on a fresh stream
of questions drawn from the task's tiers (never a pool or held-out question: the stage passes
both sets and every drawn sum that is one of them is redrawn), and stops
after `warmup.steps`, so the pool keeps a real share of never-, sometimes- and
always-solved questions. Intermediate checkpoints are saved as extra labelling policies.

A checkpoint past `warmup.steps` is a labelling policy only: the same run goes on (same data
stream, same schedule) after `final` is saved, so the RL start is the model it would be
without it, while the predictor also learns from a policy as strong as RL will make it. Labels
of the early policies alone are almost all "never solved", and a predictor that has only seen
those has little to say once RL solves half the pool.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from .config import Config
from .data import render
from .models import build_model, build_tokenizer, save_policy


def sample_batch(rng: np.random.Generator, cfg: Config, n: int,
                 exclude: frozenset[str] | set[str] = frozenset()) -> list[tuple[str, str]]:
    """n (prompt, answer) pairs drawn from the task's tiers, never one whose prompt is in
    `exclude` (the pool and held-out questions): a drawn excluded sum is replaced by a fresh draw
    from the same tier, so the tier mix stays the configured one. `generate` leaves at least half
    of every tier's questions outside pool and held-out set, so a replacement always exists."""
    tiers = cfg.task.tiers
    w = np.array([t.weight for t in tiers], dtype=np.float64)
    picks = rng.choice(len(tiers), size=n, p=w / w.sum())
    out = []
    for i in picks:
        t = tiers[int(i)]
        lo = 0 if t.digits == 1 else 10 ** (t.digits - 1)
        while True:
            pair = render([int(x) for x in rng.integers(lo, 10 ** t.digits, size=t.operands)], cfg.task.pad_width)
            if pair[0] not in exclude:
                break
        out.append(pair)
    return out


def supervised_batch(tokenizer, pairs: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """Left-padded prompt+answer+eos with labels on the answer tokens only."""
    prompts = tokenizer([p for p, _ in pairs])["input_ids"]
    answers = tokenizer([a for _, a in pairs], add_special_tokens=False)["input_ids"]
    seqs = [p + a + [tokenizer.eos_token_id] for p, a in zip(prompts, answers)]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (s, p) in enumerate(zip(seqs, prompts)):
        ids[i, width - len(s):] = torch.tensor(s)
        attn[i, width - len(s):] = 1
        labels[i, width - len(s) + len(p):] = torch.tensor(s[len(p):])
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": attn, "position_ids": pos, "labels": labels}


def warmup(cfg: Config, out_dir: str | Path, progress: Callable[[int, float], None] | None = None,
           exclude: frozenset[str] | set[str] = frozenset()) -> dict:
    """Train and save `final` (at `warmup.steps`) plus `step<N>` checkpoints under out_dir, going on
    past `final` for checkpoints beyond it; returns a summary.
    `exclude`: prompts the warm-up must never see (the stage passes every pool and held-out prompt)."""
    out_dir = Path(out_dir)
    torch.manual_seed(cfg.task.seed)
    rng = np.random.default_rng(cfg.task.seed + 1_000_003)
    tokenizer = build_tokenizer()
    model = build_model(cfg.model, tokenizer, seed=cfg.task.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.warmup.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
    model.train()
    start, loss_val, final_loss = time.perf_counter(), float("nan"), float("nan")
    last = max([cfg.warmup.steps, *cfg.warmup.checkpoints])
    for step in range(1, last + 1):
        batch = supervised_batch(tokenizer, sample_batch(rng, cfg, cfg.warmup.batch_size, exclude))
        loss = model(**batch, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_val = loss.item()
        if progress is not None:
            progress(step, loss_val)
        if step in cfg.warmup.checkpoints:
            save_policy(model, tokenizer, out_dir / f"step{step}")
        if step == cfg.warmup.steps:
            save_policy(model, tokenizer, out_dir / "final")
            final_loss = loss_val
    return {"steps": cfg.warmup.steps, "final_loss": final_loss, "label_only_steps": last - cfg.warmup.steps,
            "seconds": time.perf_counter() - start}
