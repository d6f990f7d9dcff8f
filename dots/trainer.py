"""One readable GRPO loop for the four methods of DESIGN §1, two peer baselines and their mix.

    grpo     B questions drawn uniformly, all groups fresh
    dots     B questions drawn ∝ exp(−|d̂−α|/τ) from the round's predictions, all fresh
    rr       uniform questions, δ·B fresh groups + (1−δ)·B replayed from the buffer
    dots_rr  DOTS questions for the fresh part + replay
    dapo     peer baseline: DAPO's dynamic sampling, generation batches of uniform questions until
             B groups with varied rewards are collected (`dots.dynamic_sampling`)
    greso    peer baseline: GRESO, questions skipped before rollout by their streak of all-correct
             or all-wrong groups (`dots.greso`), then the same dynamic sampling
    greso_rr GRESO's filtered groups for the fresh part + replay (beyond both papers: what replay
             adds on top of the stronger peer; its generation batches shrink with the fresh share)

Every `selection.every` steps a DOTS round rolls out K reference questions with the
current policy, predicts every other question's difficulty from their observed labels
(one K×N attention over cached projections), and the round's questions are then drawn
step by step, without replacement, by Gumbel-top-k. Informative reference groups are
training data: they fill the next fresh slots before any new question is generated.

What it simplifies: one optimizer step per batch (so π_old = the sampling policy and a
fresh group's ratio is 1), greedy held-out evaluation paused out of the training clock.
Under torchrun the same loop runs data-parallel (`dots.distributed`): rank 0 decides,
rollouts and the update are sharded, checkpoints and run files are written by rank 0; with
`train.fsdp` the policy's weights, gradients and AdamW states are sharded too (`dots.sharding`),
and each rollout or evaluation runs on the policy gathered whole on every rank.
Degenerate groups (all rewards equal) have zero advantage; with β = 0 they contribute
nothing to the gradient, so the update skips their forward/backward and keeps the mean
over *all* groups by scaling — the gradient is the same, the cost is not.
"""

from __future__ import annotations

import copy
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from .determinism import setup_from_config
from .checkpoints import (CHECKPOINT, SET_ASIDE_KEPT, SetAside, UnsafeFileError, furthest_set_aside,
                          load_checkpoint, load_tensors, prune_set_asides, save_checkpoint, set_aside_path)
from .config import TRAITS, Config
from .data import Question
from .distributed import rank_generator, setup
from .experiment_copy import in_repository
from .embeddings import backbone_identity
from .evaluation import greedy_accuracy, pass_rates, task_io
from .faults import fault_point
from .update import forwarded_groups, trained_groups, update_on_groups  # noqa: F401  (re-exported)
from .models import enable_activation_checkpointing, load_policy, resolve_device, set_training
from .oracle import answer_ids, exact_pass_rates
from .predictor import DifficultyPredictor
from .predictor_training import pearson, pearson_ceiling
from .progress import say
from .provenance import changed_modules, code_identity, data_identity, module_hashes
from .replay import ReplayBuffer
from .engines import engine_for
from .rollout import Group
from .selection import select_questions
from .dynamic_sampling import collect, dapo_sizes, greso_sizes
from .greso import SelectiveRollout
from .runfiles import (RunResult, final_smoothed, smoothed, summarize, target_eval,  # noqa: F401
                       time_to_target, write_run_files)  # (re-exported)


def given_slots(fresh: list[Group], n_filled: int) -> list[Group]:
    """`replay.fill`: the fresh groups left in a step's batch once its first `n_filled` degenerate
    ones have given their slots to replayed groups. Why drop them rather than add the fill on top:
    the loss is a mean over the batch's groups, so B fresh groups plus n fills weighed each group
    1/(B + n), a smaller step than the full batch of B informative groups the switch promises.
    A degenerate group the buffer had no replacement for keeps its slot (the batch stays B)."""
    out, left = [], n_filled
    for g in fresh:
        if left and not g.informative:
            left -= 1
            continue
        out.append(g)
    return out


class Trainer:
    def __init__(self, cfg: Config, method: str, policy_dir: str | Path, pool: list[Question],
                 eval_set: list[Question], run_dir: str | Path, predictor: DifficultyPredictor | None = None,
                 embeddings: torch.Tensor | None = None, resume: bool = True,
                 on_step: Callable[[dict], None] | None = None, checkpoint_dir: str | Path | None = None):
        self.cfg, self.method, self.run_dir = cfg, method, Path(run_dir)
        # Checkpoints may live outside the run's outputs (DVC deletes a stage's outputs before it runs).
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else self.run_dir
        traits = TRAITS[method]
        self.uses_dots, self.uses_replay = traits.selects, traits.replays
        self.filters_groups = traits.filters is not None  # dynamic sampling (the peer baselines)
        self.pool, self.eval_set, self.on_step = pool, eval_set, on_step
        setup_from_config(cfg)
        torch.manual_seed(cfg.train.seed)
        random.seed(cfg.train.seed)  # nothing of ours draws from it, but a library might: same seed, same run
        self.dist, self.device = setup(resolve_device(cfg.train.device))  # cuda:LOCAL_RANK under torchrun
        dtype = getattr(torch, cfg.model.dtype)
        self.model, self.tokenizer = load_policy(policy_dir, dtype)
        self.model.to(self.device)
        if cfg.train.gradient_checkpointing:
            enable_activation_checkpointing(self.model)
        # train.fsdp under torchrun: weights, gradients and AdamW states sharded over the ranks (FSDP2),
        # before the engine and the optimizer see the parameters
        self.sharded = cfg.train.fsdp and self.dist.enabled
        self._gathered_depth = 0
        if self.sharded:
            from .sharding import shard_model

            shard_model(self.model)
        self.io = task_io(cfg)
        self.policy_identity = backbone_identity(policy_dir)  # a re-run warm-up invalidates checkpoints
        self.data_identity = data_identity(pool, eval_set)  # so does new data under the same params
        self.model.train()
        self.ref_model = None
        if cfg.loss.beta > 0:
            self.ref_model = load_policy(policy_dir, dtype)[0].to(self.device).eval().requires_grad_(False)
        self.engine = engine_for(cfg, self.model, self.tokenizer, seed=cfg.train.seed)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.train.rate_for(method), weight_decay=0.0)
        self.np_rng = np.random.default_rng(cfg.train.seed)
        self.gen = torch.Generator().manual_seed(cfg.train.seed)
        self.prompts = self.io.encode(self.tokenizer, pool)
        self.answer_ids = answer_ids(self.tokenizer, pool) if cfg.selection.oracle else []
        self.buffer = ReplayBuffer(cfg.replay.capacity)
        self.greso = None
        if traits.filters == "greso":
            g = cfg.greso
            self.greso = SelectiveRollout(len(pool), g.p_easy, g.p_hard, g.target_zero_variance, g.p_min, g.p_max)
        self.predictor, self.projections = predictor, None
        if self.uses_dots:
            if predictor is None or embeddings is None:
                raise ValueError(f"train.method={method} needs a fitted predictor and pool embeddings "
                                 "(run `dots embed` and `dots fit-predictor`)")
            if embeddings.shape[0] != len(pool):
                raise ValueError(f"embeddings: {embeddings.shape[0]} rows for a pool of {len(pool)} questions")
            if cfg.selection.online_calibration:  # refitted in place each round: never the caller's copy
                self.predictor = predictor = copy.deepcopy(predictor)
            self.projections = predictor.project_pool(embeddings)  # once: rounds reuse them
        # DOTS round state
        self.round_pred: np.ndarray | None = None
        self.round_available: np.ndarray | None = None
        self.ref_queue: list[Group] = []
        self.round_refs: np.ndarray | None = None  # online calibration: the round's references, their labels,
        self.round_ref_labels: np.ndarray | None = None  # and the (question, observed d) of its selections
        self.round_seen: list[tuple[int, float]] = []
        # progress; token and group counts are machine-independent costs beside the seconds
        self.step, self.elapsed = 0, 0.0
        self.totals = {"tokens_sampled": 0, "tokens_trained": 0, "groups_trained": 0}
        self._sampled = 0  # response tokens generated in the current step (counted by _rollout)
        self._rolled = [0, 0]  # groups generated in the current step, and how many of them informative
        self.probe = np.arange(min(cfg.eval.probe_size, len(pool)))  # the pool is shuffled: its head is a
        # fixed, uniform probe of the pool for the frontier diagnostic
        self.records: list[dict] = []
        self.evals: list[dict] = []
        # steps at which this run went on from a checkpoint: its seconds before and after each were
        # timed in different sittings, under different machine load (the bench says so)
        self.resumed_at: list[int] = []
        self._moves: list[tuple[Path, Path]] = []  # checkpoints set aside or taken back (`_resume_state`)
        if resume:
            self._restore()
        elif self.dist.main:
            (self.checkpoint_dir / CHECKPOINT).unlink(missing_ok=True)  # starting over: drop the old run's state
        self.dist.barrier()  # every rank has read the checkpoint before rank 0 may replace it
        if self.dist.main:
            self._move_checkpoints()

    # ---- rollouts --------------------------------------------------------------------------
    @contextmanager
    def _generating(self) -> Iterator[None]:
        """Where the engine generates: under train.fsdp, with the whole policy gathered on each rank
        (`dots.sharding.gathered`; entering and leaving are collective, so every rank enters, even one
        with nothing to generate, and inside each rank may run any number of forwards). A no-op
        otherwise, and when already inside."""
        if not self.sharded or self._gathered_depth:
            yield
            return
        from .sharding import gathered

        wake = getattr(self.engine, "wake", None)
        if wake is not None:
            wake()  # a sleeping vLLM reloads the weights here, on every rank (a collective under FSDP)
        self._gathered_depth += 1
        try:
            with gathered(self.model):
                yield
        finally:
            self._gathered_depth -= 1

    def _rollout(self, idx: np.ndarray) -> list[Group]:
        """Generate and score G samples for each pool question in `idx` with the current policy
        (under torchrun: this rank's shard of `idx`, then every rank's groups in `idx` order)."""
        if len(idx) == 0:
            return []
        r = self.cfg.rollout
        mine = idx[self.dist.shard(len(idx))]
        gen = rank_generator(self.gen, self.dist) if self.dist.enabled else self.gen
        groups: list[Group] = []
        with self._generating():
            if len(mine):
                set_training(self.model, False)
                prompts = [self.prompts[i] for i in mine]
                groups = self.engine.generate(prompts, r.group_size, temperature=r.temperature,
                                              max_new_tokens=r.max_new_tokens, generator=gen)
                set_training(self.model, True)
        if len(mine):
            fault_point("rollout")  # the reliability suite kills runs here (between generate and score)
            self.io.score(groups, [self.pool[i] for i in mine])
        for g, i in zip(groups, mine):
            g.question_id, g.version = int(i), self.step
        out = self.dist.gather(groups)
        self._sampled += sum(int(g.response_mask.sum()) for g in out)
        self._rolled[0] += len(out)  # every group generated: DOTS's references and dynamic sampling's
        self._rolled[1] += sum(g.informative for g in out)  # filtered-out ones too (train/fresh_*)
        return out

    def _new_round(self, rec: dict) -> None:
        """Roll out K references, predict d̂ for the pool, open the round's candidate set."""
        s = self.cfg.selection
        refs = self.dist.decide(lambda: self.np_rng.choice(len(self.pool), size=s.ref_size, replace=False))
        ref_groups = self._rollout(refs)
        observed = np.array([1.0 - g.mean_reward for g in ref_groups])
        if s.online_calibration and self.round_seen:
            q, d = np.array(self.round_seen).T
            rec["dots/calibration_bce"] = self.dist.decide(lambda: self.predictor.refit_calibration(
                self.projections, self.round_refs, self.round_ref_labels, q.astype(np.int64), d))
        self.round_refs, self.round_ref_labels, self.round_seen = refs, observed, []
        self.round_pred = self.dist.decide(lambda: self.predictor.predict_projected(self.projections, refs,
                                                                                    observed))
        self.round_available = np.ones(len(self.pool), dtype=bool)
        if s.oracle:
            self._oracle_round(rec)
        self.round_available[refs] = False
        self.ref_queue = [g for g in ref_groups if g.informative]
        rec["dots/ref_difficulty_mean"] = float(observed.mean())

    def _oracle_round(self, rec: dict) -> None:
        """`selection.oracle` (a diagnostic): the round's d̂ of N random pool questions become their
        exact difficulty under the current policy, the rest of the pool sits the round out. Its
        forward pass is timed apart (`time/oracle_s`) and left out of the step's clock, so the
        arm measures what a perfect predictor at the real one's cost would buy."""
        t = time.perf_counter()
        n = self.cfg.selection.oracle
        cand = self.dist.decide(lambda: np.sort(self.np_rng.choice(len(self.pool), size=n, replace=False)))
        rates = self.dist.decide(lambda: exact_pass_rates(
            self.model, [self.prompts[i] for i in cand], [self.answer_ids[i] for i in cand],
            int(self.tokenizer.eos_token_id), int(self.tokenizer.pad_token_id), self.cfg.rollout.max_new_tokens))
        self.round_pred[cand] = 1.0 - rates
        self.round_available[:] = False
        self.round_available[cand] = True
        rec["time/oracle_s"] = time.perf_counter() - t  # at most one round a step

    def _filtered_groups(self, n: int, rec: dict, timers: dict) -> list[Group]:
        """The peer baselines' step: generation batches of uniformly drawn questions (a permutation of
        the pool, so none twice in a step), filtered to groups with varied rewards, until n are
        collected or the round limit is reached (`dots.dynamic_sampling`). GRESO first skips
        questions by their streaks and afterwards extends the streaks and adapts its bases."""
        start = time.perf_counter()
        rollout_s = 0.0

        def rollout(idx: np.ndarray) -> list[Group]:
            nonlocal rollout_s
            t = time.perf_counter()
            groups = self._rollout(idx)
            rollout_s += time.perf_counter() - t
            if self.greso is not None:
                self.greso.record(groups)
            return groups

        order = self.dist.decide(lambda: self.np_rng.permutation(len(self.pool)))
        if self.greso is None:
            d = self.cfg.dapo
            got = collect(n, order, dapo_sizes(d.gen_batch_size, d.max_gen_batches), rollout)
        else:
            g, skips = self.cfg.greso, {"skipped_easy": 0, "skipped_hard": 0, "skip_prob_sum": 0.0, "considered": 0}

            def pick(candidates: np.ndarray, size: int) -> tuple[np.ndarray, int]:
                kept, used, stats = self.dist.decide(lambda: self.greso.pick(candidates, size, self.np_rng))
                for k, v in stats.items():
                    skips[k] += v
                return kept, used

            # GRESO's generation batches are sized for the train batch; with replay (greso_rr) only the
            # fresh share is collected, so they shrink in proportion (1.5 x the fresh groups needed)
            share = n / self.cfg.train.batch_size
            full = max(1, round(g.sampling_batch_size * share))
            least = max(1, round(g.min_sampling_batch_size * share))  # <= full: config checks min <= full
            got = collect(n, order, greso_sizes(n, full, least, g.max_gen_batches), rollout, pick)
            seen = max(got.rolled_out, 1)
            self.greso.adapt(got.easy / seen, got.hard / seen)
            rec.update({"greso/skipped_easy": skips["skipped_easy"], "greso/skipped_hard": skips["skipped_hard"],
                        "greso/skip_prob_mean": skips["skip_prob_sum"] / max(skips["considered"], 1),
                        "greso/p_easy": self.greso.p_easy, "greso/p_hard": self.greso.p_hard})
        rec.update(got.metrics())
        before = self.records[-1].get("sampling/short_total", 0) if self.records else 0
        rec["sampling/short_total"] = before + int(got.short)  # restored with the records on resume
        timers["rollout"] += rollout_s
        timers["select"] += time.perf_counter() - start - rollout_s
        return got.groups

    def _fresh_groups(self, n: int, rec: dict, timers: dict) -> list[Group]:
        if self.filters_groups:
            return self._filtered_groups(n, rec, timers)
        if not self.uses_dots:
            t = time.perf_counter()
            idx = self.dist.decide(lambda: self.np_rng.choice(len(self.pool), size=n, replace=False))
            groups = self._rollout(idx)
            timers["rollout"] += time.perf_counter() - t
            return groups
        t = time.perf_counter()
        if self.step % self.cfg.selection.every == 0 or self.round_pred is None:
            self._new_round(rec)
        taken, self.ref_queue = self.ref_queue[:n], self.ref_queue[n:]
        s = self.cfg.selection
        idx = self.dist.decide(lambda: select_questions(self.round_pred, n - len(taken), s.alpha, s.tau,
                                                        self.np_rng, self.round_available))
        self.round_available[idx] = False
        timers["select"] += time.perf_counter() - t - rec.get("time/oracle_s", 0.0)  # a diagnostic's, not DOTS's
        t = time.perf_counter()
        groups = self._rollout(idx)
        timers["rollout"] += time.perf_counter() - t
        if len(groups) >= 2:  # out of sample: these questions' labels were not seen by the predictor
            observed = np.array([1.0 - g.mean_reward for g in groups])
            rec["dots/pearson"] = pearson(self.round_pred[idx], observed)
            rec["dots/pearson_ceiling"] = pearson_ceiling([g.rewards.cpu().numpy() for g in groups])
            rec["dots/mae"] = float(np.abs(self.round_pred[idx] - observed).mean())
            self.round_seen.extend(zip(idx.tolist(), observed.tolist()))
        return taken + groups

    # ---- update ----------------------------------------------------------------------------
    def _update(self, groups: list[Group], replayed: list[Group]) -> tuple[float, dict]:
        if not trained_groups(groups, self.cfg.loss.beta, self.cfg.train.skip_degenerate):
            return 0.0, {}  # no gradient anywhere: skip the step (and vLLM's sleep/wake)
        if hasattr(self.engine, "release"):
            self.engine.release()  # a colocated vLLM frees its GPU memory for the update
        out = update_on_groups(self.model, self.opt, groups, self.cfg, self.tokenizer.pad_token_id,
                               ref_model=self.ref_model, replayed=replayed, dist=self.dist, method=self.method)
        self.engine.sync_weights(self.model)  # the next rollout samples from the updated policy
        return out

    # ---- one step --------------------------------------------------------------------------
    def train_step(self) -> dict:
        cfg, b = self.cfg, self.cfg.train.batch_size
        start = time.perf_counter()
        timers = {"rollout": 0.0, "select": 0.0, "update": 0.0}
        rec: dict = {"step": self.step + 1}
        self._sampled, self._rolled = 0, [0, 0]
        replayed: list[Group] = []
        if self.uses_replay:
            n_replay = b - max(1, int(round(cfg.replay.delta_for(self.method) * b)))
            # shortfall is generated fresh below; rank 0 draws, every rank replays the same groups
            replayed = self.dist.decide(lambda: self.buffer.sample(n_replay, self.np_rng, cfg.replay.recency))
        fresh = self._fresh_groups(b - len(replayed), rec, timers)
        fresh_in_batch = fresh
        if self.uses_replay:
            if cfg.replay.fill:  # before this step's fresh groups enter the buffer: a fill never replays them
                n_fill = sum(not g.informative for g in fresh)
                extra = self.dist.decide(lambda: self.buffer.sample(n_fill, self.np_rng, cfg.replay.recency,
                                                                    exclude=replayed))
                replayed = replayed + extra
                rec["replay/filled"] = len(extra)
                fresh_in_batch = given_slots(fresh, len(extra))
            for g in fresh:
                self.buffer.add(g)
        groups = fresh_in_batch + replayed
        t = time.perf_counter()
        loss, stats = self._update(groups, replayed)
        timers["update"] = time.perf_counter() - t
        self.step += 1
        step_s = time.perf_counter() - start - rec.get("time/oracle_s", 0.0)  # selection.oracle: off the clock
        self.elapsed += step_s
        trained = forwarded_groups(groups, cfg, self.method)  # train.downsample: only the rollouts the update forwards
        n_trained = sum(int(g.response_mask.sum()) for g in trained)
        self.totals["tokens_sampled"] += self._sampled
        self.totals["tokens_trained"] += n_trained
        self.totals["groups_trained"] += len(trained)
        rec.update({
            # a dynamic-sampling step can end short with no group at all: nothing to average (null)
            "train/reward_mean": float(np.mean([g.mean_reward for g in fresh])) if fresh else None,
            "train/loss": loss,
            "train/effective_ratio": float(np.mean([g.informative for g in groups])) if groups else 0.0,
            # of the groups generated this step (a DOTS round's K references all counted in its first step,
            # the degenerate ones that never reach a batch too): what selection buys, per group sampled
            "train/fresh_groups": self._rolled[0], "train/fresh_informative": self._rolled[1],
            "train/fresh_effective_ratio": self._rolled[1] / self._rolled[0] if self._rolled[0] else None,
            "train/policy_version": self.step,
            "time/step_s": step_s, "time/rollout_s": timers["rollout"], "time/update_s": timers["update"],
            "time/select_s": timers["select"], "time/elapsed_s": self.elapsed,
            "tokens/sampled": self._sampled, "tokens/trained": n_trained, "train/groups_trained": len(trained),
            "tokens/sampled_total": self.totals["tokens_sampled"],
            "tokens/trained_total": self.totals["tokens_trained"],
            "train/groups_trained_total": self.totals["groups_trained"],
        })
        if self.uses_replay:
            stale = ReplayBuffer.staleness(replayed, self.step - 1) or [0]
            rec.update({
                # greso_rr's dynamic sampling can end a step short with no group at all (an empty buffer too)
                "replay/size": len(self.buffer),
                "replay/fraction": len(replayed) / len(groups) if groups else None,
                "replay/staleness_mean": float(np.mean(stale)), "replay/staleness_max": int(np.max(stale)),
                "replay/ratio_mean": stats.get("replay_ratio_mean", 1.0),
                "replay/ratio_max": stats.get("replay_ratio_max", 1.0),
            })
        self.records.append(rec)
        return rec

    def _rates(self, questions: list[Question], n: int, seed: int) -> np.ndarray:
        """Mean reward of n samples per question at the rollout temperature, every question's
        rate in order (under torchrun each rank rolls out its share). The generator is seeded
        afresh at every call: every evaluation and every method draws the same dice."""
        mine = questions[self.dist.shard(len(questions))]
        r = self.cfg.rollout
        with self._generating():
            rates = pass_rates(self.engine, self.tokenizer, mine, n, r.temperature, r.max_new_tokens,
                               torch.Generator().manual_seed(seed + 7919 * self.dist.rank),
                               chunk=max(1, self.cfg.eval.batch_size // n), io=self.io,
                               paired=True) if mine else np.zeros(0)
        return np.asarray(self.dist.gather(rates.tolist()), dtype=np.float64)

    def evaluate(self) -> dict:
        """Held-out accuracy (eval.metric) with its standard error over questions, and the pool
        frontier of a fixed probe set; runs outside the training clock."""
        ev = self.cfg.eval
        set_training(self.model, False)
        if ev.metric == "sampled":
            per_question = self._rates(self.eval_set, ev.samples, ev.seed)
        else:
            mine = self.eval_set[self.dist.shard(len(self.eval_set))]  # under torchrun: this rank's share
            with self._generating():
                acc = greedy_accuracy(self.engine, self.tokenizer, mine, self.cfg.rollout.max_new_tokens,
                                      ev.batch_size, self.io, per_question=True) if mine else []
            per_question = np.asarray(self.dist.gather(list(acc)), dtype=np.float64)
        e = {"step": self.step, "elapsed_s": self.elapsed, "accuracy": float(per_question.mean()),
             "accuracy_se": float(per_question.std(ddof=1) / np.sqrt(len(per_question)))
             if len(per_question) > 1 else 0.0, **self.totals}
        if len(self.probe):
            probe = self._rates([self.pool[i] for i in self.probe], self.cfg.rollout.group_size, ev.seed + 1)
            e["frontier"] = float(((probe > 0) & (probe < 1)).mean())
            e["probe_pass_rate"] = float(probe.mean())
            if self.round_pred is not None:  # DOTS: the round's predictions on a uniform sample of the pool
                out = ~np.isin(self.probe, self.round_refs) if self.round_refs is not None else \
                    np.ones(len(self.probe), dtype=bool)  # (the round's references are its labels: left out)
                if out.sum() >= 2:
                    e["probe_pearson"] = pearson(self.round_pred[self.probe[out]], 1.0 - probe[out])
        set_training(self.model, True)
        self.evals.append(e)
        return e

    @property
    def finished(self) -> bool:
        return self.step >= self.cfg.train.steps

    def advance(self) -> dict:
        """One step of the run, with its evaluation and checkpoint when due (the evaluation of
        the starting policy comes first). `run` loops over it; the bench's lockstep calls it
        for several methods in turn, so that each step of each is timed under the same load."""
        total = self.cfg.train.steps
        if not self.evals:
            self.evaluate()
        rec = self.train_step()
        if self.step % self.cfg.eval.every == 0 or self.step == total:
            e = self.evaluate()
            rec["eval/accuracy"] = e["accuracy"]
            if "frontier" in e:
                rec["eval/frontier"] = e["frontier"]
            if "probe_pearson" in e:
                rec["dots/probe_pearson"] = e["probe_pearson"]
        if self.on_step is not None:
            self.on_step(rec)
        if self.step % self.cfg.train.checkpoint_every == 0 or self.step == total:
            self._checkpoint()
        return rec

    def run(self, stop_after: int | None = None) -> RunResult:
        """Train to `train.steps` (or stop early after `stop_after` steps, for tests of resume)."""
        if not self.evals:
            self.evaluate()
        while not self.finished:
            self.advance()
            if stop_after is not None and self.step >= stop_after:
                break
        return self.finish()

    def finish(self) -> RunResult:
        self.dist.assert_in_sync(self.model)
        return self.result()

    def result(self, target: float | None = None) -> RunResult:
        target = self.cfg.train.target_accuracy if target is None else target
        tts, sts = time_to_target(self.evals, target, self.cfg.eval.smooth)
        res = RunResult(self.method, self.records, self.evals, self.evals[-1]["accuracy"], target, tts, sts,
                        final_smoothed=final_smoothed(self.evals, self.cfg.eval.smooth),
                        resumed_at=list(self.resumed_at))
        res.summary = write_run_files(self.run_dir, self.cfg, res) if self.dist.main else summarize(res)
        return res

    # ---- checkpoints -----------------------------------------------------------------------
    def _run_identity(self) -> dict[str, str]:
        """What a checkpoint is valid for, part by part: every param that changes the trajectory (a
        longer `train.steps` or other checkpoint spacing may resume, and where MLflow logs is not
        the run's), the policy it starts from, the data it trains and evaluates on, and the dots
        code that trains it (`dots.provenance`: the trainer, what it imports, stages.py).
        `train.threads` counts since stop 69: torch's sums run in another order on other threads,
        so `-S train.threads=1` went on from (or only exported) a run trained on 2, and dvc.lock
        recorded 1 thread for its weights (found by a review)."""
        params = self.cfg.fingerprint(("paths", "train.method", "train.methods", "bench",
                                       "train.checkpoint_every", "train.steps", "tracking"), self.method)
        return {"params": params, "policy": self.policy_identity, "data": self.data_identity,
                "code": code_identity("training")}

    def _run_fingerprint(self) -> str:
        """The identity in one string: what a checkpoint's and a set-aside file's key are made of."""
        return ":".join(self._run_identity().values())

    def _checkpoint(self) -> None:
        if self.sharded:  # every rank takes part in gathering the full model and optimizer state
            model_state, opt_state = self._full_states()
        if not self.dist.main:
            return  # every rank holds the same state; rank 0 writes it
        if not self.sharded:
            model_state, opt_state = self.model.state_dict(), self.opt.state_dict()
        identity = self._run_identity()
        save_checkpoint(self.checkpoint_dir, {
            "method": self.method, "fingerprint": ":".join(identity.values()), "identity": identity,
            "code_files": module_hashes("training"),
            "step": self.step, "elapsed": self.elapsed, "resumed_at": list(self.resumed_at),
            "model": model_state, "optimizer": opt_state,
            "np_rng": self.np_rng.bit_generator.state, "torch_gen": self.gen.get_state(),
            "torch_rng": torch.get_rng_state(), "py_rng": random.getstate(),
            "buffer": self.buffer.state_dict(),
            "greso": self.greso.state_dict() if self.greso is not None else None,
            "round": {"pred": _tensor(self.round_pred), "available": _tensor(self.round_available),
                      "ref_queue": [g.__dict__.copy() for g in self.ref_queue],
                      "refs": _tensor(self.round_refs), "ref_labels": _tensor(self.round_ref_labels),
                      "seen": torch.tensor(self.round_seen, dtype=torch.float64).reshape(-1, 2),
                      "calibration": self.predictor.calibration.state_dict() if self.predictor else None},
            "records": self.records, "evals": self.evals,
        })

    def export(self, path: str | Path, info: dict | None = None) -> Path | None:
        """Write the current policy as a standard model folder (`save_pretrained`: config,
        safetensors weights, tokenizer) that transformers and vLLM load as is. Under train.fsdp
        every rank gathers the full weights (collective) and rank 0 writes. The folder is built
        beside `path` and swapped in whole, so a kill mid-write never leaves half a model."""
        from .export import write_model_folder  # noqa: PLC0415

        state = None
        if self.sharded:
            state = self._full_states()[0]  # collective: every rank takes part
        if not self.dist.main:
            return None
        return write_model_folder(self.model, self.tokenizer, path, state, info)

    def _full_states(self) -> tuple[dict, dict]:
        """train.fsdp: the model's full state dict (plain-model keys, on the CPU) and the optimizer's
        full state (keyed by parameter name, on the CPU of rank 0; other ranks get an empty dict).
        Collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        from .sharding import full_state_dict

        model_state = full_state_dict(self.model, cpu=True)
        if not self.opt.state:  # no step taken yet: get_optimizer_state_dict would initialise the
            return model_state, {}  # states by stepping (AdamW's step count would then be off by one)
        opt_state = get_optimizer_state_dict(self.model, self.opt,
                                             options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return model_state, opt_state

    def _load_full_states(self, model_state: dict, opt_state: dict) -> None:
        """train.fsdp: `_full_states`' dicts back into the sharded model and optimizer (every rank
        holds the whole checkpoint and takes its own slices)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        from .sharding import load_full_state_dict

        load_full_state_dict(self.model, model_state)
        if opt_state:  # empty: saved before any step, a fresh optimizer is the same
            self.opt.zero_grad(set_to_none=True)
            set_optimizer_state_dict(self.model, self.opt, opt_state, options=StateDictOptions(full_state_dict=True))

    def _resume_state(self) -> dict | None:
        """The state this run goes on from, or None to start over. Its checkpoint.pt when that is
        this run's (the same params and warm-up policy, not past `train.steps`); a checkpoint of
        this run set aside earlier when that got further (params changed and changed back, a
        shorter budget and then the longer one again); else None. A checkpoint.pt that is not the
        one to go on from is set aside under its run's key (`checkpoints.set_aside_path`), never
        lost. The files move once every rank has read them (`_move_checkpoints`)."""
        state = load_checkpoint(self.checkpoint_dir)
        if state is not None and state["method"] != self.method:
            raise ValueError(f"{self.checkpoint_dir / CHECKPOINT}: checkpoint is for method {state['method']!r}, "
                             f"not {self.method!r}")
        mine, budget = self._run_fingerprint(), self.cfg.train.steps
        why = None
        if state is not None and state.get("fingerprint") != mine:  # resuming would mix two runs
            why = f"was made {_made_otherwise(state, self._run_identity())}"
        elif state is not None and state["step"] > budget:
            # a shorter budget than the checkpoint's (`train.steps=240` after a 300-step run): resuming
            # returned the 300-step policy as the 240-step run's, which dvc.lock then recorded as such
            why = f"is past this run's train.steps ({budget}), and its step {budget} is not kept"
        aside = self.dist.decide(lambda: furthest_set_aside(self.checkpoint_dir, mine, budget))
        if aside is not None and state is not None and why is None:
            if aside.step <= state["step"]:
                aside = None
            else:
                why = f"is behind {aside.path.name} (step {aside.step}), which this run set aside earlier"
        where = self.checkpoint_dir
        if why:
            kept = set_aside_path(where, state.get("fingerprint", "unknown"), state["step"])
            self._moves.append((where / CHECKPOINT, kept))
            over = "starting over, " if aside is None else ""
            say(f"{where}: checkpoint (step {state['step']}) {why}; {over}old state kept as {kept.name}")
        if aside is None:
            return self._from_repository(mine, budget) if why or state is None else state
        taken = load_tensors(aside.path, "checkpoint")
        if taken.get("method") != self.method or taken.get("fingerprint") != mine:
            raise ValueError(f"{aside.path}: its name says it is this {self.method} run's state, and it "
                             f"holds another run's (method {taken.get('method')!r}, other params); delete it "
                             "or rename it")
        self._moves.append((aside.path, where / CHECKPOINT))
        say(f"{where}: going on from {aside.path.name} (step {aside.step}), set aside earlier by a run with "
            "these params")
        return taken

    def _from_repository(self, mine: str, budget: int) -> dict | None:
        """In a DVC experiment's temporary copy (`dvc exp run --queue`, `--temp`), which holds no
        checkpoint of its own, this run's checkpoint in the repository the copy was made from:
        its checkpoint.pt or one set aside there, whichever got further within `train.steps`,
        read where it lies and never moved (other experiments may read it too); else None. Why:
        every `train@*` stage shares one params list, so a queued sweep of `selection.tau` re-ran
        `train@grpo` in each copy, and grpo, whose key leaves DOTS' params out, trained from step 0
        in each (found at stop 68: 47 s a copy here, hours on the GPU profile), where a workspace
        `dvc exp run` goes on from its finished checkpoint and only exports."""
        source = in_repository(self.checkpoint_dir)
        if source is None:
            return None

        read: dict[Path, dict] = {}  # rank 0's checkpoint.pt, read once when it is the one chosen

        def furthest() -> SetAside | None:
            found = [a for a in [furthest_set_aside(source, mine, budget)] if a is not None]
            try:
                current = load_checkpoint(source)
            except UnsafeFileError as exc:
                say(f"{self.checkpoint_dir}: the repository's checkpoint is not used: {exc}")
                current = None
            if current is not None and current.get("fingerprint") == mine and current["step"] <= budget:
                read[source / CHECKPOINT] = current
                found.append(SetAside(source / CHECKPOINT, int(current["step"])))
            return max(found, key=lambda a: a.step, default=None)

        chosen = self.dist.decide(furthest)
        if chosen is None:
            return None
        state = read.get(chosen.path) or load_tensors(chosen.path, "checkpoint")
        if state.get("method") != self.method or state.get("fingerprint") != mine:
            say(f"{self.checkpoint_dir}: {chosen.path} changed while it was read; starting over")
            return None
        say(f"{self.checkpoint_dir}: going on from the repository's {chosen.path} (step {chosen.step}): this "
            "experiment runs in the copy DVC made of the repository, which holds no checkpoint of its own")
        return state

    def _move_checkpoints(self) -> None:
        """Rank 0, once every rank has read the checkpoints: set aside and take back the files
        `_resume_state` chose, then keep the newest `SET_ASIDE_KEPT` set-aside ones."""
        for src, dst in self._moves:
            src.replace(dst)
            if dst.name != CHECKPOINT:
                os.utime(dst)  # set aside now: the newest, whenever it was written
        if not self._moves:
            return
        for line in prune_set_asides(self.checkpoint_dir):
            say(f"{self.checkpoint_dir}: removed {line}, the oldest set-aside checkpoint: at most "
                f"{SET_ASIDE_KEPT} are kept")

    def _drop_last_budgets_evaluation(self) -> None:
        """A run gone on past a shorter budget: that budget's last step was evaluated because it
        was the last (`advance`), off the `eval.every` grid where the uninterrupted run never
        evaluates. Kept, it moved the smoothed end point (grpo's: compare's target) and where the
        time to target is read (a 3-step run taken to 6 with eval.every 2: evaluations at 0, 2, 3,
        4, 6; found by a review). The evaluation draws from its own generator, so dropping it
        leaves the training stream as it is."""
        if self.step % self.cfg.eval.every == 0 or not self.evals or self.evals[-1]["step"] != self.step:
            return
        self.evals = self.evals[:-1]
        if self.records and self.records[-1]["step"] == self.step:
            self.records[-1] = {k: v for k, v in self.records[-1].items() if k not in EVAL_RECORD_KEYS}

    def _restore(self) -> None:
        state = self._resume_state()
        if state is None:
            return
        if self.sharded:
            self._load_full_states(state["model"], state["optimizer"])
        else:
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optimizer"])
        self.np_rng.bit_generator.state = state["np_rng"]
        self.gen.set_state(state["torch_gen"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["py_rng"])
        self.buffer.load_state_dict(state["buffer"])
        if self.greso is not None and state.get("greso") is not None:
            self.greso.load_state_dict(state["greso"])
        rnd = state["round"]
        self.round_pred, self.round_available = _array(rnd["pred"]), _array(rnd["available"])
        self.ref_queue = [Group(**g) for g in rnd["ref_queue"]]
        self.round_refs, self.round_ref_labels = _array(rnd.get("refs")), _array(rnd.get("ref_labels"))
        self.round_seen = [(int(q), float(d)) for q, d in rnd["seen"].tolist()] if "seen" in rnd else []
        if self.predictor is not None and rnd.get("calibration") is not None:
            self.predictor.calibration.load_state_dict(rnd["calibration"])  # refitted online
        self.engine.sync_weights(self.model)  # a vLLM engine still holds the warm-up weights it loaded
        self.step, self.elapsed = state["step"], state["elapsed"]
        self.records, self.evals = state["records"], state["evals"]
        self.resumed_at = [int(s) for s in state.get("resumed_at", [])]
        if self.step < self.cfg.train.steps:  # a finished run read back trains nothing in this sitting
            self.resumed_at.append(int(self.step))
            self._drop_last_budgets_evaluation()
        if self.records:
            last = self.records[-1]
            self.totals = {"tokens_sampled": last["tokens/sampled_total"], "tokens_trained": last[
                "tokens/trained_total"], "groups_trained": last["train/groups_trained_total"]}
        say(f"{self.checkpoint_dir}: resuming from step {self.step}")


EVAL_RECORD_KEYS = ("eval/accuracy", "eval/frontier", "dots/probe_pearson")  # what `advance` adds to a record
_PARTS = {"params": "with other params", "policy": "from another warm-up policy", "data": "on other data",
          "code": "by other dots code"}


def _made_otherwise(state: dict, mine: dict[str, str]) -> str:
    """How a checkpoint's run differs from this one, for the line that sets it aside; for code, which
    of the modules training runs changed (checkpoints name their modules' hashes since stop 68)."""
    theirs = state.get("identity")
    if not isinstance(theirs, dict):  # written before checkpoints named their parts (stop 67)
        return ("before checkpoints recorded their code and data, or with other params or another "
                "warm-up policy")
    texts = []
    for part, text in _PARTS.items():
        if theirs.get(part) != mine[part]:
            if part == "code":
                changed = changed_modules(state.get("code_files"), module_hashes("training"))
                text += f" ({', '.join(changed) if changed else 'a module training runs'} changed since)"
            texts.append(text)
    return " and ".join(texts)


def _tensor(a: np.ndarray | None) -> torch.Tensor | None:
    """Checkpoints hold tensors, not numpy arrays, so they load with weights_only=True."""
    return None if a is None else torch.from_numpy(np.ascontiguousarray(a))


def _array(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.numpy()
