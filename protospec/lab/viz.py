"""Plots for notebooks: the KV block pool, and latency reports (figures, not files)."""
from __future__ import annotations

import numpy as np


def plot_block_pool(num_blocks: int, block_size: int, block_tables: list[list[int]], written: dict[str, list[int]],
                    max_blocks: int | None = None):
    """Returns the Figure. One row per block, one cell per slot: colour = owning sequence (grey = free, black = null
    block); dots = slots written in the step (o draft, x target)."""
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure

    shown = min(num_blocks, max_blocks or num_blocks)
    owner = np.full((shown, block_size), -1.0)
    owner[0] = -2  # the null block
    for seq, table in enumerate(block_tables):
        for block in table:
            if block < shown:
                owner[block] = seq
    ax = Figure(figsize=(max(4, block_size * 0.45), max(3, shown * 0.3))).subplots()
    colors = ["black", "0.85"] + [colormaps["tab10"](i % 10) for i in range(max(1, len(block_tables)))]
    ax.imshow(owner + 2, cmap=ListedColormap(colors), vmin=0, vmax=len(colors) - 1, aspect="auto",
              interpolation="nearest")
    styles = {"draft": dict(marker="o", c="white", edgecolors="black", linewidths=0.6),
              "target": dict(marker="x", c="red", linewidths=1.2)}
    for name, style in styles.items():
        slots = [s for s in written.get(name, []) if s // block_size < shown]
        if slots:
            ax.scatter([s % block_size for s in slots], [s // block_size for s in slots], s=30,
                       label=f"{name} wrote K/V", **style)
    ax.set_xlabel("offset in block (slot % block_size)")
    ax.set_ylabel("block id")
    ax.set_title("KV block pool: colour = sequence, grey = free, black = null block")
    ax.legend(loc="upper right", fontsize=8)
    return ax.figure


def load_report(path):
    import json

    with open(path) as f:
        return json.load(f)
