"""One GRPO update on a saved batch of groups, as `tests/test_distributed.py` runs it twice:
in the test process (single process) and under `torchrun --nproc-per-node 2 -m tests.dist_update_worker`
(gloo, data-parallel). Each rank saves its updated weights and the step's loss."""

from __future__ import annotations

import sys

import torch

from dots.config import load_config
from dots.distributed import SINGLE, Dist, setup
from dots.models import load_policy
from dots.rollout import Group
from dots.trainer import update_on_groups

OVERRIDES = ["train.lr=1e-3", "train.max_grad_norm=0.5", "loss.clip_eps=0.2", "rollout.temperature=1.0"]


def one_update(policy: str, batch_path: str, dist: Dist = SINGLE) -> tuple[dict, float, dict]:
    cfg = load_config(None, OVERRIDES)
    model, tok = load_policy(policy, torch.float64)  # float64: float32 noise, which Adam's first step
    # divides by |g| + eps, would otherwise show in weights whose gradient is near zero
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=0.0)  # as the Trainer builds it
    saved = torch.load(batch_path, weights_only=False)
    groups = [Group(**g) for g in saved["groups"]]
    replayed = [groups[i] for i in saved["replayed"]]
    loss, stats = update_on_groups(model, opt, groups, cfg, tok.pad_token_id, replayed=replayed, dist=dist)
    return model.state_dict(), loss, stats


if __name__ == "__main__":
    torch.set_num_threads(1)
    policy, batch_path, out = sys.argv[1:4]
    dist, _ = setup(torch.device("cpu"))
    weights, loss, stats = one_update(policy, batch_path, dist)
    torch.save({"weights": weights, "loss": loss, "stats": stats, "world": dist.world}, f"{out}/rank{dist.rank}.pt")
