"""Held-out evaluation of a policy on a math set (`dots evaluate`).

    dots evaluate -p configs/qwen2.5-math-1.5b-deepscaler.yaml --data math500.jsonl \\
        --question problem --answer answer --id none
    dots evaluate -p configs/qwen2.5-math-1.5b-deepscaler.yaml --data aime24.parquet \\
        --checkpoint artifacts-qwen/checkpoints/dots_rr --samples 8

The policy is `--policy` (a saved model folder or a hub name) or the config's own (model.pretrained,
else the warm-up's final model); `--checkpoint` then loads a training checkpoint's weights into it.
The data file is read and validated by `dots.datasets.load_pool` (parquet in verl's layout, JSONL,
or a `datasets` folder, with dotted question/answer/id columns). Prompt template, reward, response
length, engine, device and dtype come from the config, so a held-out set is scored exactly as
training scores its own held-out rows. Reports greedy accuracy; with `--samples G` also pass@G (share
of questions solved by at least one of G samples) and mean@G (mean reward of the samples) at
`rollout.temperature`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .determinism import setup_from_config
from .checkpoints import load_checkpoint, load_tensors
from .config import Config
from .data import Question
from .evaluation import greedy_accuracy, pass_rates, task_io
from .models import load_policy, resolve_device
from .rollout import context_positions
from .engines import engine_for


def evaluate_policy(cfg: Config, data: dict[str, Any], policy: str | Path,
                    checkpoint: str | Path | None = None, samples: int = 0, seed: int = 0,
                    training_pool: Callable[[], list | None] | None = None) -> dict:
    """Greedy accuracy (and pass@G, mean@G when `samples` = G > 0) of a policy on a held-out set;
    with `training_pool`, a function that makes the pool trained on, the ids of the set's questions
    that are also in it (`in_pool`). A function, called once the set has been read and checked: a bad
    file is named before the seconds a training pool can take to make."""
    from .datasets import load_pool, say_in_pool, say_repeats  # noqa: PLC0415

    # every row validated, ground truths parsed as the reward parses them, before any model loads
    questions = load_pool(data, reward=cfg.reward.name, timeout_s=cfg.reward.timeout_s)
    found = say_repeats(Path(data["path"]).name, questions, cfg.reward.name, cfg.reward.timeout_s)
    pool = training_pool() if training_pool else None
    overlap = say_in_pool(Path(data["path"]).name, questions, pool) if pool else []  # before the model loads
    state = read_checkpoint(checkpoint) if checkpoint is not None else None  # before the model loads
    start = time.perf_counter()
    setup_from_config(cfg)
    source = policy
    model, tok = load_policy(source, getattr(torch, cfg.model.dtype))
    if state is not None:
        try:
            model.load_state_dict(state["model"])
        except RuntimeError as exc:  # another model's weights: a traceback of every key before
            raise ValueError(f"--checkpoint {checkpoint}: its weights are not {source}'s ("
                             f"{str(exc).splitlines()[0].strip()} ...); give the policy the run started "
                             "from (--policy, or the params file it trained with: -p)") from None
    check_prompts_fit(cfg, model, tok, {Path(data["path"]).name: questions})
    model.to(resolve_device(cfg.train.device)).eval()
    engine = engine_for(cfg, model, tok, seed=seed, sleep_mode=False)
    engine.sync_weights(model)  # a vLLM engine loaded the folder's weights, not the checkpoint's
    out: dict[str, Any] = {
        "policy": str(source), "checkpoint": str(checkpoint) if checkpoint else None,
        "step": state["step"] if checkpoint is not None else None,
        "data": data["path"], "questions": len(questions), **found,
        **({"in_pool": overlap} if overlap else {}),
        **score(cfg, engine, tok, questions, samples, seed),
    }
    out["seconds"] = time.perf_counter() - start
    return out


def evaluation_sets(cfg: Config, repo: str | Path = ".") -> dict[str, list[Question]]:
    """Each of evaluate.sets read and every row validated, its ground truths parsed as the reward
    parses them (`load_pool`: a bad file or row is named). `repo`: where relative paths start (the
    stages run in the repository; a flow may run elsewhere)."""
    from .datasets import load_pool  # noqa: PLC0415

    sets = {}
    for spec in cfg.evaluate.sets:
        data = spec.model_dump(exclude={"name"})
        data["path"] = str(Path(repo) / data["path"])  # an absolute path stays what it was
        sets[spec.name] = load_pool(data, reward=cfg.reward.name, timeout_s=cfg.reward.timeout_s)
    return sets


def read_checkpoint(checkpoint: str | Path) -> dict[str, Any]:
    """A training checkpoint: the file named (any name: a set-aside `checkpoint.<key>.step<N>.pt`
    too), or a run folder's `checkpoint.pt`. A file named was read from its folder's
    `checkpoint.pt` instead, so the JSON named one file and scored another."""
    path = Path(checkpoint)
    state = load_tensors(path, "checkpoint") if path.is_file() else load_checkpoint(path)
    if state is None:
        raise FileNotFoundError(f"--checkpoint {path}: no training checkpoint here")
    if not isinstance(state, dict) or not {"model", "step"} <= state.keys():
        raise ValueError(f"--checkpoint {path}: not a dots training checkpoint (no model weights and step)")
    return state


def check_prompts_fit(cfg: Config, model, tok, sets: dict[str, list]) -> None:
    """Refuse, before an engine starts, a set whose prompts and rollout.max_new_tokens overrun the
    policy's positions: the embedded GPT-2 (64 positions) given a competition-math set crashed
    deep inside its position embedding ("IndexError: index out of range in self")."""
    limit = context_positions(model)
    if limit is None:
        return
    io, new = task_io(cfg), cfg.rollout.max_new_tokens
    for name, questions in sets.items():
        lengths = [len(p) for p in io.encode(tok, questions)]
        over = [(q, n) for q, n in zip(questions, lengths) if n + new > limit]
        if over:
            q, n = over[0]
            raise ValueError(f"{name}: {len(over)} of {len(questions)} prompts do not fit the policy's "
                             f"{limit} positions with rollout.max_new_tokens={new} (the first: id {q.id}, "
                             f"{n} prompt tokens); evaluate it with a policy of a longer context (--policy, "
                             "model.pretrained)")


def score(cfg: Config, engine, tok, questions: list, samples: int, seed: int) -> dict[str, Any]:
    """Greedy accuracy, and with `samples` = k > 0 pass@k (share of questions solved by at least one
    of k samples) and mean@k (mean reward of the samples) at rollout.temperature. The same seed
    gives every policy the same dice."""
    r, io = cfg.rollout, task_io(cfg)
    out: dict[str, Any] = {"greedy_accuracy": greedy_accuracy(engine, tok, questions, r.max_new_tokens,
                                                              cfg.eval.batch_size, io)}
    if samples > 0:
        rates = pass_rates(engine, tok, questions, samples, r.temperature, r.max_new_tokens,
                           torch.Generator().manual_seed(seed), chunk=max(1, r.batch_size // samples), io=io,
                           paired=True)
        out.update({"samples": samples, "temperature": r.temperature,
                    f"pass@{samples}": float((rates > 0).mean()), f"mean@{samples}": float(rates.mean())})
    return out
