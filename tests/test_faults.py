"""Fault injection (issue: survive kills and retries, refuse bad input, lose nothing).

- Kill and resume: one tracked `dots_rr` training run (replay buffer and DOTS rounds both in
  play) is SIGKILLed by `dots.faults` mid rollout, mid update, mid checkpoint write and mid
  result-file write, at seeded random hits, and re-run after each kill as a retry would. It
  must end in exactly the state of an uninterrupted run of the same seed: weights, optimizer,
  RNG states, buffer, round state, records, evals and MLflow metrics (wall-clock fields
  aside), under one MLflow run id with every step logged once; no kill may leave a torn file.
- Bad input: datasets, params, caches and checkpoints that are wrong in every way the issue
  names each give one clear error naming the file, row, column or key, and leave every byte
  already saved as it was. A file holding a pickle payload is refused, never executed.
- Service faults: MLflow unreachable or unusable at start fails before training; an S3
  artifact store that is down is a clear error with the local files kept.
- Secrets: S3 keys, tracking tokens and URI passwords appear nowhere a run writes.

Every case appends its outcome to a reliability ledger (`python -m dots.reliability PATH` prints
the README's table from it). The ledger lives in the session's temporary folder, so a test run
writes nothing into the repository; DOTS_RELIABILITY_LEDGER=results/reliability.json writes it
there on purpose, to refresh the README's figures. Mid-run tracking faults, wrong S3 credentials, missing
buckets and hanging reward checks are covered in test_pipeline.py and test_rewards.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dots import reliability
from dots.checkpoints import UnsafeFileError, load_tensors, run_key

from .conftest import REPO, default_params, tiny_overrides

REPO_LEDGER = REPO / reliability.LEDGER  # the README's copy: written only when asked for
METHOD = "dots_rr"
CHAIN = ["train.steps=6", "train.checkpoint_every=2", "eval.every=3", "tracking.enabled=true",
         "tracking.log_every=1", "tracking.experiment=faults"]
SECRETS = {"AWS_ACCESS_KEY_ID": "AKIAFAULTSUITE0000042", "AWS_SECRET_ACCESS_KEY": "s3cr3t-" + "k" * 33,
           "AWS_SESSION_TOKEN": "sess-token-0123456789abcdef", "MLFLOW_TRACKING_TOKEN": "mlflow-token-fedcba9876",
           "MLFLOW_TRACKING_PASSWORD": "tracking-pass-31415926"}
URI_PASSWORD = "hunter2-uri-password"
DATASET_URL = f"task.dataset.path=https://alice:{URI_PASSWORD}@data.example.com/pool.parquet"  # logged, not read


def _file_state(path: Path) -> tuple[int, int, str] | None:
    return (path.stat().st_mtime_ns, path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest()) \
        if path.exists() else None


REPO_LEDGER_BEFORE: dict[str, tuple | None] = {}


@pytest.fixture(scope="module", autouse=True)
def ledger(tmp_path_factory):
    """Where this module's cases record their outcome: a temporary file unless DOTS_RELIABILITY_LEDGER
    names one (relative to the repository)."""
    asked = os.environ.get("DOTS_RELIABILITY_LEDGER")
    path = REPO / asked if asked else tmp_path_factory.mktemp("reliability") / "reliability.json"
    REPO_LEDGER_BEFORE.setdefault("state", _file_state(REPO_LEDGER))
    reliability.start(path, started=time.strftime("%Y-%m-%d %H:%M:%S"), command="pytest tests/test_faults.py")
    yield path
    print(f"\nreliability ledger: {path} (python -m dots.reliability {path})")


def _inputs(tiny_pipeline, root: Path) -> Path:
    """A fresh artifacts root holding the tiny pipeline's data, policy, embeddings and predictor."""
    for sub in ("data", "models", "embeddings", "predictor"):
        shutil.copytree(tiny_pipeline.root / sub, root / sub)
    return root


def _overrides(root: Path, *extra: str) -> list[str]:
    return tiny_overrides(root) + [f"tracking.uri=sqlite:///{root / 'mlflow.db'}", "tracking.enabled=false", *extra]


def _train(root: Path, *extra: str, fault: str | None = None, trace: Path | None = None,
           env: dict | None = None) -> subprocess.CompletedProcess:
    """`dots train` in its own process, as a DVC stage or a retried Prefect task runs it."""
    args = [sys.executable, "-m", "dots.cli", "train", "--method", METHOD, "-p", default_params(root.parent)]
    for o in _overrides(root, *CHAIN, *extra):
        args += ["-S", o]
    e = {k: v for k, v in os.environ.items() if not k.startswith(("DOTS_FAULT", "MLFLOW_"))}
    e.update(HF_HUB_OFFLINE="1", **(env or {}))
    if fault:
        e["DOTS_FAULT"] = fault
    if trace:
        e["DOTS_FAULT_TRACE"] = str(trace)
    return subprocess.run(args, cwd=root.parent, env=e, capture_output=True, text=True, timeout=600,
                          check=False)


def _torn_bytes(root: Path) -> int:
    """Bytes in files that do not load: every JSON, JSONL, torch file and the MLflow store."""
    lost = 0
    for f in root.rglob("*"):
        if not f.is_file() or f.name.startswith(".") or "models" in f.relative_to(root).parts:
            continue
        try:
            if f.suffix == ".json":
                json.loads(f.read_text())
            elif f.suffix == ".jsonl":
                [json.loads(line) for line in f.read_text().splitlines()]
            elif f.suffix == ".pt":
                load_tensors(f, "file")
            elif f.suffix == ".db":
                with sqlite3.connect(f) as db:
                    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        except Exception:  # noqa: BLE001
            lost += f.stat().st_size
    return lost


def _wallclock(key: str) -> bool:
    return key.startswith("time/") or key.endswith("_s") or key in ("elapsed", "wall_s")


def _same(a, b, where: str = "") -> None:
    """Equal trees (tensors exactly), wall-clock fields aside."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        keys = {k for k in a if not (isinstance(k, str) and _wallclock(k))}
        assert keys == {k for k in b if not (isinstance(k, str) and _wallclock(k))}, where
        for k in keys:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert a == b, (where, a, b)


def _metric_histories(root: Path) -> tuple[list[str], dict[str, list[tuple[int, float]]]]:
    """(training run ids, {metric: sorted (step, value)}) in the root's MLflow store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("faults")
    runs = client.search_runs([exp.experiment_id], "tags.`dots.role` = 'train'")
    out = {}
    for key in runs[0].data.metrics:
        if not _wallclock(key):
            out[key] = sorted((m.step, m.value) for m in client.get_metric_history(runs[0].info.run_id, key))
    assert runs[0].info.status == "FINISHED"
    return [r.info.run_id for r in runs], out


def test_killed_runs_resume_to_the_uninterrupted_state(tiny_pipeline, tmp_path, ledger, monkeypatch,
                                                        capsys, request):
    ref_root = _inputs(tiny_pipeline, tmp_path / "ref" / "artifacts")
    root = _inputs(tiny_pipeline, tmp_path / "chain" / "artifacts")
    trace = tmp_path / "trace.txt"
    # the uninterrupted run, with secrets in its environment and a password in a logged param
    ref = _train(ref_root, DATASET_URL, trace=trace, env=SECRETS)
    assert ref.returncode == 0, ref.stdout[-2000:] + ref.stderr[-3000:]
    events = trace.read_text().split()
    ckpts = [i for i, e in enumerate(events) if e == "write:checkpoint.pt"]
    assert len(ckpts) == 3 and "rollout" in events and "update" in events

    rng = random.Random(6)
    every, done, kills = 2, 0, []  # done: checkpoints completed = where the next retry resumes
    # the killed-and-resumed chain runs beside a busy process (the uninterrupted one ran alone):
    # its numbers must not depend on the machine's load (dots.determinism)
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 900\n"
                                "while time.time() < end: pass\n"])
    request.addfinalizer(spinner.kill)
    for point in ["rollout", "update", "write:checkpoint.pt", "write:records.jsonl", None]:
        start = ckpts[done - 1] + 1 if done else 0  # the first event this attempt reaches
        if point is None:
            proc = _train(root)
        else:
            # a seeded random hit of the point; the first kill falls after a checkpoint, so there is one to resume
            target = rng.choice([i for i in range(max(start, ckpts[0] + 1), len(events)) if events[i] == point])
            hit = sum(e == point for e in events[start:target + 1])
            proc = _train(root, fault=f"{point}:{hit}")
            assert proc.returncode == -signal.SIGKILL, (point, hit, proc.stdout[-1500:] + proc.stderr[-3000:])
        resumed = re.search(r"resuming from step (\d+)", proc.stdout)
        resumed_from = int(resumed.group(1)) if resumed else 0
        assert resumed_from == done * every, (point, proc.stdout[-1500:])
        if kills:  # the previous kill's retry resumed from its last complete checkpoint
            kills[-1].update(resumed_from=resumed_from, resumed=resumed_from > 0)
        torn = _torn_bytes(root)
        assert torn == 0
        if point == "write:checkpoint.pt":  # the cut-off write left a half-written temp file, never loaded
            (tmp,) = (root / "checkpoints" / METHOD).glob(".checkpoint.pt.*.tmp")
            with pytest.raises(UnsafeFileError):
                load_tensors(tmp, "checkpoint")
        if point is not None:
            kills.append({"kind": "kill", "point": point, "hit": hit, "killed": True, "bytes_lost": torn})
            done = sum(i < target for i in ckpts)
    spinner.kill()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert not list(root.rglob("*.tmp")), "a killed write's temp file outlived the next write"
    for row in kills:
        reliability.record(ledger, **row)

    # the same final state as the uninterrupted run
    a = load_tensors(ref_root / "checkpoints" / METHOD / "checkpoint.pt", "checkpoint")
    b = load_tensors(root / "checkpoints" / METHOD / "checkpoint.pt", "checkpoint")
    assert a["step"] == b["step"] == 6 and len(b["buffer"]["groups"]) > 0 and b["round"]["pred"] is not None
    # apart from where the chain went on from a checkpoint (`resumed_at`: its seconds span sittings)
    # (and the run's params identity: the uninterrupted run alone logs a dataset URL)
    _same({k: v for k, v in a.items() if k not in ("fingerprint", "identity", "resumed_at")},
          {k: v for k, v in b.items() if k not in ("fingerprint", "identity", "resumed_at")})
    assert {k: v for k, v in a["identity"].items() if k != "params"} == \
        {k: v for k, v in b["identity"].items() if k != "params"}
    for name in ("records.jsonl", "evals.json", "summary.json"):
        ra, rb = ((r / "runs" / METHOD / name).read_text() for r in (ref_root, root))
        parse = (lambda t: [json.loads(x) for x in t.splitlines()]) if name.endswith("l") else json.loads
        if name == "summary.json":
            ra, rb = parse(ra), parse(rb)
            assert a["resumed_at"] == ra.pop("resumed_at") == []
            # each resume that lived to write a checkpoint, the finishing attempt's last (unless it
            # went on from the final checkpoint: a finished run trains nothing more)
            assert b["resumed_at"] == rb.pop("resumed_at") and all(0 < k < 6 for k in b["resumed_at"])
            seen = {k["resumed_from"] for k in kills if k.get("resumed")} | {resumed_from}
            assert set(b["resumed_at"]) <= seen
            assert b["resumed_at"][-1] == resumed_from if 0 < resumed_from < 6 else b["resumed_at"]
            _same(ra, rb, name)
        else:
            _same(parse(ra), parse(rb), name)
    # MLflow: one training run continued by every retry, every step's metrics once, the same values
    _, hist_a = _metric_histories(ref_root)
    ids_b, hist_b = _metric_histories(root)
    assert len(ids_b) == 1
    assert [s for s, _ in hist_b["train/loss"]] == list(range(1, 7))
    assert [s for s, _ in hist_b["eval/accuracy"]] == [0, 3, 6]
    _same(hist_a, hist_b, "mlflow")
    reliability.record(ledger, kind="chain", method=METHOD, attempts=5, matched=True, mlflow_ok=True, bytes_lost=0)

    # secrets: none in the MLflow store, its artifacts, the run files or the logs
    from dots import stages
    from dots.config import load_config

    cfg = load_config(None, _overrides(ref_root, *CHAIN, DATASET_URL, "train.methods=[dots_rr]",
                                       "train.target_accuracy=0.3"))
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    stages.compare(cfg)  # logs the config, table, plot and predictor metrics as MLflow artifacts
    needles = [v.encode() for v in SECRETS.values()] + [URI_PASSWORD.encode()]
    blobs = [f.read_bytes() for f in ref_root.rglob("*") if f.is_file() and "models" not in f.parts]
    blobs += [(ref.stdout + ref.stderr).encode(), "".join(capsys.readouterr()).encode()]
    found = sum(n in blob for n in needles for blob in blobs)
    store = (ref_root / "mlflow.db").read_bytes()
    assert b"alice:***@data.example.com" in store  # the param was logged, with its password masked
    assert list((ref_root / "mlartifacts").rglob("config.json"))
    reliability.record(ledger, kind="secrets", searched=len(blobs), found=found, bytes_lost=0)
    assert found == 0


# ---- bad input --------------------------------------------------------------------------------

def _snapshot(root: Path) -> dict[str, tuple[str, int]]:
    return {str(f.relative_to(root)): (hashlib.sha256(f.read_bytes()).hexdigest(), f.stat().st_size)
            for f in root.rglob("*") if f.is_file()}


def _bytes_lost(before: dict[str, tuple[str, int]], root: Path) -> int:
    """Bytes of saved content that no file holds any more (changed, truncated or removed)."""
    now = {h for h, _ in _snapshot(root).values()}
    return sum(size for h, size in before.values() if h not in now)


class _Payload:
    """Unpickling this runs code: open(marker, 'w') creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _rows(n: int = 40) -> list[dict]:
    return [{"id": i, "question": f"{i} + {i} =", "answer": str(2 * i)} for i in range(n)]


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _dataset(kind: str):
    def plant(root: Path) -> None:
        rows, path = _rows(), root.parent / "in" / "bad.jsonl"
        path.parent.mkdir(exist_ok=True)
        if kind == "truncated parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(rows * 50), root.parent / "in" / "bad.parquet")
            data = (root.parent / "in" / "bad.parquet").read_bytes()
            (root.parent / "in" / "bad.parquet").write_bytes(data[: len(data) // 2])
            return
        if kind == "non-UTF-8 bytes":
            lines = [json.dumps(r).encode() for r in rows]
            lines[7] = lines[7].replace(b"7 + 7", b"7 \xff 7")
            path.write_bytes(b"\n".join(lines) + b"\n")
            return
        bad = {"missing field": lambda r: r.pop("answer"), "empty string": lambda r: r.update(question=""),
               "wrong type": lambda r: r.update(answer=[1, 2]), "duplicate id": lambda r: r.update(id=3),
               "NaN": lambda r: r.update(answer=math.nan), "'nan' string": lambda r: r.update(answer="nan"),
               "unparseable LaTeX": lambda r: r.update(answer="7\\sqrt{2}.")}[kind]
        bad(rows[7])
        _jsonl(path, rows)
    return plant


def _dataset_args(name: str = "bad.jsonl") -> list[str]:
    return ["task.source=dataset", f"task.dataset.path={{in}}/{name}", "task.dataset.question=question",
            "task.dataset.answer=answer", "task.dataset.id=id"]


def _embeddings(kind: str):
    def plant(root: Path) -> None:
        from dots.data import load_questions
        from dots.embeddings import save_embeddings

        path, pool = root / "embeddings" / "pool.pt", load_questions(root / "data" / "pool.jsonl")
        current = load_tensors(path, "embedding cache")
        if kind == "another backbone":
            save_embeddings(path, current["embeddings"], "sentence-transformers:other", pool)
        elif kind == "another pool":
            save_embeddings(path, current["embeddings"][:-1], current["backbone"], pool[:-1])
        else:
            torch.save({"embeddings": _Payload(root.parent / "pwned")}, path)
    return plant


def _checkpoint(kind: str):
    def plant(root: Path) -> None:
        path = root / "checkpoints" / METHOD / "checkpoint.pt"
        path.parent.mkdir(parents=True)
        if kind == "pickle payload":
            torch.save({"method": METHOD, "model": _Payload(root.parent / "pwned")}, path)
        elif kind == "torn":
            torch.save({"method": METHOD, "model": {"w": torch.zeros(4096)}}, path)
            path.write_bytes(path.read_bytes()[:3000])
        else:  # made for another method, or with other params
            torch.save({"method": "grpo" if kind == "another method" else METHOD, "fingerprint": "other-params",
                        "step": 5, "model": {"w": torch.zeros(4)}}, path)
    return plant


def _predictor_payload(root: Path) -> None:
    torch.save({"dim": 64, "hidden": 8, "state": _Payload(root.parent / "pwned")}, root / "predictor" / "predictor.pt")


def _params_file(text: str):
    def plant(root: Path) -> None:
        (root.parent / "params.yaml").write_text(text)
    return plant


def _nothing(root: Path) -> None:
    pass


# (case, command, overrides, plant, fragments the one error must hold)
BAD = [
    *[(f"dataset: {k}", "prepare", _dataset_args(), _dataset(k), ["bad.jsonl", "row 7", col])
      for k, col in [("missing field", "answer"), ("empty string", "question"), ("wrong type", "answer"),
                     ("duplicate id", "duplicate id 3"), ("NaN", "NaN"), ("non-UTF-8 bytes", "UTF-8"),
                     ("'nan' string", "null placeholder")]],
    ("dataset: ground truth math-verify cannot parse", "prepare", [*_dataset_args(), "reward.name=math_verify"],
     _dataset("unparseable LaTeX"), ["bad.jsonl", "row 7", "math-verify cannot parse it", "unparseable: drop"]),
    ("dataset: truncated parquet", "prepare", _dataset_args("bad.parquet"), _dataset("truncated parquet"),
     ["bad.parquet", "not a readable parquet file"]),
    ("param: out of range", "train", ["replay.delta=1.5"], _nothing, ["replay.delta", "(0, 1]"]),
    ("param: zero steps", "train", ["train.steps=0"], _nothing, ["train.steps"]),
    ("param: unknown choice", "train", ["train.method=sgd"], _nothing, ["train.method"]),
    ("param: unknown key", "train", ["train.bogus=1"], _nothing, ["train.bogus: unknown key"]),
    ("param: wrong type", "train", ["train.batch_size=many"], _nothing, ["train.batch_size"]),
    ("param: NaN", "train", ["train.lr=.nan"], _nothing, ["train.lr"]),
    ("param: inconsistent sizes", "train", ["selection.ref_size=4096"], _nothing, ["selection.ref_size"]),
    ("param: store path escapes the project", "train", ["tracking.uri=sqlite:///../../../x.db"], _nothing,
     ["tracking.uri", "outside the project"]),
    ("param: artifact path outside", "train", ["tracking.artifact_location=file:///etc/dots"], _nothing,
     ["tracking.artifact_location", "/etc/dots"]),
    ("param: root is /", "train", ["paths.root=/"], _nothing, ["paths.root"]),
    ("param: override without =", "train", ["train.steps"], _nothing, ["'train.steps'", "key=value"]),
    ("params file: not YAML", "train", [], _params_file("train: [steps: 3\n"), ["params.yaml", "not valid YAML"]),
    ("params file: not a mapping", "train", [], _params_file("- train\n"), ["params.yaml", "mapping"]),
    ("embedding cache: another backbone", "train", [], _embeddings("another backbone"),
     ["embeddings/pool.pt", "made with backbone"]),
    ("embedding cache: another pool", "train", [], _embeddings("another pool"),
     ["embeddings/pool.pt", "made for pool"]),
    ("embedding cache: pickle payload", "train", [], _embeddings("pickle payload"),
     ["embeddings/pool.pt", "refused", "not executed"]),
    ("predictor: pickle payload", "train", [], _predictor_payload, ["predictor/predictor.pt", "refused"]),
    ("checkpoint: pickle payload", "train", [], _checkpoint("pickle payload"),
     ["checkpoint.pt", "refused", "not executed"]),
    ("checkpoint: torn", "train", [], _checkpoint("torn"), ["checkpoint.pt", "not a readable checkpoint"]),
    ("checkpoint: another method", "train", [], _checkpoint("another method"), ["checkpoint.pt", "'grpo'"]),
    ("checkpoint: other params (set aside)", "train", ["train.steps=1", "eval.every=1"],
     _checkpoint("other params"),
     ["other params", f"old state kept as checkpoint.{run_key('other-params')}.step5.pt"]),
]


@pytest.mark.parametrize("case,command,overrides,plant,fragments", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gives_one_clear_error_and_touches_nothing(tiny_pipeline, tmp_path, capsys, ledger, case, command,
                                                             overrides, plant, fragments):
    from dots.cli import main

    root = _inputs(tiny_pipeline, tmp_path / "artifacts")
    (tmp_path / "params.yaml").write_text("")  # every default, unless the case plants its own
    plant(root)
    before = _snapshot(root)
    args = [command, "-p", str(tmp_path / "params.yaml")] + (["--method", METHOD] if command == "train" else [])
    for o in _overrides(root) + [o.replace("{in}", str(tmp_path / "in")) for o in overrides]:
        args += ["-S", o]
    rc = main(args)
    out, err = capsys.readouterr()
    set_aside = "set aside" in case
    message = out if set_aside else err
    clear = (rc == 0) == set_aside and "Traceback" not in err and all(f in message for f in fragments)
    lost = _bytes_lost(before, root)
    named = next((line.strip() for line in message.splitlines() if fragments[0] in line), message.strip())
    reliability.record(ledger, kind="bad_input", case=case, clear=clear, bytes_lost=lost, message=named[:300])
    assert clear, (rc, fragments, out[-1500:], err[-1500:])
    assert lost == 0
    assert not (tmp_path / "pwned").exists(), "a pickle payload was executed"


def test_the_pickle_payload_is_live(tmp_path):
    """The refused files above would run code under a plain torch.load (so refusing them matters)."""
    torch.save({"x": _Payload(tmp_path / "pwned")}, tmp_path / "evil.pt")
    with pytest.raises(UnsafeFileError, match="evil.pt: refused"):
        load_tensors(tmp_path / "evil.pt", "checkpoint")
    assert not (tmp_path / "pwned").exists()
    torch.load(tmp_path / "evil.pt", weights_only=False)
    assert (tmp_path / "pwned").exists()


# ---- service faults ---------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _compare_inputs(root: Path) -> None:
    run = root / "runs" / METHOD
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"final_accuracy": 0.5, "initial_accuracy": 0.1, "elapsed_s": 3.0}))
    (run / "evals.json").write_text(json.dumps([{"step": 0, "elapsed_s": 0.0, "accuracy": 0.1},
                                                {"step": 3, "elapsed_s": 3.0, "accuracy": 0.5}]))


SERVICE = [
    ("MLflow unreachable at start", "train", lambda root: [f"tracking.uri=http://127.0.0.1:{_free_port()}"],
     _nothing, ["127.0.0.1", "unreachable"]),
    ("MLflow store not a database", "train", lambda root: [f"tracking.uri=sqlite:///{root / 'store.db'}"],
     lambda root: (root / "store.db").write_bytes(b"not a database " * 100), ["store.db", "cannot be used"]),
    ("S3 artifact store down", "compare",
     lambda root: ["tracking.artifact_location=s3://dots-mlflow/art", "train.methods=[dots_rr]",
                   "train.target_accuracy=0.3"], _compare_inputs, ["s3://dots-mlflow/art", "kept"]),
]


@pytest.mark.parametrize("case,command,overrides,plant,fragments", SERVICE, ids=[s[0] for s in SERVICE])
def test_service_fault_is_a_clear_error_and_keeps_local_state(tiny_pipeline, tmp_path, capsys, monkeypatch, ledger,
                                                              case, command, overrides, plant, fragments):
    from dots.cli import main

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "MLFLOW_S3_ENDPOINT_URL": f"http://127.0.0.1:{_free_port()}", "AWS_MAX_ATTEMPTS": "2"}.items():
        monkeypatch.setenv(k, v)
    root = _inputs(tiny_pipeline, tmp_path / "artifacts")
    plant(root)
    before = _snapshot(root)
    args = [command, "-p", default_params(tmp_path)] + (["--method", METHOD] if command == "train" else [])
    for o in _overrides(root) + ["tracking.enabled=true"] + overrides(root):
        args += ["-S", o]
    start = time.perf_counter()
    rc = main(args)
    _, err = capsys.readouterr()
    clear = rc == 1 and "Traceback" not in err and all(f in err for f in fragments)
    lost = _bytes_lost(before, root)
    reliability.record(ledger, kind="service", case=case, clear=clear, bytes_lost=lost,
                       seconds=round(time.perf_counter() - start, 1),
                       message=next((line for line in err.splitlines() if line.startswith("dots")), err)[:300])
    assert clear, err
    assert lost == 0 and not (root / "checkpoints").exists()  # failed before any training


def test_s3_endpoint_down_is_named_and_keeps_local_data(tmp_path, monkeypatch, ledger):
    from dots import versioning

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    repo = tmp_path / "repo"
    (repo / "artifacts").mkdir(parents=True)
    (repo / "artifacts" / "pool.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    versioning.dvc(["init", "--no-scm", "-q"], repo)
    versioning.dvc(["remote", "add", "-d", "s3", "s3://dots-data/dvc"], repo)
    versioning.dvc(["remote", "modify", "s3", "endpointurl", f"http://127.0.0.1:{_free_port()}"], repo)
    versioning.dvc(["add", "-q", "artifacts/pool.jsonl"], repo)
    before = _snapshot(repo)
    start = time.perf_counter()
    with pytest.raises(versioning.StageError) as err:
        versioning.push(repo, ["artifacts/pool.jsonl.dvc"])
    text = str(err.value)
    clear = "endpoint unreachable" in text and "127.0.0.1" in text
    lost = _bytes_lost(before, repo)
    reliability.record(ledger, kind="service", case="S3 endpoint down (DVC push)", clear=clear, bytes_lost=lost,
                       seconds=round(time.perf_counter() - start, 1), message=text.splitlines()[0][:300])
    assert clear, text
    assert lost == 0


# ---- secrets and paths, unit level -------------------------------------------------------------

def test_scrub_masks_uri_passwords_and_secret_env_values(monkeypatch, capsys):
    from dots.progress import say
    from dots.redact import scrub

    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "tok-0123456789")
    monkeypatch.setenv("SOME_FLAG", "visible-value")
    text = "https://bob:pa55word@mlflow.example.com/x s3://AKIA:abc/def@b tok-0123456789 visible-value"
    assert scrub(text) == "https://bob:***@mlflow.example.com/x s3://AKIA:***@b *** visible-value"
    say(f"tracking: could not reach {text}")
    out = capsys.readouterr().out
    assert "pa55word" not in out and "tok-0123456789" not in out and "visible-value" in out


def test_the_environment_is_read_safely_while_another_thread_changes_it(monkeypatch):
    """Measured 2026-12-02: MLflow's telemetry thread deleted `_MLFLOW_TELEMETRY_SESSION_ID`
    between `os.environ.items()` listing it and reading it, and the KeyError stopped a bench
    before its first step. Here that race is made certain: a key listed, then gone, and a
    listing that first fails because the dict changed size."""
    from collections.abc import MutableMapping

    from dots import redact

    class Racing(MutableMapping):
        def __init__(self, data):
            self.data, self.listings = dict(data), 0

        def __iter__(self):
            self.listings += 1
            if self.listings == 1:
                raise RuntimeError("dictionary changed size during iteration")
            yield from [*self.data, "_MLFLOW_TELEMETRY_SESSION_ID"]  # listed, deleted before it is read

        def __getitem__(self, key):
            return self.data[key]

        def __setitem__(self, key, value):
            self.data[key] = value

        def __delitem__(self, key):
            del self.data[key]

        def __len__(self):
            return len(self.data)

    racing = Racing({"MLFLOW_TRACKING_TOKEN": "tok-0123456789", "PATH": "/bin"})
    old = Racing(racing.data)
    old.listings = 1  # past the size change
    with pytest.raises(KeyError):  # the old read, `os.environ.items()`, on such a mapping
        dict(old.items())
    monkeypatch.setattr(redact.os, "environ", racing)
    assert redact.environ_snapshot() == {"MLFLOW_TRACKING_TOKEN": "tok-0123456789", "PATH": "/bin"}
    assert racing.listings == 2  # listed again after the size change
    assert redact.scrub("token tok-0123456789") == "token ***"


def test_flow_overrides_cannot_move_outputs_out_of_the_repo(tmp_path, ledger):
    from dots import versioning
    from dots.config import ConfigError

    (tmp_path / "params.yaml").write_text("train:\n  steps: 3\n")
    before = _snapshot(tmp_path)
    with pytest.raises(ConfigError) as err:
        versioning.set_params({"paths.root": "../elsewhere"}, tmp_path)
    clear = "paths.root" in str(err.value) and "outside the repository" in str(err.value)
    lost = _bytes_lost(before, tmp_path)
    reliability.record(ledger, kind="bad_input", case="flow override: paths.root outside the repo", clear=clear,
                       bytes_lost=lost, message=str(err.value)[:300])
    assert clear and lost == 0


def test_the_suite_wrote_nothing_into_the_repository(ledger):
    """Runs last in this module: the README's ledger was left alone unless it was asked for."""
    if os.environ.get("DOTS_RELIABILITY_LEDGER"):
        pytest.skip("DOTS_RELIABILITY_LEDGER set: the ledger was written where asked")
    assert ledger != REPO_LEDGER and REPO not in ledger.parents
    assert _file_state(REPO_LEDGER) == REPO_LEDGER_BEFORE["state"], f"{REPO_LEDGER} was written by the tests"
