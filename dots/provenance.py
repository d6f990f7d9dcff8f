"""What made a run's state, beside its params: the dots code that ran and the data it read.

Why: a checkpoint or a finished run is reused only when it is the same run, and params alone
do not say so. `dvc repro` re-runs a training stage when a module it depends on changed, and
the trainer then went on from the checkpoint the old code had left at the run's last step: it
trained nothing, and DVC recorded the old policy as the new code's (found at stop 67: a comment
added to dots/update.py, `dvc repro train@grpo` printed "resuming from step 300"). New data
under the same params (a dataset file re-read by the prepare stage, a policy from the hub, so
no warm-up changes) went the same way. A checkpoint and a bench's finished run now carry these
identities and are used only by a run whose identities match.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from .data import Question, pool_hash


@functools.cache
def code_identity() -> str:
    """A hash of every source file of the dots package as it is imported here (an editable
    install: the checkout's, edits included, committed or not). Why the whole package and not
    the modules training imports: a module list kept by hand misses the one that changed."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def data_identity(pool: list[Question], eval_set: list[Question]) -> str:
    """The training pool's and the held-out set's content and order."""
    return f"{pool_hash(pool)}+{pool_hash(eval_set)}"
