"""The benchmark as a Prefect flow (`make bench`): the shared stages once, then one task per
seed that trains every method of that seed in lockstep, then the report (results/bench + the
MLflow parent run).

Each seed task is a thin wrapper over `dots.bench.run_seed` (its arms in lockstep, in a process
of its own when `bench.workers` seeds train at once; the tasks are then called from worker
threads, each in a copy of the flow's context); a retried task reads back the runs that
finished and resumes the others from their checkpoints. The flow measures each
task's wall-clock from outside and writes the difference to the runs' own wall-clock (less the
seed process's start, which is the bench's own: `process_start_s`) into their summaries as
`orchestration_s`, so the report can say what Prefect adds to training.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from dots import bench
from dots.atomic import write_text
from dots.config import BENCH_SEEDS, Config, load_config, params_file

DEEPSCALER = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "deepscaler.parquet"


@task(name="bench-shared-stages", cache_policy=NO_CACHE)
def shared_stages(cfg: Config) -> dict:
    return bench.prepare_shared(cfg)


@task(name="bench-seed", task_run_name="bench-seed{seed}", retries=1, retry_delay_seconds=5,
      cache_policy=NO_CACHE)
def bench_seed(cfg: Config, seed: int, methods: list[str], variants: list[bench.Variant]) -> dict:
    return bench.run_seed(cfg, seed, methods, variants)


def timed_runner(cfg: Config, seed: int, methods: list[str], variants: list[bench.Variant] = ()) -> dict:
    """Run one seed's task and record what orchestration added around its training calls."""
    start = time.perf_counter()
    summaries = bench_seed(cfg, seed, methods, list(variants))
    outside = time.perf_counter() - start
    fresh = {m: s for m, s in summaries.items() if "orchestration_s" not in s}  # read back: keep their figure
    share = orchestration_per_group(outside, fresh)
    if share is not None:
        group = bench.lockstep_group(cfg, seed, methods, variants)
        for label, summary in fresh.items():
            summary["orchestration_s"] = share
            method, acfg = bench.resolve(cfg, label, variants)
            run_dir, _ = bench.run_dirs(acfg, seed, method, group)
            write_text(run_dir / "summary.json", json.dumps(summary, indent=1))
    return summaries


def orchestration_per_group(outside: float, summaries: dict[str, dict]) -> float | None:
    """A seed task's seconds outside training, per training call. The runs of one lockstep
    group share one wall-clock (the longest of theirs); groups run one after another (on a GPU
    each run is its own group), so training is the sum of the groups' wall-clocks, and each
    group is charged its share of the rest. None when no run reports its wall-clock.

    The seed process's start (`process_start_s`: spawning it and importing torch, transformers and
    the training code, `dots.bench.train_seed`) is not Prefect's: `dots bench` pays it without
    Prefect. It is left out here and reported apart, so this figure is what the task adds."""
    walls: dict[tuple, float] = {}
    for method, s in summaries.items():
        if s.get("wall_s") is not None:
            key = tuple(s.get("lockstep") or [method])
            walls[key] = max(walls.get(key, 0.0), s["wall_s"])
    if not walls:
        return None
    # one process a seed: its runs carry the same figure
    start = max((s.get("process_start_s") or 0.0 for s in summaries.values()), default=0.0)
    return max(0.0, outside - start - sum(walls.values())) / len(walls)


@flow(name="dots-bench", log_prints=True)
def bench_flow(seeds: list[int] | None = None, methods: list[str] | None = None, params: str = "params.yaml",
               overrides: list[str] | None = None, out_dir: str = str(bench.RESULTS),
               variants: list[str] | None = None, dataset: str | None = None) -> dict:
    """`variants`: `LABEL=METHOD:KEY=VALUE[,...]` arms trained beside the methods (see dots.bench);
    `dataset`: the parquet whose size times the predictor round (default: the shared DeepScaleR)."""
    cfg = bench.bench_config(load_config(params_file(params), overrides))
    arms = [bench.parse_variant(v, cfg) for v in variants or []]  # refused here, before any stage runs
    # run_bench checks seeds, methods and --out, then runs the shared stages as this flow's task
    return bench.run_bench(cfg, list(BENCH_SEEDS) if seeds is None else seeds, methods, Path(out_dir),
                           dataset if dataset is not None else DEEPSCALER if DEEPSCALER.exists() else None,
                           runner=timed_runner, variants=arms,
                           shared=shared_stages)


def main(argv: list[str]) -> int:
    """`make bench BENCH_ARGS=...`: `dots bench`'s arguments (`--seeds 0 1 --methods grpo dots_rr`,
    `--variant`, `--out`, `-S key=value` or a bare `key=value`). Everything is checked before the
    flow starts: a bad one is one line naming it (exit 2), not a traceback from inside a flow run
    after the shared stages."""
    import sys  # noqa: PLC0415

    from dots.cli import parse_bench_args  # noqa: PLC0415
    from dots.config import ConfigError  # noqa: PLC0415
    from dots.redact import scrub  # noqa: PLC0415

    args = parse_bench_args(argv)  # argparse exits 2 naming a bad argument
    try:
        cfg = bench.bench_config(load_config(params_file(args.params), args.overrides))
        arms = [bench.parse_variant(v, cfg) for v in args.variant]
        bench.check_arguments(cfg, args.seeds, args.methods, arms, Path(args.out))
    except ConfigError as exc:
        print(f"make bench: {scrub(str(exc))}", file=sys.stderr)
        return 2
    bench_flow(seeds=args.seeds, methods=args.methods, params=args.params or "params.yaml",
               overrides=args.overrides, out_dir=args.out, variants=args.variant, dataset=args.dataset)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
