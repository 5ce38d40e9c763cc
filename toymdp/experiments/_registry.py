"""The registry of toy experiments behind `python -m toymdp figures`.

An experiment is one small module (showyourwork style): `run` computes its results (a flat dict of
NumPy arrays and scalars, deterministic given `quick` and `seed`), `plot` draws its figure from
those cached results, and `summary` returns its headline numbers for `summary.json`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

Results = dict[str, np.ndarray]


@dataclass(frozen=True)
class Experiment:
    """One figure: `run(quick, seed) -> Results`, `plot(results, out_dir) -> [paths]`,
    `summary(results) -> JSON-serializable dict` (means and spreads over seeds)."""

    name: str
    title: str
    run: Callable[[bool, int], Mapping[str, Any]]
    plot: Callable[[Results, Path], list[Path]]
    summary: Callable[[Results], dict[str, Any]]
    order: int


EXPERIMENTS: dict[str, Experiment] = {}


def register(
    name: str,
    *,
    title: str,
    order: int,
    run: Callable[[bool, int], Mapping[str, Any]],
    plot: Callable[[Results, Path], list[Path]],
    summary: Callable[[Results], dict[str, Any]],
) -> Experiment:
    """Add an experiment to `EXPERIMENTS` (figures are made in increasing `order`).

    Raises:
        ValueError: an experiment of that name is already registered.
    """
    if name in EXPERIMENTS:
        raise ValueError(f"experiment {name!r} is already registered")
    exp = Experiment(name=name, title=title, run=run, plot=plot, summary=summary, order=order)
    EXPERIMENTS[name] = exp
    return exp
