"""MLflow tracking: one parent run per pipeline run, one child run per training method.

Names are DESIGN §4's. The parent holds the flattened config as params and the pipeline's
artifacts (config, predictor evaluation, learning-curve PNG, comparison table); each child
holds its method's per-step metrics, the per-run `time_to_target_s`, `steps_to_target`,
`final_accuracy`, and the tags `method`, `git_commit`, `data_version`.

Stages run as separate processes (DVC stages, Prefect tasks), so they meet through tags:
the parent is found by `dots.pipeline` (the env var DOTS_PIPELINE_ID when a Prefect flow
sets it, else a hash of the config and git commit), a child by that plus `method`.
Training logs live, in batches (`tracking.log_every` steps); a resumed run continues its
child run after the last step it had logged (`dots.logged_step`), so a retry neither
duplicates nor drops points.

The store is a local SQLite file by default; `tracking.uri` or MLFLOW_TRACKING_URI points
elsewhere, and `tracking.artifact_location` (e.g. s3://bucket/mlflow, with
MLFLOW_S3_ENDPOINT_URL for a non-AWS endpoint) puts artifacts on S3.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from .config import Config
from .experiment_copy import in_repository
from .provenance import code_identity
from .redact import scrub, scrub_tree

PIPELINE_TAG, LOGGED_TAG = "dots.pipeline", "dots.logged_step"
OWNER_TAG = "dots.owner"  # the process training a run (`process_owner`, read by `Tracker.end_stale_runs`)
MODEL_ARTIFACT = "model"  # where a run keeps its exported policy folder


def store_root(cfg: Config) -> Path:
    """Where the default MLflow store (`mlflow.db` and `mlartifacts/`) lives: `paths.root`, or, in
    an experiment DVC runs in a temporary copy of the repository (`dvc exp run --queue`, `--temp`),
    that folder of the repository the experiment was started from (DVC sets DVC_ROOT to it and
    runs the stages in the copy). Why: the copy is deleted when the experiment ends, and with it
    the store: a queued sweep's MLflow runs and registered models were lost, and `make ui`
    showed none of them (found at stop 67: "Creating initial MLflow database tables" in the
    queue's log, nothing in the workspace's store)."""
    return in_repository(cfg.root) or cfg.root.resolve()


def tracking_uri(cfg: Config) -> str:
    if cfg.tracking.uri:
        return cfg.tracking.uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{store_root(cfg) / 'mlflow.db'}"


def git_commit(cwd: str | Path = ".") -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def data_version(cfg: Config) -> str:
    """The DVC hash of the prepared data when dvc.lock has it, else the pool's content hash."""
    from .versioning import StageError, data_version as dvc_version  # noqa: PLC0415

    try:
        return f"dvc:{dvc_version('.')}"
    except StageError:
        from .data import load_questions, pool_hash  # noqa: PLC0415

        pool = cfg.root / "data" / "pool.jsonl"
        return f"pool:{pool_hash(load_questions(pool))}" if pool.exists() else "unknown"


def pipeline_id(cfg: Config) -> str:
    """The MLflow parent's key outside a flow or a bench (which set DOTS_PIPELINE_ID): params,
    commit and the training code (`provenance.code_identity("training")`). Why the code: a
    `dvc repro` after an edit to a module training runs, not committed, trains every method
    again, and its runs went under the parent of that commit's earlier pipeline, whose figures the
    compare stage then overwrote (stop 67's note; since stop 68 the code's part). An edit to
    another module (evaluation, logging) keeps the parent: its stages find the runs they follow."""
    if os.environ.get("DOTS_PIPELINE_ID"):
        return os.environ["DOTS_PIPELINE_ID"]
    key = cfg.fingerprint(("paths", "train.method", "train.threads", "bench", "tracking"))
    return f"{key}-{git_commit()[:12]}-{code_identity('training')[:8]}"


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return scrub(text.splitlines()[0]) if text else type(exc).__name__


class TrackingUnavailable(ConnectionError):
    """The MLflow tracking store cannot be reached or opened (raised before any training)."""


def check_reachable(uri: str, timeout: float = 10.0) -> None:
    """Fail in seconds when an http(s) tracking server does not answer: MLflow's own client
    would retry with back-off for minutes before saying so."""
    import socket  # noqa: PLC0415
    from urllib.parse import urlsplit  # noqa: PLC0415

    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return
    try:
        socket.create_connection((parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)),
                                 timeout=timeout).close()
    except OSError as exc:
        raise TrackingUnavailable(f"MLflow tracking server {scrub(uri)} unreachable ({exc}); start it, fix "
                                  "tracking.uri / MLFLOW_TRACKING_URI, or set tracking.enabled=false") from None


class Tracker:
    """A thin layer over MlflowClient that knows our parent/child layout."""

    def __init__(self, cfg: Config):
        from mlflow.tracking import MlflowClient  # noqa: PLC0415  (heavy import, only when tracking)

        self.cfg = cfg
        self.uri = tracking_uri(cfg)
        check_reachable(self.uri)
        try:
            if self.uri.startswith("sqlite:///"):
                Path(self.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            self.client = MlflowClient(self.uri)
            self.experiment_id = self._experiment()
        except Exception as exc:  # noqa: BLE001  (whatever the store raises: one clear error, before training)
            raise TrackingUnavailable(f"MLflow tracking store {scrub(self.uri)} cannot be used ({_first_line(exc)}); "
                                      "fix tracking.uri / MLFLOW_TRACKING_URI, or set tracking.enabled=false") from None
        self.pipeline = pipeline_id(cfg)
        self.commit, self.data_version = git_commit(), data_version(cfg)

    def _experiment(self) -> str:
        exp = self.client.get_experiment_by_name(self.cfg.tracking.experiment)
        if exp is not None:
            return exp.experiment_id
        location = self.cfg.tracking.artifact_location
        if location is None and self.uri.startswith("sqlite:"):  # keep artifacts beside the store, not in ./mlruns
            location = (store_root(self.cfg) / "mlartifacts").as_uri()
        return self.client.create_experiment(self.cfg.tracking.experiment, artifact_location=location)

    def _find(self, extra: str) -> Any | None:
        runs = self.client.search_runs([self.experiment_id], f"tags.`{PIPELINE_TAG}` = '{self.pipeline}' {extra}",
                                       max_results=1, order_by=["attributes.start_time DESC"])
        return runs[0] if runs else None

    def _tags(self, **extra: str) -> dict[str, str]:
        """`dvc_experiment`: the name `dvc exp show` gives the run's experiment (DVC_EXP_NAME), when
        DVC runs it as one, so a row there and a run here can be matched."""
        experiment = {"dvc_experiment": os.environ["DVC_EXP_NAME"]} if os.environ.get("DVC_EXP_NAME") else {}
        return {PIPELINE_TAG: self.pipeline, "git_commit": self.commit, "data_version": self.data_version,
                **experiment, **extra}

    def parent(self) -> str:
        """The pipeline's parent run id (created with the flattened config on first use)."""
        run = self._find("and tags.`dots.role` = 'pipeline'")
        if run is not None:
            return run.info.run_id
        run = self.client.create_run(self.experiment_id, run_name=f"pipeline-{self.pipeline[-8:]}",
                                     tags=self._tags(**{"dots.role": "pipeline", "method": "pipeline"}))
        self._log_params(run.info.run_id)
        return run.info.run_id

    def find_child(self, method: str, seed: int | None = None) -> Any | None:
        """The pipeline's training run of `method` (of `seed`, in a benchmark), or None."""
        by_seed = "" if seed is None else f" and tags.seed = '{seed}'"
        return self._find(f"and tags.method = '{method}' and tags.`dots.role` = 'train'{by_seed}")

    def child(self, method: str, seed: int | None = None, params: dict[str, Any] | None = None,
              go_on: bool = True) -> tuple[str, int]:
        """(run id, last logged step) of the method's child run (one per seed in a benchmark),
        created when missing, with `params` beside the config's; tagged with this process as its
        owner, after the runs of owners that are gone are ended (`end_stale_runs`).
        `go_on=False` (a training that starts at step 0) always creates a new one. Why: the
        pipeline's id was its params and commit, so a stage re-run at the same commit (a module
        edited, not committed; `dvc repro -f`) found the earlier run FINISHED up to its last step,
        logged none of its new steps there and overwrote its summary figures: the MLflow UI showed
        the old curve under the new run's time to target. The earlier run stays as it was; the
        new one, the latest, is the one later stages find."""
        self.end_stale_runs()
        parent = self.parent()
        run = self.find_child(method, seed) if go_on else None
        if run is not None:
            self.client.update_run(run.info.run_id, status="RUNNING")
            self.client.set_tag(run.info.run_id, OWNER_TAG, process_owner())
            return run.info.run_id, int(run.data.tags.get(LOGGED_TAG, 0))
        extra = {} if seed is None else {"seed": str(seed)}
        run = self.client.create_run(self.experiment_id, run_name=method if seed is None else f"{method}/seed{seed}",
                                     tags=self._tags(method=method, **extra, **{
                                         "mlflow.parentRunId": parent, "dots.role": "train", LOGGED_TAG: "0",
                                         OWNER_TAG: process_owner()}))
        self._log_params(run.info.run_id, params)
        return run.info.run_id, 0

    def end_stale_runs(self) -> None:
        """End KILLED every training run of the experiment still RUNNING whose owner, a process of
        this host, is gone, saying so in a line each. Why: a process killed
        outright (SIGKILL, the out-of-memory killer, a preempted node) runs no cleanup, so its run
        stayed RUNNING in the MLflow UI until the same stage ran again, and for good when none did
        (another config, another commit). The next training stage on the machine ends it. A run
        owned by another host is left alone: whether its process lives cannot be seen from here."""
        from .progress import say  # noqa: PLC0415

        host = socket.gethostname()
        running = self.client.search_runs(
            [self.experiment_id], f"attributes.status = 'RUNNING' and tags.`dots.role` = 'train' "
                                  f"and tags.`{OWNER_TAG}` LIKE '{host} %'", max_results=1000)
        for run in running:
            pid = owner_gone(run.data.tags[OWNER_TAG])
            if pid is None:
                continue
            self.client.set_terminated(run.info.run_id, "KILLED")
            say(f"tracking: MLflow run {run.info.run_name} ({run.info.run_id}) was left RUNNING by process "
                f"{pid}, which is gone (killed outright?) -> KILLED")

    def _log_params(self, run_id: str, extra: dict[str, Any] | None = None) -> None:
        """The flattened config, and `extra` (a training run's `train.lr_used`)."""
        from mlflow.entities import Param  # noqa: PLC0415

        flat = {**self.cfg.flat(), **(extra or {})}
        params = [Param(k, scrub(str(v))[:6000]) for k, v in flat.items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(run_id, params=params[i:i + 100])

    def log_metrics(self, run_id: str, records: list[dict], start_ms: int) -> None:
        """Per-step records as metrics at their step; timestamps = start + training clock,
        so the UI's relative-time axis is training seconds."""
        from mlflow.entities import Metric, RunTag  # noqa: PLC0415

        if not records:
            return
        metrics = []
        for rec in records:
            ts = start_ms + int(1000 * rec.get("time/elapsed_s", 0.0))
            for key, value in rec.items():
                if key == "step" or value is None or isinstance(value, bool):
                    continue
                if isinstance(value, (int, float)) and math.isfinite(value):
                    metrics.append(Metric(key, float(value), ts, int(rec["step"])))
        chunks = [metrics[i:i + 1000] for i in range(0, len(metrics), 1000)] or [[]]
        for i, chunk in enumerate(chunks):
            # the last batch carries the logged-step tag: one transaction, so a kill cannot record the
            # metrics without the tag (and the retry log them twice)
            tags = [RunTag(LOGGED_TAG, str(records[-1]["step"]))] if i == len(chunks) - 1 else []
            self.client.log_batch(run_id, metrics=chunk, tags=tags)

    def finish_child(self, run_id: str, summary: dict, evals: list[dict], start_ms: int) -> None:
        from mlflow.entities import Metric  # noqa: PLC0415

        now = int(time.time() * 1000)
        per_run = [Metric(k, float(summary[k]), now, 0) for k in ("time_to_target_s", "steps_to_target",
                                                                   "final_accuracy") if summary.get(k) is not None]
        # the step-0 evaluation precedes every training record; log it too
        if evals and evals[0]["step"] == 0:
            per_run.append(Metric("eval/accuracy", float(evals[0]["accuracy"]), start_ms, 0))
        if per_run:
            self.client.log_batch(run_id, metrics=per_run)
        self.client.set_terminated(run_id, "FINISHED")

    def log_artifacts(self, run_id: str, paths: list[Path], artifact_path: str | None = None) -> None:
        for p in paths:
            if Path(p).exists():
                try:
                    self.client.log_artifact(run_id, str(p), artifact_path)
                except Exception as exc:  # noqa: BLE001  (S3 down, wrong credentials, missing bucket, ...)
                    where = self.client.get_run(run_id).info.artifact_uri
                    raise TrackingUnavailable(f"MLflow artifact store {scrub(where)}: could not store {p} "
                                              f"({_first_line(exc)}); the local file is kept") from None


def process_owner() -> str:
    """This process as a run's owner tag: host, pid namespace, pid and the pid's start time (a pid
    is reused once its process has ended). The pid namespace because containers on one host can
    share its hostname (host networking) and one tracking store, each with pids of its own; a pid
    is only judged from the namespace it is in."""
    from .processes import pid_namespace, process_started  # noqa: PLC0415

    return f"{socket.gethostname()} {pid_namespace()} {os.getpid()} {process_started(os.getpid())}"


def owner_gone(tag: str) -> int | None:
    """The pid of an owner tag (`process_owner`) of this host and pid namespace whose process is
    gone, else None (alive, another host's or container's, or a tag this version does not read)."""
    from .processes import pid_alive, pid_namespace  # noqa: PLC0415

    parts = tag.rsplit(" ", 3)
    if len(parts) != 4:
        return None
    host, space, pid, started = parts
    if host != socket.gethostname() or space != pid_namespace() or not pid.isdigit():
        return None
    try:
        start = None if started == "None" else float(started)
    except ValueError:
        return None
    return None if pid_alive(int(pid), start) else int(pid)


def registered_name(cfg: Config, method: str) -> str:
    """The Model Registry name of a method's policies: `<tracking.experiment>-<method>`."""
    return f"{cfg.tracking.experiment}-{method}"


def register_model(tracker: Tracker, run_id: str, folder: Path, method: str, summary: dict) -> str:
    """Log an exported model folder to the method's run (artifact path `model`) and register it as
    a version of `<experiment>-<method>`, tagged with data version, git commit, method, final
    accuracy and the weights' digest. A retry with the same weights on the same run finds its
    version and registers no duplicate; a newly trained model gets a new version. Returns the version."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415

    from .export import read_info  # noqa: PLC0415

    client, name = tracker.client, registered_name(tracker.cfg, method)
    digest = read_info(folder)["weights_sha256"]
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name, description=f"dots policies trained with method {method}")
    for v in _run_versions(client, name, run_id):
        if v.tags.get("weights_sha256") == digest:
            return v.version
    artifact_uri = client.get_run(run_id).info.artifact_uri
    try:
        client.log_artifacts(run_id, str(folder), MODEL_ARTIFACT)
    except Exception as exc:  # noqa: BLE001  (S3 down, wrong credentials, missing bucket, ...)
        raise TrackingUnavailable(f"MLflow artifact store {scrub(artifact_uri)}: could not store the model "
                                  f"{folder} ({_first_line(exc)}); the local folder is kept") from None
    source = f"{artifact_uri}/{MODEL_ARTIFACT}"
    tags = {"method": method, "data_version": tracker.data_version, "git_commit": tracker.commit,
            "weights_sha256": digest, PIPELINE_TAG: tracker.pipeline}
    for key in ("final_accuracy", "steps"):
        if summary.get(key) is not None:
            tags[key] = str(summary[key])
    version = client.create_model_version(name, source, run_id=run_id, tags=tags)
    return version.version


def _run_versions(client, name: str, run_id: str) -> list:
    """The versions of registered model `name` that were registered from run `run_id`."""
    return client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")


def tag_model_version(tracker: Tracker, run_id: str, method: str, tags: dict) -> None:
    """Add tags (time-to-target, known after compare) to the versions registered from `run_id`."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415

    name = registered_name(tracker.cfg, method)
    try:
        versions = _run_versions(tracker.client, name, run_id)
    except MlflowException:
        return  # nothing registered (tracking was off while training)
    for v in versions:
        for key, value in tags.items():
            tracker.client.set_model_version_tag(name, v.version, key, "never" if value is None else str(value))


def method_run(tracker: Tracker, method: str) -> str:
    """The id of the pipeline's training run of `method` (created, finished, when training was not tracked)."""
    run = tracker.find_child(method)
    if run is not None:
        return run.info.run_id
    run_id, _ = tracker.child(method)
    tracker.client.set_terminated(run_id, "FINISHED")
    return run_id


def log_evaluation(cfg: Config, method: str, metrics: dict[str, float]) -> str:
    """The evaluate stage's metrics (heldout/<set>/<metric>) on the method's own run."""
    from mlflow.entities import Metric  # noqa: PLC0415

    tracker = Tracker(cfg)
    run_id = method_run(tracker, method)
    now = int(time.time() * 1000)
    tracker.client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()])
    return run_id


class LiveLogger:
    """Trainer callback: buffers step records and logs them every `every` steps.

    A tracking failure mid-run never stops training: the records stay buffered and are
    retried at the next flush; whatever still cannot be logged at the end is written to
    `fallback` (JSON lines) and reported, so no metric is lost.
    """

    def __init__(self, tracker: Tracker, method: str, every: int, fallback: str | Path | None = None,
                 seed: int | None = None, params: dict[str, Any] | None = None, go_on: bool = True):
        self.tracker, self.every = tracker, every
        # `go_on`: the run went on from a checkpoint, so it goes on in its MLflow run too
        self.run_id, self.logged = tracker.child(method, seed, params, go_on)
        self.start_ms = int(time.time() * 1000)
        self.buffer: list[dict] = []
        self.fallback = Path(fallback) if fallback is not None else None
        self.failures = 0
        self._due = every  # buffered records before the next write; doubles while the store is down
        self.ended: str | None = None  # the status this process ended the run with
        self.seconds = 0.0  # wall-clock spent in MLflow calls (reported as tracking overhead)

    def catch_up(self, records: list[dict]) -> None:
        """After a resume: log the restored records the previous attempt had not logged yet."""
        self.buffer.extend(r for r in records if r["step"] > self.logged)
        self.flush()

    def __call__(self, rec: dict) -> None:
        if rec["step"] <= self.logged:
            return
        self.buffer.append(rec)
        if len(self.buffer) >= self._due:
            self.flush()

    def flush(self) -> bool:
        """Log the buffered records; on failure keep them for the next try. True when logged."""
        if not self.buffer:
            return True
        t = time.perf_counter()
        try:
            self.tracker.log_metrics(self.run_id, self.buffer, self.start_ms)
        except Exception as exc:  # noqa: BLE001  (any tracking fault must not stop training)
            self.failures += 1
            from .progress import say  # noqa: PLC0415

            say(f"tracking: logging steps {self.buffer[0]['step']}-{self.buffer[-1]['step']} failed ({exc}); "
                "kept for retry")
            self._due = min(2 * len(self.buffer), 100 * self.every)  # back off instead of retrying every step
            return False
        finally:
            self.seconds += time.perf_counter() - t
        self.logged = self.buffer[-1]["step"]
        self.buffer = []
        self._due = self.every
        return True

    def _flush_or_keep(self) -> None:
        """Log what is buffered; what cannot reach MLflow goes to the fallback file, not lost."""
        from .progress import say  # noqa: PLC0415

        if not self.flush() and self.fallback is not None:
            self.fallback.parent.mkdir(parents=True, exist_ok=True)
            with self.fallback.open("a") as f:
                for rec in self.buffer:
                    f.write(json.dumps({"run_id": self.run_id, **rec}) + "\n")
            say(f"tracking: {len(self.buffer)} step records could not reach MLflow; written to {self.fallback}")
            self.buffer = []

    def finish(self, summary: dict, evals: list[dict]) -> None:
        from .progress import say  # noqa: PLC0415

        self._flush_or_keep()
        t = time.perf_counter()
        try:
            self.tracker.finish_child(self.run_id, summary, evals, self.start_ms)
            self.ended = "FINISHED"
        except Exception as exc:  # noqa: BLE001
            say(f"tracking: could not close MLflow run {self.run_id} ({exc}); the run files hold every figure")
        finally:
            self.seconds += time.perf_counter() - t

    def abort(self, error: BaseException) -> None:
        """The run stopped on `error`: log the steps it had buffered and end its MLflow run FAILED
        (KILLED for Ctrl-C). Why here: a Prefect flow ends its runs itself (`dots.pipeline_status`),
        but `dvc repro` and a hand `dots train` have no flow around them, and a stage that died
        left its run RUNNING in the MLflow UI until the same stage ran again. A store that cannot
        be reached is one line; the stage's own error stands."""
        from .progress import say  # noqa: PLC0415

        if self.ended is not None:
            return  # closed before the error (another run of its lockstep group failed later)
        status = "FAILED" if isinstance(error, Exception) else "KILLED"
        try:
            self._flush_or_keep()
            self.tracker.client.set_terminated(self.run_id, status)
            self.ended = status
            say(f"tracking: MLflow run {self.run_id} -> {status} (stopped at step {self.logged})")
        except Exception as exc:  # noqa: BLE001
            say(f"tracking: could not end MLflow run {self.run_id} ({_first_line(exc)}); it stays RUNNING")


def log_time_to_target(tracker: Tracker, comparison: dict, runs: dict[str, str] | None = None) -> None:
    """time_to_target_s, steps_to_target and target_accuracy on each method's own run (so the runs
    table compares runs by them), a `reached_target` tag (a method that never reached it has no
    time to log), and the same figures as tags of the model versions registered from the run.
    `runs` maps method to run id (the benchmark's per-seed runs); default: the pipeline's."""
    from mlflow.entities import Metric, RunTag  # noqa: PLC0415

    now = int(time.time() * 1000)
    target = float(comparison["target_accuracy"])
    for row in comparison["rows"]:
        method = row["method"]
        run_id = (runs or {}).get(method) or method_run(tracker, method)
        metrics = [Metric("target_accuracy", target, now, 0)]
        metrics += [Metric(k, float(row[k]), now, 0) for k in ("time_to_target_s", "steps_to_target")
                    if row.get(k) is not None]
        reached = str(row.get("time_to_target_s") is not None).lower()
        tracker.client.log_batch(run_id, metrics=metrics, tags=[RunTag("reached_target", reached)])
        tag_model_version(tracker, run_id, method, {"time_to_target_s": row.get("time_to_target_s"),
                                                    "target_accuracy": target})


def log_comparison(cfg: Config, comparison: dict, artifacts: list[Path]) -> str:
    """Attach the comparison (metrics per method, table, plot, predictor eval, config) to the parent run."""
    from mlflow.entities import Metric  # noqa: PLC0415

    tracker = Tracker(cfg)
    parent = tracker.parent()
    now = int(time.time() * 1000)
    metrics = [Metric("target_accuracy", float(comparison["target_accuracy"]), now, 0)]
    for row in comparison["rows"]:
        for key in ("time_to_target_s", "steps_to_target", "final_accuracy", "time_to_target_ratio",
                    "end_point_diff", "equal_time_diff"):
            if row.get(key) is not None:
                metrics.append(Metric(f"{key}/{row['method']}", float(row[key]), now, 0))
    tracker.client.log_batch(parent, metrics=metrics)
    log_time_to_target(tracker, comparison)
    from .atomic import write_text  # noqa: PLC0415

    config_file = cfg.root / "compare" / "config.json"
    write_text(config_file, json.dumps(scrub_tree(cfg.model_dump()), indent=1))
    tracker.log_artifacts(parent, [config_file, *artifacts])
    tracker.client.set_terminated(parent, "FINISHED")
    return parent


def log_bench(cfg: Config, result: dict, artifacts: list[Path]) -> str:
    """The benchmark's medians, ratios and goals on its parent run, with the table and plot."""
    from mlflow.entities import Metric  # noqa: PLC0415

    tracker = Tracker(cfg)
    parent = tracker.parent()
    now = int(time.time() * 1000)
    metrics = []
    for method, stats in result["summary"].items():
        # its ratio to every baseline dots.bench_summary.summarize paired it with (the peers, their and
        # grpo's variants, a variant's own method), read from the summary's keys rather than
        # decided again here, where dots.bench may not be imported (it would join every stage's
        # DVC lineage)
        paired = [k for k in stats
                  if k.startswith(("time_to_target_ratio_vs_", "time_to_target_adjusted_ratio_vs_",
                                   "end_point_diff_vs_", "equal_time_diff_vs_"))
                  and not k.endswith(("_per_seed", "_ci90"))]
        for key in ("time_to_target_s", "time_to_target_ratio", "time_to_target_adjusted_s",
                    "time_to_target_adjusted_ratio", "steps_to_target", "final_accuracy", "step_s",
                    "effective_ratio", "dots_pearson", "pearson_ceiling", "tokens_sampled_ratio",
                    "tokens_trained_ratio", "rollouts_per_step", "rollout_time_ratio", "update_time_ratio",
                    "select_time_ratio", "end_point_diff", "equal_time_diff", *paired):
            value = stats.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                metrics.append(Metric(f"bench/{key}/{method}", float(value), now, 0))
    tracker.client.log_batch(parent, metrics=metrics)
    for row in result["runs"]:  # each seed's run gets its own time-to-target, against its seed's target
        run = tracker.find_child(row["method"], row["seed"])
        if run is not None and row.get("target_accuracy") is not None:
            log_time_to_target(tracker, {"target_accuracy": row["target_accuracy"], "rows": [row]},
                               {row["method"]: run.info.run_id})
    tracker.log_artifacts(parent, artifacts, "bench")
    tracker.client.set_terminated(parent, "FINISHED")
    return parent
