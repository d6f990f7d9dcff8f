"""FSDP2 (`dots.sharding`) on tiny float64 GPT-2 and Qwen2 policies, as `tests/test_sharding.py` runs it:
the single-process reference step in the test process (`reference_step`), the sharded one under
`torchrun --nproc-per-node 2 -m tests.fsdp_worker INIT_DIR OUT_DIR` (gloo, CPU).

Each rank, per model: greedy generation inside `gathered` with a different number of prompts and
of new tokens than the other rank (so a different number of forwards), compared with a plain copy
of the model; then one step (loss on its own rows, scaled so the ranks' losses sum to the full
batch's mean; backward; clip_grad_norm_; AdamW); then `full_state_dict` (saved), a round trip into
a plain model and into a second sharded one. Writes OUT_DIR/rank{r}.pt.
"""

from __future__ import annotations

import sys

import torch
import transformers

from dots.distributed import SINGLE, Dist
from dots.rollout import HFEngine

KINDS = ("gpt2", "qwen2")
LR, WEIGHT_DECAY, MAX_NORM = 1e-2, 0.01, 0.05


def config(kind: str):
    if kind == "gpt2":
        return transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=32, n_positions=32,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                       bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "gpt2_uneven":  # odd vocab and positions: dim-0 shards of 17 and 16 rows
        return transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=33, n_positions=33,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                       bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "qwen2":
        return transformers.Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
                                        tie_word_embeddings=True, attention_dropout=0.0,
                                        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    raise ValueError(kind)


def build(kind: str, weights: dict | None = None, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    """The model in `dtype`; random (seed 0) unless `weights` are given."""
    torch.manual_seed(0)
    cfg = config(kind)
    model = (transformers.Qwen2ForCausalLM if kind == "qwen2" else transformers.GPT2LMHeadModel)(cfg)
    model = model.to(dtype).eval()  # eval: no dropout anywhere
    if weights is not None:
        model.load_state_dict({k: v.to(dtype) for k, v in weights.items()})
    return model


def batch(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed batch of 5 rows (ranks take 3 and 2) and its loss mask (rows of different lengths)."""
    vocab = config(kind).vocab_size
    ids = torch.randint(3, vocab, (5, 10), generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([10, 7, 9, 4, 8])
    mask = torch.arange(10)[None, :] < lengths[:, None]
    return ids, mask


def loss_on(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, total: int) -> torch.Tensor:
    """Summed next-token cross-entropy of these rows over `total`, the whole batch's target count."""
    logits = model(input_ids=ids, attention_mask=mask.long()).logits[:, :-1]
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    return (nll * mask[:, 1:]).sum() / total


def step(model: torch.nn.Module, kind: str, dist: Dist = SINGLE) -> dict:
    """One update on this rank's share of the batch; returns the loss, the pre-clip norm, the optimizer."""
    ids, mask = batch(kind)
    total = int(mask[:, 1:].sum())
    rows = dist.shard(ids.shape[0])
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    loss = loss_on(model, ids[rows], mask[rows], total)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    if isinstance(norm, torch.distributed.tensor.DTensor):
        norm = norm.full_tensor()
    opt.step()
    opt.zero_grad()
    return {"loss": float(loss.detach()), "norm": float(norm), "opt": opt}


def reference_step(kind: str, weights: dict, dtype: torch.dtype = torch.float64) -> dict:
    """The single-process step on the full batch: the weights and AdamW's second moments after it."""
    model = build(kind, weights, dtype)
    out = step(model, kind)
    names = {id(p): n for n, p in model.named_parameters()}
    out["state"] = model.state_dict()
    out["exp_avg_sq"] = {names[id(p)]: s["exp_avg_sq"] for p, s in out.pop("opt").state.items()}
    return out


class _Tok:
    pad_token_id, eos_token_id = 0, 2

    def batch_decode(self, rows, skip_special_tokens=False):
        return [" ".join(map(str, r)) for r in rows]


def generate(model: torch.nn.Module, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy groups; rank 0 runs 1 prompt x 2 for 3 tokens (one batch), rank 1 3 prompts x 2 for
    6 tokens (two batches of 4 rows): different forward counts on the two ranks."""
    prompts, new = ([[5, 6, 7]], 3) if rank == 0 else ([[8, 9], [10, 11, 12, 13], [14]], 6)
    groups = HFEngine(model, _Tok(), batch_size=4, fast=False).generate(prompts, 2, greedy=True, max_new_tokens=new)
    ids = torch.cat([g.response_ids for g in groups])
    return ids, torch.cat([g.response_mask for g in groups]), torch.cat([g.logprobs for g in groups])


def run(init_dir: str, out_dir: str) -> None:
    from dots.distributed import setup
    from dots.sharding import full_state_dict, gathered, load_full_state_dict, shard_model

    dist, _ = setup(torch.device("cpu"))
    result = {"world": dist.world}
    for kind in KINDS:
        weights = torch.load(f"{init_dir}/{kind}.pt")
        plain = build(kind, weights)
        model = shard_model(build(kind, weights))
        r = {"local_numel": sum(p.to_local().numel() for p in model.parameters()),
             "tied": model.lm_head.weight is model.get_input_embeddings().weight}
        # generation first (before any training forward): FSDP2's first all-gather happens in `gathered`,
        # for qwen2 entered under inference mode (whose gathered buffers would break the training step)
        with torch.inference_mode(kind == "qwen2"), gathered(model):
            r["gen"] = generate(model, dist.rank)
        r["gen_plain"] = generate(plain, dist.rank)
        out = step(model, kind, dist)
        r["loss"], r["norm"] = out["loss"], out["norm"]
        names = {id(p): n for n, p in model.named_parameters()}
        opt_state = out["opt"].state
        r["exp_avg_sq_local_numel"] = sum(s["exp_avg_sq"].to_local().numel() for s in opt_state.values())
        r["exp_avg_sq"] = {names[id(p)]: s["exp_avg_sq"].full_tensor() for p, s in opt_state.items()}
        state = full_state_dict(model)
        r["state"] = state
        # round trip 1: into a plain model, whose logits must equal the sharded model's
        ids, mask = batch(kind)
        with torch.no_grad():
            sharded_logits = model(input_ids=ids, attention_mask=mask.long()).logits
        restored = build(kind)
        restored.load_state_dict(state)
        with torch.no_grad():
            r["plain_logits_diff"] = float((restored(input_ids=ids, attention_mask=mask.long()).logits
                                            - sharded_logits).abs().max())
        # round trip 2: into a second sharded model, and gathered back
        again = shard_model(build(kind))
        load_full_state_dict(again, state)
        r["reload_equal"] = all(torch.equal(v, state[k]) for k, v in full_state_dict(again).items())
        result[kind] = r
    # float32 (FSDP2 reduces fp32/bf16 gradients with other collectives than float64 ones): the
    # clip's norm, which a mean instead of a sum over ranks would halve
    model = shard_model(build("gpt2", torch.load(f"{init_dir}/gpt2.pt"), torch.float32))
    result["gpt2_float32"] = {k: v for k, v in step(model, "gpt2", dist).items() if k != "opt"}
    result["gpt2_float32"]["state"] = full_state_dict(model)
    # uneven dim-0 shards (33 rows over 2 ranks): full_state_dict and load_full_state_dict
    weights = torch.load(f"{init_dir}/gpt2_uneven.pt")
    model = shard_model(build("gpt2_uneven"))
    load_full_state_dict(model, weights)
    wte = model.transformer.wte.weight
    result["uneven"] = {"local_rows": wte.to_local().shape[0],
                        "equal": all(torch.equal(v, weights[k]) for k, v in full_state_dict(model).items())}
    torch.save(result, f"{out_dir}/rank{dist.rank}.pt")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    run(sys.argv[1], sys.argv[2])
