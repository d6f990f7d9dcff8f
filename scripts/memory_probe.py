"""Measure one update's peak memory (and, on a GPU, its speed) beside the memory plan.

A random-initialised Qwen2 model with Qwen2.5's vocabulary (151,936) and layout (tied
embeddings, grouped-query attention) is built locally (no download), at a tiny hidden size
on the CPU or at Qwen2.5-1.5B's shapes on a GPU. Each configuration runs in a fresh process:
B groups of G synthetic answers (half rewarded, so every group is informative) go through
`dots.update.update_on_groups` with the configured micro-batch budget; the script prints the
measured peak beside `dots.memory_plan.estimate` for the same params.

CPU peak: the process's peak resident memory less its resident memory before the model was
built. GPU peak: torch.cuda.max_memory_allocated (plus the plan's CUDA context is not in it).

    .venv/bin/python scripts/memory_probe.py                  # the CPU sweeps in docs/gpu.md
    .venv/bin/python scripts/memory_probe.py --gpu            # Qwen2.5-1.5B shapes on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

TINY = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "inter": 128}
QWEN_1_5B = {"hidden": 1536, "layers": 28, "heads": 12, "kv_heads": 2, "inter": 8960}
VOCAB = 151936


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def one(args) -> dict:
    """Build the model, run `args.steps` updates, report the peak and the plan's estimate."""
    import torch

    torch.set_num_threads(int(os.environ.get("PROBE_THREADS", "2")))
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from dots.config import load_config
    from dots.memory_plan import GiB, estimate, shape_from_hf_config
    from dots.rollout import Group
    from dots.update import update_on_groups

    device = torch.device(args.device)
    base = rss_bytes()
    dims = QWEN_1_5B if args.shape == "qwen1.5b" else TINY
    hf_cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=dims["hidden"], intermediate_size=dims["inter"],
                         num_hidden_layers=dims["layers"], num_attention_heads=dims["heads"],
                         num_key_value_heads=dims["kv_heads"], max_position_embeddings=4096,
                         tie_word_embeddings=True, pad_token_id=0)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    with device:  # initialised where it trains: 1.5B parameters are not drawn on the host
        model = Qwen2ForCausalLM(hf_cfg).to(dtype=dtype)
    if args.checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None)
        enable({"use_reentrant": False}) if enable else model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    gen = torch.Generator().manual_seed(1)
    groups = []
    for q in range(args.groups):
        rewards = torch.tensor([1.0, 0.0] * (args.group_size // 2))
        groups.append(Group(question_id=q, prompt_ids=torch.randint(1, VOCAB, (args.prompt,), generator=gen),
                            response_ids=torch.randint(1, VOCAB, (args.group_size, args.response), generator=gen),
                            response_mask=torch.ones((args.group_size, args.response), dtype=torch.bool),
                            logprobs=-torch.rand((args.group_size, args.response), generator=gen) * 10,
                            texts=[""] * args.group_size, rewards=rewards))
    overrides = [f"model.dtype={args.dtype}", f"train.batch_size={args.groups}",
                 f"rollout.group_size={args.group_size}", f"rollout.max_new_tokens={args.response}",
                 f"train.micro_batch_tokens={args.budget}", f"train.logprob_chunk_tokens={args.chunk}",
                 f"train.gradient_checkpointing={str(args.checkpointing).lower()}", "task.pool_size=100000"]
    cfg = load_config(None, overrides)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    seconds = []
    for _ in range(args.steps):
        start = time.perf_counter()
        update_on_groups(model, opt, groups, cfg, 0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    plan = estimate(cfg, shape_from_hf_config(hf_cfg), device=device.type, prompt=args.prompt)
    planned = sum(v for k, v in plan.update.items() if k != "cuda_context")
    tokens = args.groups * args.group_size * (args.prompt + args.response)
    row = {"groups": args.groups, "budget": args.budget, "chunk": args.chunk, "checkpointing": args.checkpointing,
           "measured_gib": peak / GiB, "planned_gib": planned / GiB, "ratio": planned / peak,
           "update_s": min(seconds), "tokens_per_s": tokens / min(seconds), "tokens": tokens}
    if args.rollout:
        row.update(rollout(model, groups, args, cfg, hf_cfg, prompt=args.prompt))
    return row


def rollout(model, groups, args, cfg, hf_cfg, prompt: int) -> dict:
    """Sample G answers of exactly `args.rollout` tokens per prompt with the hf engine (a random
    model never says eos); its seconds, tokens per second and peak beside the plan's rollout peak."""
    from types import SimpleNamespace

    import torch

    from dots.config import load_config
    from dots.memory_plan import GiB, estimate, shape_from_hf_config
    from dots.rollout import HFEngine

    device = next(model.parameters()).device
    rows = len(groups) * args.group_size
    engine = HFEngine(model, SimpleNamespace(pad_token_id=0, eos_token_id=-1), batch_size=rows)
    prompts = [g.prompt_ids.tolist() for g in groups for _ in range(args.group_size)]
    model.eval()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    ids, mask, _ = engine._sample_batch(prompts, 1.0, args.rollout, False, torch.Generator(device).manual_seed(0))
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else float("nan")
    rcfg = load_config(None, [f"model.dtype={args.dtype}", f"train.batch_size={len(groups)}",
                              f"rollout.group_size={args.group_size}", f"rollout.max_new_tokens={args.rollout}",
                              f"rollout.batch_size={rows}", "task.pool_size=100000"])
    plan = estimate(rcfg, shape_from_hf_config(hf_cfg), device=device.type, prompt=prompt)
    planned = sum(v for k, v in plan.rollout.items() if k != "cuda_context")
    return {"rollout_rows": rows, "rollout_new_tokens": int(mask.sum()), "rollout_s": seconds,
            "rollout_tokens_per_s": int(mask.sum()) / seconds, "rollout_measured_gib": peak / GiB,
            "rollout_planned_gib": planned / GiB}


def args_tokens(row: dict) -> int:
    return row["rollout_new_tokens"] // max(1, row["rollout_rows"])


def sweep(base_args: list[str], runs: list[list[str]]) -> list[dict]:
    out = []
    for extra in runs:
        res = subprocess.run([sys.executable, __file__, "--one", *base_args, *extra], capture_output=True,
                             text=True, check=False)
        if res.returncode:
            print(res.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"probe {extra} failed")
        row = json.loads(res.stdout.strip().splitlines()[-1])
        out.append(row)
        print(f"  B={row['groups']:>3} budget={row['budget']:>6} chunk={row['chunk']:>5} ckpt={row['checkpointing']!s:5}"
              f" measured {row['measured_gib']:7.3f} GiB  plan {row['planned_gib']:7.3f} GiB"
              f" (plan/measured {row['ratio']:.2f})  update {row['update_s']:.2f}s"
              f" {row['tokens_per_s']:,.0f} tok/s", flush=True)
        if "rollout_s" in row:
            print(f"    rollout {row['rollout_rows']} rows x {args_tokens(row)} tokens: {row['rollout_s']:.1f}s,"
                  f" {row['rollout_tokens_per_s']:,.0f} tok/s, peak {row['rollout_measured_gib']:.2f} GiB,"
                  f" plan {row['rollout_planned_gib']:.2f} GiB", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gpu", action="store_true", help="Qwen2.5-1.5B shapes, bf16, on cuda")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shape", default="tiny", choices=["tiny", "qwen1.5b"])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--response", type=int, default=96)
    ap.add_argument("--budget", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--rollout", type=int, default=0, help="also sample answers of this many tokens (hf engine)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args)))
        return
    rows = {}
    if args.gpu:
        base = ["--device", "cuda", "--shape", "qwen1.5b", "--dtype", "bfloat16", "--prompt", "256",
                "--response", "1536", "--steps", "2", "--chunk", "2048", "--checkpointing"]
        print("Qwen2.5-1.5B shapes, bf16, G=8, prompt 256 + answer 1,536 tokens, checkpointing, chunk 2,048:")
        rows["gpu_batch"] = sweep(base + ["--budget", "16384"], [["--groups", "4"], ["--groups", "8", "--rollout",
                                                                                     "512"], ["--groups", "16"]])
        rows["gpu_budget"] = sweep(base + ["--groups", "8"], [["--budget", str(t)] for t in (8192, 32768)])
    else:
        print("CPU, Qwen2.5 vocabulary and layout, hidden 64, 2 layers; G=8, prompt 32 + answer 96 tokens:")
        print("peak as B grows (budget 1,024 tokens, chunk 512):")
        rows["batch"] = sweep(["--budget", "1024"], [["--groups", str(b)] for b in (4, 8, 16, 32)])
        print("peak as the budget grows (B = 8, chunk 4,096):")
        rows["budget"] = sweep(["--groups", "8", "--chunk", "4096"],
                               [["--budget", str(t)] for t in (512, 1024, 2048, 4096)])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
