"""`dots bench-diff A B`: do two benches of one commit agree?

Why: a figure we publish must survive a second run. Issue 11's bar is two clean-clone `make bench`
runs of one commit giving median time ratios within 0.10 of each other for every method, and
until now that check was done by hand from two `summary.json` files. This module does it the
same way every time, and also checks what no machine's load can move: each run's steps and
tokens to target, and its smoothed end point, must be identical (a run's numbers are
deterministic for one build; a mismatch
means another commit, another build or another config, and then the seconds are not comparable
either).

Which figure decides: the load-adjusted time ratios where both benches have them, as the bench's
goals judge them; raw seconds otherwise (arms timed one after another, on a GPU). Both are shown,
each with its own verdict. Exit status as `diff`'s: 0 agree, 1 differ, 2 bad input.

`--ratios-only` (`ratios_only`) is for benches of two machines, such as one of yours against the
one this repository publishes (`docs/bench/summary.json`): the runs are deterministic for one
build on one machine, and another CPU's kernels round differently, so its runs are other draws of
the same algorithms. Their differing steps and tokens are counted (the first ten listed), only
the ratios decide, and no run is named as having moved apart from its seed's other arms (that
reading assumes the same runs in both benches).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .runfiles import json_infinities

TOLERANCE = 0.10  # issue 11: median ratios of two benches of one commit within 0.10
TIME_RATIOS = ("time_to_target_ratio", "time_to_target_adjusted_ratio")
# what no load can move: the end point too, since the bench pairs it by seed (`end_point_diff`)
DETERMINISTIC = ("steps_to_target", "tokens_sampled_to_target", "tokens_trained_to_target", "final_smoothed")
MOVED = 0.05  # a run whose seconds moved 5% apart from its seed's other arms is named
SHOWN = 10  # --ratios-only: how many differing run figures are listed (another machine's may all differ)


class BenchDiffError(ValueError):
    """Two summaries that cannot be compared (missing, unreadable, or of different benches)."""


def read_summary(path: str | Path) -> dict:
    """A bench's `summary.json` (or the bench's folder holding it: `--out`'s folder is what a user
    names), refused with its path named when missing or not a bench summary."""
    path = Path(path)
    if path.is_dir():
        if not (path / "summary.json").is_file():
            raise BenchDiffError(f"{path}: a folder without a summary.json "
                                 "(a bench writes results/bench/summary.json)")
        path = path / "summary.json"
    if not path.is_file():
        raise BenchDiffError(f"{path}: no such file (a bench writes results/bench/summary.json)")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise BenchDiffError(f"{path}: not JSON ({exc})") from exc
    for key in ("methods", "seeds", "summary", "runs"):
        if key not in data:
            raise BenchDiffError(f"{path}: not a bench summary (no '{key}')")
    return json_infinities(data)


def _baselines(stats: dict) -> list[str]:
    """The arms a method's time ratios are taken against: grpo, and each peer or baseline
    (`time_to_target_ratio_vs_<arm>`)."""
    prefix = TIME_RATIOS[0] + "_vs_"
    return ["grpo"] + sorted(k[len(prefix):] for k in stats
                             if k.startswith(prefix) and not k.endswith(("_ci90", "_per_seed")))


def _key(kind: str, baseline: str) -> str:
    return kind if baseline == "grpo" else f"{kind}_vs_{baseline}"


def _runs(summary: dict) -> dict[tuple[str, int], dict]:
    """A bench's run rows by (method, seed)."""
    return {(r["method"], r["seed"]): r for r in summary["runs"]}


def compare_benches(a: dict, b: dict, tolerance: float = TOLERANCE, ratios_only: bool = False) -> dict:
    """Every median time ratio of two benches side by side with its difference, and every run whose
    steps, tokens to target or end point differ. `within` is True when no ratio differs by more than
    `tolerance` and every run is identical (`ratios_only`: whatever the runs)."""
    for key in ("methods", "seeds", "steps"):
        if a.get(key) != b.get(key):
            raise BenchDiffError(f"the benches differ in '{key}': {a.get(key)} against {b.get(key)}; "
                                 "only benches of the same methods, seeds and budget compare")
    runs_b = _runs(b)
    mismatched = []
    for r in a["runs"]:
        other = runs_b.get((r["method"], r["seed"]))
        if other is None:
            mismatched.append({"method": r["method"], "seed": r["seed"], "field": "run", "a": "present", "b": "missing"})
            continue
        mismatched += [{"method": r["method"], "seed": r["seed"], "field": f, "a": r.get(f), "b": other.get(f)}
                       for f in DETERMINISTIC if r.get(f) != other.get(f)]
    ratios = []
    for method in a["methods"]:
        sa, sb = a["summary"].get(method, {}), b["summary"].get(method, {})
        for baseline in _baselines(sa):
            if baseline == method:
                continue  # a method against itself is 1 in every bench
            for kind in TIME_RATIOS:
                key = _key(kind, baseline)
                if key not in sa and key not in sb:
                    continue  # e.g. no load-adjusted seconds where the arms were timed one after another
                va, vb = sa.get(key), sb.get(key)
                diff = ratio_difference(va, vb)
                ratios.append({"method": method, "baseline": baseline, "ratio": key, "a": va, "b": vb,
                               "diff": diff, "within": (va is None and vb is None)
                               or (diff is not None and diff <= tolerance)})
    worst = max((r for r in ratios if r["diff"] is not None), key=lambda r: r["diff"], default=None)
    verdicts = {}
    for kind in TIME_RATIOS:
        mine = [r for r in ratios if r["ratio"].split("_vs_")[0] == kind]
        if any(r["diff"] is not None for r in mine):
            verdicts[kind] = {"within": all(r["within"] for r in mine),
                              "worst": max((r for r in mine if r["diff"] is not None), key=lambda r: r["diff"])}
    judged = judged_ratio(verdicts)
    return {"tolerance": tolerance, "ratios": ratios, "worst": worst, "mismatched_runs": mismatched,
            # which runs moved apart assumes the same runs in both: not for other draws (--ratios-only)
            "moved_runs": [] if ratios_only and mismatched else moved_runs(a, b),
            "verdicts": verdicts, "judged": judged,
            "not_one_sitting": {"read_back": [a.get("runs_read_back") or [], b.get("runs_read_back") or []],
                                "resumed": [a.get("runs_resumed") or [], b.get("runs_resumed") or []]},
            "ratios_only": ratios_only,
            "within": (ratios_only or not mismatched) and (judged is None or verdicts[judged]["within"])}


def ratio_difference(a: float | None, b: float | None) -> float | None:
    """|a − b| of one median ratio in two benches; None where either was not measured. A ratio of
    "never" (inf: more than half the seeds missed the target) agrees only with "never"."""
    if a is None or b is None:
        return None
    if math.isinf(a) or math.isinf(b):
        return 0.0 if a == b else math.inf
    return abs(a - b)


def judged_ratio(verdicts: dict) -> str | None:
    """The time ratio whose agreement decides: the load-adjusted one where both benches have it,
    as the bench's goals judge it (`dots.bench_goals.goals`); raw seconds where the arms were timed one
    after another (a GPU) and there is no load to divide out. The other is still shown and
    flagged."""
    return TIME_RATIOS[1] if TIME_RATIOS[1] in verdicts else (TIME_RATIOS[0] if TIME_RATIOS[0] in verdicts else None)


def moved_runs(a: dict, b: dict, threshold: float = MOVED) -> list[dict]:
    """The runs whose seconds to target moved apart from their seed's other arms between the two
    benches: where a ratio disagrees, these are why.

    The runs of two benches of one commit are the same runs, so each arm's seconds in B over its
    seconds in A would be one number per seed (how much faster or slower B's machine was) if load
    hit every arm alike. Each run's B / A over the median of its seed's B / A is how far it moved on
    its own (the load-adjusted seconds where both benches have them, else raw seconds); those
    more than `threshold` apart, largest first."""
    key = "time_to_target_adjusted_s"
    if not all(r.get(key) is not None for r in a["runs"] + b["runs"] if r.get("time_to_target_s") is not None):
        key = "time_to_target_s"
    runs_b = _runs(b)
    speeds: dict[int, dict[str, float]] = {seed: {} for seed in a["seeds"]}
    for (method, seed), r in _runs(a).items():
        other = runs_b.get((method, seed))
        if other is not None and r.get(key) and other.get(key) and seed in speeds:
            speeds[seed][method] = other[key] / r[key]
    out = []
    for seed, speed in speeds.items():
        if len(speed) < 3:  # with two arms either one's shift is the other's
            continue
        typical = float(np.median(list(speed.values())))
        out += [{"method": m, "seed": seed, "shift": v / typical - 1.0, "seconds": key}
                for m, v in speed.items() if abs(v / typical - 1.0) > threshold]
    return sorted(out, key=lambda x: -abs(x["shift"]))


def sitting_caveats(not_one_sitting: dict) -> list[str]:
    """Lines naming the runs whose seconds a bench did not time in one sitting of its own: read back
    from an earlier bench (`dots.bench.runs_finished_before`: then both benches may hold the very same
    seconds, and their agreement proves nothing) or resumed from a checkpoint (`dots.bench_table.runs_resumed`)."""
    lines = []
    for kind, what in (("read_back", "read back from an earlier bench, not timed by it"),
                       ("resumed", "resumed from a checkpoint, timed in more than one sitting")):
        for label, runs in zip("AB", not_one_sitting.get(kind, ([], []))):
            if runs:
                n = f"{len(runs)} run{'s' * (len(runs) != 1)}"
                lines.append(f"Bench {label}: {n} {what}: {'; '.join(runs)}.")
    return lines


def _f(x) -> str:
    if x is None:
        return "—"
    return "never" if x == math.inf else f"{x:.3f}"


def _diff(x) -> str:
    """A difference of two ratios; inf where one bench's is "never" and the other's is not."""
    return "inf" if x == math.inf else _f(x)


def render_comparison(result: dict, label_a: str = "A", label_b: str = "B") -> str:
    """The comparison as markdown: one row per method and baseline, raw and load-adjusted median
    time ratios of both benches with their differences, then the verdict."""
    tol = result["tolerance"]
    lines = [f"A: {label_a}", f"B: {label_b}", "",
             "| method | time ratio to | raw A | raw B | difference | load-adjusted A | load-adjusted B | difference |",
             "|---|---|---|---|---|---|---|---|"]
    rows: dict[tuple[str, str], dict[str, dict]] = {}
    for r in result["ratios"]:
        rows.setdefault((r["method"], r["baseline"]), {})[r["ratio"].split("_vs_")[0]] = r

    def cells(r: dict | None) -> str:
        if r is None:
            return "— | — | —"
        flag = "" if r["within"] else f" **(> {tol:.2f})**"
        return f"{_f(r['a'])} | {_f(r['b'])} | {_diff(r['diff'])}{flag}"

    lines += [f"| {m} | {base} | " + " | ".join(cells(kinds.get(k)) for k in TIME_RATIOS) + " |"
              for (m, base), kinds in rows.items()]
    lines.append("")
    mismatched = result["mismatched_runs"]
    if mismatched and result.get("ratios_only"):
        runs = len({(m["method"], m["seed"]) for m in mismatched})
        lines.append(f"{len(mismatched)} run figures that no load can move differ, in {runs} runs; with "
                     "--ratios-only they do not decide (another machine's or build's runs are other draws)"
                     + (f"; the first {SHOWN}:" if len(mismatched) > SHOWN else ":"))
        lines += [f"- {m['method']} seed {m['seed']}: {m['field']} {m['a']} against {m['b']}"
                  for m in mismatched[:SHOWN]]
    elif mismatched:
        lines.append(f"{len(mismatched)} run figures that no load can move differ "
                     "(another commit, build, config or machine? --ratios-only compares the ratios alone):")
        lines += [f"- {m['method']} seed {m['seed']}: {m['field']} {m['a']} against {m['b']}"
                  for m in mismatched]
    else:
        lines.append("Steps and tokens to target, and end points: identical for every run.")
    if result["moved_runs"]:
        lines.append(f"Runs whose seconds moved more than {MOVED:.0%} apart from their seed's other arms "
                     f"({result['moved_runs'][0]['seconds']}, B / A over the seed's median):")
        lines += [f"- {m['method']} seed {m['seed']}: {m['shift']:+.1%}" for m in result["moved_runs"]]
    lines += sitting_caveats(result.get("not_one_sitting", {}))
    names = {TIME_RATIOS[0]: "Raw seconds", TIME_RATIOS[1]: "Load-adjusted seconds"}
    for kind, v in result["verdicts"].items():
        w = v["worst"]
        judged = " (what the goals judge)" if kind == result["judged"] else ""
        lines.append(f"{names[kind]}{judged}: {'within' if v['within'] else '**beyond**'} {tol:.2f}; largest "
                     f"difference {w['method']} / {w['baseline']} {_f(w['a'])} against {_f(w['b'])} "
                     f"({_diff(w['diff'])}).")
    which = f" on the {names[result['judged']].lower()}" if result["judged"] else ""
    lines.append(f"The benches agree{which}." if result["within"] else f"The benches do **not** agree{which}.")
    return "\n".join(lines)
