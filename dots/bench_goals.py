"""Where the benchmark issue's goals and the task checks stand on a bench's runs, and the
wall-clock accounting they read (each lockstep group's wall-clock, Prefect's and MLflow's share of it).

Why apart: the goals are the project's claims (a time ratio at most 0.5 with its interval's upper end
below 0.8, the peers, the predictor, the overhead), judged on the summary's figures; the task checks
say whether the embedded task can tell the methods apart at all. Both are read by the table and
written to summary.json as they were judged.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .bench_summary import PEERS, median_of
from .bench_table import interval_detail, with_interval
from .config import TRAITS, Config


def predictor_round_seconds(dataset: str | Path, dim: int = 1536, ref_size: int = 256, hidden: int = 128,
                            repeats: int = 30, threads: int = 2) -> dict:
    """Seconds of one DOTS prediction round over a real pool's size, keys cached.

    The embeddings' values do not change the cost, only their shape: the questions of
    `dataset` are counted and given random `dim`-wide embeddings (1536 = Qwen2.5-Math-1.5B).
    """
    import pyarrow.parquet as pq  # noqa: PLC0415
    import torch  # noqa: PLC0415

    from .predictor import DifficultyPredictor  # noqa: PLC0415

    torch.set_num_threads(threads)
    n = pq.ParquetFile(dataset).metadata.num_rows
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(n, dim, generator=gen)
    predictor = DifficultyPredictor(dim, hidden).eval()
    t = time.perf_counter()
    proj = predictor.project_pool(emb)
    project_s = time.perf_counter() - t
    rng = np.random.default_rng(0)
    times = []
    for _ in range(repeats):
        refs = rng.choice(n, size=ref_size, replace=False)
        labels = rng.random(ref_size)
        t = time.perf_counter()
        predictor.predict_projected(proj, refs, labels)
        times.append(time.perf_counter() - t)
    return {"questions": n, "dim": dim, "ref_size": ref_size, "round_s": float(np.median(times)),
            "round_s_max": float(np.max(times)), "project_once_s": project_s, "threads": threads}


def task_checks(rows: list[dict]) -> list[dict]:
    """Does the task decide? Checked on every grpo seed (the issue's criteria): learning keeps
    moving (at most half of the gain by 20% of the budget), the gain stands above evaluation noise
    (at least 10 standard errors of the metric), and a frontier of half-solved pool questions
    remains (the probe set's share with 0 < pass rate < 1 never falls to 20%)."""
    grpo = [r for r in rows if r["method"] == "grpo"]
    out = []

    def check(name, values, target, ok):
        vals = [v for v in values if v is not None]
        worst = None if not vals else (max(vals) if target.startswith("<=") else min(vals))
        out.append({"check": name, "per_seed": values, "worst": worst, "target": target,
                    "met": bool(vals) and len(vals) == len(values) and all(ok(v) for v in vals)})
    check("grpo gain share in the first 20% of the budget", [r["early_gain_share"] for r in grpo], "<= 0.5",
          lambda v: v <= 0.5)
    check("grpo total gain / standard error of the metric", [r["gain_se"] for r in grpo], ">= 10",
          lambda v: v >= 10)
    check("grpo probe frontier, lowest over the run", [r["frontier_min"] for r in grpo], "> 0.2",
          lambda v: v > 0.2)
    return out


def judged_key(stats: dict, suffix: str = "") -> str:
    """The summary key of the time ratio a goal judges: the load-adjusted one where the bench
    measured the load (`machine_load`: it reproduces between benches where raw seconds did not),
    else raw seconds'."""
    adjusted = f"time_to_target_adjusted_ratio{suffix}"
    return adjusted if stats.get(adjusted) is not None else f"time_to_target_ratio{suffix}"


def judged_time_ratio(stats: dict, suffix: str = "") -> tuple[float | None, list | None, str]:
    """The time ratio a goal judges (`judged_key`: median, interval, detail); the detail gives the
    raw ratio beside the adjusted one."""
    raw_key, key = f"time_to_target_ratio{suffix}", judged_key(stats, suffix)
    raw, raw_ci = stats.get(raw_key), stats.get(f"{raw_key}_ci90")
    if key == raw_key:
        return raw, raw_ci, interval_detail(raw_ci)
    adj, adj_ci = stats[key], stats.get(f"{key}_ci90")
    return adj, adj_ci, f"load-adjusted, {interval_detail(adj_ci)}; raw seconds {with_interval(raw, raw_ci, '.2f')}"


def goal(name: str, value, target: str, met, detail: str = "") -> dict:
    """One line of the goals table: unmet when there is no value to judge."""
    return {"goal": name, "value": value, "target": target, "met": bool(met) if value is not None else False,
            "detail": detail}


def informative_goal(g: dict, dd: dict) -> dict:
    """`dots`'s fresh groups at least 2x as often informative as `grpo`'s, and at least half: counted
    over every group each generated (`fresh_effective_ratio`: a DOTS round's K references, degenerate
    ones included). Runs written before those counts (read back) are judged on the trained groups'
    `effective_ratio`, which leaves out DOTS's degenerate references, and the line says so."""
    key = "fresh_effective_ratio"
    if g.get(key) is None or dd.get(key) is None:
        key = "effective_ratio"
    share = dd[key] / g[key] if g.get(key) and dd.get(key) is not None else None
    detail = "" if share is None else f"dots {dd[key]:.2f}, grpo {g[key]:.2f}" + (
        "" if key == "fresh_effective_ratio" else " (runs without fresh-group counts: the trained groups' "
                                                  "effective ratio, DOTS's degenerate references left out)")
    return goal("dots informative share of fresh groups / grpo's", share, ">= 2 and dots' >= 0.5",
                share is not None and share >= 2 and dd[key] >= 0.5, detail)


def goals(summary: dict, cfg: Config, predictor_round: dict | None, rows: list[dict]) -> list[dict]:
    """Where each goal of the benchmark issue stands on this run."""
    out = []
    d = summary.get("dots_rr", {})
    ratio, ci, detail = judged_time_ratio(d)
    if d.get("update_time_ratio") is not None:  # what bounds it: the update's seconds alone (dots.time_split)
        detail += f"; its update alone {d['update_time_ratio']:.2f} of grpo's time"
    # how many seeds sit on the goal's side: a median of six is the mean of the middle two, and a
    # "yes" with three seeds above the line says less than one with all six below it
    if per_seed := d.get(f"{judged_key(d)}_per_seed"):
        detail += f"; {sum(x <= 0.5 for x in per_seed)} of {len(per_seed)} seeds at or below 0.5"
    out.append(goal("dots_rr time-to-target / grpo (median over seeds)", ratio, "<= 0.5, 90% CI upper < 0.8",
                    ratio is not None and ratio <= 0.5 and ci is not None and ci[1] < 0.8, detail))
    for peer in PEERS:
        ratio, ci, detail = judged_time_ratio(d, f"_vs_{peer}")
        if ratio is not None:
            out.append(goal(f"peer {peer}: dots_rr time-to-target / {peer} (median over seeds)", ratio, "<= 0.8",
                            ratio <= 0.8, detail))
    selecting = [m for m, t in TRAITS.items() if t.selects]  # the methods whose rounds log dots/pearson
    pear, probe, ceiling = (median_of([summary.get(m, {}).get(key) for m in selecting])
                            for key in ("dots_pearson", "probe_pearson", "pearson_ceiling"))
    notes = []
    if ceiling is not None:
        notes.append(f"a predictor knowing the true pass rates would score about {ceiling:.2f} against these "
                     f"labels of G = {cfg.rollout.group_size} samples")
    if probe is not None:
        notes.append(f"on a uniform probe of the pool instead of the selected questions: {probe:.2f}")
    out.append(goal("dots/pearson (median of dots, dots_rr)", pear, ">= 0.8", pear is not None and pear >= 0.8,
                    "; ".join(notes)))
    out.append(informative_goal(summary.get("grpo", {}), summary.get("dots", {})))
    if predictor_round is not None:
        rs = predictor_round["round_s"]
        out.append(goal(f"predictor round over {predictor_round['questions']} questions (s)", rs, "<= 0.1",
                        rs <= 0.1, f"K={predictor_round['ref_size']}, dim {predictor_round['dim']}, "
                                   f"{predictor_round['threads']} threads, keys cached"))
    over = median_of(overhead_shares(rows))
    start = median_of(process_start_shares(rows))
    out.append(goal("Prefect + MLflow share of a training run's wall-clock (median)", over, "<= 0.03",
                    over is not None and over <= 0.03,
                    "" if start is None else
                    f"apart, the seed process's start (spawn and imports, the bench's own): {start:.3f}"))
    return out


def lockstep_groups(rows: list[dict]) -> list[list[dict]]:
    """The rows that share one wall-clock: a seed's runs trained in lockstep, or (on a GPU,
    one after another) each run alone. Rows without a wall-clock are left out."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("wall_s"):
            groups.setdefault((r["seed"], tuple(r.get("lockstep") or [r["method"]])), []).append(r)
    return list(groups.values())


def overhead_shares(rows: list[dict]) -> list[float]:
    """Prefect + MLflow seconds over wall-clock, per lockstep group (a seed's runs share one
    wall-clock and one orchestration figure; each run has its own tracking seconds)."""
    groups = lockstep_groups([r for r in rows if r.get("tracking_s") is not None
                              or r.get("orchestration_s") is not None])
    return [(sum(r["tracking_s"] or 0 for r in g) + max(r["orchestration_s"] or 0 for r in g))
            / max(r["wall_s"] for r in g) for g in groups]


def process_start_shares(rows: list[dict]) -> list[float]:
    """The seed process's start (`process_start_s`, see `train_seed`) over wall-clock, per
    lockstep group that trained in a spawned process; left out of `overhead_shares`, because
    starting a process and importing torch is the bench's cost, not Prefect's or MLflow's."""
    groups = lockstep_groups([r for r in rows if r.get("process_start_s") is not None])
    return [max(r["process_start_s"] for r in g) / max(r["wall_s"] for r in g) for g in groups]


def runs_wall_s(rows: list[dict]) -> float | None:
    """The wall-clock the runs took when they were trained: each lockstep group's (its longest
    run's) summed over groups, read from the runs' own summaries. Unlike `bench_wall_s` (the
    seconds of the invocation that wrote the report), a report re-written later, every run
    read back, keeps it."""
    groups = lockstep_groups(rows)
    return float(sum(max(r["wall_s"] for r in g) for g in groups)) if groups else None
