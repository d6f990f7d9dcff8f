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
- A run that already finished with the same config is read back, not re-trained, and an
  interrupted one resumes from its checkpoint, so a killed bench loses at most one run's
  progress since its last checkpoint.
- A variant (`--variant every4=dots_rr:selection.every=4`) is one of the methods with some
  params changed, trained in the same lockstep group as the methods and reported beside them,
  with its ratios to its own method paired by seed: a switch is judged against the settings
  it would replace under the same load, not against runs timed at another time.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from . import time_split
from .atomic import check_writable_folder, write_text
from .config import BENCH_METHODS, METHODS, TRAITS, Config, ConfigError, with_overrides
from .machine_load import adjusted_seconds, round_loads
from .progress import say
from .runfiles import json_safe
from .runfiles import (Crossing, crossing, equal_time_difference, final_smoothed, resumed_label, smoothed,
                       step_seconds)
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
UNUSED = {m: (*(() if t.selects else _DOTS), *(() if t.replays else ("replay",)),
              *(p for p in PEERS if p != t.filters)) for m, t in TRAITS.items()}


class Variant(NamedTuple):
    """A method with some params changed, benched beside the methods as its own arm."""
    label: str
    method: str
    overrides: tuple[str, ...]


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


def peer_arms(methods: Sequence[str], variant_of: dict[str, str | None]) -> list[str]:
    """The arms every arm is paired with as a peer baseline (`<ratio>_vs_<arm>`): dapo and greso,
    and their variants, e.g. greso at the learning rate that suits dots_rr too, so that dots_rr at
    its better setting meets each peer at its own (against grpo's target, as every arm)."""
    return [m for m in methods if m in PEERS or variant_of.get(m) in PEERS]


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
    return scfg.fingerprint(("paths", "train.method", "train.methods", "tracking", *UNUSED[method]), method) + \
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
    """The summary of a run that already finished with the same config and group, else None."""
    done = run_dirs(cfg, seed, method, group)[0] / "summary.json"
    if done.exists():
        summary = json.loads(done.read_text())
        if summary.get("bench_fingerprint") == run_fingerprint(cfg, seed, method, group):
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


# the peer baselines' sampling figures: per-step means the run's summary holds (None for other methods)
PEER_FIGURES = {"rollouts_per_step": "sampling/rollouts", "gen_batches": "sampling/gen_batches",
                "short_share": "sampling/short", "skip_prob": "greso/skip_prob_mean"}


def _median(vals: list) -> float | None:
    vals = [v for v in vals if v is not None]
    return float(np.median(vals)) if vals else None


def _spread(vals: list) -> list | None:
    vals = [v for v in vals if v is not None]
    return [float(min(vals)), float(max(vals))] if vals else None


MEDIAN_KEYS = ("time_to_target_s", "time_to_target_adjusted_s", "steps_to_target", "tokens_sampled_to_target", "tokens_trained_to_target",
               "final_accuracy", "final_smoothed", "step_s", "rollout_s", "update_s", "select_s", "other_s",
               "effective_ratio", "staleness", "dots_pearson", "probe_pearson", "pearson_ceiling", "s_per_group_trained",
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
    ratios = [_paired_ratio(r.get(key), by_seed[r["seed"]].get(key) if r["seed"] in by_seed else None)
              for r in mine]
    return _paired([x for x in ratios if x is not None])


def _paired(values: list[float]) -> dict:
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
    return _paired([float(r[key] - by_seed[r["seed"]][key]) for r in mine
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
    return _paired(diffs)


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

    runs = by_arm(rows)
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
            stats[k] = _median([r.get(k) for r in mine])
            stats[f"{k}_spread"] = _spread([r.get(k) for r in mine])
        own = [v.method] if v is not None and v.method in runs and v.method not in peers else []
        bases = [*peers, *own, *(b for b in other_bases if b != m)]
        pairs = [(mine, grpo, "")]
        for b in bases:
            arm_rows = runs_vs.get(b, runs)
            pairs.append((arm_rows[m], arm_rows[b], f"_vs_{b}"))
        for mine_b, base, suffix in pairs:
            figures = [(name, paired_ratios(mine_b, base, key)) for key, name in RATIOS]
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
        return raw, raw_ci, _ci_detail(raw_ci)
    adj, adj_ci = stats[key], stats.get(f"{key}_ci90")
    return adj, adj_ci, f"load-adjusted, {_ci_detail(adj_ci)}; raw seconds {_ci(raw, raw_ci, '.2f')}"


def goals(summary: dict, cfg: Config, predictor_round: dict | None, rows: list[dict]) -> list[dict]:
    """Where each goal of the benchmark issue stands on this run."""
    def goal(name, value, target, met, detail=""):
        return {"goal": name, "value": value, "target": target, "met": bool(met) if value is not None else False,
                "detail": detail}

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
    pear, probe, ceiling = (_median([summary.get(m, {}).get(key) for m in selecting])
                            for key in ("dots_pearson", "probe_pearson", "pearson_ceiling"))
    notes = []
    if ceiling is not None:
        notes.append(f"a predictor knowing the true pass rates would score about {ceiling:.2f} against these "
                     f"labels of G = {cfg.rollout.group_size} samples")
    if probe is not None:
        notes.append(f"on a uniform probe of the pool instead of the selected questions: {probe:.2f}")
    out.append(goal("dots/pearson (median of dots, dots_rr)", pear, ">= 0.8", pear is not None and pear >= 0.8,
                    "; ".join(notes)))
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
    start = _median(process_start_shares(rows))
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


def _end_point(stats: dict, suffix: str = "") -> str:
    """The paired end-point difference and its interval, signed (`paired_differences`)."""
    return _ci(stats.get(f"end_point_diff{suffix}"), stats.get(f"end_point_diff{suffix}_ci90"), "+.3f")


def _equal_time(stats: dict, suffix: str = "") -> str:
    """The paired accuracy difference at equal seconds and its interval (`equal_time_differences`)."""
    return _ci(stats.get(f"equal_time_diff{suffix}"), stats.get(f"equal_time_diff{suffix}_ci90"), "+.3f")


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
        cells = [_ci(s.get(f"{n}_vs_{b}"), s.get(f"{n}_vs_{b}_ci90"), ".2f") for b in bases
                 for n in ("time_to_target_ratio", "time_to_target_adjusted_ratio", "tokens_sampled_ratio",
                           "tokens_trained_ratio")]
        cells += [f(s, f"_vs_{b}") for b in bases for f in (_end_point, _equal_time)]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


def render(rows: list[dict], summary: dict, goal_list: list[dict], methods: list[str],
           checks: list[dict] | None = None) -> str:
    head = ("| method | seed | time-to-target (s) | load-adjusted (s) | steps | tokens sampled | tokens trained | final acc "
            "| step (s) | rollout | update | select | s / group trained | effective ratio | staleness "
            "| dots/pearson |")
    lines = ["Per run (target = grpo's mean of its last evaluations, same seed):", "", head, "|" + "---|" * 16]
    for r in sorted(rows, key=lambda r: (methods.index(r["method"]), r["seed"])):
        lines.append(f"| {r['method']} | {r['seed']} | {_f(r['time_to_target_s'], '.1f')} | "
                     f"{_f(r.get('time_to_target_adjusted_s'), '.1f')} | "
                     f"{_f(r['steps_to_target'], '.1f')} | {_f(r['tokens_sampled_to_target'], ',.0f')} | "
                     f"{_f(r['tokens_trained_to_target'], ',.0f')} | {_f(r['final_smoothed'], '.3f')} | "
                     f"{_f(r['step_s'], '.3f')} | {_f(r['rollout_s'], '.3f')} | {_f(r['update_s'], '.3f')} | "
                     f"{_f(r['select_s'], '.3f')} | {_f(r['s_per_group_trained'], '.4f')} | "
                     f"{_f(r['effective_ratio'], '.2f')} | {_f(r['staleness'], '.1f')} | "
                     f"{_f(r['dots_pearson'], '.2f')} |")
    lines += ["", "Medians over seeds; ratios and accuracy differences to grpo are paired by seed, "
              "with 90% bootstrap intervals:", "",
              "| method | time ratio | load-adjusted time ratio | steps ratio | tokens-sampled ratio "
              "| tokens-trained ratio | time-to-target (s) | final acc | end point − grpo "
              "| at equal time − grpo | step (s) | s / group trained | effective ratio | staleness "
              "| dots/pearson | reached |",
              "|" + "---|" * 16]
    for m in methods:
        s = summary[m]
        lines.append(f"| {m} | " + " | ".join(_ci(s.get(n), s.get(f"{n}_ci90"), ".2f") for _, n in RATIOS) +
                     f" | {_f(s['time_to_target_s'], '.1f')} | {_f(s['final_smoothed'], '.3f')} | "
                     f"{_end_point(s)} | {_equal_time(s)} | {_f(s['step_s'], '.3f')} | "
                     f"{_f(s['s_per_group_trained'], '.4f')} | "
                     f"{_f(s['effective_ratio'], '.2f')} | {_f(s['staleness'], '.1f')} | "
                     f"{_f(s['dots_pearson'], '.2f')} | {s['reached_target']}/{len(s['seeds'])} |")
    lines += time_split.render(summary, methods, lambda v: _f(v, ".2f"))
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
            lines.append(f"| {m} | {_f(s['gen_batches'], '.2f')} | {_f(s['rollouts_per_step'], '.1f')} | "
                         f"{_f(s['short_share'], '.3f')} | {_f(s['skip_prob'], '.3f')} |")
    variants = [m for m in methods if summary[m].get("variant_of")]
    if variants:
        lines += ["", "Variants against their own method: ratios and accuracy differences paired by seed, "
                  "with 90% bootstrap intervals:", "",
                  "| variant | params | time | load-adjusted time | steps | tokens sampled | tokens trained "
                  "| end point − its method | ended lower on | at equal time − its method |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for m in variants:
            s, base = summary[m], summary[m]["variant_of"]
            cells = [_ci(s.get(f"{n}_vs_{base}"), s.get(f"{n}_vs_{base}_ci90"), ".2f") for _, n in RATIOS]
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
            per = ", ".join(_f(v, ".2f") for v in c["per_seed"])
            lines.append(f"| {c['check']} | {per} | {c['target']} | {'yes' if c['met'] else 'no'} |")
    lines += ["", "Goals:", "", "| goal | measured | target | met |", "|---|---|---|---|"]
    for g in goal_list:
        detail = f" ({g['detail']})" if g["detail"] else ""
        lines.append(f"| {g['goal']} | {_f(g['value'], '.3f')}{detail} | {g['target']} | "
                     f"{'yes' if g['met'] else 'no'} |")
    return "\n".join(lines)


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
    write_text(out_dir / "summary.json", json.dumps(json_safe(result), indent=1))
    write_text(out_dir / "table.md", table + "\n")
    def evals(seed: int, label: str) -> list[dict]:
        method, acfg = resolve(cfg, label, variants)
        return json.loads((run_dirs(acfg, seed, method, group[seed])[0] / "evals.json").read_text())

    curves = {m: [evals(s, m) for s in seeds] for m in methods}
    target = _median(list(targets.values()))
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
    if cfg.tracking.enabled and "DOTS_PIPELINE_ID" not in os.environ:  # one MLflow parent for every seed
        from .tracking import git_commit  # noqa: PLC0415

        tag = "".join(f"+{v.label}:{','.join(v.overrides)}" for v in variants)
        os.environ["DOTS_PIPELINE_ID"] = f"bench-{cfg.fingerprint(BENCH_EXCLUDE)}-{git_commit()[:12]}" + (
            f"-{hashlib.sha256(tag.encode()).hexdigest()[:8]}" if tag else "")
    # a second bench of this workspace waits: two would train the same run folders at once
    with exclusive(cfg.root, f"bench of seeds {' '.join(map(str, seeds))} ({' '.join(all_arms)})"):
        start, began = time.perf_counter(), time.time()  # after any wait: its seconds are not the bench's
        (shared or prepare_shared)(cfg)
        order = run_order(all_arms, seeds)
        train_seeds(cfg, [(seed, [m for s, m in order if s == seed]) for seed in seeds], variants, runner)
        extra = {"bench_wall_s": time.perf_counter() - start,
                 "runs_read_back": runs_finished_before(cfg, all_arms, seeds, began, variants)}
        result = report(cfg, all_arms, seeds, out_dir, dataset, extra, variants)
    say(Path(out_dir / "table.md").read_text())
    return result
