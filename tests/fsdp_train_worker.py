"""Training with `train.fsdp` (FSDP2) as `tests/test_fsdp_training.py` runs it, under
`torchrun --nproc-per-node 2 -m tests.fsdp_train_worker MODE ...` (gloo, CPU):

- `update POLICY OUT BATCH...`: one `update_on_groups` step per saved batch and per micro-batch
  budget in BUDGETS, on a float64 policy sharded with `dots.sharding.shard_model`; each rank saves
  the full (gathered) weights, the loss and the stats. `one_update(..., fsdp=False)` in the test
  process is the single-process reference.
- `train ROOT OUT`: the Trainer on the tiny pipeline under ROOT (grpo, train.fsdp=true): one
  uninterrupted run, and one stopped after its first step's checkpoint and resumed; each rank
  saves both runs' records and evaluations.
"""

from __future__ import annotations

import sys

import torch

from dots.config import load_config
from dots.distributed import SINGLE, Dist, setup
from dots.models import load_policy
from dots.rollout import Group
from dots.update import update_on_groups

OVERRIDES = ["train.lr=1e-3", "train.max_grad_norm=0.5", "loss.clip_eps=0.2", "rollout.temperature=1.0"]
BUDGETS = (None, 40)  # one batch; micro-batches of at most 40 padded tokens (a few rows each)
# log-probs from the full logits, and from the final hidden states 16 response tokens at a time (the
# path every GPU-profile micro-batch takes: its train.logprob_chunk_tokens is 2,048)
CHUNKS = (None, 16)


def one_update(policy: str, batch_path: str, budget: int | None, dist: Dist = SINGLE,
               fsdp: bool = False, chunk: int | None = None) -> tuple[dict, float, dict]:
    """One update of the float64 policy on the saved groups; the full weights after it."""
    from dots.sharding import full_state_dict, shard_model

    cfg = load_config(None, OVERRIDES + [f"train.micro_batch_tokens={'null' if budget is None else budget}"]
                      + ([] if chunk is None else [f"train.logprob_chunk_tokens={chunk}"]))
    model, tok = load_policy(policy, torch.float64)
    if fsdp:
        shard_model(model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=0.0)  # as the Trainer builds it
    saved = torch.load(batch_path, weights_only=False)
    groups = [Group(**g) for g in saved["groups"]]
    replayed = [groups[i] for i in saved["replayed"]]
    loss, stats = update_on_groups(model, opt, groups, cfg, tok.pad_token_id, replayed=replayed, dist=dist)
    return (full_state_dict(model) if fsdp else model.state_dict()), loss, stats


def train_overrides(root: str) -> list[str]:
    from tests.conftest import tiny_overrides

    return tiny_overrides(root) + ["train.fsdp=true", "train.steps=3", "train.checkpoint_every=1", "eval.every=3",
                                   "train.batch_size=8", "eval.probe_size=8", "eval.samples=2", "train.threads=1",
                                   "tracking.enabled=false"]


def train(root: str, out: str, dist: Dist) -> dict:
    from dots import stages
    from dots.checkpoints import load_checkpoint
    from dots.trainer import Trainer

    cfg = load_config(None, train_overrides(root))
    pool, held = stages.load_data(cfg)
    held = held[:24]  # a short evaluation: the runs are compared with each other
    policy = stages.paths(cfg).policy
    result = {}
    whole = Trainer(cfg, "grpo", policy, pool, held, f"{out}/whole", resume=False)
    result["sharded"] = type(whole.model).__name__
    result["local_numel"] = sum(p.to_local().numel() for p in whole.model.parameters())
    whole.run()
    result["whole"] = {"records": whole.records, "evals": whole.evals,
                       "checkpoint": load_checkpoint(f"{out}/whole") if dist.main else None}
    first = Trainer(cfg, "grpo", policy, pool, held, f"{out}/resumed", resume=False)
    first.run(stop_after=1)
    second = Trainer(cfg, "grpo", policy, pool, held, f"{out}/resumed", resume=True)
    result["resumed_from"] = second.step
    second.run()
    result["resumed"] = {"records": second.records, "evals": second.evals,
                         "checkpoint": load_checkpoint(f"{out}/resumed") if dist.main else None}
    return result


if __name__ == "__main__":
    torch.set_num_threads(1)
    mode, *args = sys.argv[1:]
    dist, _ = setup(torch.device("cpu"))
    if mode == "update":
        policy, out, *batches = args
        result = {"world": dist.world}
        for b, path in enumerate(batches):
            for budget in BUDGETS:
                for chunk in CHUNKS:
                    weights, loss, stats = one_update(policy, path, budget, dist, fsdp=True, chunk=chunk)
                    result[b, budget, chunk] = {"weights": weights, "loss": loss, "stats": stats}
    else:
        root, out = args
        result = train(root, out, dist)
    torch.save(result, f"{out}/rank{dist.rank}.pt")
    torch.distributed.destroy_process_group()
