"""Where a DVC experiment's temporary copy of the repository came from.

Why: `dvc exp run --queue` (then `dvc queue start`) and `dvc exp run --temp` run the stages in a
copy of the repository under .dvc/tmp/exps, deleted when the experiment ends, with DVC_ROOT set
to the repository the experiment was started from. A copy holds the git files and the DVC
outputs, nothing else: no MLflow store (a queued sweep's runs were lost with the copy until
stop 67: `tracking.store_root`) and no training checkpoints (a queued sweep of a selection
param trained `grpo` from step 0 in every copy until stop 68: `Trainer`). Under `dvc repro`
and a workspace `dvc exp run`, DVC_ROOT is the working directory itself and nothing changes.
"""

from __future__ import annotations

import os
from pathlib import Path


def in_repository(path: str | Path) -> Path | None:
    """`path` (under the working directory) at the same place in the repository this DVC
    experiment's copy was made from; None when this process does not run in such a copy."""
    parent = os.environ.get("DVC_ROOT")
    if not parent:
        return None
    here, repository, path = Path.cwd().resolve(), Path(parent).resolve(), Path(path).resolve()
    if repository == here or not path.is_relative_to(here):
        return None
    return repository / path.relative_to(here)
