"""The bench's statistics over seeds: each arm's medians and min-max spread, and its ratios and
accuracy differences to grpo, to the peer baselines and to its own method, paired by seed, each with
a 90% percentile-bootstrap interval of its median (`dots.bench.report` writes them to summary.json).

Why pairing by seed: a seed fixes the pool's order, the warm-up's draw and the dice of every
rollout, and in lockstep the machine load of every arm; a ratio taken within a seed cancels what
the seeds share, and the median over seeds with its interval says how far the figure would move
on other seeds. Why apart from the bench's running of seeds: these are pure functions of the
runs' rows, read again by `dots bench-diff` and the tests without training anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from . import time_split
from .runfiles import equal_time_difference


class Variant(NamedTuple):
    """A method with some params changed, benched beside the methods as its own arm (parsed and
    checked by `dots.bench.parse_variant`); here, because its ratios to its own method are paired."""
    label: str
    method: str
    overrides: tuple[str, ...]


PEERS = ("dapo", "greso")  # the peer baselines dots is measured against beside grpo


def peer_arms(methods: Sequence[str], variant_of: dict[str, str | None]) -> list[str]:
    """The arms every arm is paired with as a peer baseline (`<ratio>_vs_<arm>`): dapo and greso,
    and their variants, e.g. greso at the learning rate that suits dots_rr too, so that dots_rr at
    its better setting meets each peer at its own (against grpo's target, as every arm)."""
    return [m for m in methods if m in PEERS or variant_of.get(m) in PEERS]


# the peer baselines' sampling figures: per-step means the run's summary holds (None for other methods)
PEER_FIGURES = {"rollouts_per_step": "sampling/rollouts", "gen_batches": "sampling/gen_batches",
                "short_share": "sampling/short", "skip_prob": "greso/skip_prob_mean"}


TO_TARGET = ("time_to_target_s", "time_to_target_adjusted_s", "steps_to_target", "tokens_sampled_to_target",
             "tokens_trained_to_target")


def to_target(row: dict, key: str, measured: bool = True) -> float | None:
    """A run's cost to the target as its medians read it: +inf for a run that had a target and
    never reached it (infinitely slow, as in the paired ratios). Why: leaving the misses out made
    the median of an arm that reached the target on 2 of 6 seeds the median of its 2 runs that
    did, its fastest. None where there was no target or the bench did not measure the figure
    (`measured_figures`: no load-adjusted seconds off lockstep)."""
    if measured and row.get("target_accuracy") is not None and row.get("steps_to_target") is None:
        return float("inf")
    return row.get(key)


def measured_figures(rows: list[dict]) -> set[str]:
    """The costs to target (`TO_TARGET`) a bench measured: those some run has a value of. Why: a
    bench timed off lockstep (on a GPU, or with fewer than 3 arms) has no load-adjusted seconds,
    yet a run that missed the target was scored for them all the same (+inf in its arm's median,
    0 in a ratio to a peer that missed): the ratio to `dapo` read 0.0 from its missed seeds
    alone, the peer goal judged it and called 0.0 met against a raw 0.9, and `dots bench-diff`
    decided on it. grpo reaches its own end point on every seed, so a measured figure has one."""
    return {k for k in TO_TARGET if any(r.get(k) is not None for r in rows)}


def median_of(vals: list) -> float | None:
    """The median of the figures a run has (None: not measured, e.g. a Pearson of grpo)."""
    vals = [v for v in vals if v is not None]
    return float(np.median(vals)) if vals else None


def spread_of(vals: list) -> list | None:
    """[min, max] of the figures a run has, beside the median."""
    vals = [v for v in vals if v is not None]
    return [float(min(vals)), float(max(vals))] if vals else None


MEDIAN_KEYS = ("time_to_target_s", "time_to_target_adjusted_s", "steps_to_target", "tokens_sampled_to_target", "tokens_trained_to_target",
               "final_accuracy", "final_smoothed", "step_s", "rollout_s", "update_s", "select_s", "other_s",
               "effective_ratio", "fresh_effective_ratio", "staleness", "dots_pearson", "probe_pearson",
               "pearson_ceiling", "s_per_group_trained",
               "frontier_min", *PEER_FIGURES)
RATIOS = (("time_to_target_s", "time_to_target_ratio"), ("time_to_target_adjusted_s", "time_to_target_adjusted_ratio"),
          ("steps_to_target", "steps_to_target_ratio"),
          ("tokens_sampled_to_target", "tokens_sampled_ratio"), ("tokens_trained_to_target", "tokens_trained_ratio"))
CONFIDENCE = 0.9


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> list[float] | None:
    """Percentile-bootstrap interval of the median over seeds (scipy.stats.bootstrap, fixed seed).

    A run that never reached the target enters as +inf (infinitely slow). The bootstrap runs on
    a finite stand-in for it; any bound above the largest finite ratio involves a stand-in (with
    an even count the median may average one with a real ratio), so it is reported as inf."""
    from scipy.stats import bootstrap  # noqa: PLC0415

    vals = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if len(vals) == 0:
        return None
    if len(vals) == 1 or np.all(vals == vals[0]):
        return [float(vals[0]), float(vals[0])]
    finite = vals[np.isfinite(vals)]
    top = float(finite.max()) if len(finite) else -np.inf  # the largest ratio a run really reached
    stand_in = np.where(np.isfinite(vals), vals, top * 10 + 1 if len(finite) else 1.0)
    res = bootstrap((stand_in,), np.median, confidence_level=confidence, method="percentile",
                    n_resamples=9999, random_state=np.random.default_rng(0), vectorized=True)
    def bound(x: float) -> float:
        # the percentile interpolation can land an ulp above the largest ratio: that is the ratio,
        # while a bound that involves the stand-in lies ten times higher
        return min(x, top) if x <= top + 1e-9 * abs(top) else float("inf")

    return [bound(float(res.confidence_interval.low)), bound(float(res.confidence_interval.high))]


def paired_ratio(mine: float | None, base: float | None) -> float | None:
    """mine / base for one seed; a run that never reaches the target counts as infinitely slow
    (so it weighs in the median), and a target already met at step 0 by both is a tie."""
    if base is None:
        return None
    if mine is None:
        return float("inf")
    if base == 0:
        return 1.0 if mine == 0 else float("inf")
    return mine / base


def paired_ratios(mine: list[dict], base: list[dict], key: str, measured: bool = True) -> dict:
    """Seed-paired ratios of `key` (mine / base): their median, the per-seed values and a 90%
    bootstrap interval of the median; none of a figure the bench did not measure (`measured_figures`),
    whose misses say nothing either."""
    if not measured:
        return paired([])
    by_seed = {r["seed"]: r for r in base}
    ratios = [paired_ratio(r.get(key), by_seed[r["seed"]].get(key)) if by_seed[r["seed"]].get(
        "steps_to_target") is not None else never_base_ratio(r) for r in mine if r["seed"] in by_seed]
    return paired([x for x in ratios if x is not None])


def never_base_ratio(mine: dict) -> float:
    """The ratio of a seed whose base run never reached the target (a peer baseline can miss
    grpo's end point): the same rule as a run of mine that misses, the other way round. Mine
    reached it: 0 (infinitely faster); mine missed too: a tie. Leaving such seeds out dropped
    exactly the ones most favourable to `mine` from the median and its interval."""
    return 1.0 if mine.get("steps_to_target") is None else 0.0


def paired(values: list[float]) -> dict:
    """Per-seed values as the summary holds them: their median, the values, a 90% bootstrap
    interval of the median."""
    return {"median": float(np.median(values)) if values else None, "per_seed": values,
            "ci90": median_interval(values)}


def paired_differences(mine: list[dict], base: list[dict], key: str) -> dict:
    """Seed-paired differences of `key` (mine − base): their median, the per-seed values and a
    90% bootstrap interval of the median. Why beside the time ratios: an arm can reach grpo's
    end point sooner and still end lower (a switch that trades the end point for an earlier
    crossing); the end point's own paired interval says whether it does, by more than noise."""
    by_seed = {r["seed"]: r for r in base}
    return paired([float(r[key] - by_seed[r["seed"]][key]) for r in mine
                    if r.get(key) is not None and by_seed.get(r["seed"], {}).get(key) is not None])


def equal_time_differences(mine: list[dict], base: list[dict]) -> dict:
    """Seed-paired differences of smoothed accuracy at equal training seconds: on each seed, both
    runs' smoothed curves read at the shorter run's last second (linear between evaluations, as
    the time to target is), mine − base; median, per seed and 90% bootstrap interval. Why: time to
    `grpo`'s end point says who clears one bar first and the end points who is ahead after the
    same steps, but an arm that spends 3x the seconds a step can end higher without being better
    for the compute; this is the figure at the same compute. Rows without a curve are left out."""
    by_seed = {r["seed"]: r for r in base}
    diffs = []
    for r in mine:
        b = by_seed.get(r["seed"])
        if not r.get("curve_s") or not b or not b.get("curve_s"):
            continue
        diffs.append(equal_time_difference(r["curve_s"], r["curve_smoothed"],
                                           b["curve_s"], b["curve_smoothed"]))
    return paired(diffs)


def summarize(rows: list[dict], methods: list[str], variants: Sequence[Variant] = (),
              baseline_rows: dict[str, list[dict]] | None = None) -> dict:
    """Per arm: medians over seeds, their min–max spread, seed-paired ratios to grpo and, where
    the peer baselines or their variants ran, to each of them (`<ratio>_vs_<peer>`, see
    `peer_arms`); a variant also to its own method (`<ratio>_vs_<method>`); beside each pairing's
    ratios, the paired difference of the smoothed end points (`end_point_diff<suffix>`,
    `paired_differences`) and of the accuracy at equal seconds (`equal_time_diff<suffix>`,
    `equal_time_differences`). A variant of grpo
    is another baseline: every other arm gets its ratios to it too (`<ratio>_vs_<label>`), e.g.
    to grpo as a plain trainer runs it.

    `baseline_rows[label]`: every arm's rows against that grpo variant's own target (its own
    smoothed end point, see `baseline_targets`); its `_vs_<label>` ratios are read from them, so
    a baseline that ends a little below grpo's end point is still a baseline (against grpo's
    target it would never arrive, and every seed would drop out of the pairing)."""
    def by_arm(some: list[dict]) -> dict[str, list[dict]]:
        return {m: [r for r in some if r["method"] == m] for m in methods}

    runs, measured = by_arm(rows), measured_figures(rows)
    runs_vs = {b: by_arm(rows_b) for b, rows_b in (baseline_rows or {}).items()}  # against b's own end point
    grpo = runs.get("grpo", [])
    by_label = {v.label: v for v in variants}
    peers = peer_arms(methods, {label: v.method for label, v in by_label.items()})
    other_bases = [v.label for v in variants if v.method == "grpo" and v.label in methods]
    out: dict[str, dict] = {}
    for m in methods:
        mine = runs[m]
        stats: dict = {"seeds": [r["seed"] for r in mine],
                       "reached_target": sum(r["time_to_target_s"] is not None for r in mine)}
        if (v := by_label.get(m)) is not None:
            stats["variant_of"], stats["overrides"] = v.method, list(v.overrides)
        for k in MEDIAN_KEYS:
            vals = [to_target(r, k, k in measured) if k in TO_TARGET else r.get(k) for r in mine]
            stats[k], stats[f"{k}_spread"] = median_of(vals), spread_of(vals)
        own = [v.method] if v is not None and v.method in runs and v.method not in peers else []
        bases = [*peers, *own, *(b for b in other_bases if b != m)]
        pairs = [(mine, grpo, "")]
        for b in bases:
            arm_rows = runs_vs.get(b, runs)
            pairs.append((arm_rows[m], arm_rows[b], f"_vs_{b}"))
        for mine_b, base, suffix in pairs:
            figures = [(name, paired_ratios(mine_b, base, key, key in measured)) for key, name in RATIOS]
            figures += [("end_point_diff", paired_differences(mine_b, base, "final_smoothed")),  # as the target
                        ("equal_time_diff", equal_time_differences(mine_b, base))]
            for name, pr in figures:
                stats[name + suffix] = pr["median"]
                stats[f"{name}{suffix}_per_seed"] = pr["per_seed"]
                stats[f"{name}{suffix}_ci90"] = pr["ci90"]
        stats.update(time_split.ratios_to_grpo(mine, grpo))
        out[m] = stats
    return out


def baseline_targets(rows: list[dict], variants: Sequence[Variant] = ()) -> dict[str, dict[int, float]]:
    """Per variant of grpo, its own target for each seed: its own smoothed end point, as grpo's is
    the bench's. Ratios to such a baseline measure who reaches *its* end point first; measured
    against grpo's, a baseline that is the same gradient up to float order (train.skip_degenerate
    off) missed it on 3 of 5 seeds and left no pair to compare."""
    labels = {v.label for v in variants if v.method == "grpo"}
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        if r["method"] in labels and r.get("final_smoothed") is not None:
            out.setdefault(r["method"], {})[r["seed"]] = r["final_smoothed"]
    return out


def grpo_baselines(summary: dict) -> list[str]:
    """The arms of a summary that are variants of grpo: baselines every other arm was also
    compared with (`<ratio>_vs_<label>`)."""
    return [m for m, stats in summary.items() if stats.get("variant_of") == "grpo"]
