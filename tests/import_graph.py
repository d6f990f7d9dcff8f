"""The project's own import graph, read from the source (every import, including those inside
functions and under TYPE_CHECKING: a lazy import is still a dependency). Used by the layering
test and by the DVC lineage test."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dots"


def _imported(tree: ast.AST) -> set[str]:
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


@cache
def graph() -> dict[str, frozenset[str]]:
    """{module: the dots modules it imports}, over dots/*.py."""
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    return {p.stem: frozenset(_imported(ast.parse(p.read_text())) & modules - {p.stem})
            for p in PACKAGE.glob("*.py")}


def closure(module: str) -> set[str]:
    """`module` and every dots module it imports, directly or not."""
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph().get(m, ()))
    return seen


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
