"""Markdown reports and plots from run logs."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from rlvr_gym.files import read_log


def plot_curves(runs: dict[str, str | os.PathLike], keys: Sequence[str], out_png: str | os.PathLike, title: str = "") -> Path:
    """One panel per metric key, one line per run (read from each run dir's log.jsonl)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for label, run_dir in runs.items():
            points = [(r["step"], r[key]) for r in read_log(run_dir) if key in r]
            if points:
                ax.plot(*zip(*points), marker="." if len(points) < 30 else None, label=label)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def markdown_table(rows: Sequence[dict], columns: Sequence[str] | None = None, digits: int = 3) -> str:
    columns = list(columns or dict.fromkeys(k for row in rows for k in row))
    def cell(v):
        return f"{v:.{digits}f}" if isinstance(v, float) else "" if v is None else str(v)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)
