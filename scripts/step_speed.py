"""Side-by-side timing of a step's two big parts, lean GPT-2 path against transformers' forward.

    .venv/bin/python scripts/step_speed.py [--root artifacts/bench] [--repeats 7]

Times (median of repeats, 2 threads) one rollout of 64 pool questions x G = 8 and one
update forward+backward on 37 groups x 8 (about what a `dots_rr` step updates on), with the
warm-up policy of `<root>` (run `make bench` or `dots warmup` first). It prints numbers only;
correctness of the lean path is tested in tests/test_fast_decode.py.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dots.config import load_config
from dots.evaluation import PLAIN
from dots.loss import collate, grpo_loss, token_logprobs
from dots.models import load_policy
from dots.rollout import HFEngine
from dots.stages import load_data, policy_path


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="artifacts/bench")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(2)
    cfg = load_config("params.yaml", [f"paths.root={args.root}"])
    pool, _ = load_data(cfg)
    model, tok = load_policy(policy_path(cfg))
    prompts = PLAIN.encode(tok, pool[:64])
    tokens = cfg.rollout.max_new_tokens
    groups = HFEngine(model, tok).generate(PLAIN.encode(tok, pool[64:101]), 8, max_new_tokens=tokens,
                                           generator=torch.Generator().manual_seed(0))
    for i, g in enumerate(groups):  # a reward spread, so every group has advantages
        g.rewards = torch.tensor([float((i + j) % 2) for j in range(g.size)])
    batch = collate(groups, tok.pad_token_id)

    def update(shared: bool) -> None:
        model.zero_grad(set_to_none=True)
        loss, _ = grpo_loss(token_logprobs(model, batch, 1.0, shared_prompts=shared), batch)
        loss.backward()

    for name, fast in (("transformers", False), ("lean", True)):
        engine = HFEngine(model, tok, fast=fast)
        gen = torch.Generator().manual_seed(1)
        roll = _median_seconds(lambda: engine.generate(prompts, 8, max_new_tokens=tokens, generator=gen), args.repeats)
        upd = _median_seconds(lambda: update(fast), args.repeats)
        print(f"{name:>12}: rollout 64x8 {roll:.3f} s   update fwd+bwd 37x8 {upd:.3f} s")


if __name__ == "__main__":
    main()
