"""The pipeline's stages, one function each, reading and writing fixed paths under
`paths.root`. The CLI, the DVC stages and the Prefect tasks all call these.

    prepare        data/pool.jsonl, data/eval.jsonl
    warmup         models/warmup/{step*,final}, models/warmup/spectrum.json
    embed          embeddings/pool.pt
    label          labels/labels.json
    fit-predictor  predictor/predictor.pt, predictor/metrics.json
    train          runs/<method>/{records.jsonl,evals.json,summary.json}, checkpoints/<method>/checkpoint.pt
    compare        compare/{comparison.json,table.md,learning_curve.png,curves.json}; MLflow parent run
                   artifacts
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from .atomic import write_text
from .determinism import GlobalRng, setup_from_config
from .config import TRAITS, Config
from .data import Question, generate, load_questions, save_questions
from .distributed import launched_main, launched_world_size
from .embeddings import (SENTENCE_TRANSFORMERS, StaleCacheError, backbone_identity,
                         encode_with_sentence_transformers, load_embeddings, masked_mean_embeddings,
                         save_embeddings)
from .evaluation import pass_rates, spectrum, task_io
from .models import load_policy, resolve_device
from .predictor import load_predictor, save_predictor
from .predictor_training import fit_predictor
from .progress import Progress, say
from .engines import close_engine, engine_for
from .runfiles import equal_time_difference, final_smoothed, resumed_label, smoothed, time_to_target
from .trainer import Trainer
from .runfiles import json_safe, read_run


@dataclass(frozen=True)
class Paths:
    root: Path

    @property
    def pool(self) -> Path: return self.root / "data" / "pool.jsonl"
    @property
    def eval(self) -> Path: return self.root / "data" / "eval.jsonl"
    @property
    def prepared(self) -> Path: return self.root / "data" / "prepare.json"
    @property
    def warmup(self) -> Path: return self.root / "models" / "warmup"
    @property
    def policy(self) -> Path: return self.warmup / "final"
    @property
    def embeddings(self) -> Path: return self.root / "embeddings" / "pool.pt"
    @property
    def labels(self) -> Path: return self.root / "labels" / "labels.json"
    @property
    def predictor(self) -> Path: return self.root / "predictor" / "predictor.pt"
    @property
    def predictor_metrics(self) -> Path: return self.root / "predictor" / "metrics.json"
    @property
    def compare(self) -> Path: return self.root / "compare"

    def run(self, method: str) -> Path:
        return self.root / "runs" / method

    def model(self, method: str) -> Path:
        """The exported final policy (a save_pretrained folder; DVC output of train@<method>)."""
        return self.run(method) / "model"

    def evaluation(self, method: str) -> Path:
        """evaluate@<method>'s metrics (a DVC metrics file)."""
        return self.root / "evaluations" / method / "metrics.json"

    def checkpoints(self, method: str) -> Path:
        """Kept apart from the run's outputs, so a retried or re-run stage can resume from them."""
        return self.root / "checkpoints" / method


def paths(cfg: Config) -> Paths:
    return Paths(cfg.root)


def policy_path(cfg: Config) -> str | Path:
    """The policy RL starts from: `model.pretrained` when set, else the warm-up's final model."""
    return cfg.model.pretrained or paths(cfg).policy


def labelling_policy(cfg: Config, name: str) -> str | Path:
    return policy_path(cfg) if name == "final" else paths(cfg).warmup / name


def _write_json(path: Path, obj) -> None:
    write_text(path, json.dumps(json_safe(obj), indent=1))


def split_dataset(cfg: Config, dropped: list[dict] | None = None, repeats: list[dict] | None = None,
                  conflicting: list[int] | None = None) -> tuple[list[Question], list[Question]]:
    """A dataset's rows, validated (ground truths with the configured reward's parser), split by the
    task seed into pool and held-out set; rows dropped under task.dataset.unparseable=drop are
    appended to `dropped`, rows that repeat an earlier row's question (`drop_repeats`: held out
    means held out) to `repeats`, the first rows of questions whose rows' ground truths conflict
    (dropped whole: no label to trust) to `conflicting`."""
    from .datasets import drop_repeats, load_pool, shown_ids  # noqa: PLC0415

    rows = load_pool(cfg.task.dataset, reward=cfg.reward.name, timeout_s=cfg.reward.timeout_s, dropped=dropped)
    rows, repeated, conflicts = drop_repeats(rows, cfg.reward.name, cfg.reward.timeout_s)
    if repeated:
        say(f"prepare: dropped {len(repeated)} row{'s' if len(repeated) != 1 else ''} repeating an earlier "
            f"row's question (ids {shown_ids([r['id'] for r in repeated])}), so that no held-out question "
            "is also in the pool")
        if repeats is not None:
            repeats.extend(repeated)
    if conflicts:
        say(f"prepare: dropped {len(conflicts)} question{'s' if len(conflicts) != 1 else ''} whose rows give "
            f"ground truths that {cfg.reward.name} does not take for one answer (first rows' ids "
            f"{shown_ids(conflicts)}), so that no reward rests on a label picked at random")
        if conflicting is not None:
            conflicting.extend(conflicts)
    if cfg.task.eval_size >= len(rows):
        raise ValueError(f"task.eval_size: must be < the dataset's {len(rows)} rows; got {cfg.task.eval_size}")
    order = np.random.default_rng(cfg.task.seed).permutation(len(rows))
    held = [rows[i] for i in sorted(order[: cfg.task.eval_size])]
    pool = [rows[i] for i in sorted(order[cfg.task.eval_size:])]
    return pool, held


def training_pool(cfg: Config) -> list[Question] | None:
    """The pool this config trains on, for naming a held-out set's questions that were trained on:
    this workspace's prepared pool, or where `prepare` has not run here (an exported policy evaluated
    in another checkout) the pool it would make, made the same way (the same rows, checks and split
    by `task.seed`; nothing is written). None, said in one line, when the config's data cannot be
    read here: the evaluation goes on without the check rather than fail for it."""
    p = paths(cfg)
    if p.pool.exists():
        return load_questions(p.pool)
    where = (f"task.dataset {cfg.task.dataset['path']}" if cfg.task.source == "dataset"
             else "the synthetic task")
    say(f"evaluate: {p.pool} is not there (prepare has not run in this workspace): making the training "
        f"pool from {where} as prepare would, to name the set's questions that are in it")
    try:
        return split_dataset(cfg)[0] if cfg.task.source == "dataset" else generate(cfg.task)[0]
    except (OSError, ValueError) as exc:  # a DatasetError is a ValueError
        say(f"evaluate: {where}: cannot be read here ({str(exc).splitlines()[0]}), so the set is not "
            "checked against the training pool")
        return None


def prepare(cfg: Config) -> dict:
    """prepare: the pool and the held-out set, and `prepare.json` beside them: their sizes and every
    row left out, by id and why (a printed line names only the first ids of each kind, and DeepScaleR
    leaves out 207 rows)."""
    dropped: list[dict] = []
    repeats: list[dict] = []
    conflicting: list[int] = []
    if cfg.task.source == "dataset":
        pool, held = split_dataset(cfg, dropped, repeats, conflicting)
    else:
        if cfg.task.dataset:  # the embedded task: a spec set beside it is read by nothing
            say(f"prepare: task.dataset ({cfg.task.dataset.get('path')}) is set but task.source is "
                "'synthetic': training on the embedded task; set task.source=dataset to train on the file")
        pool, held = generate(cfg.task)
    if len(pool) < max(cfg.selection.ref_size, cfg.train.batch_size, cfg.label.num_questions):
        raise ValueError(f"task: the pool has {len(pool)} questions, fewer than selection.ref_size, "
                         "train.batch_size or label.num_questions ask for")
    p = paths(cfg)
    save_questions(pool, p.pool)
    save_questions(held, p.eval)
    kind = f"{len(cfg.task.tiers)} tiers" if cfg.task.source == "synthetic" else f"from {cfg.task.dataset['path']}"
    say(f"prepare: {len(pool)} pool questions, {len(held)} held-out, {kind} -> {p.pool.parent}")
    info = {"pool": len(pool), "eval": len(held)}
    if dropped:  # task.dataset.unparseable=drop: rows whose ground truth the reward cannot read
        info["dropped"] = {"rows": len(dropped), "ids": [d["id"] for d in dropped],
                           "why": [d["why"] for d in dropped]}
    if repeats:  # rows repeating an earlier row's question (first_ids: that row's): left out of both sides
        info["repeats"] = {"rows": len(repeats), "ids": [r["id"] for r in repeats],
                           "first_ids": [r["first_id"] for r in repeats],
                           "conflicting": [r["id"] for r in repeats if r["conflict"]]}
    if conflicting:  # the first rows of questions whose ground truths conflict: left out too
        info["conflicting"] = {"questions": len(conflicting), "ids": conflicting}
    _write_json(p.prepared, info)
    if dropped or repeats or conflicting:
        say(f"prepare: every row left out, and why: {p.prepared}")
    return info


def load_data(cfg: Config) -> tuple[list[Question], list[Question]]:
    p = paths(cfg)
    return load_questions(p.pool), load_questions(p.eval)


def _questions_per_chunk(cfg: Config, samples: int | None = None) -> int:
    """Questions per engine call: `samples` each (default G), rollout.batch_size sequences in all."""
    return max(1, cfg.rollout.batch_size // (samples or cfg.rollout.group_size))


def _check_context(cfg: Config, questions: list[Question]) -> None:
    """The embedded model's positions (model.n_positions) hold the task's longest prompt and
    rollout.max_new_tokens. Checked where the rollout meets it (`HFEngine.generate`), that was
    after the whole warm-up had trained and saved its checkpoints."""
    from .models import build_tokenizer  # noqa: PLC0415

    longest = max(questions, key=lambda q: len(q.prompt))
    width = len(task_io(cfg).encode(build_tokenizer(), [longest])[0])
    new, limit = cfg.rollout.max_new_tokens, cfg.model.n_positions
    if width + new > limit:
        raise ValueError(f"rollout.max_new_tokens: {new} beside the task's longest prompt ({width} tokens, "
                         f"id {longest.id}) overruns model.n_positions ({limit}); lower "
                         f"rollout.max_new_tokens to {limit - width} or raise model.n_positions")


def run_warmup(cfg: Config) -> dict:
    from .warmup import warmup  # noqa: PLC0415

    setup_from_config(cfg)
    p = paths(cfg)
    pool, held = load_data(cfg)
    if cfg.model.pretrained:  # a real model: nothing to warm up, but measure where it starts
        info = {"steps": 0, "seconds": 0.0, "final_loss": None, "pretrained": cfg.model.pretrained}
    else:
        _check_context(cfg, [*pool, *held])  # before the warm-up's minutes, not at its first rollout
        seen_by_rl = frozenset(q.prompt for q in pool) | frozenset(q.prompt for q in held)
        with Progress("warm-up", max([cfg.warmup.steps, *cfg.warmup.checkpoints])) as bar:
            info = warmup(cfg, p.warmup, progress=lambda step, loss: bar.update(step, loss=loss),
                          exclude=seen_by_rl)
    model, tok = load_policy(policy_path(cfg), getattr(torch, cfg.model.dtype))
    model.to(resolve_device(cfg.train.device))
    sample = pool[: cfg.warmup.spectrum_questions]
    engine = engine_for(cfg, model, tok, sleep_mode=False)
    rates = pass_rates(engine, tok, sample, cfg.rollout.group_size, cfg.rollout.temperature,
                       cfg.rollout.max_new_tokens, torch.Generator().manual_seed(0),
                       chunk=_questions_per_chunk(cfg), io=task_io(cfg), progress="warm-up spectrum")
    close_engine(engine)
    spec = spectrum(rates)
    info["spectrum"] = spec
    info["spectrum_questions"] = len(sample)
    _write_json(p.warmup / "spectrum.json", info)
    extra = f" (+{info['label_only_steps']} for labelling only)" if info.get("label_only_steps") else ""
    say(f"warm-up: {info['steps']} steps{extra} in {info['seconds']:.0f}s; pool spectrum under G={cfg.rollout.group_size}"
        f" ({len(sample)} questions): never {spec['never']:.0%}, sometimes {spec['sometimes']:.0%}, "
        f"always {spec['always']:.0%}")
    return info


def _backbone(cfg: Config) -> str:
    """What an embedding cache is valid for: the backbone's weights (or name) and the pooling."""
    spec = cfg.embed.backbone
    if spec == "warmup":
        ident = backbone_identity(paths(cfg).policy)
    elif spec.startswith("hf:") and Path(spec[3:]).is_dir():
        ident = backbone_identity(spec[3:])
    else:
        return spec  # sentence-transformers pools its own way
    return ident if cfg.embed.pooling == "mean" else f"{ident}|{cfg.embed.pooling}"


def embed(cfg: Config) -> dict:
    """Embed the pool once; reuse the cache when it matches backbone and pool, redo it when stale."""
    setup_from_config(cfg)
    p = paths(cfg)
    pool, _ = load_data(cfg)
    ident = _backbone(cfg)
    if p.embeddings.exists():
        try:
            emb = load_embeddings(p.embeddings, ident, pool)
            say(f"embed: cache {p.embeddings} is current ({tuple(emb.shape)}); nothing to do")
            return {"cached": True, "shape": list(emb.shape)}
        except StaleCacheError as exc:
            say(f"embed: {exc}; recomputing")
    start = time.perf_counter()
    texts = [q.prompt for q in pool]
    if cfg.embed.backbone == "warmup":
        model, tok = load_policy(p.policy)
        emb = masked_mean_embeddings(model, tok, texts, cfg.embed.batch_size, cfg.embed.pooling)
    elif cfg.embed.backbone.startswith("hf:"):  # a frozen hub/local causal LM, e.g. the instruct model
        model, tok = load_policy(cfg.embed.backbone[3:], getattr(torch, cfg.model.dtype),
                                 key="embed.backbone")
        model.to(resolve_device(cfg.train.device))
        emb = masked_mean_embeddings(model, tok, texts, cfg.embed.batch_size, cfg.embed.pooling)
    else:  # 'sentence-transformers:<name>', the one form left: the config refuses any other
        name = cfg.embed.backbone[len(SENTENCE_TRANSFORMERS):]
        emb = encode_with_sentence_transformers(name, texts, cfg.embed.batch_size)
    save_embeddings(p.embeddings, emb, ident, pool)
    say(f"embed: {tuple(emb.shape)} in {time.perf_counter() - start:.1f}s -> {p.embeddings}")
    return {"cached": False, "shape": list(emb.shape)}


def label(cfg: Config) -> dict:
    """Observed difficulty of a labelled subset of the pool under each warm-up policy."""
    setup_from_config(cfg)
    p = paths(cfg)
    pool, _ = load_data(cfg)
    rng = np.random.default_rng(cfg.task.seed + 7)
    idx = np.sort(rng.choice(len(pool), size=cfg.label.num_questions, replace=False))
    subset = [pool[i] for i in idx]
    samples = cfg.label.samples or cfg.rollout.group_size
    out = {"question_index": idx.tolist(), "group_size": samples, "policies": {}}
    for name in cfg.label.policies:
        model, tok = load_policy(labelling_policy(cfg, name), getattr(torch, cfg.model.dtype))
        model.to(resolve_device(cfg.train.device))
        engine = engine_for(cfg, model, tok, seed=cfg.task.seed, sleep_mode=False)
        rates = pass_rates(engine, tok, subset, samples, cfg.rollout.temperature,
                           cfg.rollout.max_new_tokens, torch.Generator().manual_seed(cfg.task.seed),
                           chunk=_questions_per_chunk(cfg, samples), io=task_io(cfg), progress=f"label {name}")
        close_engine(engine)  # one labelling policy's engine at a time
        out["policies"][name] = (1.0 - rates).tolist()
        spec = spectrum(rates)
        say(f"label: {name}: never {spec['never']:.0%}, sometimes {spec['sometimes']:.0%}, "
            f"always {spec['always']:.0%} on {len(subset)} questions, G={samples}")
    _write_json(p.labels, out)
    return {"questions": len(subset), "policies": list(out["policies"])}


def fit(cfg: Config) -> dict:
    setup_from_config(cfg)
    p = paths(cfg)
    pool, _ = load_data(cfg)
    emb = load_embeddings(p.embeddings, _backbone(cfg), pool)
    data = json.loads(p.labels.read_text()) if p.labels.exists() else None
    if data is None:
        raise FileNotFoundError(f"{p.labels}: no labels; run `dots label` first")
    idx = np.asarray(data["question_index"])
    labels = {k: np.asarray(v) for k, v in data["policies"].items()}
    with Progress("fit predictor", cfg.predictor.steps) as bar:
        model, metrics = fit_predictor(emb[idx], labels, cfg.predictor, cfg.selection.ref_size, cfg.task.seed,
                                       progress=lambda s, loss: bar.update(s + 1, loss=loss))
    p.predictor.parent.mkdir(parents=True, exist_ok=True)
    save_predictor(p.predictor, model, metrics)
    _write_json(p.predictor_metrics, metrics)
    say(f"fit-predictor: held-out Pearson {metrics['pearson']:.3f}, MAE {metrics['mae']:.3f} "
        f"({metrics['holdout_questions']} questions, K={metrics['ref_size']})")
    return metrics


def run_shared(cfg: Config) -> dict[str, dict]:
    """The stages every method shares, in pipeline order (prepare, warm-up, embed, label, fit),
    each one's info by name. `dots all`, the bench and the tests build them through this one
    chain; dvc.yaml and the Prefect flow list the same stages as DVC stages."""
    return {"prepare": prepare(cfg), "warmup": run_warmup(cfg), "embed": embed(cfg), "label": label(cfg),
            "predictor": fit(cfg)}


def _check_memory(cfg: Config) -> None:
    """On a GPU (or with train.memory_gb), print the memory plan and refuse a config that cannot fit."""
    from .memory_plan import device_memory, estimate, check, policy_shape  # noqa: PLC0415

    device_bytes, device = device_memory(cfg)
    if device_bytes is None:
        return  # a CPU run: nothing to plan against
    shape = policy_shape(cfg)
    plan = estimate(cfg, shape, launched_world_size(), device_bytes, device)
    check(plan, cfg, shape)
    if launched_main():
        say(plan.table())


def train(cfg: Config, method: str | None = None, resume: bool = True, run_dir: Path | None = None,
          checkpoint_dir: Path | None = None, seed_tag: int | None = None) -> dict:
    """Train one method; `run_dir`/`checkpoint_dir`/`seed_tag` let the benchmark keep one run per seed."""
    method = method or cfg.train.method
    runs: list[_Run] = []
    with runs_ended_on_error(runs):
        with Progress(f"train {method}", cfg.train.steps) as bar:
            runs.append(_open_run(cfg, method, resume, run_dir, checkpoint_dir, seed_tag, bar))
            result = runs[0].trainer.run()
        return runs[0].close(result)


@contextmanager
def runs_ended_on_error(runs: list[_Run]) -> Iterator[None]:
    """Around training: a stage that raises (or is stopped with Ctrl-C) ends the MLflow runs it had
    opened FAILED (KILLED), their buffered steps logged (`LiveLogger.abort`), and raises on."""
    try:
        yield
    except BaseException as exc:
        for r in runs:
            if r.logger is not None:
                r.logger.abort(exc)
        raise


class LockstepRun(NamedTuple):
    """One run of a lockstep group: its method and folders; `cfg` (default: the group's) and
    `name` (default: the method) let a bench variant train beside its own method."""
    method: str
    run_dir: Path
    checkpoint_dir: Path
    cfg: Config | None = None
    name: str | None = None


def train_lockstep(cfg: Config, specs: list[tuple], seed_tag: int | None = None) -> dict[str, dict]:
    """Train several runs of one seed side by side: one step of each in turn, so every run's
    steps are timed under the same machine load at the same moments.

    Why: run one after another, two methods' ~30-s runs meet different load (a 20% slower
    half-minute moved a seed's time ratio by 0.2), and paired ratios do not cancel it. In
    lockstep, load changes hit every method within a second. Each run keeps its own global
    random states (`GlobalRng`), so it is the same run, step for step and token for token, as
    when it trains alone; only the seconds differ. `specs`: `LockstepRun`s or (method,
    run_dir, checkpoint_dir) tuples. Returns each run's summary by name."""
    specs = [LockstepRun(*s) for s in specs]
    names = [s.name or s.method for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"train_lockstep: run names must differ; got {names}")
    seed = "" if seed_tag is None else f", seed {seed_tag}"  # two seeds' processes share one log in the bench
    runs: list[_Run] = []
    with runs_ended_on_error(runs):
        with Progress(f"train {'+'.join(names)} (lockstep{seed})", cfg.train.steps * len(specs)) as bar:
            for spec, name in zip(specs, names):
                runs.append(_open_run(spec.cfg or cfg, spec.method, True, spec.run_dir, spec.checkpoint_dir,
                                      seed_tag, None, name=name))
                runs[-1].rng.capture()
            while not all(r.trainer.finished for r in runs):
                for r in runs:
                    if not r.trainer.finished:
                        with r.rng:
                            r.trainer.advance()
                bar.update(sum(r.trainer.step for r in runs))
            results = []
            for r in runs:
                with r.rng:
                    results.append(r.trainer.finish())
        return {name: r.close(res, lockstep=names) for name, r, res in zip(names, runs, results)}


class _Run:
    """One method's run between loading and its closing writes (export, tracking, summary)."""

    def __init__(self, cfg: Config, method: str, trainer: Trainer, logger, run_dir: Path, wall_start: float,
                 name: str | None = None):
        self.cfg, self.method, self.trainer, self.logger = cfg, method, trainer, logger
        self.run_dir, self.wall_start = run_dir, wall_start
        self.name = name or method  # a bench variant's label: its MLflow run and registered model
        self.rng = GlobalRng()

    def close(self, result, lockstep: list[str] | None = None) -> dict:
        trainer, logger, method = self.trainer, self.logger, self.method
        s = result.summary
        model_dir = self.run_dir / "model"
        trainer.export(model_dir, {"method": method, "steps": s["steps"], "final_accuracy": s["final_accuracy"],
                                   "started_from": str(policy_path(self.cfg))})  # collective under fsdp
        extra: dict = {}
        if trainer.device.type == "cuda":
            extra["gpu_peak_memory_gb"] = torch.cuda.max_memory_allocated(trainer.device) / 2**30
        if logger is not None:
            logger.finish(s, result.evals)
            t = time.perf_counter()
            from .tracking import register_model  # noqa: PLC0415

            extra["registered_version"] = register_model(logger.tracker, logger.run_id, model_dir, self.name, s)
            extra["tracking_s"] = logger.seconds + time.perf_counter() - t
        # the whole call: loading, training, evals, tracking (in lockstep: of every method together)
        extra["wall_s"] = time.perf_counter() - self.wall_start
        if lockstep is not None:
            extra["lockstep"] = lockstep
        s.update(extra)  # figures known only after the run files were written: one more write of the summary
        if trainer.dist.main:
            _write_json(self.run_dir / "summary.json", s)
        say(f"train {method}: final accuracy {s['final_accuracy']:.3f} (from {s['initial_accuracy']:.3f}) after "
            f"{s['steps']} steps, {s['elapsed_s']:.0f}s training clock")
        return s


def _open_run(cfg: Config, method: str, resume: bool, run_dir: Path | None, checkpoint_dir: Path | None,
              seed_tag: int | None, bar: Progress | None, name: str | None = None) -> _Run:
    """Load the data (and DOTS' predictor), open the MLflow child run (named `name`, default the
    method: a bench variant's own), build the trainer."""
    _check_memory(cfg)  # before any model loads: a config that cannot fit is refused now, not hours in
    p = paths(cfg)
    run_dir = run_dir or p.run(method)
    checkpoint_dir = checkpoint_dir or p.checkpoints(method)
    wall_start = time.perf_counter()
    pool, held = load_data(cfg)
    predictor = emb = None
    if TRAITS[method].selects:
        emb = load_embeddings(p.embeddings, _backbone(cfg), pool)
        predictor = load_predictor(p.predictor)
    logger = tracker = None
    if cfg.tracking.enabled and launched_main():  # under torchrun rank 0 logs for all
        from .tracking import LiveLogger, Tracker  # noqa: PLC0415

        tracker = Tracker(cfg)  # an unreachable store fails here, before the model loads

    def on_step(rec: dict) -> None:
        if bar is not None:
            bar.update(rec["step"], reward=rec["train/reward_mean"], acc=rec.get("eval/accuracy"))
        if logger is not None:
            logger(rec)
    trainer = Trainer(cfg, method, policy_path(cfg), pool, held, run_dir, predictor, emb, resume=resume,
                      on_step=on_step, checkpoint_dir=checkpoint_dir)
    if bar is not None:
        bar.update(trainer.step)
    if tracker is not None:  # the run's MLflow run: its own when it went on from a checkpoint, else a new one
        logger = LiveLogger(tracker, name or method, cfg.tracking.log_every,
                            fallback=run_dir / "mlflow_fallback.jsonl", seed=seed_tag,
                            params={"train.lr_used": cfg.train.rate_for(method),  # train.lr may be null
                                    "train.downsample_used": cfg.train.downsample_for(method)},
                            go_on=trainer.step > 0)
        logger.catch_up(trainer.records)
    return _Run(cfg, method, trainer, logger, run_dir, wall_start, name)


def evaluate(cfg: Config, method: str | None = None) -> dict:
    """evaluate@<method>: the exported final policy on the task's held-out set ('task') and on each
    of evaluate.sets: greedy accuracy, pass@k and mean@k. Every set is read and validated before
    the model loads. Writes evaluations/<method>/metrics.json and logs heldout/<set>/<metric> to the
    method's MLflow run."""
    from .datasets import say_in_pool, say_repeats  # noqa: PLC0415
    from .heldout import check_prompts_fit, evaluation_sets, score  # noqa: PLC0415

    method = method or cfg.train.method
    p = paths(cfg)
    folder = p.model(method)
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder}: no exported model; run `dots train --method {method}` first")
    pool, held = load_data(cfg)
    sets = {"task": held, **evaluation_sets(cfg)}
    found: dict[str, dict[str, list[int]]] = {}  # per extra set, ids kept in the results
    for spec in cfg.evaluate.sets:
        found[spec.name] = say_repeats(spec.name, sets[spec.name], cfg.reward.name, cfg.reward.timeout_s)
        if ids := say_in_pool(spec.name, sets[spec.name], pool):
            found[spec.name]["in_pool"] = ids
    start = time.perf_counter()
    setup_from_config(cfg)
    model, tok = load_policy(folder, getattr(torch, cfg.model.dtype))
    check_prompts_fit(cfg, model, tok, sets)
    model.to(resolve_device(cfg.train.device)).eval()
    engine = engine_for(cfg, model, tok, seed=cfg.evaluate.seed, sleep_mode=False)
    results = {}
    for name, questions in sets.items():
        results[name] = {"questions": len(questions), **found.get(name, {}),
                         **score(cfg, engine, tok, questions, cfg.evaluate.samples, cfg.evaluate.seed)}
        say(f"evaluate {method}: {name}: " + ", ".join(f"{k} {v:.4f}" for k, v in _scores(results[name]).items()))
    close_engine(engine)
    out = {"method": method, "model": str(folder), "seconds": time.perf_counter() - start, "heldout": results}
    _write_json(p.evaluation(method), out)
    if cfg.tracking.enabled:
        from .tracking import log_evaluation  # noqa: PLC0415

        log_evaluation(cfg, method, heldout_metrics(out))
    return out


def heldout_metrics(evaluation: dict) -> dict[str, float]:
    """evaluate's results as flat metric names: heldout/<set>/<metric>, with pass@k written pass_at_k
    (MLflow allows no '@' in a metric name)."""
    return {f"heldout/{name}/{k.replace('@', '_at_')}": float(v) for name, r in evaluation["heldout"].items()
            for k, v in _scores(r).items()}


def _scores(result: dict) -> dict:
    """The accuracy figures of one set's result (greedy_accuracy, pass@k, mean@k), not its counts."""
    return {k: v for k, v in result.items() if k.startswith(("greedy", "pass@", "mean@"))}


def compare(cfg: Config, methods: list[str] | None = None) -> dict:
    """Time-to-target of each method, the target being grpo's final accuracy (DESIGN §5)."""
    p = paths(cfg)
    methods = methods or cfg.train.methods
    runs = {m: read_run(p.run(m)) for m in methods}
    window = cfg.eval.smooth
    target = final_smoothed(runs["grpo"][1], window) if "grpo" in runs else cfg.train.target_accuracy
    if target is None:
        raise ValueError("compare: needs a grpo run or train.target_accuracy to define the target")
    rows = []
    for m, (summary, evals) in runs.items():
        tts, sts = time_to_target(evals, target, window)
        rows.append({"method": m, "time_to_target_s": tts, "steps_to_target": sts,
                     "final_accuracy": summary["final_accuracy"], "initial_accuracy": summary["initial_accuracy"],
                     "elapsed_s": summary["elapsed_s"], "mean_step_s": summary.get("mean:time/step_s"),
                     "effective_ratio": summary.get("mean:train/effective_ratio"),
                     "dots_pearson": summary.get("mean:dots/pearson"),
                     "resumed_at": summary.get("resumed_at", [])})
        if p.evaluation(m).exists():  # evaluate@<method> ran: its held-out metrics join the row
            rows[-1]["heldout"] = heldout_metrics(json.loads(p.evaluation(m).read_text()))
    base = next((r for r in rows if r["method"] == "grpo"), None)
    curves = {m: ([e["elapsed_s"] for e in evals], smoothed(evals, window)) for m, (_, evals) in runs.items()}
    for r in rows:
        ok = base and base["time_to_target_s"] and r["time_to_target_s"] is not None
        r["time_to_target_ratio"] = r["time_to_target_s"] / base["time_to_target_s"] if ok else None
        # beside the ratio, as the bench pairs them: who ends higher after the same steps, and who is
        # ahead at the same seconds (the shorter run's last); null without a grpo run to pair with
        mine, grpo = curves[r["method"]], curves.get("grpo")
        r["end_point"] = mine[1][-1] if mine[1] else None
        paired = grpo is not None and bool(mine[1]) and bool(grpo[1])
        r["end_point_diff"] = r["end_point"] - grpo[1][-1] if paired else None
        r["equal_time_diff"] = equal_time_difference(*mine, *grpo) if paired else None
    out = {"target_accuracy": target, "rows": rows}
    _write_json(p.compare / "comparison.json", out)
    table = render_table(out)
    write_text(p.compare / "table.md", table + "\n")
    from .plots import learning_curve  # noqa: PLC0415

    learning_curve({m: [evals] for m, (_, evals) in runs.items()}, target, p.compare / "learning_curve.png")
    # the same curves for `dvc plots show` (dvc.yaml's accuracy_vs_training_seconds): one file of the
    # methods this run compared, where a plot of each method's own file failed on those not trained
    _write_json(p.compare / "curves.json", [{"method": m, "step": e["step"], "elapsed_s": e["elapsed_s"],
                                             "accuracy": e["accuracy"]} for m, (_, evals) in runs.items()
                                            for e in evals])
    if cfg.tracking.enabled:
        from .tracking import log_comparison  # noqa: PLC0415

        log_comparison(cfg, out, [p.compare / "table.md", p.compare / "comparison.json",
                                  p.compare / "learning_curve.png", p.predictor_metrics])
    say(table)
    return out


def render_table(comparison: dict) -> str:
    def f(v, fmt, missing="—"):
        return missing if v is None else format(v, fmt)

    lines = [f"target accuracy (grpo's mean of its last evaluations): {comparison['target_accuracy']:.4f}", "",
             "| method | time-to-target (s) | steps-to-target | final accuracy | ratio to grpo "
             "| end point − grpo | at equal time − grpo | mean step (s) | effective ratio | dots/pearson |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    base = next((r for r in comparison["rows"] if r["method"] == "grpo"), None)
    for r in comparison["rows"]:
        # a run that never reached the target says so, as the bench's table does ("—": nothing to read)
        missed = r["time_to_target_s"] is None
        ratio = "never" if missed and base and base["time_to_target_s"] else \
            f(r["time_to_target_ratio"], ".2f")
        lines.append(f"| {r['method']} | {f(r['time_to_target_s'], '.1f', 'never')} | "
                     f"{f(r['steps_to_target'], '.1f', 'never' if missed else '—')} | "
                     f"{f(r['final_accuracy'], '.4f')} | {ratio} | "
                     f"{f(r.get('end_point_diff'), '+.3f')} | {f(r.get('equal_time_diff'), '+.3f')} | "
                     f"{f(r['mean_step_s'], '.3f')} | {f(r['effective_ratio'], '.2f')} | "
                     f"{f(r['dots_pearson'], '.2f')} |")
    resumed = [resumed_label(r["method"], r["resumed_at"]) for r in comparison["rows"] if r.get("resumed_at")]
    if resumed:  # its steps and accuracies are an uninterrupted run's; its seconds are not one sitting's
        lines += ["", f"Resumed from a checkpoint: {'; '.join(resumed)}. A resumed run's seconds were "
                  "timed in more than one sitting, under different machine load; "
                  "`dots train --method M --restart` times it in one."]
    return "\n".join(lines)
