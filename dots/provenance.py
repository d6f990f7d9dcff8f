"""What made a run's state, beside its params: the dots code that ran and the data it read.

Why: a checkpoint or a finished run is reused only when it is the same run, and params alone
do not say so. `dvc repro` re-runs a training stage when a module it depends on changed, and
the trainer then went on from the checkpoint the old code had left at the run's last step: it
trained nothing, and DVC recorded the old policy as the new code's (found at stop 67: a comment
added to dots/update.py, `dvc repro train@grpo` printed "resuming from step 300"). New data
under the same params (a dataset file re-read by the prepare stage, a policy from the hub, so
no warm-up changes) went the same way. A checkpoint, a bench's finished run and an embedding
cache now carry these identities and are used only where they match.

Which code: the modules that can change what a part produces, read from the package's own
imports (`closure`, lazy imports inside functions included), not a list kept by hand, which
misses the module that changed. At stop 67 it was the whole package, so an edit to the bench's
table or to MLflow logging threw away killed runs' checkpoints and made a bench train every run
again (27 minutes here; hours on the GPU profile). tests/test_provenance.py checks that every
module a DVC stage's code can reach is in its part's identity or named there as one that decides
nothing about the results.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from collections.abc import Iterable
from pathlib import Path

from .data import Question, pool_hash

PACKAGE = Path(__file__).resolve().parent

# What the shared stages (prepare, warm-up, embed, label, fit the predictor) run, besides stages.py.
_SHARED = ("data", "datasets", "heldout", "warmup", "evaluation", "models", "embeddings", "predictor",
           "predictor_training", "determinism", "runfiles")
# part -> (modules followed through their imports, modules counted alone). stages.py sets every
# part up, and bench.py the bench's, but they import every stage's code (stages.py reaches 46 of the
# package's modules): their own source counts, their imports only where the part follows them.
PARTS = {
    "training": (("trainer",), ("stages",)),
    "embeddings": (("embeddings", "models", "determinism"), ("stages",)),
    "bench shared stages": (_SHARED, ("stages", "bench")),
    "bench run": (("trainer", *_SHARED), ("stages", "bench")),
}


def _imported(tree: ast.AST) -> set[str]:
    """The dots modules one module's source imports, wherever the import statement stands."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:  # from .x import y / from . import x
                if node.module:
                    out.add(node.module.split(".")[0])
                else:
                    out.update(a.name for a in node.names)
            elif node.level == 0 and node.module and node.module.split(".")[0] == "dots":
                parts = node.module.split(".")
                if len(parts) > 1:
                    out.add(parts[1])
                else:
                    out.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("dots."))
    return out


@functools.cache
def module_graph(package: Path = PACKAGE) -> dict[str, frozenset[str]]:
    """{module: the dots modules it imports}, over the package's *.py files."""
    modules = {p.stem for p in package.glob("*.py")}
    return {p.stem: frozenset(_imported(ast.parse(p.read_text())) & modules - {p.stem})
            for p in package.glob("*.py")}


def closure(modules: Iterable[str], package: Path = PACKAGE) -> set[str]:
    """The modules and every dots module they import, directly or not."""
    graph = module_graph(package)
    seen, todo = set(), list(modules)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return seen


def part_modules(part: str, package: Path = PACKAGE) -> set[str]:
    """The modules whose source makes a part's identity (PARTS)."""
    followed, alone = PARTS[part]
    return closure(followed, package) | set(alone)


@functools.cache
def module_hashes(part: str, package: Path = PACKAGE) -> dict[str, str]:
    """{module file: a hash of its source} over a part's modules, as imported here (an editable
    install: the checkout's, edits included, committed or not)."""
    return {f"{m}.py": hashlib.sha256((package / f"{m}.py").read_bytes()).hexdigest()[:12]
            for m in sorted(part_modules(part, package))}


def code_identity(part: str, package: Path = PACKAGE) -> str:
    """One hash of a part's modules: what a checkpoint, a bench run or a cache records."""
    return hashlib.sha256(repr(sorted(module_hashes(part, package).items())).encode()).hexdigest()[:16]


def changed_modules(theirs: dict | None, mine: dict[str, str]) -> list[str]:
    """The module files whose source differs between two `module_hashes`, added and removed
    ones included; empty when `theirs` was not recorded."""
    if not isinstance(theirs, dict):
        return []
    return sorted(m for m in set(theirs) | set(mine) if theirs.get(m) != mine.get(m))


def data_identity(pool: list[Question], eval_set: list[Question]) -> str:
    """The training pool's and the held-out set's content and order."""
    return f"{pool_hash(pool)}+{pool_hash(eval_set)}"
