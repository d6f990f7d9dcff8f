"""The bench's table (table.md, printed at its end): per run, medians with their intervals, the
time split, the peers and variants side by side, the task checks and the goals, and the notes that
name runs whose seconds are not this bench's sitting (read back, or resumed from a checkpoint).

Why apart: the table is Markdown built from the summary `dots.bench_summary` computes and the goals
`dots.bench_goals` judges; rendering it again from a summary needs no run and no config.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import time_split
from .bench_summary import RATIOS, grpo_baselines, peer_arms
from .runfiles import resumed_label


def fmt(v, spec: str) -> str:
    """A table cell: "—" for a figure not measured, "never" for a target never reached."""
    if v is None:
        return "—"
    if isinstance(v, float) and not np.isfinite(v):
        return "never"
    return format(v, spec)


def interval_detail(ci) -> str:
    return "" if ci is None else f"90% CI {fmt(ci[0], '.2f')}–{fmt(ci[1], '.2f')}"


def with_interval(v, ci, spec: str) -> str:
    """A figure and its interval: "0.46 [0.43–0.49]"."""
    return fmt(v, spec) + ("" if not ci else f" [{fmt(ci[0], spec)}–{fmt(ci[1], spec)}]")


def _end_point(stats: dict, suffix: str = "") -> str:
    """The paired end-point difference and its interval, signed (`paired_differences`)."""
    return with_interval(stats.get(f"end_point_diff{suffix}"), stats.get(f"end_point_diff{suffix}_ci90"), "+.3f")


def _equal_time(stats: dict, suffix: str = "") -> str:
    """The paired accuracy difference at equal seconds and its interval (`equal_time_differences`)."""
    return with_interval(stats.get(f"equal_time_diff{suffix}"), stats.get(f"equal_time_diff{suffix}_ci90"), "+.3f")


def _lower_on(stats: dict, suffix: str = "") -> str:
    """On how many seeds the arm ended below its base: "15/20"."""
    diffs = stats.get(f"end_point_diff{suffix}_per_seed") or []
    return f"{sum(d < 0 for d in diffs)}/{len(diffs)}" if diffs else "—"


def _against(summary: dict, methods: list[str], bases: list[str], title: str) -> list[str]:
    """A table section: every other arm's time and token ratios to each of `bases`, then its end
    point and accuracy at equal seconds against each."""
    lines = ["", f"{title}: ratios and accuracy differences paired by seed, with 90% bootstrap intervals:",
             "",
             "| method | " + " | ".join(f"{label} / {b}" for b in bases for label in
                                       ("time", "load-adjusted time", "tokens sampled", "tokens trained"))
             + " | " + " | ".join(f"{label} − {b}" for b in bases
                                  for label in ("end point", "at equal time")) + " |",
             "|" + "---|" * (1 + 6 * len(bases))]
    for m in methods:
        s = summary[m]
        cells = [with_interval(s.get(f"{n}_vs_{b}"), s.get(f"{n}_vs_{b}_ci90"), ".2f") for b in bases
                 for n in ("time_to_target_ratio", "time_to_target_adjusted_ratio", "tokens_sampled_ratio",
                           "tokens_trained_ratio")]
        cells += [f(s, f"_vs_{b}") for b in bases for f in (_end_point, _equal_time)]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


def render(rows: list[dict], summary: dict, goal_list: list[dict], methods: list[str],
           checks: list[dict] | None = None) -> str:
    head = ("| method | seed | time-to-target (s) | load-adjusted (s) | steps | tokens sampled | tokens trained | final acc "
            "| step (s) | rollout | update | select | s / group trained | effective ratio "
            "| fresh informative | staleness | dots/pearson |")
    lines = ["Per run (target = grpo's mean of its last evaluations, same seed):", "", head,
             "|" + "---|" * 17]
    for r in sorted(rows, key=lambda r: (methods.index(r["method"]), r["seed"])):
        lines.append(f"| {r['method']} | {r['seed']} | {fmt(r['time_to_target_s'], '.1f')} | "
                     f"{fmt(r.get('time_to_target_adjusted_s'), '.1f')} | "
                     f"{fmt(r['steps_to_target'], '.1f')} | {fmt(r['tokens_sampled_to_target'], ',.0f')} | "
                     f"{fmt(r['tokens_trained_to_target'], ',.0f')} | {fmt(r['final_smoothed'], '.3f')} | "
                     f"{fmt(r['step_s'], '.3f')} | {fmt(r['rollout_s'], '.3f')} | {fmt(r['update_s'], '.3f')} | "
                     f"{fmt(r['select_s'], '.3f')} | {fmt(r['s_per_group_trained'], '.4f')} | "
                     f"{fmt(r['effective_ratio'], '.2f')} | {fmt(r.get('fresh_effective_ratio'), '.2f')} | "
                     f"{fmt(r['staleness'], '.1f')} | {fmt(r['dots_pearson'], '.2f')} |")
    lines += ["", "Medians over seeds; ratios and accuracy differences to grpo are paired by seed, "
              "with 90% bootstrap intervals:", "",
              "| method | time ratio | load-adjusted time ratio | steps ratio | tokens-sampled ratio "
              "| tokens-trained ratio | time-to-target (s) | final acc | end point − grpo "
              "| at equal time − grpo | step (s) | s / group trained | effective ratio | fresh informative "
              "| staleness | dots/pearson | reached |",
              "|" + "---|" * 17]
    for m in methods:
        s = summary[m]
        lines.append(f"| {m} | " + " | ".join(with_interval(s.get(n), s.get(f"{n}_ci90"), ".2f") for _, n in RATIOS) +
                     f" | {fmt(s['time_to_target_s'], '.1f')} | {fmt(s['final_smoothed'], '.3f')} | "
                     f"{_end_point(s)} | {_equal_time(s)} | {fmt(s['step_s'], '.3f')} | "
                     f"{fmt(s['s_per_group_trained'], '.4f')} | "
                     f"{fmt(s['effective_ratio'], '.2f')} | {fmt(s.get('fresh_effective_ratio'), '.2f')} | "
                     f"{fmt(s['staleness'], '.1f')} | {fmt(s['dots_pearson'], '.2f')} | "
                     f"{s['reached_target']}/{len(s['seeds'])} |")
    lines += time_split.render(summary, methods, lambda v: fmt(v, ".2f"))
    peers = peer_arms(methods, {m: summary[m].get("variant_of") for m in methods})
    if peers:
        lines += _against(summary, methods, peers, "Against the peer baselines")
        lines += ["", "How the peers sample (medians of per-step means over seeds):", "",
                  "| method | generation batches / step | groups rolled out / step | short steps | "
                  "GRESO skip probability |", "|---|---|---|---|---|"]
        for m in methods:
            s = summary[m]
            if s.get("rollouts_per_step") is None:
                continue
            lines.append(f"| {m} | {fmt(s['gen_batches'], '.2f')} | {fmt(s['rollouts_per_step'], '.1f')} | "
                         f"{fmt(s['short_share'], '.3f')} | {fmt(s['skip_prob'], '.3f')} |")
    variants = [m for m in methods if summary[m].get("variant_of")]
    if variants:
        lines += ["", "Variants against their own method: ratios and accuracy differences paired by seed, "
                  "with 90% bootstrap intervals:", "",
                  "| variant | params | time | load-adjusted time | steps | tokens sampled | tokens trained "
                  "| end point − its method | ended lower on | at equal time − its method |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for m in variants:
            s, base = summary[m], summary[m]["variant_of"]
            cells = [with_interval(s.get(f"{n}_vs_{base}"), s.get(f"{n}_vs_{base}_ci90"), ".2f") for _, n in RATIOS]
            vs = f"_vs_{base}"
            cells += [_end_point(s, vs), _lower_on(s, vs), _equal_time(s, vs)]
            lines.append(f"| {m} | {base} with {', '.join(s['overrides'])} | " + " | ".join(cells) + " |")
    other_bases = [m for m in grpo_baselines(summary) if m in methods]
    if other_bases:
        lines += _against(summary, methods, other_bases,
                          "Against grpo's variants as baselines (target: each baseline's own smoothed end point)")
    if checks:
        lines += ["", "Does the task decide? (grpo, every seed)", "", "| check | per seed | target | met |",
                  "|---|---|---|---|"]
        for c in checks:
            per = ", ".join(fmt(v, ".2f") for v in c["per_seed"])
            lines.append(f"| {c['check']} | {per} | {c['target']} | {'yes' if c['met'] else 'no'} |")
    lines += ["", "Goals:", "", "| goal | measured | target | met |", "|---|---|---|---|"]
    for g in goal_list:
        detail = f" ({g['detail']})" if g["detail"] else ""
        lines.append(f"| {g['goal']} | {fmt(g['value'], '.3f')}{detail} | {g['target']} | "
                     f"{'yes' if g['met'] else 'no'} |")
    return "\n".join(lines)


def read_back_note(read_back: list[str], runs: int, root: Path) -> str:
    """The table's warning that some of its seconds are an earlier bench's (`runs_finished_before`)."""
    return (f"\n\nRead back, not timed by this bench: {len(read_back)} of {runs} runs ({', '.join(read_back)}) "
            "finished in an earlier bench in this workspace, so their seconds are that bench's and this table "
            f"is not a second measurement of them. To time them again, move {root / 'runs'} and "
            f"{root / 'checkpoints'} aside (the shared stages can stay), or bench in a clean clone.")


def runs_resumed(rows: list[dict]) -> list[str]:
    """`<arm> seed <s> at step <k>[, <k2>]` for each run that went on from a checkpoint (a killed or
    stopped bench, run again): its seconds before and after were timed in different sittings."""
    return [resumed_label(f"{r['method']} seed {r['seed']}", r["resumed_at"])
            for r in rows if r.get("resumed_at")]


def resumed_note(resumed: list[str], runs: int, root: Path) -> str:
    """The table's warning that some runs' seconds come from two sittings (`runs_resumed`). Steps,
    tokens and accuracies are those of an uninterrupted run (resume is exact); seconds are not: the
    machine's load differed between the sittings, which the load-adjusted figure divides out round by
    round and the raw one does not."""
    return (f"\n\nResumed from a checkpoint: {len(resumed)} of {runs} runs ({'; '.join(resumed)}). Their "
            "steps, tokens and accuracies are an uninterrupted run's, but their seconds were timed in two or "
            "more sittings under different machine load; read the load-adjusted columns for them. To time "
            f"them in one sitting, move {root / 'runs'} and {root / 'checkpoints'} aside and bench again.")
