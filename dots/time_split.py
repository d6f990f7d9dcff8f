"""Where a method's time to target goes: the seconds of each phase of its steps (rollout,
update, selection, the rest) up to the target, over `grpo`'s time to target on the same seed.

Why: the time ratio says how much sooner a method arrives, not what it still pays for. The
split does, and it shows what bounds a ratio: on the embedded CPU default `dots_rr` trains as
many tokens to the target as `grpo` does, at the same cost per token, so its update alone is
about 0.42 of `grpo`'s time however little it samples (docs/benchmark.md, "What bounds
`dots_rr`'s ratio"). The phases are the trainer's own timers (`time/<phase>_s`, disjoint spans
inside `time/step_s`), summed over the steps up to the target, so with the rest of the step
they add up to the raw time to target.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from .runfiles import Crossing, step_records

PHASES = ("rollout", "update", "select")
PARTS = (*PHASES, "other")  # "other": the rest of each step (collation, replay, bookkeeping)


def seconds_to_target(run_dir: str | Path, steps: int) -> dict[str, float] | None:
    """Seconds of each phase, and of the rest of the step, over the run's first `steps` steps.
    None where a record lacks a phase's timer (a run folder written before it was kept)."""
    return _split(step_records(run_dir), steps)


def _split(records: list[dict], steps: int) -> dict[str, float] | None:
    """`seconds_to_target` over records already read (in step order)."""
    records = records[:steps]
    if any(f"time/{p}_s" not in r for r in records for p in (*PHASES, "step")):
        return None
    out = {p: float(sum(r[f"time/{p}_s"] for r in records)) for p in PHASES}
    out["other"] = float(sum(r["time/step_s"] for r in records)) - sum(out.values())
    return out


def row_fields(run_dir: str | Path, crossed: Crossing | None) -> dict[str, float | None]:
    """A bench row's `<part>_to_target_s` fields at the crossing (`dots.runfiles.Crossing`: each
    part summed to the two evaluations' steps, read between them as the time to target is); None
    for a run that never reached the target. The run's records are read once."""
    none = {f"{p}_to_target_s": None for p in PARTS}
    if crossed is None:
        return none
    records = step_records(run_dir)
    before, hit = (_split(records, n) for n in crossed.steps)
    if before is None or hit is None:
        return none
    return {f"{p}_to_target_s": crossed.at(before[p], hit[p]) for p in PARTS}


def ratios_to_grpo(mine: list[dict], grpo: list[dict]) -> dict:
    """`<part>_time_ratio`: each part's seconds up to the target over grpo's time to target on the
    same seed, median over the seeds where both arrived (`_per_seed` beside it). A run that never
    arrived has no split: it is left out here, while the time ratio counts it as never."""
    base = {r["seed"]: r.get("time_to_target_s") for r in grpo}
    out: dict = {}
    for p in PARTS:
        per_seed = [r[f"{p}_to_target_s"] / base[r["seed"]] for r in mine
                    if r.get(f"{p}_to_target_s") is not None and base.get(r["seed"])]
        out[f"{p}_time_ratio"] = float(np.median(per_seed)) if per_seed else None
        out[f"{p}_time_ratio_per_seed"] = per_seed
    return out


def render(summary: dict, methods: list[str], fmt: Callable[[float | None], str]) -> list[str]:
    """The table section, each ratio written by `fmt` (the bench table's own cell format, so a
    never-reached ratio reads as it does there); empty when no arm has a split (rows read back
    from older benches)."""
    if not any(summary[m].get("update_time_ratio") is not None for m in methods):
        return []
    title = ("Where the time to target goes: each part of the steps up to the target, in seconds over grpo's "
             "time to target, paired by seed (medians; raw seconds, so they add up to about the time ratio):")
    lines = ["", title, "",
             "| method | rollout | update | select | other | time ratio |", "|---|---|---|---|---|---|"]
    for m in methods:
        s = summary[m]
        lines.append(f"| {m} | " + " | ".join(fmt(s.get(f"{p}_time_ratio")) for p in PARTS)
                     + f" | {fmt(s.get('time_to_target_ratio'))} |")
    return lines
