"""The project's own import graph, read from the source (every import, including those inside
functions and under TYPE_CHECKING: a lazy import is still a dependency). Used by the layering
test, the DVC lineage test and the provenance test; the reading itself is `dots.provenance`'s."""

from __future__ import annotations

from pathlib import Path

from dots.provenance import PACKAGE, closure as _closure, module_graph

ROOT = Path(__file__).resolve().parents[1]
assert PACKAGE == ROOT / "dots", f"dots is imported from {PACKAGE}, not from this checkout"


def graph() -> dict[str, frozenset[str]]:
    """{module: the dots modules it imports}, over dots/*.py (`dots.provenance.module_graph`,
    which the code identities of checkpoints and caches are read from)."""
    return module_graph()


def closure(module: str) -> set[str]:
    """`module` and every dots module it imports, directly or not."""
    return _closure([module])


def cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (each one an import cycle)."""
    g = graph()
    return [sorted(c) for c in _components(g) if len(c) > 1]


def _components(g: dict[str, frozenset[str]]) -> list[set[str]]:
    reach = {m: closure(m) for m in g}
    seen: set[str] = set()
    comps = []
    for m in sorted(g):
        if m not in seen:
            comp = {n for n in reach[m] if m in reach[n]}
            seen |= comp
            comps.append(comp)
    return comps
