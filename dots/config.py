"""One validated config for every entry point.

`params.yaml` is the single source of truth: the CLI, the DVC stages and the Prefect
flows all call :func:`load_config`, which applies dotted-key overrides (``train.method=grpo``)
and validates everything with pydantic *before* any work starts. A bad value is refused
with a message that names the key and the allowed range, e.g.::

    replay.delta: must be in (0, 1]; got 1.5

Each field carries a description (cleanrl-style) that says what it does and why.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Callable, Literal, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

BENCH_METHODS = ("grpo", "dots", "rr", "dots_rr", "dapo", "greso")  # what `make bench` trains
# The seeds `make bench` trains. Six, not five: seeds train `bench.workers` (2) at a time, so a
# fifth seed trained alone in a third wave with one core idle; a sixth fills that core for about
# 40 s more of wall-clock, and a median over six seeds moves less from build to build.
BENCH_SEEDS = (0, 1, 2, 3, 4, 5)
# greso_rr: GRESO's filtered fresh groups with Rollout Replay's buffer (beyond both papers; benched on demand)
METHODS = (*BENCH_METHODS, "greso_rr")
Method = Literal["grpo", "dots", "rr", "dots_rr", "dapo", "greso", "greso_rr"]


class MethodTraits(NamedTuple):
    """What a method's step does: the one table the trainer (which parts of a step run) and the
    bench (which params a method's runs read) both follow, so a new method is one row here."""

    selects: bool  # DOTS: reference rollouts, predicted difficulty, selection (needs embeddings and a predictor)
    replays: bool  # Rollout Replay: part of each batch drawn from the buffer of informative groups
    filters: str | None  # the peers' dynamic sampling: "dapo" (filter and redraw) or "greso" (skips first)


TRAITS = {"grpo": MethodTraits(False, False, None), "dots": MethodTraits(True, False, None),
          "rr": MethodTraits(False, True, None), "dots_rr": MethodTraits(True, True, None),
          "dapo": MethodTraits(False, False, "dapo"), "greso": MethodTraits(False, False, "greso"),
          "greso_rr": MethodTraits(False, True, "greso")}
_SELECTION_SECTIONS = ("selection", "embed", "label", "predictor")  # DOTS' own (and its predictor's)


def unread_sections(method: str) -> tuple[str, ...]:
    """The params sections a method's training never reads, from its `TRAITS` row: a grpo run is
    the same run whatever the selection, replay or peer params. A run's key (`Config.fingerprint`
    with a method) leaves them out, so changing them keeps the run's checkpoint valid: `dvc exp run
    -S selection.tau=...` re-runs `train@grpo` (its params list is the stage's, shared by every
    method), which goes on from its finished checkpoint and only exports, instead of training grpo
    again (on the GPU profile, hours); a bench reads such a run back."""
    t, peers = TRAITS[method], sorted({x.filters for x in TRAITS.values() if x.filters})
    return (*(() if t.selects else _SELECTION_SECTIONS), *(() if t.replays else ("replay",)),
            *(p for p in peers if p != t.filters))
# Each method's learning rate on the embedded task (train.lr_by_method): the better of 3e-4 and 6e-4,
# measured side by side in lockstep benches, twice each (docs/benchmark.md); greso_rr at the rate of
# both its parents, greso and dots_rr (3e-4 not benched).
LR_BY_METHOD = {"grpo": 3e-4, "dots": 3e-4, "rr": 3e-4, "dots_rr": 6e-4, "dapo": 6e-4, "greso": 6e-4,
                "greso_rr": 6e-4}
# Each method's PODS down-sampling on the embedded task (train.downsample_by_method; a method not named
# trains on all G): dots_rr keeps 3 of 8 (ties to the wrong answers, train.downsample_ties: low), 0.86-0.87x
# its time at 4 of 8 in two six-seed lockstep benches, beyond the interval (docs/benchmark.md, "Three of
# eight rollouts"); 4 of 8 was 0.87-0.89x its time with all 8 (two five-seed benches); grpo with 4 of 8 never
# reached its own end point, and the other methods were not measured.
DOWNSAMPLE_BY_METHOD = {"dots_rr": 3}
# train.downsample_ties: which side of the rewards a tie between equally varied subsets favours
# (dots.downsample reads the same list to check callers outside the config)
DownsampleTies = Literal["high", "low"]
# Each replaying method's fresh share (replay.delta_by_method; a method not named takes the paper's 0.5):
# dots_rr 0.375 (24 fresh and 40 replayed groups of 64), 0.95x its time at 0.5 beyond the interval in two
# twenty-seed benches (docs/benchmark.md, "A smaller fresh share"); rr tied at 0.375 (ten seeds twice,
# "A still smaller fresh share") and keeps 0.5; greso_rr was not measured.
PAPER_DELTA = 0.5
DELTA_BY_METHOD = {"rr": PAPER_DELTA, "dots_rr": 0.375, "greso_rr": PAPER_DELTA}


class ConfigError(ValueError):
    """A config value is missing, unknown or out of range. The message names the key."""


# numpy's generators take no negative seed (its error names no key), torch's none of 2**64 or more;
# the trainer adds offsets to a seed (ranks, evaluations), so the bound leaves room below both.
MAX_SEED = 2**62


def _range(lo: float | None = None, hi: float | None = None, *, lo_open=False, hi_open=False,
           default: Any = ..., desc: str = "") -> Any:
    """A Field whose allowed range is both enforced and quoted back in error messages."""
    left = "(" if lo_open or lo is None else "["
    right = ")" if hi_open or hi is None else "]"
    allowed = f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"
    kw: dict[str, Any] = {}
    if lo is not None:
        kw["gt" if lo_open else "ge"] = lo
    if hi is not None:
        kw["lt" if hi_open else "le"] = hi
    return Field(default, description=desc, json_schema_extra={"allowed": allowed}, **kw)


def _per_method(shipped: dict[str, Any], desc: str) -> Any:
    """A map of method to value whose default is a copy of `shipped`, the measured values (the
    three per-method maps: train.lr_by_method, train.downsample_by_method, replay.delta_by_method)."""
    return Field(default_factory=lambda: dict(shipped), description=desc)


def _over_shipped(value: Any, shipped: dict[str, Any]) -> Any:
    """A per-method map from a params file or `-S key.method=x` names only the methods it changes;
    every method it does not name keeps its shipped value (not the paper's, not null)."""
    return {**shipped, **value} if isinstance(value, dict) else value


def _refuse_outside(key: str, values: dict[str, Any], ok: Callable[[Any], bool], rule: str) -> None:
    """Refuse a per-method map any of whose values fails `ok`, naming the key, the rule and the
    methods at fault."""
    bad = {m: v for m, v in values.items() if not ok(v)}
    if bad:
        raise ValueError(f"{key}: {rule}; got {bad}")


DatasetFormat = Literal["parquet", "jsonl", "datasets"]


class DatasetSpec(BaseModel):
    """Where a prompt pool lives and which (dotted) columns hold question, answer and id.

    The defaults fit verl's parquet layout (deepscaler); a dotted path walks into struct / dict
    columns (``reward_model.ground_truth``), and a path that ends at a list of chat messages
    (verl's ``prompt`` column) yields the content of the last user message.
    """

    model_config = ConfigDict(extra="forbid")

    path: str = Field(..., min_length=1, description="a .parquet / .jsonl file, a datasets save_to_disk "
                                                     "folder, or a Hugging Face hub name (online only)")
    format: DatasetFormat | None = Field(None, description="parquet | jsonl | datasets; None infers it from the "
                                                    "path (.parquet, .jsonl/.json, anything else: datasets)")
    question: str = Field("extra_info.question", min_length=1,
                          description="dotted column of the question text (or of a list of chat messages)")
    answer: str = Field("reward_model.ground_truth", min_length=1,
                        description="dotted column of the ground-truth answer (LaTeX for math_verify)")
    id: str | None = Field("extra_info.index", description="dotted column of a unique non-negative integer "
                                                           "id; None numbers rows 0, 1, ...")
    max_chars: int = Field(20000, ge=1, description="longest question or answer accepted; longer rows are "
                                                    "refused (they would be truncated by the prompt budget)")
    split: str = Field("train", min_length=1, description="split to load (datasets format only)")
    limit: int | None = Field(None, ge=1, description="keep only the first `limit` rows (quick runs)")
    unparseable: Literal["refuse", "drop"] = Field(
        "refuse", description="a ground truth the reward cannot read (a 'nan'/'None'/'null'-like string, or "
                              "LaTeX the reward's parser cannot parse): 'refuse' the file, listing the rows; "
                              "'drop' those rows, reporting how many and their ids")

    @property
    def resolved_format(self) -> "DatasetFormat":
        if self.format is not None:
            return self.format
        suffix = Path(self.path).suffix.lower()
        if suffix == ".parquet":
            return "parquet"
        if suffix in (".jsonl", ".json"):
            return "jsonl"
        return "datasets"


_NUMBERS = (int, float, int | None, float | None)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_yes_no_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """A yes/no is not a number: pydantic reads `true` as 1, so `-S train.steps=true` or
        `eval.every: yes` (YAML's booleans) trained 1 step or evaluated every step without a word."""
        if isinstance(value, bool) and cls.model_fields[info.field_name].annotation in _NUMBERS:
            raise PydanticCustomError("yes_no_for_a_number", "a yes/no (true, false, yes, no), not a number")
        return value


class Tier(_Section):
    """One difficulty tier of the synthetic task: `operands` numbers of `digits` digits summed."""

    operands: int = _range(2, 6, desc="how many numbers are added")
    digits: int = _range(1, 9, desc="digits of each number")
    weight: float = _range(0, None, lo_open=True, default=1.0, desc="relative share of the pool")


class TaskConfig(_Section):
    source: Literal["synthetic", "dataset"] = Field("synthetic", description="'synthetic' (the embedded "
                                                    "arithmetic task) or 'dataset' (task.dataset, e.g. DeepScaleR)")
    dataset: dict[str, Any] | None = Field(None, description="dots.datasets.DatasetSpec: path, format, "
                                                             "question/answer/id columns, max_chars, limit")
    prompt_template: Literal["plain", "chat"] = Field("plain", description="'chat' wraps each question in the "
                                                                           "tokenizer's chat template")
    system_prompt: str | None = Field(None, description="system turn of the chat template (chat only)")
    seed: int = _range(0, MAX_SEED, default=0,
                       desc="seed of the question generator and of the pool/eval split")
    pool_size: int = _range(16, None, default=16384, desc="training pool questions DOTS selects from")
    eval_size: int = _range(16, None, default=2048, desc="held-out questions for accuracy (>= 2048 for "
                                                          "differences above noise)")
    pad_width: int = _range(0, 9, default=4, desc="zero-pad every operand to this many digits (0: none); a "
                            "fixed layout lets skills learned on short sums carry over to long ones")
    tiers: list[Tier] = Field(
        default_factory=lambda: [Tier(operands=2, digits=d) for d in range(1, 5)]
        + [Tier(operands=3, digits=d) for d in range(1, 4)],
        description="difficulty spectrum: more digits and more operands are harder",
    )

    @model_validator(mode="after")
    def _pad_fits(self) -> "TaskConfig":
        widest = max((t.digits for t in self.tiers), default=0)
        if self.source == "synthetic" and 0 < self.pad_width < widest:
            raise ValueError(f"task.pad_width: must be 0 or at least the widest tier's digits ({widest}); "
                             f"got {self.pad_width}")
        return self


class ModelConfig(_Section):
    pretrained: str | None = Field(None, description="hub name or local folder of a causal LM to fine-tune; "
                                                     "set, it replaces the tiny model and skips the warm-up")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="policy weights' dtype")
    plan_config: str | None = Field(None, description="a config.json with model.pretrained's architecture, for "
                                                      "`dots plan` on a machine that has not downloaded the model")
    n_layer: int = _range(1, 48, default=3, desc="transformer blocks of the tiny GPT-2")
    n_embd: int = _range(8, 4096, default=64, desc="hidden size")
    n_head: int = _range(1, 64, default=4, desc="attention heads; must divide n_embd")
    n_positions: int = _range(8, 4096, default=64, desc="longest prompt + answer")

    @model_validator(mode="after")
    def _heads_divide(self) -> "ModelConfig":
        if self.n_embd % self.n_head:
            raise ValueError(f"model.n_head: must divide model.n_embd ({self.n_embd}); got {self.n_head}")
        return self


class WarmupConfig(_Section):
    steps: int = _range(1, None, default=400, desc="supervised steps; stopped early on purpose so the "
                                                    "pool keeps unsolved and half-solved questions")
    batch_size: int = _range(1, None, default=128, desc="sequences per supervised step")
    lr: float = _range(0, 1, lo_open=True, default=3e-3, desc="AdamW learning rate")
    checkpoints: list[int] = Field(default_factory=lambda: [300, 350, 600, 800],
                                   description="steps saved as extra labelling policies; one past warmup.steps "
                                               "goes on training after 'final' (the RL start) is saved, for "
                                               "labels only")
    spectrum_questions: int = _range(8, None, default=1024, desc="pool questions rolled out (G each) to "
                                                                 "print the difficulty spectrum")


EMBED_PREFIXES = ("hf:", "sentence-transformers:")  # what embed.backbone may start with, beside 'warmup'


class EmbedConfig(_Section):
    backbone: str = Field("warmup", description="'warmup' (the frozen warm-up policy) or "
                                                "'sentence-transformers:<name or path>'")
    batch_size: int = _range(1, None, default=512, desc="questions per encoder forward pass")
    pooling: Literal["mean", "mean+last"] = Field("mean+last", description="'mean': masked mean of the last "
                                                  "hidden state (the paper); 'mean+last': also the last token's "
                                                  "state (causal LMs, not sentence-transformers)")


def holdout_size(n: int, fraction: float) -> int:
    """How many of n labelled questions `fit-predictor` holds out (at least one); here, so that the
    config can refuse a split that leaves too few on either side before any stage runs."""
    return max(1, int(round(n * fraction)))


class LabelConfig(_Section):
    num_questions: int = _range(8, None, default=2048, desc="pool questions labelled for the predictor")
    policies: list[str] = Field(default_factory=lambda: ["step300", "step350", "final", "step600", "step800"],
                                description="warm-up checkpoints whose pass rates label the predictor data")
    samples: int | None = _range(2, None, default=None,
                                 desc="rollouts per labelled question; None: rollout.group_size. More samples "
                                      "give the predictor less noisy targets (a labelling pass costs about "
                                      "samples / G times as much)")


class PredictorConfig(_Section):
    hidden: int = _range(4, None, default=128, desc="adapter width h")
    dropout: float = _range(0, 1, hi_open=True, default=0.1, desc="adapter dropout")
    lr: float = _range(0, 1, lo_open=True, default=1e-3, desc="AdamW learning rate")
    steps: int = _range(1, None, default=600, desc="training batches")
    batch_size: int = _range(1, None, default=128, desc="queries per batch (one shared reference set)")
    holdout_fraction: float = _range(0, 1, lo_open=True, hi_open=True, default=0.2,
                                     desc="labelled questions kept out for held-out Pearson/MAE")


class SelectionConfig(_Section):
    every: int = _range(1, None, default=8, desc="steps per DOTS selection round (8 with a 128-group replay "
                                                 "buffer: 0.91-0.92x dots_rr's time to target of every 4 with "
                                                 "256, ten seeds, measured twice side by side)")
    ref_size: int = _range(2, None, default=32, desc="K reference questions rolled out per round; keep "
                                                     "small against every x batch_size (at least 2: the "
                                                     "predictor's training masks a query out of its own "
                                                     "references, and one left it none)")
    alpha: float = _range(0, 1, default=0.5, desc="target difficulty (0.5 maximises the GRPO gradient)")
    online_calibration: bool = Field(False, description="refit the predictor's calibration (T, b) each round "
                                                        "from the difficulties its selected questions showed")
    oracle: int = _range(0, None, default=0, desc="diagnostic, not a method (dots/oracle.py): N > 0 replaces "
                                                  "each round's predictions with the exact pass rates of N random "
                                                  "pool questions under the current policy (exact_match reward at "
                                                  "temperature 1), computed outside the training clock; 0: off")
    tau: float = _range(0, None, lo_open=True, default=0.1, desc="sampling temperature of "
                                                                 "P(q) ~ exp(-|d-alpha|/tau)")


class ReplayConfig(_Section):
    capacity: int = _range(1, None, default=128, desc="C, most groups the FIFO buffer holds (128: "
                                                       "fresher replay; with selection.every 8 it wins)")
    delta: float | None = _range(0, 1, lo_open=True, default=None,
                                 desc="fresh share of each batch for every replaying method (1 = no replay); "
                                      "null: each method's own from replay.delta_by_method")
    delta_by_method: dict[Method, float] = _per_method(
        DELTA_BY_METHOD,
        "each method's fresh share when replay.delta is null (a method not named: the paper's 0.5): "
        "dots_rr 0.375, 0.95x its time at 0.5 beyond the interval in two twenty-seed benches "
        "(docs/benchmark.md); rr keeps 0.5 (tied at 0.375); greso_rr keeps 0.5 (not measured)")
    recency: float = _range(0, None, default=0.0, desc="replay sampling weight exp(-recency x age in steps); 0: "
                                                       "uniform (the paper)")
    fill: bool = Field(default=False, description="beyond the paper: a fresh group that comes back degenerate "
                                                  "gives its slot to one more replayed group, so a step trains "
                                                  "a full batch of informative groups (false: the paper)")

    @field_validator("delta_by_method", mode="before")
    @classmethod
    def _unnamed_methods_keep_their_share(cls, value: Any) -> Any:
        """`-S replay.delta_by_method.rr=0.375` changes rr's share and leaves dots_rr's."""
        return _over_shipped(value, DELTA_BY_METHOD)

    @model_validator(mode="after")
    def _shares_in_range(self) -> "ReplayConfig":
        _refuse_outside("replay.delta_by_method", self.delta_by_method, lambda d: 0 < d <= 1,
                        "each share must be in (0, 1]")
        return self

    def delta_for(self, method: str | None) -> float:
        """The fresh share `method` trains with: replay.delta when set, else its own (0.5 when
        not named, the paper's)."""
        if self.delta is not None:
            return self.delta
        return self.delta_by_method.get(method, PAPER_DELTA)


class DapoConfig(_Section):
    """DAPO's dynamic sampling (method `dapo`), with the DAPO recipe's settings in verl."""
    gen_batch_size: int = _range(1, None, default=192, desc="prompts per generation batch (verl's "
                                                            "data.gen_batch_size; the recipe: 3 x the train batch)")
    max_gen_batches: int = _range(0, None, default=10, desc="generation batches a step may draw before it trains "
                                                            "on what it has (verl's max_num_gen_batches; 0: no limit)")


class GresoConfig(_Section):
    """GRESO's selective rollouts (method `greso`), with the GRESO paper's settings."""
    p_easy: float = _range(0, 1, default=0.5, desc="initial exploration base for all-correct streaks")
    p_hard: float = _range(0, 1, default=0.5, desc="initial exploration base for all-wrong streaks")
    target_zero_variance: float = _range(0, 1, default=0.25, desc="target share of zero-variance groups among "
                                                                  "those rolled out (1/3 easy, 2/3 hard)")
    p_min: float = _range(0, 1, default=0.05, desc="lowest exploration base")
    p_max: float = _range(0, 1, default=0.95, desc="highest exploration base")
    sampling_batch_size: int = _range(1, None, default=96, desc="prompts kept per full generation batch (GRESO: "
                                                                "384 for a 256-prompt train batch, 1.5 x)")
    min_sampling_batch_size: int = _range(1, None, default=16, desc="smallest follow-up generation batch (GRESO: "
                                                                    "64 for 256, a quarter of the train batch)")
    max_gen_batches: int = _range(0, None, default=10, desc="generation batches a step may draw (0: no limit, "
                                                            "as GRESO)")


class LossConfig(_Section):
    clip_eps: float = _range(0, 1, lo_open=True, hi_open=True, default=0.2, desc="PPO clip epsilon")
    beta: float = _range(0, None, default=0.0, desc="KL weight against the warm-up policy (0 skips "
                                                    "the reference forward pass)")
    scale_rewards: Literal["none", "group"] = Field("none", description="'group' divides advantages by "
                                                                        "the group's reward std")


class RolloutConfig(_Section):
    engine: Literal["hf", "vllm"] = Field("hf", description="rollout engine: 'hf' (CPU, tests) or 'vllm'")
    group_size: int = _range(2, None, default=8, desc="G, samples per question")
    temperature: float = _range(0, None, lo_open=True, default=1.0, desc="sampling temperature")
    max_new_tokens: int = _range(1, None, default=10, desc="longest answer")
    batch_size: int = _range(1, None, default=1024, desc="sequences per generation batch")
    vllm_gpu_memory_utilization: float = _range(0, 1, lo_open=True, default=0.35,
                                                desc="vLLM's share of GPU memory when colocated with the trainer")
    vllm_sleep_mode: bool = Field(True, description="vLLM sleeps (frees its GPU memory) during each update")
    behaviour_logprobs: Literal["trainer", "vllm"] = Field(
        "trainer", description="vllm only: where replay's behaviour log-probs come from: 'trainer' (the "
                               "training forward, micro-batched, after vLLM sleeps: like for like with the "
                               "update) or 'vllm' (vLLM's own, at the sampling temperature; no extra forward)")


class RewardConfig(_Section):
    name: Literal["exact_match", "math_verify"] = Field("exact_match", description="exact_match (embedded "
                                                        "task) or math_verify (boxed LaTeX answers)")
    timeout_s: float = _range(0, 600, lo_open=True, default=5.0,
                              desc="CPU seconds one math_verify check may take")


class EvalConfig(_Section):
    every: int = _range(1, None, default=10, desc="steps between held-out evaluations (the resolution of "
                                                  "time-to-target)")
    batch_size: int = _range(1, None, default=1024, desc="sequences per evaluation decoding batch")
    metric: Literal["sampled", "greedy"] = Field("sampled", description="'sampled': mean reward of "
                                                 "eval.samples answers per held-out question at the rollout "
                                                 "temperature (mean@k, the usual RLVR metric; it keeps moving "
                                                 "while the policy sharpens); 'greedy': exact match of one "
                                                 "greedy answer (saturates early)")
    samples: int = _range(1, None, default=2, desc="k answers per held-out question (sampled metric)")
    seed: int = _range(0, MAX_SEED, default=1234,
                       desc="seed of the evaluation's sampling, the same at every evaluation and for every "
                            "method (common random numbers: differences between two evaluations come from "
                            "the policy, not from the dice)")
    smooth: int = _range(1, None, default=3, desc="evaluations averaged (trailing) before the curve is "
                                                  "compared with the target; the target is grpo's mean of "
                                                  "its last `smooth` evaluations")
    probe_size: int = _range(0, None, default=256, desc="fixed pool questions rolled out (G each) at every "
                                                        "evaluation to log eval/frontier, the share whose "
                                                        "sampled pass rate is strictly between 0 and 1 (0: off)")


class HeldoutSet(DatasetSpec):
    """An extra held-out set of the evaluate stage (e.g. MATH500, AIME): a local file in any
    layout the dataset loader reads, scored like the task's own held-out rows."""

    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]+$", description="short name; metrics are "
                                                                    "heldout/<name>/<metric>")


class EvaluateConfig(_Section):
    """The evaluate@<method> stage: the exported final policy on held-out sets, after training.
    Apart from `eval` (the in-training curve), so changing these re-runs only evaluation."""

    samples: int = _range(0, None, default=4, desc="k sampled answers per question at rollout.temperature "
                                                   "for pass@k and mean@k (0: greedy accuracy only)")
    seed: int = _range(0, MAX_SEED, default=0,
                       desc="sampling seed (the same for every method: common random numbers)")
    sets: list[HeldoutSet] = Field(default_factory=list, description="extra held-out sets beside the task's "
                                   "own (named 'task'): [{name, path, question, answer, id, ...}]")

    @model_validator(mode="after")
    def _unique_names(self) -> "EvaluateConfig":
        names = ["task", *(s.name for s in self.sets)]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"evaluate.sets: names must be unique and not 'task' (the task's own held-out "
                             f"set); repeated: {dup}")
        return self


class TrainConfig(_Section):
    method: Method = Field("dots_rr", description="one of grpo, dots, rr, dots_rr, the peer baselines dapo, "
                                                  "greso, and greso_rr (GRESO's fresh groups with replay)")
    methods: list[Method] = Field(default_factory=lambda: ["grpo", "dots_rr"],
                                  description="methods `dots compare` and `make run` train side by side")
    seed: int = _range(0, MAX_SEED, default=0, desc="seed of rollouts, selection and replay sampling")
    steps: int = _range(1, None, default=300, desc="step budget shared by every method")
    batch_size: int = _range(1, None, default=64, desc="B, question groups per step")
    lr: float | None = _range(0, 1, lo_open=True, default=None,
                              desc="AdamW learning rate of every method; null: each method's own rate from "
                                   "train.lr_by_method (a number here, e.g. -S train.lr=0.0003, overrides them all)")
    lr_by_method: dict[Method, float] = _per_method(
        LR_BY_METHOD,
        "each method's AdamW learning rate when train.lr is null (a method not named keeps the rate "
        "below): the better of 3e-4 and 6e-4 on the "
        "embedded task, each measured twice side by side (docs/benchmark.md); grpo gets worse at 6e-4, "
        "rr ties, dots_rr, dapo and greso gain; dots alone was not measured at 6e-4 and keeps 3e-4")
    max_grad_norm: float = _range(0, None, lo_open=True, default=1.0, desc="gradient clipping")
    skip_degenerate: bool = Field(True, description="forward only the informative groups in the update: with "
                                                    "loss.beta = 0 a group whose rewards are all equal has zero "
                                                    "gradient, so the step is the same at less cost. false: "
                                                    "forward every group, as a plain GRPO trainer does (the "
                                                    "cost the paper's baseline pays)")
    downsample: int | None = _range(2, None, default=None,
                                    desc="rollouts of each trained group the update forwards, for every method: "
                                         "the m of G whose rewards vary most, advantages taken over those m (PODS "
                                         "max-variance down-sampling, dots.downsample); null: each method's own m "
                                         "from train.downsample_by_method (a number here, e.g. -S "
                                         "train.downsample=8 for all G, overrides them all)")
    downsample_by_method: dict[Method, int | None] = _per_method(
        DOWNSAMPLE_BY_METHOD,
        "each method's train.downsample when that is null (a method not named, null, or an m of "
        "at least rollout.group_size: all G): dots_rr keeps 3 of 8 (with train.downsample_ties: low), "
        "which beat 4 of 8 beyond the interval in two six-seed benches, as 4 had beaten all 8 "
        "(docs/benchmark.md); grpo with 4 of 8 never reached its target; the others were not measured")
    downsample_ties: DownsampleTies = Field(
        "low", description="when two of a group's m-row subsets vary as much (an odd m with right and wrong "
                           "answers: 2 right + 1 wrong or 1 right + 2 wrong), keep the one with more of the "
                           "lower rewards ('low': dots_rr's 3 of 8 keep 1 right + 2 wrong, 0.86-0.87x the "
                           "time of 4 of 8, docs/benchmark.md) or of the higher ones ('high', the rule "
                           "before: at 3 of 8 it took about 1.3x the steps of 4); dots.downsample")
    checkpoint_every: int = _range(1, None, default=50, desc="steps between resumable checkpoints")
    target_accuracy: float | None = _range(0, 1, default=None,
                                           desc="accuracy for time-to-target; `compare` uses grpo's final")
    threads: int = _range(1, 256, default=2, desc="torch CPU threads")
    deterministic: bool = Field(True, description="torch's deterministic kernels (and cuBLAS's fixed workspace "
                                                  "on CUDA): a run's numbers depend on its seed, params and "
                                                  "train.threads alone, not on the machine's load "
                                                  "(dots.determinism); off trades that for GPU speed")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where the policy trains; auto = cuda "
                                                                       "when available")
    micro_batch_tokens: int | None = _range(1, None, default=None,
                                            desc="padded tokens (rows x (prompt + response)) per forward/backward "
                                                 "of the update; gradients accumulate over micro-batches, the "
                                                 "loss is the same (dots.microbatch). null: one batch per step")
    logprob_chunk_tokens: int = _range(1, None, default=8192,
                                       desc="response tokens whose full-vocabulary logits exist at once when "
                                            "log-probs are taken (chunked and recomputed in the backward pass "
                                            "above this; a batch within it takes one plain log-softmax)")
    gradient_checkpointing: bool = Field(False, description="keep only each transformer block's inputs and "
                                                            "recompute its activations in the backward pass "
                                                            "(less memory, about a third more update compute)")
    memory_gb: float | None = _range(0, None, lo_open=True, default=None,
                                     desc="GPU memory per rank to plan against (`dots plan`); null: the visible "
                                          "GPU's, or no check on a machine without one")
    fsdp: bool = Field(False, description="shard weights, gradients and AdamW states over the torchrun ranks "
                                          "with PyTorch FSDP2 (dots.sharding); rollouts and evaluations gather "
                                          "the whole policy on each rank; no effect in a single process")


    @field_validator("lr_by_method", "downsample_by_method", mode="before")
    @classmethod
    def _unnamed_methods_keep_their_value(cls, value: Any, info: ValidationInfo) -> Any:
        """`-S train.lr_by_method.greso=0.0003` changes greso's rate and leaves the others';
        `-S train.downsample_by_method.rr=4` down-samples rr too and leaves dots_rr's 3."""
        shipped = {"lr_by_method": LR_BY_METHOD, "downsample_by_method": DOWNSAMPLE_BY_METHOD}[info.field_name]
        return _over_shipped(value, shipped)

    @model_validator(mode="after")
    def _rates_in_range(self) -> "TrainConfig":
        _refuse_outside("train.lr_by_method", self.lr_by_method, lambda r: 0 < r < 1, "rates must be in (0, 1)")
        _refuse_outside("train.downsample_by_method", self.downsample_by_method, lambda k: k is None or k >= 2,
                        "each must be null or at least 2 (one rollout has no advantage)")
        return self

    def rate_for(self, method: str) -> float:
        """The AdamW learning rate `method` trains with: train.lr when set, else its own."""
        return self.lr if self.lr is not None else self.lr_by_method[method]

    def downsample_for(self, method: str | None) -> int | None:
        """The m of G rollouts `method`'s update trains on (None: all G): train.downsample when
        set, else the method's own; with no method, train.downsample alone."""
        if self.downsample is not None or method is None:
            return self.downsample
        return self.downsample_by_method.get(method)


class BenchConfig(_Section):
    """How `make bench` times its runs on the CPU (docs/benchmark.md, "One thread a run")."""
    workers: int = _range(1, 64, default=2,
                          desc="seeds the bench trains at once, each seed's arms in lockstep in a process of its "
                               "own (on a GPU, where runs are timed one after another, always 1)")
    threads: int = _range(1, 256, default=1,
                          desc="torch threads of every bench run (it replaces train.threads there; the shared "
                               "stages keep train.threads): on one thread a busy neighbour process moves a step "
                               "by ~5%, on two by 2-4x (docs/benchmark.md)")


class TrackingConfig(_Section):
    enabled: bool = Field(True, description="log runs to MLflow (parent per pipeline, child per method)")
    uri: str | None = Field(None, description="tracking URI; null: $MLFLOW_TRACKING_URI, else "
                                              "sqlite:///<paths.root>/mlflow.db")
    experiment: str = Field("dots", description="MLflow experiment name")
    artifact_location: str | None = Field(None, description="where a new experiment stores artifacts, "
                                                            "e.g. s3://bucket/mlflow")
    log_every: int = _range(1, None, default=10, desc="steps buffered between MLflow writes")


class PathsConfig(_Section):
    root: str = Field("artifacts", description="where every stage writes its outputs")


class Config(_Section):
    task: TaskConfig = Field(default_factory=TaskConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    embed: EmbedConfig = Field(default_factory=EmbedConfig)
    label: LabelConfig = Field(default_factory=LabelConfig)
    predictor: PredictorConfig = Field(default_factory=PredictorConfig)
    selection: SelectionConfig = Field(default_factory=SelectionConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    dapo: DapoConfig = Field(default_factory=DapoConfig)
    greso: GresoConfig = Field(default_factory=GresoConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    bench: BenchConfig = Field(default_factory=BenchConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    paths: PathsConfig = Field(default_factory=PathsConfig)

    @model_validator(mode="after")
    def _fits_the_pool(self) -> "Config":
        pool = self.task.pool_size
        checks = [
            ("selection.ref_size", self.selection.ref_size, pool, "task.pool_size"),
            ("train.batch_size", self.train.batch_size, pool, "task.pool_size"),
            ("label.num_questions", self.label.num_questions, pool, "task.pool_size"),
            ("predictor.batch_size", self.predictor.batch_size, self.label.num_questions,
             "label.num_questions"),
            ("greso.min_sampling_batch_size", self.greso.min_sampling_batch_size, self.greso.sampling_batch_size,
             "greso.sampling_batch_size"),
            ("greso.p_min", self.greso.p_min, self.greso.p_max, "greso.p_max"),
        ]
        for key, value, limit, limit_key in checks:
            if value > limit:
                raise ValueError(f"{key}: must be <= {limit_key} ({limit}); got {value}")
        n_label = self.label.num_questions
        n_hold = holdout_size(n_label, self.predictor.holdout_fraction)
        if n_hold < 2 or n_label - n_hold < 3:  # a K = 1 fit predicts every question alike: a NaN Pearson
            raise ValueError(f"predictor.holdout_fraction: splits label.num_questions ({n_label}) into "
                             f"{n_label - n_hold} questions to train on and {n_hold} held out; the predictor "
                             "needs at least 3 to train on (2 references beside each query) and 2 held out "
                             "(a Pearson)")
        fresh_per_round = self.selection.every * self.train.batch_size
        if self.selection.ref_size + fresh_per_round > pool:
            raise ValueError(
                f"selection.ref_size: ref_size + selection.every x train.batch_size "
                f"({self.selection.ref_size} + {fresh_per_round}) must be <= task.pool_size ({pool})")
        if self.selection.oracle:
            if self.selection.oracle > pool:
                raise ValueError(f"selection.oracle: must be <= task.pool_size ({pool}); got {self.selection.oracle}")
            if self.reward.name != "exact_match" or self.rollout.temperature != 1.0:
                raise ValueError("selection.oracle: exact pass rates need reward.name=exact_match and "
                                 f"rollout.temperature=1.0; got {self.reward.name!r} at {self.rollout.temperature}")
        if self.train.downsample is not None and self.train.downsample > self.rollout.group_size:
            raise ValueError(f"train.downsample: must be <= rollout.group_size ({self.rollout.group_size}); "
                             f"got {self.train.downsample}")
        for step in self.warmup.checkpoints:
            if step <= 0 or step == self.warmup.steps:
                raise ValueError(f"warmup.checkpoints: each must be > 0 and not warmup.steps={self.warmup.steps} "
                                 f"(that one is 'final'); got {step}")
        known = {f"step{s}" for s in self.warmup.checkpoints} | {"final"}
        if self.model.pretrained:
            known = {"final"}
        for name in self.label.policies:
            if name not in known:
                raise ValueError(f"label.policies: {name!r} is not a warm-up checkpoint; allowed: {sorted(known)}")
        if not self.label.policies:
            raise ValueError("label.policies: needs at least one policy")
        if not self.task.tiers:
            raise ValueError("task.tiers: needs at least one tier")
        if self.task.source == "dataset" and not self.task.dataset:
            raise ValueError("task.dataset: needed when task.source is 'dataset' (at least a path)")
        if self.task.dataset:  # also while unread (task.source synthetic): a typo in it is named now
            try:
                DatasetSpec.model_validate(self.task.dataset)
            except ValidationError as exc:
                err = exc.errors()[0]
                raise ValueError(f"task.dataset.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None
        if not self.train.methods:
            raise ValueError("train.methods: needs at least one method (what `dots all` and `make run` "
                             "train)")
        if repeated := sorted({m for m in self.train.methods if self.train.methods.count(m) > 1}):
            raise ValueError(f"train.methods: {repeated} given twice (each would train from step 0 again)")
        backbone = self.embed.backbone
        if backbone != "warmup" and not any(backbone.startswith(p) and backbone[len(p):]
                                            for p in EMBED_PREFIXES):
            raise ValueError(f"embed.backbone: {backbone!r}; allowed: 'warmup', 'hf:<name or path>' or "
                             "'sentence-transformers:<name>'")
        if self.model.pretrained:
            if self.embed.backbone == "warmup":
                raise ValueError("embed.backbone: 'warmup' needs the embedded model; with model.pretrained use "
                                 "'hf:<name or path>' (e.g. the instruct model) or 'sentence-transformers:<name>'")
            bad = [p for p in self.label.policies if p != "final"]
            if bad:
                raise ValueError(f"label.policies: with model.pretrained only 'final' (the pretrained policy) "
                                 f"exists; got {bad}")
        return self

    # -- helpers ---------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return Path(self.paths.root)

    def fingerprint(self, exclude: tuple[str, ...] = ("paths",), method: str | None = None) -> str:
        """Hash of the config less the `exclude`d dotted keys or sections: what a result depends on.
        With `method`, the learning rate, the down-sampling and the fresh share are the ones that
        method trains with, and the other methods' are left out (changing greso's rate does not
        change a dots_rr run), and the sections it never reads (`unread_sections`) are left out too;
        the down-sampling's tie rule only counts for a method that down-samples (it cannot change
        a run that trains on all G)."""
        if method is not None:
            exclude = (*exclude, *unread_sections(method))
        flat = {k: v for k, v in self.flat().items() if not any(k == e or k.startswith(e + ".") for e in exclude)}
        if method is not None:
            reads_replay = "replay.delta" in flat
            flat = {k: v for k, v in flat.items()
                    if not k.startswith(("train.lr_by_method.", "train.downsample_by_method.",
                                         "replay.delta_by_method."))}
            flat["train.lr"] = self.train.rate_for(method)
            flat["train.downsample"] = self.train.downsample_for(method)
            if flat["train.downsample"] is None:
                flat.pop("train.downsample_ties", None)
            if reads_replay:
                flat["replay.delta"] = self.replay.delta_for(method)
        return hashlib.sha256(yaml.safe_dump(flat, sort_keys=True).encode()).hexdigest()[:16]

    def flat(self) -> dict[str, Any]:
        """The whole config as dotted keys (what MLflow logs as params)."""
        return flatten(self.model_dump())


def check_writes(cfg: Config) -> None:
    """Params may not make dots write outside the project: paths.root is a folder of its own,
    and a local tracking store or artifact folder lies in the folder that holds paths.root.
    (Checked on what users pass in, in `load_config`; configs derived in code, such as the
    benchmark's `<paths.root>/bench` workspace, keep the user's checked store.)"""
    root = cfg.root.expanduser().resolve()
    if root == Path(root.anchor) or root == Path.home().resolve():
        raise ConfigError(f"invalid config:\n  paths.root: must be a folder of the project's outputs, not {root}; "
                          f"got {cfg.paths.root!r}")
    for key in ("uri", "artifact_location"):
        value = getattr(cfg.tracking, key)
        local = local_path(value)
        if local is not None and not local.expanduser().resolve().is_relative_to(root.parent):
            raise ConfigError(f"invalid config:\n  tracking.{key}: {value!r} would write to "
                              f"{local.expanduser().resolve()}, outside the project folder {root.parent} (the "
                              "folder holding paths.root); use a path under it or a remote store")


def local_path(uri: str | None) -> Path | None:
    """The local file or folder a store URI writes to; None for a remote or in-memory store."""
    if not uri:
        return None
    if uri.startswith("sqlite:"):
        rest = uri.removeprefix("sqlite:")
        path = rest[3:].split("?")[0] if rest.startswith("///") else ""
        return Path(path) if path and path != ":memory:" else None
    if uri.startswith("file:"):
        from urllib.parse import unquote, urlsplit  # noqa: PLC0415

        return Path(unquote(urlsplit(uri).path))
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", uri):
        return None  # http(s), s3, gs, databricks, postgresql, ...
    return Path(uri)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def _allowed(loc: tuple) -> str | None:
    """The 'allowed' text of the field at `loc`, walking the model classes."""
    model: Any = Config
    info = None
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        fields = getattr(model, "model_fields", {})
        if part not in fields:
            return None
        info = fields[part]
        ann = info.annotation
        args = getattr(ann, "__args__", ()) or ()
        model = next((a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None)
    extra = info.json_schema_extra if info is not None else None
    return extra.get("allowed") if isinstance(extra, dict) else None


def _format(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in loc)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "value_error":
            lines.append(msg)  # our own checks already name their keys
            continue
        if e["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key")
            continue
        allowed = _allowed(loc)
        hint = f"; allowed: {allowed}" if allowed else ""
        got = f"; got {e['input']!r}" if "input" in e and not isinstance(e["input"], dict) else ""
        lines.append(f"{key}: {msg}{hint}{got}")
    return "invalid config:\n  " + "\n  ".join(lines)


def apply_overrides(raw: dict[str, Any], overrides: list[str] | dict[str, Any] | None) -> dict[str, Any]:
    """Set dotted keys (``train.method=grpo`` or ``{"train.method": "grpo"}``) in a raw config dict.

    Values are parsed as YAML, so ``-S train.target_accuracy=0.6`` gives a float and
    ``-S task.tiers=[...]`` a list.
    """
    items: list[tuple[str, Any]] = []
    if isinstance(overrides, dict):
        items = list(overrides.items())
    else:
        for text in overrides or []:
            if "=" not in text:
                raise ConfigError(f"override {text!r}: expected key=value, e.g. train.method=grpo")
            key, value = text.split("=", 1)
            items.append((key.strip(), yaml.safe_load(value)))
    for key, value in items:
        parts = key.split(".")
        node = raw
        for i, part in enumerate(parts[:-1]):
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"{'.'.join(parts[: i + 1])}: is a value, not a section; cannot set {key}")
            node = nxt
        node[parts[-1]] = value
    return raw


def _validated(raw: dict[str, Any]) -> Config:
    """A raw config dict validated, or ConfigError naming each bad key."""
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format(exc)) from None


def with_overrides(cfg: Config, overrides: list[str]) -> Config:
    """`cfg` with dotted-key overrides applied and validated (ConfigError naming the key)."""
    return _validated(apply_overrides(cfg.model_dump(), overrides))


def params_file(named: str | Path | None, default: str = "params.yaml") -> str | None:
    """The params file a command reads: the one named (`-p`, a flow's `params`), which must exist,
    or ./params.yaml when there is one, else None (every default). `load_config` reads a missing
    path as all defaults, so `dots all -p configs/profile.yml` with a typo trained the embedded
    default in the profile's place, over the default paths.root. While a flow's overrides are in
    a params.yaml, a process outside that flow reads the user's own file (`dots.params_record`)."""
    if named is None:
        chosen = default if Path(default).is_file() else None
    elif not Path(named).is_file():
        raise ConfigError(f"{named}: no such params file")
    else:
        chosen = str(named)
    if chosen is None:
        return None
    from .params_record import users_params  # noqa: PLC0415
    from .progress import say  # noqa: PLC0415

    return users_params(chosen, say)  # not a running flow's overrides, unless this is that flow's stage


class _UniqueKeys(yaml.SafeLoader):
    """YAML that refuses a key given twice in one mapping: PyYAML keeps the last, so a params file
    with two `train:` sections dropped the first one's settings without a word."""


def _mapping_without_repeats(loader: _UniqueKeys, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"{key!r} is given twice in one mapping (the second would silently replace the "
                "first)", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_repeats)


def load_config(path: str | Path | None = "params.yaml",
                overrides: list[str] | dict[str, Any] | None = None) -> Config:
    """Read `path` (missing file = all defaults), apply overrides, validate, or raise ConfigError."""
    raw: dict[str, Any] = {}
    if path is not None and Path(path).exists():
        try:
            raw = yaml.load(Path(path).read_text(), Loader=_UniqueKeys) or {}  # noqa: S506 (a SafeLoader)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: top level must be a mapping of sections")
    cfg = _validated(apply_overrides(raw, overrides))
    check_writes(cfg)
    return cfg
