"""Shared figure helpers: a headless backend and reproducible PNG + PDF output."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np

plt.rcParams.update(
    {
        "figure.dpi": 110,
        "savefig.dpi": 130,
        "font.size": 9,
        "axes.titlesize": 10,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "legend.frameon": False,
    }
)


#: File formats `save` writes; `python -m toymdp figures --pdf` adds "pdf" (PNG alone by default:
#: PDF output costs about a third of the plotting time and is not tracked in git).
FORMATS: list[str] = ["png"]


def save(fig: plt.Figure, out_dir: Path, stem: str) -> list[Path]:
    """Write `out_dir/stem.png` (and `stem.pdf` when "pdf" is in `FORMATS`) without timestamps
    (reruns give equal files) and close the figure. Returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in FORMATS:
        path = out_dir / f"{stem}.{fmt}"
        meta = {"Software": None} if fmt == "png" else {"CreationDate": None, "Producer": None}
        if fmt == "pdf":
            meta["Creator"] = None
        fig.savefig(path, metadata=meta, bbox_inches="tight")
        paths.append(path)
    plt.close(fig)
    return paths


def mean_and_spread(x: object, axis: int = 0) -> tuple[object, object]:
    """Mean and standard deviation over `axis` (the seeds axis, by convention)."""

    arr = np.asarray(x, dtype=np.float64)
    return arr.mean(axis=axis), arr.std(axis=axis)
