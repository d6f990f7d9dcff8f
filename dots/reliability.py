"""The reliability ledger: what the fault-injection suite (tests/test_faults.py) tried, and
what came of it, one row per case, so the README's Reliability table quotes measured
figures rather than claims.

    python -m dots.reliability [results/reliability.json]     # print the table

The test suite writes its ledger under pytest's temporary folder (it prints the path) and leaves
the repository alone; to refresh the README's figures, run it with
``DOTS_RELIABILITY_LEDGER=results/reliability.json pytest tests/test_faults.py``.

Row kinds: `kill` (a SIGKILL injected at a fault point, then a retry), `chain` (one training
run killed and retried until done, compared with an uninterrupted run of the same seed),
`bad_input` (a bad dataset, param, cache or checkpoint), `service` (MLflow or S3 down),
`secrets` (secret values searched for in everything a run wrote).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .atomic import write_text

LEDGER = Path("results") / "reliability.json"


def start(path: Path, **meta: Any) -> None:
    write_text(path, json.dumps({**meta, "rows": []}, indent=1))


def record(path: Path, **row: Any) -> None:
    """Append one case's outcome (read, append, atomic rewrite: a killed test never tears it)."""
    data = json.loads(path.read_text()) if path.exists() else {"rows": []}
    data["rows"].append(row)
    write_text(path, json.dumps(data, indent=1))


def table(data: dict) -> str:
    rows = data["rows"]

    def of(kind: str) -> list[dict]:
        return [r for r in rows if r["kind"] == kind]

    kills, chains, bad, service, secrets = of("kill"), of("chain"), of("bad_input"), of("service"), of("secrets")
    points = sorted({r["point"] for r in kills})
    lost = sum(r.get("bytes_lost", 0) for r in rows)
    lines = [
        "| what | count |",
        "|---|---|",
        f"| faults injected (SIGKILL at {', '.join(points) or '—'}) | {sum(r['killed'] for r in kills)} |",
        f"| runs resumed from their last complete checkpoint | {sum(r['resumed'] for r in kills)} |",
        (f"| runs whose final state matched the uninterrupted run (weights, optimizer, RNG, buffer, selection, "
         f"records, evals, MLflow) | {sum(r['matched'] for r in chains)} of {len(chains)} |"),
        (f"| MLflow: training runs continued under the same run id, every step logged once | "
         f"{sum(r['mlflow_ok'] for r in chains)} of {len(chains)} |"),
        f"| bad inputs tried (datasets, params, caches, checkpoints) | {len(bad)} |",
        (f"| clear errors given (one message naming the file, row, column or key; a checkpoint from other "
         f"params is set aside under a new name with such a message) | {sum(r['clear'] for r in bad)} |"),
        f"| service faults tried / clear errors given | {len(service)} / {sum(r['clear'] for r in service)} |",
        (f"| secret values found in MLflow params, tags, artifacts, run files and logs | "
         f"{sum(r['found'] for r in secrets)} |"),
        f"| bytes lost (saved files torn, changed or removed) | {lost} |",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = Path(argv[0]) if argv else LEDGER
    if not path.exists():
        print(f"{path}: no ledger; run `pytest tests/test_faults.py` first", file=sys.stderr)
        return 1
    data = json.loads(path.read_text())
    print(f"{path}: {len(data['rows'])} cases, {data.get('started', '?')} ({data.get('command', '')})\n")
    print(table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
