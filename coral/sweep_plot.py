"""The savings study's heatmap (``coral bench --sweep --plot FILE.png``): needs matplotlib (Agg backend)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PANELS = (
    ("homo+pd", "homogeneous + prefill/decode:\ncost saved vs the best baseline"),
    ("agg", "aggregated, mixed types:\ncost saved vs the best baseline"),
    ("coral", "Coral:\ncost saved vs the best baseline"),
    ("goodput_gain_vs_best_baseline", "Coral:\ngoodput gained vs the best baseline"),
    ("coral_served", "Coral:\ndemand served"),
)
"""(key, title) per panel: a column's saving (blank where it serves a different amount than the best
baseline), Coral's goodput gain, and the fraction of demand Coral serves."""


def plot_sweep(cells: Sequence[Mapping[str, Any]], path: Path | str, *, title: str) -> None:
    """Heatmaps over availability setting (rows) x demand scale (columns), from the sweep's JSON cells
    (``solvers.study.Cell.to_json``): see ``PANELS``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    scales = sorted({float(c["scale"]) for c in cells})
    settings = list(dict.fromkeys(str(c["availability"]) for c in cells))
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 1.6 + 0.75 * len(settings)))
    for ax, (key, label) in zip(axes, PANELS, strict=True):
        grid = np.full((len(settings), len(scales)), np.nan)
        for c in cells:
            if key == "coral_served":
                v = c["columns"]["coral"]["served_fraction"]
            elif key in c["savings_vs_best_baseline"]:
                v = c["savings_vs_best_baseline"][key]
            else:
                v = c[key]
            if v is not None:
                grid[settings.index(str(c["availability"])), scales.index(float(c["scale"]))] = 100.0 * v
        if key == "coral_served":
            image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=100, aspect="auto")
        else:
            top = max(float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0, 1.0)
            image = ax.imshow(grid, cmap="RdYlGn", vmin=-top, vmax=top, aspect="auto")
        for i in range(len(settings)):
            for j in range(len(scales)):
                text = "-" if np.isnan(grid[i, j]) else f"{grid[i, j]:.0f}%"
                ax.text(j, i, text, ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(scales)), [f"{s:g}x" for s in scales])
        ax.set_yticks(range(len(settings)), settings)
        ax.set_xlabel("demand scale")
        ax.set_title(label, fontsize=10)
        fig.colorbar(image, ax=ax, format="%.0f%%", shrink=0.8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)
