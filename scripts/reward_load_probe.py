"""How many math-verify checks time out on an idle machine and beside CPU-bound processes.

    .venv/bin/python scripts/reward_load_probe.py [--data ../shared/data/deepscaler.parquet]
        [--budget 0.02] [--answers 1500] [--burners 4] [--rounds 2]

Parses the dataset's first `--answers` distinct ground truths (verl parquet: `reward_model.
ground_truth`) through a fresh two-worker pool per round, with a budget tight enough that some
time out, alternately on an idle machine and beside `--burners` processes that spin on the CPU.
The budget is the reward worker's CPU time (dots.rewards), so the loaded rounds should time out
about as many as the idle ones; a wall-clock budget times out many more under load. It prints
numbers only; tests/test_rewards.py checks the mechanism.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import pandas as pd

from dots.rewards import MathVerifyPool


def spin(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/deepscaler.parquet")
    ap.add_argument("--budget", type=float, default=0.02, help="reward.timeout_s of each check")
    ap.add_argument("--answers", type=int, default=1500)
    ap.add_argument("--burners", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    truths = pd.read_parquet(args.data)["reward_model"].map(lambda r: str(r["ground_truth"]))
    answers = list(dict.fromkeys(truths))[:args.answers]
    for _ in range(args.rounds):
        for label, burners in (("idle", 0), (f"beside {args.burners} spinning processes", args.burners)):
            stop = mp.Event()
            spinners = [mp.Process(target=spin, args=(stop,)) for _ in range(burners)]
            pool = MathVerifyPool(workers=2)  # fresh each round: a worker caches what it parsed
            try:
                pool.check_answers([str(k) for k in range(20)])  # started: time the checks only
                for p in spinners:
                    p.start()
                time.sleep(0.5 if burners else 0.0)
                start = time.perf_counter()
                got = pool.check_answers(answers, timeout_s=args.budget)
                seconds = time.perf_counter() - start
            finally:
                stop.set()
                for p in spinners:
                    p.join()
                pool.close()
            print(f"{label}: {sum(g == 'timeout' for g in got)} of {len(answers)} timed out at "
                  f"{args.budget:g} s, {seconds:.1f} s wall", flush=True)


if __name__ == "__main__":
    main()
