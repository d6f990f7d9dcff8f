"""`dots` command line: one subcommand per pipeline stage, each reading params.yaml plus
`-S key=value` overrides (the same dotted keys as `dvc exp run -S`).

    dots prepare | warmup | embed | label | fit-predictor | train [--method M] | evaluate --method M
         | compare | all
    dots plan                     (peak GPU memory per rank; refuses a config that cannot fit)
    dots evaluate --data FILE [--policy DIR | --checkpoint DIR] [--samples G]   (a held-out math set)
    dots bench-diff A/summary.json B/summary.json [--tolerance 0.10] [--ratios-only]   (do two benches agree?)
    torchrun --nproc-per-node N -m dots.cli train ...                         (data-parallel training)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from .atomic import NO_SPACE, DiskFull
from .config import BENCH_METHODS, BENCH_SEEDS, MAX_SEED, METHODS, ConfigError, load_config, params_file
from .redact import scrub
from .workspace_lock import HolderGone, WorkspaceBusy


def _int_in(low: int, high: int | None):
    """An argparse type for an integer in [low, high]: a bad value is refused by argparse, naming
    the argument, before any data or model loads (as the config's own keys are)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}; got {value}")
        return value
    return parse


def _parser(prog: str = "dots") -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-p", "--params",
                        help="params file (default: ./params.yaml; without one, every default)")
    common.add_argument("-S", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a param, e.g. -S train.steps=50 (repeatable)")
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in [("prepare", "generate the pool and held-out set"),
                       ("warmup", "supervised warm-up of the tiny policy; prints the pool's spectrum"),
                       ("embed", "embed the pool with the frozen backbone (cached)"),
                       ("label", "label a pool subset with each warm-up policy's pass rate"),
                       ("fit-predictor", "train the difficulty predictor; prints held-out Pearson/MAE"),
                       ("compare", "time-to-target table of the trained methods"),
                       ("all", "every stage, then train and evaluate each of train.methods and compare")]:
        sub.add_parser(name, parents=[common], help=text)
    sub.add_parser("plan", parents=[common],
                   help="peak GPU memory per rank of this config; exits 1 (naming the key) when it cannot fit")
    train = sub.add_parser("train", parents=[common], help="train one method")
    train.add_argument("--method", choices=METHODS, help="overrides train.method")
    train.add_argument("--restart", action="store_true", help="ignore an existing checkpoint and start over")
    ev = sub.add_parser("evaluate", parents=[common],
                        help="--method M: the evaluate stage (M's exported model on the held-out sets of "
                             "params); --data FILE: any policy on one held-out set, printed as JSON")
    ev.add_argument("--method", choices=METHODS, help="the evaluate@<method> stage")
    ev.add_argument("--data", help="held-out set: .parquet (verl layout), .jsonl or a datasets folder")
    ev.add_argument("--question", default="extra_info.question", help="dotted question column")
    ev.add_argument("--answer", default="reward_model.ground_truth", help="dotted answer column")
    ev.add_argument("--id", default="extra_info.index", help="dotted id column; 'none' numbers the rows")
    ev.add_argument("--limit", type=_int_in(1, None), help="first N rows only")
    ev.add_argument("--unparseable", choices=("refuse", "drop"), default="refuse",
                    help="rows whose ground truth the reward cannot read: refuse the set (default) or drop "
                         "them, reported")
    ev.add_argument("--policy", help="model folder or hub name (default: the config's policy)")
    ev.add_argument("--checkpoint", help="training checkpoint (folder or .pt) loaded into the policy")
    ev.add_argument("--samples", type=_int_in(0, None), default=0, metavar="G",
                    help="also pass@G and mean@G (default: greedy only)")
    ev.add_argument("--seed", type=_int_in(0, MAX_SEED), default=0, help="sampling seed for --samples")
    ev.add_argument("--out", help="also write the JSON here")
    bench = sub.add_parser("bench", parents=[common], help="grpo, dots, rr, dots_rr and the peers dapo, greso over seeds, side by side")
    bench.add_argument("--seeds", type=int, nargs="+", default=list(BENCH_SEEDS),
                       help="train.seed values (default: " + " ".join(map(str, BENCH_SEEDS)) + ")")
    bench.add_argument("--methods", nargs="+", choices=METHODS, default=list(BENCH_METHODS),
                       help="default: every method but greso_rr")
    bench.add_argument("--variant", action="append", default=[], metavar="LABEL=METHOD:KEY=VALUE[,KEY=VALUE]",
                       help="also bench METHOD with these params as its own arm, in the same lockstep group, "
                            "paired with METHOD by seed (repeatable; e.g. every4=dots_rr:selection.every=4)")
    bench.add_argument("--out", default="results/bench", help="summary.json, table.md, curves.png go here")
    bench.add_argument("--dataset", default="../shared/data/deepscaler.parquet",
                       help="parquet whose size times the predictor round (skipped when missing)")
    diff = sub.add_parser("bench-diff", help="do two benches of one commit agree? every median time ratio side "
                                             "by side; exit 0 agree, 1 differ, 2 bad input")
    diff.add_argument("a", help="the first bench's summary.json (or its folder)")
    diff.add_argument("b", help="the second bench's summary.json (or its folder)")
    diff.add_argument("--tolerance", type=float, default=None, help="largest allowed difference (default 0.10)")
    diff.add_argument("--ratios-only", action="store_true",
                      help="benches of two machines: runs that differ are listed, the ratios alone decide")
    return parser


def _bench_diff(args) -> int:
    """`dots bench-diff`: needs no params file, only the two summaries."""
    from .bench_diff import TOLERANCE, BenchDiffError, compare_benches, read_summary, render_comparison  # noqa: PLC0415

    tolerance = TOLERANCE if args.tolerance is None else args.tolerance
    if not tolerance >= 0:
        print(f"dots bench-diff: --tolerance must be >= 0, got {args.tolerance}", file=sys.stderr)
        return 2
    try:
        result = compare_benches(read_summary(args.a), read_summary(args.b), tolerance, args.ratios_only)
    except BenchDiffError as exc:
        print(f"dots bench-diff: {exc}", file=sys.stderr)
        return 2
    print(render_comparison(result, args.a, args.b))
    return 0 if result["within"] else 1


class Terminated(BaseException):
    """SIGTERM, raised where the command is. Not an Exception: a stage's MLflow runs end KILLED
    (as for Ctrl-C), not FAILED."""


def _raise_terminated(signum, frame):
    raise Terminated()


def _stopped_by_sigterm() -> bool:
    """SIGTERM (what `kill`, `timeout`, schedulers and a dying parent's PDEATHSIG send) ends a
    command as Ctrl-C does: a training stage logs its buffered steps and ends its MLflow runs
    KILLED. Before, the process died at once and left its run RUNNING, with its last steps
    unlogged, until the next training stage on the machine ended it (found by a review). Only
    where no one else handles the signal (a Prefect worker, a test harness may)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return False
    signal.signal(signal.SIGTERM, _raise_terminated)
    return True


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "bench-diff":
        return _bench_diff(args)
    try:
        cfg = load_config(params_file(args.params), args.overrides)
    except ConfigError as exc:
        print(f"dots: {scrub(str(exc))}", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.command == "evaluate" and bool(args.method) == bool(args.data):
        print("dots evaluate: give exactly one of --method (the stage) and --data (one held-out set)",
              file=sys.stderr)
        return 2
    if args.command == "plan":
        return _plan(cfg)
    if args.command == "bench":  # a bad --variant is refused before any stage runs
        from .bench import bench_config, parse_variant  # noqa: PLC0415

        bench_cfg = bench_config(cfg)
        try:
            variants = [parse_variant(v, bench_cfg) for v in args.variant]
        except ConfigError as exc:
            print(f"dots bench: {scrub(str(exc))}", file=sys.stderr)
            return 2
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and args.command != "train":
        print(f"dots {args.command}: runs in one process; only `dots train` runs under torchrun",
              file=sys.stderr)
        return 2
    from . import stages  # noqa: PLC0415  (heavy imports only after the config is valid)

    installed = _stopped_by_sigterm()
    try:
        _require_environment(cfg, args, stages)
        with _workspace(args) as held:  # a command that writes the repository waits for a flow writing it
            if held:  # params.yaml as it is now: while this waited, a flow's overrides were in it
                cfg = load_config(params_file(args.params), args.overrides)
            if args.command == "prepare":
                stages.prepare(cfg)
            elif args.command == "warmup":
                stages.run_warmup(cfg)
            elif args.command == "embed":
                stages.embed(cfg)
            elif args.command == "label":
                stages.label(cfg)
            elif args.command == "fit-predictor":
                stages.fit(cfg)
            elif args.command == "train":
                stages.train(cfg, args.method, resume=not args.restart)
            elif args.command == "bench":
                from pathlib import Path  # noqa: PLC0415

                from .bench import run_bench  # noqa: PLC0415

                run_bench(bench_cfg, args.seeds, args.methods, Path(args.out), args.dataset,
                          variants=variants)
            elif args.command == "compare":
                stages.compare(cfg)
            elif args.command == "evaluate" and args.method:
                stages.evaluate(cfg, args.method)
            elif args.command == "evaluate":
                _evaluate(cfg, args)
            elif args.command == "all":
                from .pipeline_inputs import check_pipeline  # noqa: PLC0415

                check_pipeline(cfg)  # what compare and evaluate need, before the shared stages
                stages.run_shared(cfg)
                for method in cfg.train.methods:  # a full run starts training over
                    stages.train(cfg, method, resume=False)
                    stages.evaluate(cfg, method)
                stages.compare(cfg)
    except (FileNotFoundError, ValueError, ConnectionError) as exc:  # bad input, unreachable service
        print(f"dots {args.command}: {scrub(str(exc))}", file=sys.stderr)
        return 1
    except WorkspaceBusy as exc:  # a `dvc repro` by hand beside a flow: see _workspace
        print(f"{scrub(str(exc))}; as DVC's stage {os.environ.get(DVC_STAGE)} this command does not "
              "wait for it (DVC keeps its locks on the stage's files meanwhile, which fails that run's next "
              "stages). Run `dvc repro` again when it has finished", file=sys.stderr)
        return 1
    except HolderGone as exc:  # a flow's stage whose flow died before it started
        print(scrub(str(exc)), file=sys.stderr)
        return 1
    except Terminated:
        print(f"dots {args.command}: stopped by SIGTERM; run it again to go on from its last checkpoint",
              file=sys.stderr)
        return 128 + signal.SIGTERM
    except OSError as exc:  # a full disk: one line naming the file (atomic writes keep the old one)
        if exc.errno not in NO_SPACE:
            raise
        said = exc.strerror if isinstance(exc, DiskFull) else (
            f"{exc.filename or 'a file'}: no space left on its disk. Free space and run the command again")
        print(f"dots {args.command}: {scrub(said)}", file=sys.stderr)
        return 1
    finally:
        if installed:  # an in-process caller (a test, a notebook) gets its own handling back
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return 0


WRITES_REPOSITORY = ("prepare", "warmup", "embed", "label", "fit-predictor", "train", "compare", "all")


DVC_STAGE = "DVC_STAGE"  # DVC sets it for every stage command it runs


def _workspace(args):
    """The repository's lock (dots.workspace_lock) for a command that writes its artifacts: run by
    hand beside a flow of the same repository (or another such command), it waits instead of
    training into the same run folder at once. The DVC stages a flow runs inherit its hold (they
    would otherwise wait on their own flow); under torchrun rank 0 holds it for every rank.

    A stage of a `dvc repro` run by hand does not wait: DVC holds its read and write locks on the
    stage's dependencies and outputs while the command runs, so a stage waiting here for a flow made
    that flow's next stage fail at once ("... is busy, it is being blocked by ... dvc repro")."""
    from contextlib import nullcontext  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    writes = args.command in WRITES_REPOSITORY or (args.command == "evaluate" and args.method)
    if not writes or os.environ.get("RANK", "0") != "0":
        return nullcontext(False)
    from .versioning import held  # noqa: PLC0415

    method = getattr(args, "method", None)
    return held(Path.cwd(), f"dots {args.command}" + (f" --method {method}" if method else ""),
                wait=DVC_STAGE not in os.environ)


_ONE_VALUE = {"-p", "--params", "-S", "--set", "--variant", "--out", "--dataset"}


def parse_bench_args(argv: list[str]) -> argparse.Namespace:
    """`make bench BENCH_ARGS=...`: `dots bench`'s own arguments (--seeds, --methods, --variant,
    --out, --dataset, -p, -S), so the Prefect flow is driven as the CLI is, with a bare
    `key=value` word taken as `-S key=value` (what BENCH_ARGS took before). A bad argument exits
    2 naming it, as `dots bench` does."""
    words, i = [], 0
    while i < len(argv):
        word = argv[i]
        if word in _ONE_VALUE and i + 1 < len(argv):  # its value may hold '=' (a variant, a key)
            words += [word, argv[i + 1]]
            i += 2
            continue
        words += ["-S", word] if "=" in word and not word.startswith("-") else [word]
        i += 1
    return _parser(prog="make").parse_args(["bench", *words])  # its errors say "make bench: error: ..."


def _require_environment(cfg, args, stages) -> None:
    """What this machine must hold for a command that loads a model, checked before it starts: a
    GPU for `train.device: cuda`, vLLM for `rollout.engine: vllm`, and (offline) the hub models in
    the local cache. Each was a traceback from inside the stage, after the data step or the policy
    load (`dots all` with the GPU profile failed at the warm-up, after preparing the data). The
    embedding backbone only where its cache is not there yet: with valid embeddings `dots embed`
    never loads it."""
    from .embeddings import require_sentence_transformers  # noqa: PLC0415
    from .engines import require_engine  # noqa: PLC0415
    from .hub import require_cached  # noqa: PLC0415
    from .models import resolve_device  # noqa: PLC0415

    if args.command not in ("warmup", "embed", "label", "train", "evaluate", "all", "bench"):
        return
    resolve_device(cfg.train.device)
    if args.command != "embed":
        require_engine(cfg.rollout.engine)
    encodes = args.command in ("embed", "all", "bench") and not stages.paths(cfg).embeddings.exists()
    if encodes:
        require_sentence_transformers(cfg.embed.backbone)
    if args.command == "evaluate" and args.data and args.policy:
        require_cached({"--policy": args.policy})
    elif args.command in ("warmup", "label", "train", "evaluate"):
        require_cached(config_models(cfg, backbone=False))
    elif args.command in ("all", "bench"):
        require_cached(config_models(cfg, backbone=encodes))
    elif encodes:  # embed: the backbone it is about to load
        require_cached(config_models(cfg, policy=False))


def config_models(cfg, policy: bool = True, backbone: bool = True) -> dict[str, str | None]:
    """The hub models a config names: the policy (`model.pretrained`) and the embedding backbone
    (`embed.backbone: hf:<name>` or `sentence-transformers:<name>`). Here, not in dots/hub.py: a
    stage's DVC params are what its modules read, and only the commands check these up front."""
    from .embeddings import sentence_transformers_model  # noqa: PLC0415

    refs: dict[str, str | None] = {}
    if policy:
        refs["model.pretrained"] = cfg.model.pretrained
    if backbone and cfg.embed.backbone.startswith("hf:"):
        refs["embed.backbone"] = cfg.embed.backbone[3:]
    elif backbone and (name := sentence_transformers_model(cfg.embed.backbone)):
        refs["embed.backbone"] = name
    return refs


def _plan(cfg) -> int:
    """`dots plan`: print the memory plan; a config that cannot fit is refused with the key to change."""
    from .memory_plan import PlanError, device_memory, estimate, policy_shape  # noqa: PLC0415

    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        shape = policy_shape(cfg)
        device_bytes, device = device_memory(cfg)
        plan = estimate(cfg, shape, world, device_bytes, device)
        print(f"{shape.params / 1e6:,.1f}M parameters, {world} rank(s)")
        print(plan.table())
        from .memory_plan import check  # noqa: PLC0415

        check(plan, cfg, shape)
    except (PlanError, ValueError) as exc:
        print(f"dots plan: {scrub(str(exc).splitlines()[0])}", file=sys.stderr)  # the table is printed above
        return 1
    print("fits" if device_bytes is not None else "no GPU memory to check against (set train.memory_gb to plan "
          "for one)")
    return 0


def _evaluate(cfg, args) -> None:
    import json  # noqa: PLC0415

    from pathlib import Path  # noqa: PLC0415

    from .atomic import check_writable_folder, write_text  # noqa: PLC0415
    from .heldout import evaluate_policy  # noqa: PLC0415

    if args.out:  # refused now, not after minutes of generation
        out = Path(args.out)
        if out.is_dir():
            raise ValueError(f"--out {out}: is a folder; give the JSON file's path")
        try:
            check_writable_folder(out.parent)
        except OSError as exc:
            raise ValueError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None

    data = {"path": args.data, "question": args.question, "answer": args.answer,
            "id": None if args.id.lower() == "none" else args.id, "limit": args.limit,
            "unparseable": args.unparseable}
    from .stages import policy_path, training_pool  # noqa: PLC0415

    result = evaluate_policy(cfg, data, args.policy or policy_path(cfg), args.checkpoint, args.samples,
                             args.seed, lambda: training_pool(cfg))
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        write_text(args.out, text + "\n")


if __name__ == "__main__":
    sys.exit(main())
