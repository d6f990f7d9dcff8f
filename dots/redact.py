"""Keep secrets out of what dots writes for others to read: MLflow params, tags and
artifacts, log messages, error messages.

Two kinds are masked: the password part of a URI (`https://user:token@host` becomes
`https://user:***@host`), and the value of every environment variable whose name says
it holds a secret (AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, MLFLOW_TRACKING_TOKEN,
MLFLOW_TRACKING_PASSWORD, HF_TOKEN, ...) wherever it appears.
"""

from __future__ import annotations

import os
import re
from typing import Any

MASK = "***"
# the password may hold a raw "/" (AWS secret keys do, pasted unencoded)
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@\s:]*):(?P<password>[^@\s]+)@")
_SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|ACCESS_KEY|API_KEY|PRIVATE_KEY|CONNECTION_STRING")
_MIN_LEN = 8  # shorter values ("1", "true", a test's "testing") are not worth masking everywhere


def environ_snapshot() -> dict[str, str]:
    """A copy of `os.environ` that another thread changing it cannot break.

    MLflow's telemetry thread sets and deletes `_MLFLOW_TELEMETRY_SESSION_ID` while a run
    starts. Iterating `os.environ` meanwhile (`.items()`, `dict(os.environ)`) lists the key, then
    reads it after it is gone: a KeyError that stopped a bench before its first step (measured
    2026-12-02). So: list the keys (again, if the dict changed size while listed), then read each
    with `get`, skipping those that vanished."""
    for _ in range(100):
        try:
            keys = list(os.environ)
            break
        except RuntimeError:  # the dict changed size while it was listed
            continue
    else:
        raise RuntimeError("os.environ kept changing while it was listed")
    return {k: v for k in keys if (v := os.environ.get(k)) is not None}


def secret_values() -> list[str]:
    """Values of the environment's secret-named variables, longest first."""
    vals = {v for k, v in environ_snapshot().items() if _SECRET_NAME.search(k.upper()) and len(v) >= _MIN_LEN}
    return sorted(vals, key=len, reverse=True)


def scrub(text: str) -> str:
    """`text` with URI passwords and secret environment values masked."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    for value in secret_values():
        text = text.replace(value, MASK)
    return text


def scrub_tree(obj: Any) -> Any:
    """`scrub` applied to every string in a dict/list tree (a config dump, a param table)."""
    if isinstance(obj, str):
        return scrub(obj)
    if isinstance(obj, dict):
        return {k: scrub_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub_tree(v) for v in obj]
    return obj
