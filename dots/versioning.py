"""DVC as the pipeline's one lineage.

Prefect tasks do not call the stages' Python directly: they run the DVC stage
(`dvc repro -s <stage>`), so a Prefect run and a `dvc repro` write the same artifacts and
the same dvc.lock. This module wraps the few DVC operations the tasks need, and turns
DVC's failures into errors that say what to fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from .atomic import atomic_path
from .config import ConfigError, load_config
from .redact import scrub


class StageError(RuntimeError):
    """A DVC command failed; the message carries the tail of its output."""


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Our venv's bin first on PATH, so stage commands (`dots ...`) resolve to this install."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.update(extra or {})
    return env


def dvc(args: list[str], repo: str | Path, env: dict[str, str] | None = None, timeout: float | None = None) -> str:
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, env=_env(env), capture_output=True,
                          text=True, timeout=timeout)
    out = (proc.stdout or "") + (proc.stderr or "")
    if proc.returncode != 0:
        tail = "\n".join(out.strip().splitlines()[-25:])
        raise StageError(scrub(f"`dvc {' '.join(args)}` failed in {repo} (exit {proc.returncode}):\n{tail}"))
    return out


def repro(stage: str, repo: str | Path = ".", env: dict[str, str] | None = None) -> str:
    """Run one stage (not its upstream: the flow orders the stages); DVC skips it when nothing changed."""
    return dvc(["repro", "--single-item", stage], repo, env)


def set_params(overrides: list[str] | dict | None, repo: str | Path = ".") -> None:
    """Write dotted overrides into params.yaml, as `dvc exp run -S` does in the workspace.

    The result is validated *before* the file is touched; comments and order are kept.
    """
    if not overrides:
        return
    path = Path(repo) / "params.yaml"
    cfg = load_config(path, overrides)  # raises ConfigError naming the key; the file is untouched
    if not (Path(repo) / cfg.paths.root).resolve().is_relative_to(Path(repo).resolve()):
        raise ConfigError(f"paths.root: {cfg.paths.root!r} is outside the repository {repo}, where the DVC "
                          "stages write; the file is untouched")
    from ruamel.yaml import YAML  # noqa: PLC0415  (a DVC dependency)

    ry = YAML()
    ry.preserve_quotes = True
    doc = ry.load(path.read_text()) if path.exists() else {}
    items = overrides.items() if isinstance(overrides, dict) else (
        (k.strip(), yaml.safe_load(v)) for k, v in (o.split("=", 1) for o in overrides))
    for key, value in items:
        node = doc
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    with atomic_path(path) as tmp, tmp.open("w") as f:
        ry.dump(doc, f)


def lock(repo: str | Path = ".") -> dict:
    p = Path(repo) / "dvc.lock"
    return (yaml.safe_load(p.read_text()) or {}).get("stages", {}) if p.exists() else {}


def data_version(repo: str | Path = ".") -> str:
    """The DVC hash of the prepared data (the `prepare` stage's output)."""
    for out in lock(repo).get("prepare", {}).get("outs", []):
        if out.get("md5"):
            return out["md5"]
    raise StageError("dvc.lock has no `prepare` output yet; run the prepare stage first")


def push(repo: str | Path = ".", targets: list[str] | None = None, remote: str | None = None) -> str:
    """Send the targets' cached data to the (default or named) DVC remote."""
    args = ["push", *(targets or [])]
    if remote:
        args += ["--remote", remote]
    try:
        return dvc(args, repo, timeout=600)
    except StageError as exc:
        text = str(exc)
        if "NoSuchBucket" in text or ("Bucket" in text and "not exist" in text):
            raise StageError(f"DVC remote bucket does not exist: create it or fix the remote url\n{text}") from None
        if any(k in text for k in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "Forbidden",
                                   "(403)")):
            raise StageError(f"DVC remote refused the credentials (AWS_ACCESS_KEY_ID / "
                             f"AWS_SECRET_ACCESS_KEY or `dvc remote modify`)\n{text}") from None
        if any(k in text for k in ("Could not connect to the endpoint", "Connection refused", "ConnectTimeout",
                                   "Name or service not known", "Cannot connect to host")):
            raise StageError(f"DVC remote endpoint unreachable: check `dvc remote modify <name> endpointurl` "
                             f"and the network; the local data and cache are untouched\n{text}") from None
        raise


def stage_inputs_key(stage: str, repo: str | Path = ".") -> str:
    """A hash of what `stage` reads: its params' current values, the recorded hashes of
    upstream outputs it depends on, the content of its code dependencies, and the state of
    its own outputs in this workspace. Equal keys mean the stage's result is there and
    current (Prefect's cache key for embed and predictor)."""
    repo = Path(repo)
    spec = (yaml.safe_load((repo / "dvc.yaml").read_text()) or {})["stages"][stage]
    params = yaml.safe_load((repo / "params.yaml").read_text()) or {}
    upstream = {o["path"]: o.get("md5") for s in lock(repo).values() for o in s.get("outs", [])}
    h = hashlib.sha256(stage.encode())
    for key in spec.get("params", []):
        value = params
        for part in str(key).split("."):
            value = value.get(part) if isinstance(value, dict) else None
        h.update(f"{key}={json.dumps(value, sort_keys=True, default=str)}".encode())
    for dep in spec.get("deps", []):
        if dep in upstream:
            h.update(f"{dep}:{upstream[dep]}".encode())
        elif (repo / dep).is_file():
            h.update(f"{dep}:".encode() + (repo / dep).read_bytes())
        else:
            h.update(f"{dep}:missing".encode())
    # This workspace's own outputs: a fresh clone or deleted outputs never hit another run's cache.
    h.update(str(repo.resolve()).encode())
    for out in spec.get("outs", []):
        path = out if isinstance(out, str) else next(iter(out))
        h.update(f"{path}:{(repo / path).exists()}:{upstream.get(path)}".encode())
    return h.hexdigest()[:24]
