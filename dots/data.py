"""The embedded task: integer addition with a graded difficulty spectrum.

Each question sums `operands` numbers of `digits` digits, e.g. ``372+45+9=``. The answer
is written least-significant digit first (``624`` for 426): a tiny model learns carries
left-to-right far faster that way (normal order was measured to learn too slowly).
Difficulty grows with digits (longer carry chains, later positions) and operands (carries
above 1), so after a short warm-up the pool holds solved, half-solved and unsolved tiers,
and the frontier moves as the policy improves.

Generation is deterministic in the seed. Pool and held-out eval set are disjoint.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .atomic import write_text
from .config import TaskConfig, Tier


@dataclass(frozen=True)
class Question:
    id: int
    prompt: str
    answer: str
    tier: int = -1


def render(numbers: list[int], width: int = 0) -> tuple[str, str]:
    """Prompt and (reversed) answer for a list of operands, each zero-padded to `width` digits."""
    return "+".join(str(n).zfill(width) for n in numbers) + "=", str(sum(numbers))[::-1]


def _tier_capacity(tier: Tier) -> int:
    per_number = 10 if tier.digits == 1 else 9 * 10 ** (tier.digits - 1)
    return per_number ** tier.operands


def _tier_counts(tiers: list[Tier], total: int) -> list[int]:
    """Split `total` over tiers by weight, never asking a tier for more than half its distinct questions."""
    caps = [_tier_capacity(t) // 2 for t in tiers]
    counts = [0] * len(tiers)
    remaining, open_ = total, [i for i in range(len(tiers))]
    while remaining > 0 and open_:
        weight = sum(tiers[i].weight for i in open_)
        share = {i: int(np.ceil(remaining * tiers[i].weight / weight)) for i in open_}
        for i in list(open_):
            take = min(share[i], caps[i] - counts[i], remaining)
            counts[i] += take
            remaining -= take
            if counts[i] >= caps[i]:
                open_.remove(i)
    if remaining > 0:
        raise ValueError(f"task.tiers: hold only {sum(caps)} distinct questions usable; "
                         f"task.pool_size + task.eval_size asks for {total}")
    return counts


def _sample_tier(rng: np.random.Generator, tier: Tier, n: int, seen: set[str],
                 width: int = 0) -> list[tuple[str, str]]:
    lo = 0 if tier.digits == 1 else 10 ** (tier.digits - 1)
    hi = 10 ** tier.digits
    out: list[tuple[str, str]] = []
    while len(out) < n:
        numbers = rng.integers(lo, hi, size=(n - len(out), tier.operands))
        for row in numbers:
            prompt, answer = render([int(x) for x in row], width)
            if prompt not in seen:
                seen.add(prompt)
                out.append((prompt, answer))
                if len(out) == n:
                    break
    return out


def generate(task: TaskConfig) -> tuple[list[Question], list[Question]]:
    """Deterministic (pool, eval) split of the synthetic task."""
    rng = np.random.default_rng(task.seed)
    total = task.pool_size + task.eval_size
    seen: set[str] = set()
    items: list[tuple[str, str, int]] = []
    for t, (tier, count) in enumerate(zip(task.tiers, _tier_counts(task.tiers, total))):
        items.extend((p, a, t) for p, a in _sample_tier(rng, tier, count, seen, task.pad_width))
    order = rng.permutation(len(items))
    items = [items[i] for i in order]
    pool = [Question(i, p, a, t) for i, (p, a, t) in enumerate(items[: task.pool_size])]
    held = [Question(task.pool_size + i, p, a, t) for i, (p, a, t) in enumerate(items[task.pool_size:])]
    return pool, held


def save_questions(questions: list[Question], path: str | Path) -> None:
    write_text(path, "".join(json.dumps(asdict(q)) + "\n" for q in questions))


def load_questions(path: str | Path) -> list[Question]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no question file; run `dots prepare` first")
    out = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            try:
                row = json.loads(line)
                out.append(Question(int(row["id"]), str(row["prompt"]), str(row["answer"]), int(row.get("tier", -1))))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: bad question row ({exc})") from None
    return out


def pool_hash(questions: list[Question]) -> str:
    """Identity of a pool's content and order (what an embedding cache is valid for)."""
    h = hashlib.sha256()
    for q in questions:
        h.update(f"{q.id}\t{q.prompt}\t{q.answer}\n".encode())
    return h.hexdigest()[:16]
