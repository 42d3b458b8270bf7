"""Side-by-side panels of held-out accuracy over training steps, one per family or node (B8, B10)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def save_step_panels(
    path: Path, titles: list[str], draw: Callable[[Any, str], None], ylabel: str, ymax: float = 1.0
) -> None:
    """One panel per title, ``draw(ax, title)`` filling each; accuracy axes (0..``ymax``) over steps; saved to
    ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(titles), figsize=(5 * len(titles), 3.6), squeeze=False)
    for ax, title in zip(axes[0], titles, strict=True):
        draw(ax, title)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylim(0, ymax)
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
