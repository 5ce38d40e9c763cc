"""What ``python -m llm eval`` writes: `write_eval` merges one label's results
(`llm.eval.heldout.evaluate`) into ``DIR/eval.json`` and redraws ``DIR/passk.png``
(`plot_pass_at_k`). Kept out of `llm.eval.heldout`, so that a worker that imports the evaluation
does not import matplotlib's pyplot."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt

__all__ = ["plot_pass_at_k", "write_eval"]


def write_eval(
    out_dir: str | os.PathLike[str], label: str, result: dict[str, Any], **info: Any
) -> Path:
    """Merge ``{label: result | info}`` into ``DIR/eval.json`` (atomically) and redraw
    ``DIR/passk.png`` with every label; returns the json path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "eval.json"
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    data[label] = {**info, **result}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    plot_pass_at_k(data, out / "passk.png")
    return path


def plot_pass_at_k(data: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """pass@k against k (log2 axis, k up to each label's n: 256 draws the curve of Yue et al.
    2025), one line per label of an eval.json mapping, and its maj@k dashed in the same colour
    when recorded."""

    matplotlib.use("Agg")

    fig, ax = plt.subplots(figsize=(5, 3.5))
    markers = itertools.cycle("osD^v<>")
    for label, res in data.items():
        ks = [int(k) for k in res["pass_at_k"]]
        (line,) = ax.plot(ks, list(res["pass_at_k"].values()), marker=next(markers), label=label)
        if "maj_at_k" in res:
            maj = res["maj_at_k"]
            ax.plot([int(k) for k in maj], list(maj.values()), ls="--", color=line.get_color(),
                    marker=line.get_marker(), markersize=3, label=f"{label} maj@k")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k (solid), maj@k (dashed)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
