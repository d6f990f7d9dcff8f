"""Run outputs on disk, named as DESIGN §4.

Every training run writes, in its run folder: `records.jsonl` (one line of §4 figures per
step), `evals.json` (held-out accuracy against training seconds) and `summary.json`
(time_to_target_s, steps_to_target, final_accuracy and the medians of the step figures).
These files are what `dots compare` reads and what the pipeline's MLflow logging replays.
`RunResult` and the time-to-target rule (DESIGN §5) live here, beside the files that carry
them, so the trainer, compare and the bench read one definition.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .atomic import write_text

if TYPE_CHECKING:
    from .config import Config

STEP_FIGURES = ("time/step_s", "time/rollout_s", "time/update_s", "time/select_s", "train/effective_ratio",
                "train/reward_mean", "replay/staleness_mean", "dots/pearson", "dots/pearson_ceiling", "dots/mae",
                "dots/probe_pearson", "sampling/rollouts", "sampling/gen_batches", "sampling/short", "greso/skip_prob_mean")


INFINITY = "inf"  # how a bench's summary.json writes +inf (JSON has none): a target never reached


def _clean(value: Any, infinity: str | None = None) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        if infinity is None or math.isnan(value):
            return None
        return infinity if value > 0 else "-" + infinity
    if isinstance(value, (np.floating, np.integer)):
        return _clean(value.item(), infinity)
    return value


def json_safe(obj: Any, infinity: str | None = None) -> Any:
    """Replace NaN/inf (e.g. a Pearson of constant labels) by null, so the file is strict JSON.
    With `infinity` (the bench's summary: `INFINITY`), ±inf is written as that string instead: there
    an infinite cost or ratio means a target never reached, which null would make read as "not
    measured"; `json_infinities` reads it back."""
    if isinstance(obj, dict):
        return {k: json_safe(v, infinity) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v, infinity) for v in obj]
    return _clean(obj, infinity)


def json_infinities(obj: Any, infinity: str = INFINITY) -> Any:
    """The inverse of `json_safe(obj, infinity)` for infinities: the strings back to ±inf."""
    if isinstance(obj, dict):
        return {k: json_infinities(v, infinity) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_infinities(v, infinity) for v in obj]
    if obj in (infinity, "-" + infinity):
        return float(obj)
    return obj


@dataclass
class RunResult:
    method: str
    records: list[dict]
    evals: list[dict]
    final_accuracy: float
    target_accuracy: float | None = None
    time_to_target_s: float | None = None
    steps_to_target: float | None = None  # read between evaluations (`Crossing`)
    summary: dict = field(default_factory=dict)
    final_smoothed: float | None = None  # mean of the last eval.smooth evaluations
    resumed_at: list[int] = field(default_factory=list)  # steps it went on from a checkpoint (Trainer)


def resumed_label(name: str, resumed_at: list[int]) -> str:
    """`<name> at step k[, k2]`: how a table names a run that went on from a checkpoint (`resumed_at`)."""
    return f"{name} at step {', '.join(str(k) for k in resumed_at)}"


def smoothed(evals: list[dict], window: int = 1) -> list[float]:
    """Trailing mean of the last `window` evaluations' accuracy at each evaluation (fewer at the
    start): one noisy evaluation can neither set the target nor reach it."""
    acc = [float(e["accuracy"]) for e in evals]
    return [float(np.mean(acc[max(0, i + 1 - window): i + 1])) for i in range(len(acc))]


def final_smoothed(evals: list[dict], window: int = 1) -> float | None:
    """The run's end point on the smoothed curve: the mean of its last `window` evaluations
    (grpo's is the target of DESIGN §5)."""
    return smoothed(evals, window)[-1] if evals else None


def equal_time_difference(mine_s: list[float], mine: list[float],
                          base_s: list[float], base: list[float]) -> float:
    """Smoothed accuracy at equal training seconds, mine − base: both curves (seconds, smoothed
    accuracy at each evaluation) read at the shorter run's last second, linear between
    evaluations as the time to target is. The figure at the same compute, beside the end points
    (an arm that spends 3x the seconds a step can end higher without being better for them)."""
    t = min(mine_s[-1], base_s[-1])
    return float(np.interp(t, mine_s, mine) - np.interp(t, base_s, base))


def target_eval(evals: list[dict], target: float | None, window: int = 1) -> dict | None:
    """The first evaluation whose smoothed accuracy reaches `target` (None: never)."""
    found = crossing(evals, target, window)
    return None if found is None else found.hit


@dataclass(frozen=True)
class Crossing:
    """Where a run's smoothed accuracy first reaches the target: `fraction` of the way from the
    last evaluation below it (`before`; None when the first evaluation already reaches it) to the
    first at or above it (`hit`), the smoothed curve taken as straight between the two.

    Why not simply `hit`: the target is grpo's own smoothed end point, so grpo meets it at one of
    its evaluations (its last on 85 of 106 bench runs, stop 51), while any other method crosses
    it somewhere between two evaluations and was charged the rest of that interval (on average
    half of `eval.every` steps). Read at `hit`, every other method's time carried a delay grpo's
    did not (docs/benchmark.md, "Time to target between evaluations")."""

    before: dict | None
    hit: dict
    fraction: float

    @property
    def steps(self) -> tuple[int, int]:
        """The two evaluations' steps (`before`'s 0 when there is none): where per-step sums
        (seconds, load-adjusted seconds, the time split) are taken before `at` reads between them."""
        return (0 if self.before is None else int(self.before["step"])), int(self.hit["step"])

    def at(self, before_value: float, hit_value: float) -> float:
        """A cumulative figure (seconds, steps, tokens) at the crossing, given its values at
        `before` and at `hit`: linear in between, as the smoothed curve is taken to be."""
        if self.before is None:
            return float(hit_value)
        return float(before_value) + self.fraction * (float(hit_value) - float(before_value))

    def of(self, key: str) -> float | None:
        """`at` for a field both evaluations carry (`elapsed_s`, `step`, `tokens_sampled`, ...)."""
        if self.hit.get(key) is None or (self.before is not None and self.before.get(key) is None):
            return None
        return self.at(self.before[key] if self.before is not None else 0.0, self.hit[key])


def crossing(evals: list[dict], target: float | None, window: int = 1) -> Crossing | None:
    """Where the smoothed accuracy (`smoothed`) first reaches `target` (None: never)."""
    if target is None:
        return None
    curve = smoothed(evals, window)
    for i, (e, acc) in enumerate(zip(evals, curve)):
        if acc >= target - 1e-12:
            if i == 0:
                return Crossing(None, e, 1.0)
            rise = acc - curve[i - 1]  # > 0: the previous evaluation was below the target
            fraction = 1.0 if rise <= 0 else min(1.0, max(0.0, (target - curve[i - 1]) / rise))
            return Crossing(evals[i - 1], e, fraction)
    return None


def time_to_target(evals: list[dict], target: float | None, window: int = 1) -> tuple[float | None, float | None]:
    """Training seconds and steps where the smoothed accuracy first reaches `target`, read
    between evaluations (`Crossing`): steps may be fractional."""
    found = crossing(evals, target, window)
    return (None, None) if found is None else (found.of("elapsed_s"), found.of("step"))


def fresh_share(records: list[dict]) -> dict:
    """Groups generated over the run and the share of them with varied rewards. Why beside the mean of
    `train/effective_ratio`: that reads the groups a step trains on, and a DOTS round's degenerate
    references, a dynamic-sampling step's filtered-out groups, never reach one; this counts every
    group sampled. None for records written before the counts were (they lack `train/fresh_groups`)."""
    if not records or any("train/fresh_groups" not in r for r in records):
        return {"train/fresh_groups_total": None, "train/fresh_informative_total": None,
                "fresh_effective_ratio": None}
    groups = sum(int(r["train/fresh_groups"]) for r in records)
    informative = sum(int(r["train/fresh_informative"]) for r in records)
    return {"train/fresh_groups_total": groups, "train/fresh_informative_total": informative,
            "fresh_effective_ratio": informative / groups if groups else None}


def summarize(result: RunResult) -> dict:
    out: dict[str, Any] = {
        "method": result.method, "steps": len(result.records), "final_accuracy": result.final_accuracy,
        "target_accuracy": result.target_accuracy, "time_to_target_s": result.time_to_target_s,
        "steps_to_target": result.steps_to_target,
        "elapsed_s": result.records[-1]["time/elapsed_s"] if result.records else 0.0,
        "initial_accuracy": result.evals[0]["accuracy"] if result.evals else None,
        "final_accuracy_smoothed": result.final_smoothed,
        "accuracy_se": result.evals[-1].get("accuracy_se") if result.evals else None,
        "resumed_at": list(result.resumed_at),
    }
    if result.records:  # machine-independent costs of the whole run
        last = result.records[-1]
        for key in ("tokens/sampled_total", "tokens/trained_total", "train/groups_trained_total"):
            out[key] = last.get(key)
        out.update(fresh_share(result.records))
    frontier = [e["frontier"] for e in result.evals if "frontier" in e]
    if frontier:
        out["frontier_min"], out["frontier_final"] = float(min(frontier)), float(frontier[-1])
    for key in STEP_FIGURES:
        vals = [r[key] for r in result.records if key in r and r[key] is not None and math.isfinite(r[key])]
        out[f"mean:{key}"] = float(np.mean(vals)) if vals else None
    return {k: _clean(v) for k, v in out.items()}


def rows_with_every_key(rows: list[dict]) -> list[dict]:
    """Every row with every key any row has (null where it had none). Why: DVC plots a file's rows
    only when they share their keys, and drops the whole series otherwise; the evaluation at step 0
    has no `probe_pearson` (no selection round yet), so `dvc plots show` drew nothing of `dots`,
    `dots_rr`, ... and said only "argument of type 'NoneType' is not iterable"."""
    keys = list(dict.fromkeys(k for row in rows for k in row))
    return [{k: row.get(k) for k in keys} for row in rows]


def write_run_files(run_dir: str | Path, cfg: "Config", result: RunResult) -> dict:
    run_dir = Path(run_dir)
    write_text(run_dir / "records.jsonl",
               "".join(json.dumps({k: _clean(v) for k, v in rec.items()}) + "\n" for rec in result.records))
    write_text(run_dir / "evals.json", json.dumps(rows_with_every_key(result.evals), indent=1))
    summary = summarize(result)
    write_text(run_dir / "summary.json", json.dumps(summary, indent=1))
    return summary


def step_records(run_dir: str | Path) -> list[dict]:
    """Each step's record (`records.jsonl`) of a finished run folder, in step order."""
    lines = (Path(run_dir) / "records.jsonl").read_text().splitlines()
    return sorted((json.loads(x) for x in lines if x.strip()), key=lambda r: r["step"])


def step_seconds(run_dir: str | Path) -> list[float]:
    """Each step's training seconds (`time/step_s`) of a finished run folder, in step order."""
    return [float(rec["time/step_s"]) for rec in step_records(run_dir)]


def read_run(run_dir: str | Path) -> tuple[dict, list[dict]]:
    """(summary, evals) of a finished run folder."""
    run_dir = Path(run_dir)
    if not (run_dir / "summary.json").exists():
        raise FileNotFoundError(f"{run_dir}: no finished run; run `dots train` first")
    return json.loads((run_dir / "summary.json").read_text()), json.loads((run_dir / "evals.json").read_text())
