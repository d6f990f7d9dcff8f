"""Exact pass rates of the embedded task, for the oracle selection diagnostic (`selection.oracle`).

Under the exact-match reward, a sampled response is right only when it is the answer's tokens
followed by eos (`rollout.decode_responses` keeps every other token in the text, and the
character tokenizer spells a number one way). At temperature 1 the sampler draws from the
model's own softmax, so a question's pass rate is exactly

    P(answer, eos | prompt) = Π_t softmax(logits_t)[answer_t] · softmax(logits_T)[eos]

— one teacher-forced forward pass, no sampling. (A response cut at `max_new_tokens` without eos
counts when its tokens are the answer: then no eos factor; an answer longer than `max_new_tokens`
can never be written, and its rate is 0.) That makes a perfect difficulty
predictor available on this task, and with it an upper bound on what a better predictor could
buy DOTS: `selection.oracle` replaces the predicted d̂ of each round with 1 − these rates under
the current policy. It reads the answers, so it is a diagnostic of the embedded task, never a
method: on a task where many responses are right (math with reasoning), no such formula exists.
"""

from __future__ import annotations

import numpy as np
import torch

from .data import Question
from .loss import collate, token_logprobs
from .models import set_training
from .rollout import Group


@torch.inference_mode()
def exact_pass_rates(model, prompts: list[list[int]], answers: list[list[int]], eos_id: int, pad_id: int,
                     max_new_tokens: int, batch_size: int = 2048) -> np.ndarray:
    """P(answer then eos | prompt) at temperature 1 for each (prompt ids, answer ids) pair: the
    right response laid out as a one-sample group and scored by the update's own log-prob path
    (`loss.collate`, `loss.token_logprobs`), so it is the sampler's distribution by construction."""
    device = next(model.parameters()).device
    was = model.training
    set_training(model, False)  # torch's flag alone, as around a rollout (dots.models.set_training)
    out = []
    for start in range(0, len(prompts), batch_size):
        groups = []
        for p, a in zip(prompts[start:start + batch_size], answers[start:start + batch_size]):
            target = torch.tensor([list(a[:max_new_tokens]) + ([eos_id] if len(a) < max_new_tokens else [])])
            groups.append(Group(question_id=0, prompt_ids=torch.tensor(p, dtype=torch.long), response_ids=target,
                                response_mask=torch.ones_like(target, dtype=torch.bool),
                                logprobs=torch.zeros(target.shape), texts=[], rewards=torch.zeros(1)))
        batch = collate(groups, pad_id).to(device)
        logp = torch.where(batch.response_mask, token_logprobs(model, batch), 0.0)
        rate = logp.sum(-1).exp().double().cpu()
        # an answer longer than max_new_tokens cannot be written: its cut prefix's probability was
        # returned (0.82 for a question no sample solved; found by a review)
        too_long = torch.tensor([len(a) > max_new_tokens for a in answers[start:start + batch_size]])
        out.append(torch.where(too_long, 0.0, rate))
    set_training(model, was)
    return torch.cat(out).numpy() if out else np.empty(0, dtype=np.float64)


def answer_ids(tokenizer, questions: list[Question]) -> list[list[int]]:
    """Each answer as the tokens a right response holds (no bos, no eos)."""
    return [tokenizer(q.answer, add_special_tokens=False)["input_ids"] for q in questions]
