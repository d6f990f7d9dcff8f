"""Run outputs on disk, named as DESIGN §4.

Every training run writes, in its run folder: `records.jsonl` (one line of §4 figures per
step), `evals.json` (held-out accuracy against training seconds) and `summary.json`
(time_to_target_s, steps_to_target, final_accuracy and the medians of the step figures).
These files are what `dots compare` reads and what the pipeline's MLflow logging replays.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .atomic import write_text

if TYPE_CHECKING:
    from .config import Config
    from .trainer import RunResult

STEP_FIGURES = ("time/step_s", "time/rollout_s", "time/update_s", "time/select_s", "train/effective_ratio",
                "train/reward_mean", "replay/staleness_mean", "dots/pearson", "dots/mae")


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (np.floating, np.integer)):
        return _clean(value.item())
    return value


def json_safe(obj: Any) -> Any:
    """Replace NaN/inf (e.g. a Pearson of constant labels) by null, so the file is strict JSON."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return _clean(obj)


def summarize(result: "RunResult") -> dict:
    out: dict[str, Any] = {
        "method": result.method, "steps": len(result.records), "final_accuracy": result.final_accuracy,
        "target_accuracy": result.target_accuracy, "time_to_target_s": result.time_to_target_s,
        "steps_to_target": result.steps_to_target,
        "elapsed_s": result.records[-1]["time/elapsed_s"] if result.records else 0.0,
        "initial_accuracy": result.evals[0]["accuracy"] if result.evals else None,
        "final_accuracy_smoothed": result.final_smoothed,
        "accuracy_se": result.evals[-1].get("accuracy_se") if result.evals else None,
    }
    if result.records:  # machine-independent costs of the whole run
        last = result.records[-1]
        for key in ("tokens/sampled_total", "tokens/trained_total", "train/groups_trained_total"):
            out[key] = last.get(key)
    frontier = [e["frontier"] for e in result.evals if "frontier" in e]
    if frontier:
        out["frontier_min"], out["frontier_final"] = float(min(frontier)), float(frontier[-1])
    for key in STEP_FIGURES:
        vals = [r[key] for r in result.records if key in r and r[key] is not None and math.isfinite(r[key])]
        out[f"mean:{key}"] = float(np.mean(vals)) if vals else None
    return {k: _clean(v) for k, v in out.items()}


def write_run_files(run_dir: str | Path, cfg: "Config", result: "RunResult") -> dict:
    run_dir = Path(run_dir)
    write_text(run_dir / "records.jsonl",
               "".join(json.dumps({k: _clean(v) for k, v in rec.items()}) + "\n" for rec in result.records))
    write_text(run_dir / "evals.json", json.dumps(result.evals, indent=1))
    summary = summarize(result)
    write_text(run_dir / "summary.json", json.dumps(summary, indent=1))
    return summary


def read_run(run_dir: str | Path) -> tuple[dict, list[dict]]:
    """(summary, evals) of a finished run folder."""
    run_dir = Path(run_dir)
    if not (run_dir / "summary.json").exists():
        raise FileNotFoundError(f"{run_dir}: no finished run; run `dots train` first")
    return json.loads((run_dir / "summary.json").read_text()), json.loads((run_dir / "evals.json").read_text())
