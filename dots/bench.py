"""The side-by-side benchmark (`make bench`): grpo, dots, rr and dots_rr, and the peer baselines
dapo and greso, on the embedded default over several seeds, in lockstep, with one summary, one
table and one plot.

Why it is built this way:
- Every method shares the model, pool, warm-up, predictor, batch size, learning rate and
  step budget: the shared stages run once, then only `train.seed` and `train.method` vary.
- A seed's runs of every method train in lockstep, one step of each in turn in one process
  (`stages.train_lockstep`), so that a slower half-minute of a shared, noisy machine hits
  every method alike and cancels in the paired ratios. Run one after another, it did not:
  two benches of one commit gave time ratios 0.18 apart. Each run keeps its own random
  states, so steps and tokens are those of the run trained alone. The method order within a
  round of steps rotates with the seed.
- The target of seed s is grpo's final accuracy at its step budget with seed s, smoothed:
  the mean of its last `eval.smooth` evaluations, so that one noisy evaluation cannot set it.
  A method reaches it at the first evaluation whose trailing mean of `eval.smooth`
  evaluations does. The ratio to grpo is taken seed by seed; the median over seeds is
  reported with a 90% percentile-bootstrap interval over the seeds (scipy).
- Beside seconds, costs that machine noise cannot move: response tokens sampled (references
  included) and trained (the informative groups' tokens the update backpropagates) up to the
  target, and seconds per informative group trained.
- The task itself is checked on every grpo seed (`task_checks`): learning must keep moving
  (at most half of the gain in the first 20% of the budget, a gain of at least 10 standard
  errors of the metric) and the pool must keep a frontier of half-solved questions.
- A run that already finished with the same config is read back, not re-trained, and an
  interrupted one resumes from its checkpoint, so a killed bench loses at most one run's
  progress since its last checkpoint.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .atomic import write_text
from .config import METHODS, Config, apply_overrides
from .progress import say
from .runfiles import json_safe
from .runfiles import final_smoothed, target_eval

RESULTS = Path("results/bench")
SHARED_SECTIONS = ("task", "model", "warmup", "embed", "label", "predictor", "rollout", "selection.ref_size")
SPLIT = ("rollout", "update", "select")
BENCH_EXCLUDE = ("paths", "train.method", "train.methods", "train.seed", "train.threads", "tracking")


def bench_config(cfg: Config) -> Config:
    """The benchmark keeps its own workspace, `<paths.root>/bench`, beside the pipeline's."""
    return Config.model_validate(apply_overrides(cfg.model_dump(), [f"paths.root={cfg.root / 'bench'}"]))


def seed_config(cfg: Config, seed: int) -> Config:
    return Config.model_validate(apply_overrides(cfg.model_dump(), [f"train.seed={seed}"]))


def run_order(methods: list[str], seeds: list[int]) -> list[tuple[int, str]]:
    """Seed by seed, with the method order rotated by one each seed."""
    out = []
    for i, seed in enumerate(seeds):
        k = i % len(methods)
        out.extend((seed, m) for m in methods[k:] + methods[:k])
    return out


def _shared_key(cfg: Config) -> str:
    keep = {k: v for k, v in cfg.flat().items() if any(k == s or k.startswith(s + ".") for s in SHARED_SECTIONS)}
    return json.dumps(keep, sort_keys=True, default=str)


def prepare_shared(cfg: Config) -> dict:
    """Data, warm-up, embeddings, labels and predictor, once for every run (kept when current)."""
    from . import stages  # noqa: PLC0415

    marker = cfg.root / "shared.json"
    key = _shared_key(cfg)
    if marker.exists() and json.loads(marker.read_text()).get("key") == key and stages.paths(cfg).predictor.exists():
        say(f"bench: shared stages under {cfg.root} are current; reusing them")
        return json.loads(marker.read_text())["info"]
    info = stages.run_shared(cfg)
    write_text(marker, json.dumps(json_safe({"key": key, "info": info}), indent=1))
    return info


# Sections a method's training does not read: a grpo run is the same run whatever the
# selection or replay params, so variants of those reuse it instead of training it again.
_DOTS = ("selection", "embed", "label", "predictor")
PEERS = ("dapo", "greso")  # the peer baselines dots is measured against beside grpo
UNUSED = {"grpo": (*_DOTS, "replay", *PEERS), "dots": ("replay", *PEERS), "rr": (*_DOTS, *PEERS),
          "dots_rr": PEERS, "dapo": (*_DOTS, "replay", "greso"), "greso": (*_DOTS, "replay", "dapo")}


def timing(cfg: Config) -> str:
    """How the bench times a seed's runs: "lockstep" on the CPU, where every method's tiny model
    fits in one process beside the others; "alone", one run after another, on a GPU, where each
    run's model, optimizer and engine are planned to fill the device by themselves. Part of a
    run's key: seconds timed one way are another measurement than seconds timed the other."""
    from .models import resolve_device  # noqa: PLC0415

    return "lockstep" if resolve_device(cfg.train.device).type == "cpu" else "alone"


def run_fingerprint(cfg: Config, seed: int, method: str) -> str:
    scfg = seed_config(cfg, seed)
    return scfg.fingerprint(("paths", "train.method", "train.methods", "tracking", *UNUSED[method])) + f"/{timing(cfg)}"


def run_dirs(cfg: Config, seed: int, method: str) -> tuple[Path, Path]:
    """One folder per (method, the params it reads, seed): variants never overwrite each other."""
    key = f"{run_fingerprint(cfg, seed, method)[:10]}/seed{seed}"
    return cfg.root / "runs" / method / key, cfg.root / "checkpoints" / method / key


def finished_run(cfg: Config, seed: int, method: str) -> dict | None:
    """The summary of a run that already finished with the same config, else None."""
    done = run_dirs(cfg, seed, method)[0] / "summary.json"
    if done.exists():
        summary = json.loads(done.read_text())
        if summary.get("bench_fingerprint") == run_fingerprint(cfg, seed, method):
            return summary
    return None


def train_seed(cfg: Config, seed: int, methods: list[str]) -> dict[str, dict]:
    """Every method's run of one seed, trained in lockstep (`stages.train_lockstep`: one step
    of each in turn, so all are timed under the same load; on a GPU one after another, see
    `timing`); finished runs are read back, interrupted ones resume from their checkpoints."""
    from . import stages  # noqa: PLC0415

    out = {}
    for m in methods:
        if (done := finished_run(cfg, seed, m)) is not None:
            say(f"bench: {m} seed {seed} already finished; reading it back")
            out[m] = done
    todo = [m for m in methods if m not in out]
    groups = [todo] if timing(cfg) == "lockstep" else [[m] for m in todo]
    for group in (g for g in groups if g):
        specs = [(m, *run_dirs(cfg, seed, m)) for m in group]
        for m, summary in stages.train_lockstep(seed_config(cfg, seed), specs, seed_tag=seed).items():
            summary["bench_fingerprint"] = run_fingerprint(cfg, seed, m)
            write_text(run_dirs(cfg, seed, m)[0] / "summary.json", json.dumps(json_safe(summary), indent=1))
            out[m] = summary
    return out


def run_row(cfg: Config, seed: int, method: str, target: float | None) -> dict:
    run_dir, _ = run_dirs(cfg, seed, method)
    summary = json.loads((run_dir / "summary.json").read_text())
    evals = json.loads((run_dir / "evals.json").read_text())
    def mean(key: str):  # the per-step means the run's summary already holds
        return summary.get(f"mean:{key}")

    hit = target_eval(evals, target, cfg.eval.smooth)
    acc = [e["accuracy"] for e in evals]
    early = next((e for e in evals if e["step"] >= 0.2 * cfg.train.steps), evals[-1])
    gain = final_smoothed(evals, cfg.eval.smooth) - acc[0]
    frontier = [e["frontier"] for e in evals if "frontier" in e]
    groups = summary.get("train/groups_trained_total")
    row = {"method": method, "seed": seed, "target_accuracy": target,
           "time_to_target_s": None if hit is None else float(hit["elapsed_s"]),
           "steps_to_target": None if hit is None else int(hit["step"]),
           "tokens_sampled_to_target": None if hit is None else hit.get("tokens_sampled"),
           "tokens_trained_to_target": None if hit is None else hit.get("tokens_trained"),
           "initial_accuracy": acc[0], "final_smoothed": final_smoothed(evals, cfg.eval.smooth), "gain": gain,
           "early_gain_share": (early["accuracy"] - acc[0]) / gain if gain > 0 else None,
           "gain_se": gain / evals[-1]["accuracy_se"] if evals[-1].get("accuracy_se") else None,
           "frontier_min": min(frontier) if frontier else None,
           "frontier_final": frontier[-1] if frontier else None,
           "s_per_group_trained": summary["elapsed_s"] / groups if groups else None,
           "final_accuracy": summary["final_accuracy"],
           "best_accuracy": max(e["accuracy"] for e in evals), "elapsed_s": summary["elapsed_s"],
           "step_s": mean("time/step_s"), "effective_ratio": mean("train/effective_ratio"),
           "staleness": mean("replay/staleness_mean"), "dots_pearson": mean("dots/pearson"),
           "probe_pearson": mean("dots/probe_pearson"),
           "wall_s": summary.get("wall_s"), "tracking_s": summary.get("tracking_s"),
           "orchestration_s": summary.get("orchestration_s"), "lockstep": summary.get("lockstep")}
    row.update({name: mean(key) for name, key in PEER_FIGURES.items()})
    for part in SPLIT:
        row[f"{part}_s"] = mean(f"time/{part}_s")
    row["other_s"] = row["step_s"] - sum(row[f"{p}_s"] for p in SPLIT) if row["step_s"] is not None else None
    return row


# the peer baselines' sampling figures: per-step means the run's summary holds (None for other methods)
PEER_FIGURES = {"rollouts_per_step": "sampling/rollouts", "gen_batches": "sampling/gen_batches",
                "short_share": "sampling/short", "skip_prob": "greso/skip_prob_mean"}


def _median(vals: list) -> float | None:
    vals = [v for v in vals if v is not None]
    return float(np.median(vals)) if vals else None


def _spread(vals: list) -> list | None:
    vals = [v for v in vals if v is not None]
    return [float(min(vals)), float(max(vals))] if vals else None


MEDIAN_KEYS = ("time_to_target_s", "steps_to_target", "tokens_sampled_to_target", "tokens_trained_to_target",
               "final_accuracy", "final_smoothed", "step_s", "rollout_s", "update_s", "select_s", "other_s",
               "effective_ratio", "staleness", "dots_pearson", "probe_pearson", "s_per_group_trained", "frontier_min",
               *PEER_FIGURES)
RATIOS = (("time_to_target_s", "time_to_target_ratio"), ("steps_to_target", "steps_to_target_ratio"),
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
    lo, hi = (float(x) for x in (res.confidence_interval.low, res.confidence_interval.high))
    return [lo if lo <= top else float("inf"), hi if hi <= top else float("inf")]


def _paired_ratio(mine: float | None, base: float | None) -> float | None:
    """mine / base for one seed; a run that never reaches the target counts as infinitely slow
    (so it weighs in the median), and a target already met at step 0 by both is a tie."""
    if base is None:
        return None
    if mine is None:
        return float("inf")
    if base == 0:
        return 1.0 if mine == 0 else float("inf")
    return mine / base


def paired_ratios(mine: list[dict], base: list[dict], key: str) -> dict:
    """Seed-paired ratios of `key` (mine / base): their median, the per-seed values and a 90%
    bootstrap interval of the median."""
    by_seed = {r["seed"]: r for r in base}
    ratios = [_paired_ratio(r[key], by_seed[r["seed"]][key] if r["seed"] in by_seed else None) for r in mine]
    ratios = [x for x in ratios if x is not None]
    return {"median": float(np.median(ratios)) if ratios else None, "per_seed": ratios,
            "ci90": median_interval(ratios)}


def summarize(rows: list[dict], methods: list[str]) -> dict:
    """Per method: medians over seeds, their min–max spread, seed-paired ratios to grpo and, where
    the peer baselines ran, to each peer (`<ratio>_vs_<peer>`)."""
    runs = {m: [r for r in rows if r["method"] == m] for m in methods}
    grpo = runs.get("grpo", [])
    peers = [p for p in PEERS if p in methods]
    out: dict[str, dict] = {}
    for m in methods:
        mine = runs[m]
        stats: dict = {"seeds": [r["seed"] for r in mine],
                       "reached_target": sum(r["time_to_target_s"] is not None for r in mine)}
        for k in MEDIAN_KEYS:
            stats[k] = _median([r.get(k) for r in mine])
            stats[f"{k}_spread"] = _spread([r.get(k) for r in mine])
        for base, suffix in [(grpo, "")] + [(runs[p], f"_vs_{p}") for p in peers]:
            for key, name in RATIOS:
                pr = paired_ratios(mine, base, key)
                stats[name + suffix] = pr["median"]
                stats[f"{name}{suffix}_per_seed"] = pr["per_seed"]
                stats[f"{name}{suffix}_ci90"] = pr["ci90"]
        out[m] = stats
    return out


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


def goals(summary: dict, cfg: Config, predictor_round: dict | None, rows: list[dict]) -> list[dict]:
    """Where each goal of the benchmark issue stands on this run."""
    def goal(name, value, target, met, detail=""):
        return {"goal": name, "value": value, "target": target, "met": bool(met) if value is not None else False,
                "detail": detail}

    out = []
    d = summary.get("dots_rr", {})
    ratio, ci = d.get("time_to_target_ratio"), d.get("time_to_target_ratio_ci90")
    out.append(goal("dots_rr time-to-target / grpo (median over seeds)", ratio, "<= 0.5, 90% CI upper < 0.8",
                    ratio is not None and ratio <= 0.5 and ci is not None and ci[1] < 0.8, _ci_detail(ci)))
    for peer in PEERS:
        ratio, ci = d.get(f"time_to_target_ratio_vs_{peer}"), d.get(f"time_to_target_ratio_vs_{peer}_ci90")
        if ratio is not None:
            out.append(goal(f"peer {peer}: dots_rr time-to-target / {peer} (median over seeds)", ratio, "<= 0.8",
                            ratio <= 0.8, _ci_detail(ci)))
    pear = _median([summary.get(m, {}).get("dots_pearson") for m in ("dots", "dots_rr")])
    probe = _median([summary.get(m, {}).get("probe_pearson") for m in ("dots", "dots_rr")])
    out.append(goal("dots/pearson (median of dots, dots_rr)", pear, ">= 0.8", pear is not None and pear >= 0.8,
                    "" if probe is None else f"on a uniform probe of the pool instead of the selected questions: "
                                             f"{probe:.2f}"))
    g, dd = summary.get("grpo", {}), summary.get("dots", {})
    share = (dd["effective_ratio"] / g["effective_ratio"]) if g.get("effective_ratio") and dd.get(
        "effective_ratio") is not None else None
    out.append(goal("dots informative share of fresh groups / grpo's", share, ">= 2 and dots' >= 0.5",
                    share is not None and share >= 2 and dd["effective_ratio"] >= 0.5,
                    "" if share is None else f"dots {dd['effective_ratio']:.2f}, grpo {g['effective_ratio']:.2f}"))
    if predictor_round is not None:
        rs = predictor_round["round_s"]
        out.append(goal(f"predictor round over {predictor_round['questions']} questions (s)", rs, "<= 0.1",
                        rs <= 0.1, f"K={predictor_round['ref_size']}, dim {predictor_round['dim']}, "
                                   f"{predictor_round['threads']} threads, keys cached"))
    over = _median(overhead_shares(rows))
    out.append(goal("Prefect + MLflow share of a training run's wall-clock (median)", over, "<= 0.03",
                    over is not None and over <= 0.03))
    return out


def overhead_shares(rows: list[dict]) -> list[float]:
    """Prefect + MLflow seconds over wall-clock, per lockstep group (a seed's runs share one
    wall-clock and one orchestration figure; each run has its own tracking seconds)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("wall_s") and (r.get("tracking_s") is not None or r.get("orchestration_s") is not None):
            groups.setdefault((r["seed"], tuple(r.get("lockstep") or [r["method"]])), []).append(r)
    return [(sum(r["tracking_s"] or 0 for r in g) + max(r["orchestration_s"] or 0 for r in g))
            / max(r["wall_s"] for r in g) for g in groups.values()]


def _f(v, fmt: str) -> str:
    if v is None:
        return "—"
    if isinstance(v, float) and not np.isfinite(v):
        return "never"
    return format(v, fmt)


def _ci_detail(ci) -> str:
    return "" if ci is None else f"90% CI {_f(ci[0], '.2f')}–{_f(ci[1], '.2f')}"


def _ci(v, ci, fmt: str) -> str:
    return _f(v, fmt) + ("" if not ci else f" [{_f(ci[0], fmt)}–{_f(ci[1], fmt)}]")


def render(rows: list[dict], summary: dict, goal_list: list[dict], methods: list[str],
           checks: list[dict] | None = None) -> str:
    head = ("| method | seed | time-to-target (s) | steps | tokens sampled | tokens trained | final acc "
            "| step (s) | rollout | update | select | s / informative group | effective ratio | staleness "
            "| dots/pearson |")
    lines = ["Per run (target = grpo's mean of its last evaluations, same seed):", "", head, "|" + "---|" * 15]
    for r in sorted(rows, key=lambda r: (methods.index(r["method"]), r["seed"])):
        lines.append(f"| {r['method']} | {r['seed']} | {_f(r['time_to_target_s'], '.1f')} | "
                     f"{_f(r['steps_to_target'], 'd')} | {_f(r['tokens_sampled_to_target'], ',d')} | "
                     f"{_f(r['tokens_trained_to_target'], ',d')} | {_f(r['final_smoothed'], '.3f')} | "
                     f"{_f(r['step_s'], '.3f')} | {_f(r['rollout_s'], '.3f')} | {_f(r['update_s'], '.3f')} | "
                     f"{_f(r['select_s'], '.3f')} | {_f(r['s_per_group_trained'], '.4f')} | "
                     f"{_f(r['effective_ratio'], '.2f')} | {_f(r['staleness'], '.1f')} | "
                     f"{_f(r['dots_pearson'], '.2f')} |")
    lines += ["", "Medians over seeds; ratios to grpo are paired by seed, with 90% bootstrap intervals:", "",
              "| method | time ratio | steps ratio | tokens-sampled ratio | tokens-trained ratio | time-to-target (s) "
              "| final acc | step (s) | s / informative group | effective ratio | staleness | dots/pearson "
              "| reached |", "|" + "---|" * 13]
    for m in methods:
        s = summary[m]
        lines.append(f"| {m} | " + " | ".join(_ci(s[n], s.get(f"{n}_ci90"), ".2f") for _, n in RATIOS) +
                     f" | {_f(s['time_to_target_s'], '.1f')} | {_f(s['final_smoothed'], '.3f')} | "
                     f"{_f(s['step_s'], '.3f')} | {_f(s['s_per_group_trained'], '.4f')} | "
                     f"{_f(s['effective_ratio'], '.2f')} | {_f(s['staleness'], '.1f')} | "
                     f"{_f(s['dots_pearson'], '.2f')} | {s['reached_target']}/{len(s['seeds'])} |")
    peers = [p for p in PEERS if p in methods]
    if peers:
        lines += ["", "Against the peer baselines: ratios paired by seed, with 90% bootstrap intervals:", "",
                  "| method | " + " | ".join(f"{label} / {p}" for p in peers for label in
                                            ("time", "tokens sampled", "tokens trained")) + " |",
                  "|" + "---|" * (1 + 3 * len(peers))]
        for m in methods:
            s = summary[m]
            cells = [_ci(s[f"{n}_vs_{p}"], s.get(f"{n}_vs_{p}_ci90"), ".2f") for p in peers
                     for n in ("time_to_target_ratio", "tokens_sampled_ratio", "tokens_trained_ratio")]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines += ["", "How the peers sample (medians of per-step means over seeds):", "",
                  "| method | generation batches / step | groups rolled out / step | short steps | "
                  "GRESO skip probability |", "|---|---|---|---|---|"]
        for m in methods:
            s = summary[m]
            if s.get("rollouts_per_step") is None:
                continue
            lines.append(f"| {m} | {_f(s['gen_batches'], '.2f')} | {_f(s['rollouts_per_step'], '.1f')} | "
                         f"{_f(s['short_share'], '.3f')} | {_f(s['skip_prob'], '.3f')} |")
    if checks:
        lines += ["", "Does the task decide? (grpo, every seed)", "", "| check | per seed | target | met |",
                  "|---|---|---|---|"]
        for c in checks:
            per = ", ".join(_f(v, ".2f") for v in c["per_seed"])
            lines.append(f"| {c['check']} | {per} | {c['target']} | {'yes' if c['met'] else 'no'} |")
    lines += ["", "Goals:", "", "| goal | measured | target | met |", "|---|---|---|---|"]
    for g in goal_list:
        detail = f" ({g['detail']})" if g["detail"] else ""
        lines.append(f"| {g['goal']} | {_f(g['value'], '.3f')}{detail} | {g['target']} | "
                     f"{'yes' if g['met'] else 'no'} |")
    return "\n".join(lines)


def report(cfg: Config, methods: list[str], seeds: list[int], out_dir: Path = RESULTS,
           dataset: str | Path | None = None, extra: dict | None = None) -> dict:
    """Read every finished run, write summary.json, table.md and curves.png under out_dir."""
    from .plots import learning_curve  # noqa: PLC0415

    targets = {}
    for s in seeds:
        g = run_dirs(cfg, s, "grpo")[0] / "evals.json"
        targets[s] = final_smoothed(json.loads(g.read_text()), cfg.eval.smooth) if g.exists() \
            else cfg.train.target_accuracy
    rows = [run_row(cfg, s, m, targets[s]) for s, m in run_order(methods, seeds)]
    summary = summarize(rows, methods)
    rnd = None
    if dataset is not None and Path(dataset).exists():
        rnd = predictor_round_seconds(dataset, ref_size=256, hidden=cfg.predictor.hidden, threads=cfg.train.threads)
    goal_list = goals(summary, cfg, rnd, rows)
    checks = task_checks(rows)
    table = render(rows, summary, goal_list, methods, checks)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"date": time.strftime("%Y-%m-%d"), "methods": methods, "seeds": seeds,
              "steps": cfg.train.steps, "targets": targets, "eval_metric": cfg.eval.metric,
              "eval_samples": cfg.eval.samples, "smooth": cfg.eval.smooth, "confidence": CONFIDENCE,
              "summary": summary, "task_checks": checks, "goals": goal_list,
              "predictor_round": rnd, "runs": rows, **(extra or {})}
    write_text(out_dir / "summary.json", json.dumps(json_safe(result), indent=1))
    write_text(out_dir / "table.md", table + "\n")
    curves = {m: [json.loads((run_dirs(cfg, s, m)[0] / "evals.json").read_text()) for s in seeds] for m in methods}
    target = _median(list(targets.values()))
    learning_curve(curves, target, out_dir / "curves.png")
    if cfg.tracking.enabled:
        from .tracking import log_bench  # noqa: PLC0415

        log_bench(cfg, result, [out_dir / "summary.json", out_dir / "table.md", out_dir / "curves.png"])
    return result


def run_bench(cfg: Config, seeds: list[int], methods: list[str] | None = None, out_dir: Path = RESULTS,
              dataset: str | Path | None = None,
              runner: Callable[[Config, int, list[str]], dict] | None = None) -> dict:
    """Shared stages once, then each seed's runs of every method in lockstep, then the report.
    `runner` lets the Prefect flow wrap each seed in a task; by default they are direct calls."""
    methods = list(methods or METHODS)
    if "grpo" not in methods:
        raise ValueError("bench: methods must include grpo (it defines the target)")
    if cfg.tracking.enabled and "DOTS_PIPELINE_ID" not in os.environ:  # one MLflow parent for every seed
        from .tracking import git_commit  # noqa: PLC0415

        os.environ["DOTS_PIPELINE_ID"] = f"bench-{cfg.fingerprint(BENCH_EXCLUDE)}-{git_commit()[:12]}"
    start = time.perf_counter()
    prepare_shared(cfg)
    order = run_order(methods, seeds)
    for i, seed in enumerate(seeds, 1):
        mine = [m for s, m in order if s == seed]
        say(f"bench: seed {seed} ({i}/{len(seeds)}): {', '.join(mine)} in lockstep")
        (runner or train_seed)(cfg, seed, mine)
    result = report(cfg, methods, seeds, out_dir, dataset, {"bench_wall_s": time.perf_counter() - start})
    say(Path(out_dir / "table.md").read_text())
    return result
