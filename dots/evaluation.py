"""Held-out accuracy and pass rates.

Accuracy is greedy decoding against exact match. Pass rates sample G responses per
question; 1 − pass rate is the observed difficulty d that labels the predictor and
describes the pool's spectrum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .data import Question
from .progress import report
from .rewards import exact_match
from .rollout import Group, RolloutEngine


@dataclass(frozen=True)
class TaskIO:
    """How questions become prompts and responses become rewards: plain text and exact match
    for the embedded task; the tokenizer's chat template and math-verify for real math data."""

    template: str = "plain"
    system: str | None = None
    reward: Callable[[str, str], float] = exact_match
    # scores a whole step's responses in one call (math-verify spreads them over its worker pool)
    batch_reward: Callable[[list[str], list[str]], list[float]] | None = None

    def encode(self, tokenizer, questions: list[Question]) -> list[list[int]]:
        if self.template == "chat":
            out = []
            for q in questions:
                messages = ([{"role": "system", "content": self.system}] if self.system else [])
                messages.append({"role": "user", "content": q.prompt})
                ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
                out.append(list(ids["input_ids"] if isinstance(ids, dict) else ids))
            return out
        return tokenizer([q.prompt for q in questions], add_special_tokens=True)["input_ids"]

    def score(self, groups: list[Group], questions: list[Question]) -> None:
        """Fill each group's rewards in place (group i answers questions[i])."""
        if self.batch_reward is not None:
            texts = [t for g in groups for t in g.texts]
            answers = [q.answer for g, q in zip(groups, questions) for _ in g.texts]
            flat = iter(self.batch_reward(texts, answers))
            scores = [[next(flat) for _ in g.texts] for g in groups]
        else:
            scores = [[self.reward(t, q.answer) for t in g.texts] for g, q in zip(groups, questions)]
        for g, q, sc in zip(groups, questions, scores):
            g.question_id = q.id
            g.rewards = torch.tensor(sc, dtype=torch.float32)


PLAIN = TaskIO()


def task_io(cfg) -> TaskIO:
    from .rewards import get_reward  # noqa: PLC0415

    reward = get_reward(cfg.reward.name)
    batch = None
    if cfg.reward.name == "math_verify":
        from .rewards import math_verify_rewards  # noqa: PLC0415

        timeout = cfg.reward.timeout_s
        base = reward
        reward = lambda text, answer: base(text, answer, timeout_s=timeout)  # noqa: E731
        batch = lambda texts, answers: math_verify_rewards(texts, answers, timeout)  # noqa: E731
    return TaskIO(cfg.task.prompt_template, cfg.task.system_prompt, reward, batch)


def greedy_accuracy(engine: RolloutEngine, tokenizer, questions: list[Question], max_new_tokens: int,
                    batch_size: int = 1024, io: TaskIO = PLAIN, per_question: bool = False,
                    progress: str = "evaluation"):
    """Share of questions whose greedy answer is right (or, with per_question, each question's 0/1)."""
    scores: list[float] = []
    for start in range(0, len(questions), batch_size):
        chunk = questions[start:start + batch_size]
        groups = engine.generate(io.encode(tokenizer, chunk), 1, temperature=1.0,
                                 max_new_tokens=max_new_tokens, greedy=True, need_logprobs=False)
        io.score(groups, chunk)
        scores.extend(float(g.rewards[0]) for g in groups)
        report(progress, len(scores), len(questions))
    if per_question:
        return scores
    return sum(scores) / max(1, len(questions))


def pass_rates(engine: RolloutEngine, tokenizer, questions: list[Question], group_size: int,
               temperature: float, max_new_tokens: int, generator: torch.Generator | None = None,
               chunk: int = 256, io: TaskIO = PLAIN, progress: str = "evaluation",
               paired: bool = False) -> np.ndarray:
    """Mean reward of `group_size` samples per question.

    `paired` (evaluations, whose policies are compared question by question): every chunk, at
    most one engine batch, samples from a generator of its own, seeded from `generator` before
    anything is sampled, so the numbers a question draws do not depend on the policy. With one
    shared generator, a decoding batch that stops when its rows have all ended leaves the stream
    where its answers' lengths put it: from the first chunk two policies answered at different
    lengths, every later chunk drew other numbers (`grpo` and `dots_rr` shared the dice on half of
    the held-out set; found by a review). Labels and the warm-up spectrum keep the one stream:
    they compare no two policies draw for draw, and their draws are the published runs'."""
    seeds: list[int] = []
    if paired and generator is not None:
        chunk = min(chunk, max(1, getattr(engine, "batch_size", chunk * group_size) // group_size))
        n_chunks = -(-len(questions) // chunk)
        seeds = torch.randint(0, 2**62, (n_chunks,), generator=generator).tolist()
    out = []
    for i, start in enumerate(range(0, len(questions), chunk)):
        part = questions[start:start + chunk]
        gen = torch.Generator().manual_seed(seeds[i]) if seeds else generator
        groups = engine.generate(io.encode(tokenizer, part), group_size, temperature=temperature,
                                 max_new_tokens=max_new_tokens, generator=gen, need_logprobs=False)
        io.score(groups, part)
        out.extend(g.mean_reward for g in groups)
        report(progress, len(out), len(questions))
    return np.asarray(out, dtype=np.float64)


def spectrum(rates: np.ndarray) -> dict[str, float]:
    """Share of questions never solved, sometimes solved, always solved."""
    rates = np.asarray(rates)
    return {"never": float((rates == 0).mean()), "sometimes": float(((rates > 0) & (rates < 1)).mean()),
            "always": float((rates == 1).mean())}
