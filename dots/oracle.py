"""Exact pass rates of the embedded task, for the oracle selection diagnostic (`selection.oracle`).

Under the exact-match reward, a sampled response is right only when it is the answer's tokens
followed by eos (`rollout.decode_responses` keeps every other token in the text, and the
character tokenizer spells a number one way). At temperature 1 the sampler draws from the
model's own softmax, so a question's pass rate is exactly

    P(answer, eos | prompt) = Π_t softmax(logits_t)[answer_t] · softmax(logits_T)[eos]

— one teacher-forced forward pass, no sampling. (A response cut at `max_new_tokens` without eos
counts when its tokens are the answer: then no eos factor.) That makes a perfect difficulty
predictor available on this task, and with it an upper bound on what a better predictor could
buy DOTS: `selection.oracle` replaces the predicted d̂ of each round with 1 − these rates under
the current policy. It reads the answers, so it is a diagnostic of the embedded task, never a
method: on a task where many responses are right (math with reasoning), no such formula exists.
"""

from __future__ import annotations

import numpy as np
import torch

from .data import Question


@torch.inference_mode()
def exact_pass_rates(model, prompts: list[list[int]], answers: list[list[int]], eos_id: int, pad_id: int,
                     max_new_tokens: int, batch_size: int = 2048) -> np.ndarray:
    """P(answer then eos | prompt) at temperature 1 for each (prompt ids, answer ids) pair."""
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    out = np.empty(len(prompts), dtype=np.float64)
    for start in range(0, len(prompts), batch_size):
        rows = []
        for p, a in zip(prompts[start:start + batch_size], answers[start:start + batch_size]):
            target = list(a[:max_new_tokens]) + ([eos_id] if len(a) < max_new_tokens else [])
            rows.append((list(p), target))
        width = max(len(p) + len(t) for p, t in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (p, t) in enumerate(rows):  # left-padded, as the rollout engine lays prompts out
            seq = p + t
            ids[i, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
            attn[i, width - len(seq):] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        logp = torch.log_softmax(model(input_ids=ids.to(device), attention_mask=attn.to(device),
                                       position_ids=pos.to(device)).logits.float(), dim=-1).cpu()
        for i, (p, t) in enumerate(rows):
            first = width - len(t)  # the position of the first target token; its logits sit one before
            picked = logp[i, first - 1:width - 1].gather(-1, torch.tensor(t)[:, None])
            out[start + i] = float(picked.sum().exp())
    model.train(was)
    return out


def answer_ids(tokenizer, questions: list[Question]) -> list[list[int]]:
    """Each answer as the tokens a right response holds (no bos, no eos)."""
    return [tokenizer(q.answer, add_special_tokens=False)["input_ids"] for q in questions]
