"""Held-out accuracy and pass rates.

Accuracy is greedy decoding against exact match. Pass rates sample G responses per
question; 1 − pass rate is the observed difficulty d that labels the predictor and
describes the pool's spectrum.
"""

from __future__ import annotations

import numpy as np
import torch

from .data import Question
from .rewards import exact_match
from .rollout import Group, RolloutEngine


def encode_prompts(tokenizer, questions: list[Question]) -> list[list[int]]:
    return tokenizer([q.prompt for q in questions], add_special_tokens=True)["input_ids"]


def score(groups: list[Group], questions: list[Question], reward=exact_match) -> None:
    """Fill each group's rewards in place (group i answers questions[i])."""
    for g, q in zip(groups, questions):
        g.question_id = q.id
        g.rewards = torch.tensor([reward(t, q.answer) for t in g.texts], dtype=torch.float32)


def greedy_accuracy(engine: RolloutEngine, tokenizer, questions: list[Question], max_new_tokens: int,
                    batch_size: int = 1024) -> float:
    correct = 0
    for start in range(0, len(questions), batch_size):
        chunk = questions[start:start + batch_size]
        groups = engine.generate(encode_prompts(tokenizer, chunk), 1, temperature=1.0,
                                 max_new_tokens=max_new_tokens, greedy=True)
        score(groups, chunk)
        correct += sum(int(g.rewards[0]) for g in groups)
    return correct / max(1, len(questions))


def pass_rates(engine: RolloutEngine, tokenizer, questions: list[Question], group_size: int,
               temperature: float, max_new_tokens: int, generator: torch.Generator | None = None,
               chunk: int = 256) -> np.ndarray:
    """Mean reward of `group_size` samples per question."""
    out = []
    for start in range(0, len(questions), chunk):
        part = questions[start:start + chunk]
        groups = engine.generate(encode_prompts(tokenizer, part), group_size, temperature=temperature,
                                 max_new_tokens=max_new_tokens, generator=generator)
        score(groups, part)
        out.extend(g.mean_reward for g in groups)
    return np.asarray(out, dtype=np.float64)


def spectrum(rates: np.ndarray) -> dict[str, float]:
    """Share of questions never solved, sometimes solved, always solved."""
    rates = np.asarray(rates)
    return {"never": float((rates == 0).mean()), "sometimes": float(((rates > 0) & (rates < 1)).mean()),
            "always": float((rates == 1).mean())}
