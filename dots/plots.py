"""The learning-curve figure: held-out accuracy against training seconds, every method on
one chart (seeds shaded when there are several), with grpo's final accuracy as the target."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def learning_curve(curves: dict[str, list[list[dict]]], target: float | None, path: str | Path) -> Path:
    """`curves[method]` is a list of eval lists (one per seed); each eval has elapsed_s and accuracy."""
    from .atomic import atomic_path  # noqa: PLC0415
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for method, runs in curves.items():
        runs = [r for r in runs if r]
        if not runs:
            continue
        if len(runs) == 1:
            xs = [e["elapsed_s"] for e in runs[0]]
            ax.plot(xs, [e["accuracy"] for e in runs[0]], marker=".", label=method)
            continue
        grid = np.linspace(0, min(r[-1]["elapsed_s"] for r in runs), 60)
        ys = np.array([np.interp(grid, [e["elapsed_s"] for e in r], [e["accuracy"] for e in r]) for r in runs])
        line, = ax.plot(grid, np.median(ys, 0), label=f"{method} (median of {len(runs)})")
        ax.fill_between(grid, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.2)
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label="target (grpo final)")
    ax.set_xlabel("training seconds (evaluation excluded)")
    ax.set_ylabel("held-out accuracy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:  # a killed write never leaves a torn PNG
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return Path(path)
