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
  A method reaches it where its trailing mean of `eval.smooth` evaluations first crosses it,
  read between the evaluations on either side (`runfiles.Crossing`: grpo meets its own end
  point at an evaluation, the others between two, and read at the later one they paid a delay
  grpo did not). The ratio to grpo is taken seed by seed; the median over seeds is
  reported with a 90% percentile-bootstrap interval over the seeds (scipy).
- Load that lockstep cannot cancel (a slow stretch after one arm reached the target and before
  another did) is divided out in a second time figure, `time_to_target_adjusted_s`: every step's
  seconds over its round's load factor, measured with the group's arms as the probe
  (`machine_load`). The goals judge it, with the raw seconds beside. Over six clean-clone benches
  of the same runs it held dots_rr / grpo to 0.81-0.82 (raw 0.80-0.85), but not dapo / grpo
  (1.27-1.41, raw 1.26-1.43): load does not slow every arm's work alike (docs/benchmark.md).
- Beside seconds, costs that machine noise cannot move: response tokens sampled (references
  included) and trained (the tokens the update backpropagates) up to the target, and seconds
  per group trained (with `train.skip_degenerate`, the default, exactly the informative groups;
  with it off, every group of the batch).
- The task itself is checked on every grpo seed (`task_checks`): learning must keep moving
  (at most half of the gain in the first 20% of the budget, a gain of at least 10 standard
  errors of the metric) and the pool must keep a frontier of half-solved questions.
- A run that already finished with the same config and code is read back, not re-trained, and an
  interrupted one resumes from its checkpoint, so a killed bench loses at most one run's
  progress since its last checkpoint.
- A variant (`--variant every4=dots_rr:selection.every=4`) is one of the methods with some
  params changed, trained in the same lockstep group as the methods and reported beside them,
  with its ratios to its own method paired by seed: a switch is judged against the settings
  it would replace under the same load, not against runs timed at another time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from . import time_split
from .atomic import check_writable_folder, write_text
from .bench_goals import goals, predictor_round_seconds, runs_wall_s, task_checks
from .bench_summary import CONFIDENCE, PEER_FIGURES, Variant, baseline_targets, median_of, summarize
from .bench_table import read_back_note, render, resumed_note, runs_resumed
from .provenance import code_identity
from .config import BENCH_METHODS, METHODS, Config, ConfigError, with_overrides
from .machine_load import adjusted_seconds, round_loads
from .pipeline_status import pipeline_runs_ended
from .progress import say
from .runfiles import INFINITY, Crossing, crossing, final_smoothed, json_safe, smoothed, step_seconds
from .workspace_lock import exclusive

RESULTS = Path("results/bench")
SHARED_SECTIONS = ("task", "model", "warmup", "embed", "label", "predictor", "rollout", "selection.ref_size")
SPLIT = time_split.PHASES  # the trainer's timed phases of a step
BENCH_EXCLUDE = ("paths", "train.method", "train.methods", "train.seed", "train.threads", "tracking")


def bench_config(cfg: Config) -> Config:
    """The benchmark keeps its own workspace, `<paths.root>/bench`, beside the pipeline's."""
    return with_overrides(cfg, [f"paths.root={cfg.root / 'bench'}"])


def seed_config(cfg: Config, seed: int) -> Config:
    """A run's config: the bench's, with its seed and the bench's torch threads (`bench.threads`)."""
    return with_overrides(cfg, [f"train.seed={seed}", f"train.threads={cfg.bench.threads}"])


def run_order(methods: list[str], seeds: list[int]) -> list[tuple[int, str]]:
    """Seed by seed, with the method order rotated by one each seed."""
    out = []
    for i, seed in enumerate(seeds):
        k = i % len(methods)
        out.extend((seed, m) for m in methods[k:] + methods[:k])
    return out


def _shared_key(cfg: Config) -> str:
    """The shared stages' params and the dots code that ran them (`provenance.PARTS`): other code
    makes them again."""
    keep = {k: v for k, v in cfg.flat().items() if any(k == s or k.startswith(s + ".") for s in SHARED_SECTIONS)}
    code = code_identity("bench shared stages")
    return json.dumps({**keep, "dots code": code}, sort_keys=True, default=str)


def prepare_shared(cfg: Config) -> dict:
    """Data, warm-up, embeddings, labels and predictor, once for every run (kept when current)."""
    from . import stages  # noqa: PLC0415

    marker = cfg.root / "shared.json"
    key = _shared_key(cfg)
    recorded = json.loads(marker.read_text()) if marker.exists() else None
    if recorded is not None and recorded.get("key") == key and stages.paths(cfg).predictor.exists():
        say(f"bench: shared stages under {cfg.root} are current; reusing them")
        return recorded["info"]
    code = code_identity("bench shared stages")
    if recorded is not None and recorded.get("code") != code:  # the embed stage's cache knows its code
        say(f"bench: shared stages under {cfg.root} were made by other dots code; making them again")
    info = stages.run_shared(cfg)
    write_text(marker, json.dumps(json_safe({"key": key, "code": code, "info": info}), indent=1))
    return info


_LABEL = re.compile(r"[a-z][a-z0-9_]{0,31}")
_FIXED = ("paths", "train.seed", "train.method", "train.methods", "train.steps", "train.device", "tracking")


def parse_variant(text: str, cfg: Config) -> Variant:
    """`LABEL=METHOD:KEY=VALUE[,KEY=VALUE...]` checked against `cfg` before any work starts: a
    bad label, method or key is refused with a message that names it. Refused too: keys the
    shared stages read (the variant would need its own warm-up and predictor: bench it in its
    own `paths.root`), keys every arm must share (seed, steps, paths, tracking), and params
    the method does not read (the variant would be its method's run again)."""
    label, eq, rest = text.partition("=")
    method, colon, sets = rest.partition(":")
    if not eq or not colon or not sets:
        raise ConfigError(f"--variant {text!r}: expected LABEL=METHOD:KEY=VALUE[,KEY=VALUE...], "
                          f"e.g. every4=dots_rr:selection.every=4")
    if not _LABEL.fullmatch(label) or label in METHODS:
        raise ConfigError(f"--variant {text!r}: label {label!r} must be lower-case letters, digits or _ "
                          f"(at most 32, a letter first) and not a method name ({', '.join(METHODS)})")
    if method not in METHODS:
        raise ConfigError(f"--variant {label}: method {method!r} is not one of {', '.join(METHODS)}")
    overrides = tuple(x.strip() for x in sets.split(","))
    keys: set[str] = set()
    for o in overrides:
        key = o.partition("=")[0].strip()
        if "=" not in o or not key:
            raise ConfigError(f"--variant {label}: {o!r} is not KEY=VALUE")
        if key in keys:  # the last would win silently: which value did the user mean?
            raise ConfigError(f"--variant {label}: {key} given twice")
        keys.add(key)
        for group, why in ((SHARED_SECTIONS, "the shared stages read it (give the variant its own "
                                              "-S paths.root and bench it there)"),
                           (_FIXED, "every arm of a bench shares it")):
            if any(key == g or key.startswith(g + ".") for g in group):
                raise ConfigError(f"--variant {label}: {key} cannot vary within a bench: {why}")
    variant = Variant(label, method, overrides)
    vcfg = arm_config(cfg, variant)  # an unknown key or a bad value: ConfigError naming it
    if run_fingerprint(vcfg, 0, method) == run_fingerprint(cfg, 0, method):
        raise ConfigError(f"--variant {label}: {method} does not read {', '.join(overrides)} "
                          f"(or the values are the defaults): the variant would be the {method} run itself")
    return variant


def arm_config(cfg: Config, variant: Variant | None) -> Config:
    """The config one arm trains with: the bench's, with the variant's params when there is one."""
    if variant is None:
        return cfg
    try:
        return with_overrides(cfg, list(variant.overrides))
    except ConfigError as exc:
        raise ConfigError(f"--variant {variant.label}: {exc}") from None


def arms(methods: Sequence[str], variants: Sequence[Variant] = ()) -> list[str]:
    """The bench's arms in table order: the methods, then the variants' labels."""
    return [*methods, *(v.label for v in variants)]


def resolve(cfg: Config, label: str, variants: Sequence[Variant] = ()) -> tuple[str, Config]:
    """(method, config) of an arm."""
    for v in variants:
        if v.label == label:
            return v.method, arm_config(cfg, v)
    return label, cfg


def timing(cfg: Config) -> str:
    """How the bench times a seed's runs: "lockstep" on the CPU, where every method's tiny model
    fits in one process beside the others; "alone", one run after another, on a GPU, where each
    run's model, optimizer and engine are planned to fill the device by themselves. Part of a
    run's key: seconds timed one way are another measurement than seconds timed the other."""
    from .models import resolve_device  # noqa: PLC0415

    return "lockstep" if resolve_device(cfg.train.device).type == "cpu" else "alone"


def run_fingerprint(cfg: Config, seed: int, method: str, group: str = "") -> str:
    """What a run's figures depend on: the params its method reads, its seed, how it was timed
    and, in lockstep, which runs it was timed beside (`group`, see `lockstep_group`)."""
    scfg = seed_config(cfg, seed)
    return scfg.fingerprint(("paths", "train.method", "train.methods", "tracking"), method) + \
        f"/{timing(cfg)}" + (f"-{group}" if group else "")


def lockstep_group(cfg: Config, seed: int, labels: Sequence[str], variants: Sequence[Variant] = ()) -> str:
    """The key of a seed's lockstep group: a hash of every arm's own fingerprint. Part of each
    run's key, because seconds timed beside other runs are another measurement: a bench with
    a variant, or with one method's params changed, trains all its arms anew side by side
    instead of pairing new runs with ones timed at another time. Empty when runs train one
    after another (on a GPU), where a run's seconds depend on itself alone."""
    if timing(cfg) != "lockstep":
        return ""
    keys = sorted(f"{label}:{run_fingerprint(acfg, seed, m)}" for label in labels
                   for m, acfg in [resolve(cfg, label, variants)])
    return hashlib.sha256("|".join(keys).encode()).hexdigest()[:8]


def run_dirs(cfg: Config, seed: int, method: str, group: str = "") -> tuple[Path, Path]:
    """One folder per (method, the params it reads, seed, lockstep group): variants never
    overwrite each other, nor one bench's runs another's."""
    key = f"{run_fingerprint(cfg, seed, method)[:10]}{'-' + group if group else ''}/seed{seed}"
    return cfg.root / "runs" / method / key, cfg.root / "checkpoints" / method / key


def finished_run(cfg: Config, seed: int, method: str, group: str = "") -> dict | None:
    """The summary of a run that already finished with the same config and group and was trained
    by this dots code (`provenance.code_identity("bench run")`: what trains it and makes its shared
    stages; an edit to the bench's report alone reads it back), else None: a run of other code is
    another measurement, trained again in its folder."""
    done = run_dirs(cfg, seed, method, group)[0] / "summary.json"
    if done.exists():
        summary = json.loads(done.read_text())
        if summary.get("bench_fingerprint") == run_fingerprint(cfg, seed, method, group) and \
                summary.get("bench_code") == code_identity("bench run"):
            return summary
    return None


def train_seed(cfg: Config, seed: int, methods: list[str], variants: Sequence[Variant] = (),
               submitted: float | None = None) -> dict[str, dict]:
    """Every arm's run of one seed (`methods` may name variants' labels), trained in lockstep
    (`stages.train_lockstep`: one step of each in turn, so all are timed under the same load;
    on a GPU one after another, see `timing`); finished runs are read back, interrupted ones
    resume from their checkpoints. Returns the summaries by arm.

    `submitted`: the wall-clock time (`time.time()`) at which `run_seed` asked for this seed's
    process. The runs it trains then carry `process_start_s`, the seconds from that moment to
    here, once torch, transformers and the training code are imported: what starting the seed's
    process cost, which is the bench's own (`dots bench` without Prefect pays it too), so the
    flow's orchestration figure leaves it out (`flows.bench.timed_runner`)."""
    from . import stages  # noqa: PLC0415

    started = None if submitted is None else max(0.0, time.time() - submitted)
    out = {}
    resolved = {label: resolve(cfg, label, variants) for label in methods}
    group = lockstep_group(cfg, seed, methods, variants)
    for label, (m, acfg) in resolved.items():
        if (done := finished_run(acfg, seed, m, group)) is not None:
            say(f"bench: {label} seed {seed} already finished; reading it back")
            out[label] = done
    todo = [label for label in methods if label not in out]
    together = [todo] if timing(cfg) == "lockstep" else [[label] for label in todo]  # trained side by side
    for part in (t for t in together if t):
        specs = [stages.LockstepRun(m, *run_dirs(acfg, seed, m, group), seed_config(acfg, seed), label)
                 for label in part for m, acfg in [resolved[label]]]
        for label, summary in stages.train_lockstep(seed_config(cfg, seed), specs, seed_tag=seed).items():
            m, acfg = resolved[label]
            summary["bench_fingerprint"] = run_fingerprint(acfg, seed, m, group)
            summary["bench_code"] = code_identity("bench run")
            summary["process_start_s"] = started
            write_text(run_dirs(acfg, seed, m, group)[0] / "summary.json", json.dumps(json_safe(summary), indent=1))
            out[label] = summary
    return out


def workers(cfg: Config) -> int:
    """How many seeds train at once: `bench.workers` in lockstep on the CPU, one on a GPU (where
    each run is planned to fill the device alone)."""
    return cfg.bench.workers if timing(cfg) == "lockstep" else 1


def run_seed(cfg: Config, seed: int, methods: list[str], variants: Sequence[Variant] = ()) -> dict[str, dict]:
    """`train_seed`, in a process of its own when seeds train side by side (`workers` > 1): each
    process sets its own torch threads and global random states, and a crash in one seed's
    process leaves the others' runs and checkpoints intact. Spawned, not forked, and killed with
    the bench process however it dies (`dots.parent_death`), so a killed bench leaves no seed
    training on as an orphan."""
    if workers(cfg) == 1:
        return train_seed(cfg, seed, methods, variants)
    from .parent_death import pool_dying_with_this_process  # noqa: PLC0415

    submitted = time.time()  # wall-clock, not perf_counter: the child reads it against its own clock
    with pool_dying_with_this_process() as pool:
        return pool.submit(train_seed, cfg, seed, list(methods), list(variants), submitted).result()


def train_seeds(cfg: Config, order: list[tuple[int, list[str]]], variants: Sequence[Variant] = (),
                runner: Callable[..., dict] | None = None) -> None:
    """Every seed's arms, `workers(cfg)` seeds at a time (`runner`, default `run_seed`, once per
    seed). Why two at a time on one thread each: with two torch threads on the two cores, one
    busy neighbour process stalls every parallel op and slowed steps 2-4x, unevenly across
    arms; on one thread it moves them ~5% (docs/benchmark.md), and two single-threaded seeds
    keep both cores busy. A seed that fails does not stop the seeds already training: they
    finish (their runs are kept for the next bench to read back), the seeds not yet started
    are dropped, and the first failure is raised."""
    run = runner or run_seed
    n = workers(cfg)
    if n == 1:
        for i, (seed, mine) in enumerate(order, 1):
            _announced(run, cfg, seed, mine, variants, i, len(order))
        return
    import contextvars  # noqa: PLC0415
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    if cfg.tracking.enabled:  # the MLflow parent exists before the seeds' processes look for it
        from .tracking import Tracker  # noqa: PLC0415

        Tracker(cfg).parent()
    say(f"bench: {len(order)} seeds, {n} at a time, {cfg.bench.threads} torch thread(s) each")
    pool = ThreadPoolExecutor(n)
    try:
        # each seed's call runs in a copy of this context (Prefect's flow run, for its tasks)
        futures = [pool.submit(contextvars.copy_context().run, _announced, run, cfg, seed, mine, variants, i, len(order))
                   for i, (seed, mine) in enumerate(order, 1)]
        for f in futures:
            f.result()
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _announced(run: Callable[..., dict], cfg: Config, seed: int, mine: list[str], variants: Sequence[Variant],
               i: int, n: int) -> dict:
    say(f"bench: seed {seed} ({i}/{n}): {', '.join(mine)} in lockstep")
    return run(cfg, seed, mine, variants)


def seed_loads(cfg: Config, seed: int, labels: Sequence[str], variants: Sequence[Variant] = (),
               group: str = "") -> np.ndarray | None:
    """The load factor of each lockstep round of one seed's arms (`machine_load.round_loads`);
    None where the arms were timed one after another (on a GPU) or are too few to measure it."""
    if timing(cfg) != "lockstep":
        return None
    secs = {}
    for label in labels:
        method, acfg = resolve(cfg, label, variants)
        secs[label] = step_seconds(run_dirs(acfg, seed, method, group)[0])
    return round_loads(secs)


def run_row(cfg: Config, seed: int, label: str, target: float | None, variants: Sequence[Variant] = (),
            group: str = "", loads: np.ndarray | None = None) -> dict:
    """One arm's run of one seed as a table row (its `method` is the arm's label); `loads`: its
    lockstep group's load factors (`seed_loads`), for the load-adjusted time to target."""
    method, cfg = resolve(cfg, label, variants)
    run_dir, _ = run_dirs(cfg, seed, method, group)
    summary = json.loads((run_dir / "summary.json").read_text())
    evals = json.loads((run_dir / "evals.json").read_text())
    def mean(key: str):  # the per-step means the run's summary already holds
        return summary.get(f"mean:{key}")

    hit = crossing(evals, target, cfg.eval.smooth)  # read between evaluations: docs/benchmark.md
    acc = [e["accuracy"] for e in evals]
    early = next((e for e in evals if e["step"] >= 0.2 * cfg.train.steps), evals[-1])
    gain = final_smoothed(evals, cfg.eval.smooth) - acc[0]
    frontier = [e["frontier"] for e in evals if "frontier" in e]
    groups = summary.get("train/groups_trained_total")
    row = {"method": label, "seed": seed, "run_dir": str(run_dir), "target_accuracy": target,
           "time_to_target_s": None if hit is None else hit.of("elapsed_s"),
           "time_to_target_adjusted_s": None if hit is None or loads is None
           else _adjusted_at(hit, step_seconds(run_dir), loads),
           "steps_to_target": None if hit is None else hit.of("step"),
           "tokens_sampled_to_target": None if hit is None else hit.of("tokens_sampled"),
           "tokens_trained_to_target": None if hit is None else hit.of("tokens_trained"),
           "initial_accuracy": acc[0], "final_smoothed": final_smoothed(evals, cfg.eval.smooth), "gain": gain,
           # the smoothed curve against training seconds: accuracy at equal time (`equal_time_differences`)
           "curve_s": [e["elapsed_s"] for e in evals], "curve_smoothed": smoothed(evals, cfg.eval.smooth),
           "early_gain_share": (early["accuracy"] - acc[0]) / gain if gain > 0 else None,
           "gain_se": gain / evals[-1]["accuracy_se"] if evals[-1].get("accuracy_se") else None,
           "frontier_min": min(frontier) if frontier else None,
           "frontier_final": frontier[-1] if frontier else None,
           "s_per_group_trained": summary["elapsed_s"] / groups if groups else None,
           "final_accuracy": summary["final_accuracy"],
           "best_accuracy": max(e["accuracy"] for e in evals), "elapsed_s": summary["elapsed_s"],
           "step_s": mean("time/step_s"), "effective_ratio": mean("train/effective_ratio"),
           "fresh_effective_ratio": summary.get("fresh_effective_ratio"),
           "staleness": mean("replay/staleness_mean"), "dots_pearson": mean("dots/pearson"),
           "probe_pearson": mean("dots/probe_pearson"), "pearson_ceiling": mean("dots/pearson_ceiling"),
           "wall_s": summary.get("wall_s"), "tracking_s": summary.get("tracking_s"),
           "orchestration_s": summary.get("orchestration_s"),
           "process_start_s": summary.get("process_start_s"), "lockstep": summary.get("lockstep"),
           "resumed_at": summary.get("resumed_at", [])}
    row.update({name: mean(key) for name, key in PEER_FIGURES.items()})
    for part in SPLIT:
        row[f"{part}_s"] = mean(f"time/{part}_s")
    row["other_s"] = row["step_s"] - sum(row[f"{p}_s"] for p in SPLIT) if row["step_s"] is not None else None
    row.update(time_split.row_fields(run_dir, hit))
    return row


def _adjusted_at(crossed: Crossing, seconds: list[float], loads: np.ndarray) -> float:
    """Load-adjusted seconds (`adjusted_seconds`) at the crossing, read between the two
    evaluations' steps as the raw seconds are."""
    return crossed.at(*(adjusted_seconds(seconds, loads, n) for n in crossed.steps))


def runs_finished_before(cfg: Config, arms_: list[str], seeds: list[int], began: float,
                         variants: Sequence[Variant] = ()) -> list[str]:
    """`<arm> seed <s>` for each run whose summary was written before `began`: read back from an
    earlier bench in this workspace, not timed by this one. Why say so: a second `dots bench` in
    the same workspace re-reports those runs' seconds, and reads like a second measurement when
    it is the first one again."""
    out, group = [], {s: lockstep_group(cfg, s, arms_, variants) for s in seeds}
    for seed, label in run_order(arms_, seeds):
        method, acfg = resolve(cfg, label, variants)
        done = run_dirs(acfg, seed, method, group[seed])[0] / "summary.json"
        if done.exists() and done.stat().st_mtime < began:
            out.append(f"{label} seed {seed}")
    return out


def report(cfg: Config, methods: list[str], seeds: list[int], out_dir: Path = RESULTS,
           dataset: str | Path | None = None, extra: dict | None = None, variants: Sequence[Variant] = ()) -> dict:
    """Read every finished run, write summary.json, table.md and curves.png under out_dir
    (`methods`: the arms, variants' labels included)."""
    from .plots import learning_curve  # noqa: PLC0415

    targets, group = {}, {s: lockstep_group(cfg, s, methods, variants) for s in seeds}
    for s in seeds:
        g = run_dirs(cfg, s, "grpo", group[s])[0] / "evals.json"
        targets[s] = final_smoothed(json.loads(g.read_text()), cfg.eval.smooth) if g.exists() \
            else cfg.train.target_accuracy
    loads = {s: seed_loads(cfg, s, methods, variants, group[s]) for s in seeds}
    rows = [run_row(cfg, s, m, targets[s], variants, group[s], loads[s]) for s, m in run_order(methods, seeds)]
    own_targets = baseline_targets(rows, variants)
    baseline_rows = {b: [run_row(cfg, s, m, t.get(s), variants, group[s], loads[s])
                         for s, m in run_order(methods, seeds)] for b, t in own_targets.items()}
    summary = summarize(rows, methods, variants, baseline_rows)
    rnd = None
    if dataset is not None and Path(dataset).exists():
        rnd = predictor_round_seconds(dataset, ref_size=256, hidden=cfg.predictor.hidden, threads=cfg.train.threads)
    goal_list = goals(summary, cfg, rnd, rows)
    checks = task_checks(rows)
    table = render(rows, summary, goal_list, methods, checks)
    if read_back := (extra or {}).get("runs_read_back"):
        table += read_back_note(read_back, len(rows), cfg.root)
    if resumed := runs_resumed(rows):
        table += resumed_note(resumed, len(rows), cfg.root)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"date": time.strftime("%Y-%m-%d"), "methods": methods, "seeds": seeds,
              "steps": cfg.train.steps, "targets": targets, "baseline_targets": own_targets,
              "eval_metric": cfg.eval.metric,
              "timing": {"mode": timing(cfg), "workers": workers(cfg), "threads": seed_config(cfg, seeds[0]).train.threads},
              "eval_samples": cfg.eval.samples, "smooth": cfg.eval.smooth, "confidence": CONFIDENCE,
              "summary": summary, "task_checks": checks, "goals": goal_list,
              "predictor_round": rnd, "runs_wall_s": runs_wall_s(rows), "runs": rows, "runs_resumed": resumed,
              "variants": {v.label: {"method": v.method, "overrides": list(v.overrides)} for v in variants},
              **(extra or {})}
    write_text(out_dir / "summary.json", json.dumps(json_safe(result, INFINITY), indent=1))
    write_text(out_dir / "table.md", table + "\n")
    def evals(seed: int, label: str) -> list[dict]:
        method, acfg = resolve(cfg, label, variants)
        return json.loads((run_dirs(acfg, seed, method, group[seed])[0] / "evals.json").read_text())

    curves = {m: [evals(s, m) for s in seeds] for m in methods}
    target = median_of(list(targets.values()))
    learning_curve(curves, target, out_dir / "curves.png")
    if cfg.tracking.enabled:
        from .tracking import log_bench  # noqa: PLC0415

        log_bench(cfg, result, [out_dir / "summary.json", out_dir / "table.md", out_dir / "curves.png"])
    return result


def _twice(values: Sequence) -> list:
    return sorted(v for v, n in Counter(values).items() if n > 1)


def check_seeds_and_methods(cfg: Config, seeds: Sequence[int], methods: Sequence[str]) -> None:
    """Refuse, before the shared stages' minutes, what would fail or collide later: no seed; a seed or
    a method given twice (two processes would train one run folder at once, or a lockstep group would
    hold one arm twice); a seed the run's config refuses (negative: numpy's error names no key)."""
    if not seeds:
        raise ConfigError("--seeds: give at least one seed")
    if dup := _twice(seeds):
        raise ConfigError(f"--seeds: {', '.join(map(str, dup))} given twice; each seed's runs train once")
    if dup := _twice(methods):
        raise ConfigError(f"--methods: {', '.join(dup)} given twice")
    for seed in seeds:
        try:
            seed_config(cfg, seed)
        except ConfigError as exc:
            raise ConfigError(f"--seeds {seed}: {exc}") from None


def writable_out(out_dir: Path) -> None:
    """The report's folder, made now: a file in its place or no right to write there would
    otherwise fail the bench after every run had trained (the runs are kept, the tables not)."""
    try:
        check_writable_folder(out_dir)
    except OSError as exc:
        raise ConfigError(f"--out {out_dir}: cannot write the report there ({exc.strerror or exc})") from None


def check_arguments(cfg: Config, seeds: Sequence[int], methods: Sequence[str] | None,
                    variants: Sequence[Variant], out_dir: Path) -> list[str]:
    """Everything a bench's arguments can be refused for, before the shared stages' minutes (the
    methods to bench: every one of BENCH_METHODS when none are given)."""
    methods = list(methods or BENCH_METHODS)
    if "grpo" not in methods:
        raise ConfigError("--methods: must include grpo (it defines the target)")
    check_seeds_and_methods(cfg, seeds, methods)
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"--variant: labels must differ; got {labels}")
    for v in variants:
        if v.method not in methods:
            raise ConfigError(f"--variant {v.label}: its method {v.method} must be benched too (add it to --methods)")
    writable_out(out_dir)
    return methods


@contextlib.contextmanager
def bench_parent(cfg: Config, variants: Sequence[Variant]) -> Iterator[str]:
    """One MLflow parent for every seed of a bench: DOTS_PIPELINE_ID while the bench runs (its
    seeds' processes inherit it), restored as it was when the bench ends, so that a second bench or
    a by-hand stage in the same process (a test, a notebook) does not log under this one's parent.
    A flow's id, set before, is kept. The key holds the code too: after an edit to what trains its
    runs, a bench trains every run again (`finished_run`) under its own parent; an edit to its
    report alone reads them back under the same one."""
    before = os.environ.get("DOTS_PIPELINE_ID")
    if not cfg.tracking.enabled or before:
        yield before or ""
        return
    from .tracking import git_commit  # noqa: PLC0415

    tag = "".join(f"+{v.label}:{','.join(v.overrides)}" for v in variants)
    variants_tag = f"-{hashlib.sha256(tag.encode()).hexdigest()[:8]}" if tag else ""
    parent = f"bench-{cfg.fingerprint(BENCH_EXCLUDE)}-{git_commit()[:12]}" \
        f"-{code_identity('bench run')[:8]}{variants_tag}"
    os.environ["DOTS_PIPELINE_ID"] = parent
    try:
        yield parent
    finally:
        if before is None:
            os.environ.pop("DOTS_PIPELINE_ID", None)
        else:
            os.environ["DOTS_PIPELINE_ID"] = before


def run_bench(cfg: Config, seeds: list[int], methods: list[str] | None = None, out_dir: Path = RESULTS,
              dataset: str | Path | None = None,
              runner: Callable[..., dict] | None = None, variants: Sequence[Variant] = (),
              shared: Callable[[Config], dict] | None = None) -> dict:
    """Shared stages once, then each seed's runs of every method (and variant) in lockstep, then
    the report. `runner(cfg, seed, arms, variants)` and `shared(cfg)` let the Prefect flow wrap
    each seed and the shared stages in tasks, after the arguments are checked (the flow ran its
    shared stages first, so a seed given twice was refused only after their minutes); by default
    they are direct calls."""
    methods = check_arguments(cfg, seeds, methods, variants, Path(out_dir))
    if dataset is not None and not Path(dataset).exists():
        say(f"bench: --dataset {dataset}: no such file; the predictor round will not be timed")
    all_arms = arms(methods, variants)
    # a second bench of this workspace waits: two would train the same run folders at once; a bench
    # that fails marks its MLflow parent FAILED (it stayed RUNNING), a bench run again finishes it
    with bench_parent(cfg, variants) as parent, \
            exclusive(cfg.root, f"bench of seeds {' '.join(map(str, seeds))} ({' '.join(all_arms)})"), \
            pipeline_runs_ended(cfg, parent):
        start, began = time.perf_counter(), time.time()  # after any wait: its seconds are not the bench's
        (shared or prepare_shared)(cfg)
        order = run_order(all_arms, seeds)
        train_seeds(cfg, [(seed, [m for s, m in order if s == seed]) for seed in seeds], variants, runner)
        extra = {"bench_wall_s": time.perf_counter() - start,
                 "runs_read_back": runs_finished_before(cfg, all_arms, seeds, began, variants)}
        result = report(cfg, all_arms, seeds, out_dir, dataset, extra, variants)
    say(Path(out_dir / "table.md").read_text())
    return result
