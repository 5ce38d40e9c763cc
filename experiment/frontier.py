"""The data of a frontier study: models, their per-problem gains, and their points.

A *model* is one trained policy: a method, one of its settings (a coefficient value, a learning
rate, ...) and a checkpoint (training step). Each model is evaluated on the same `P` problems
(prompts) under the same `S` seeds (training seeds in the toy, sampling or training seeds for a
language model), which makes every comparison *paired*. The data layout, with named axes:

- ``x``: `(M, S, P)` float, the per-problem correctness measure (pass@1 of problem `p` for model
  `m` under seed `s`), or its gain over the base policy;
- ``y``: `(M, S, P)` float, the per-problem diversity measure (pass@k at a large `k`, or the
  expected number of distinct correct solutions), or its gain over the base policy;
- ``models``: `Models`, per model its ``method``, ``setting`` (a label such as ``"eta=0.1"``)
  and ``step``, each a length-`M` sequence.

A model's *point* is `(x̄_m, ȳ_m)`, the means over seeds and problems (`points`). The lift of a
model over GRPO's trade-off is `experiment.estimand`'s; its inference `experiment.inference`'s.

Sources: pass@k as an unbiased per-problem estimate (Chen et al. 2021, `docs/formulas.md` §5.1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from theory.measures import pass_at_k


@dataclass(frozen=True)
class Models:
    """Metadata of `M` models, one entry per model (validated on construction).

    Attributes:
        method: `(M,)` method names (e.g. ``"grpo"``, ``"ds_grpo"``).
        setting: `(M,)` labels of the setting within the method (e.g. ``"kl_coef=0.05"``).
        step: `(M,)` non-negative training steps (checkpoints).

    Raises:
        ValueError: naming the field, for lengths that differ, an empty method name or a
            negative or non-integer step.
    """

    method: tuple[str, ...]
    setting: tuple[str, ...]
    step: tuple[int, ...]

    def __init__(self, method: Sequence[str], setting: Sequence[str], step: Sequence[int]):
        method, setting = tuple(str(m) for m in method), tuple(str(s) for s in setting)
        steps = tuple(step)
        if not (len(method) == len(setting) == len(steps)):
            raise ValueError(
                f"models: method, setting and step must have equal lengths, got "
                f"{len(method)}, {len(setting)}, {len(steps)}"
            )
        for i, name in enumerate(method):
            if not name:
                raise ValueError(f"models.method[{i}] is empty")
        for i, s in enumerate(steps):
            if isinstance(s, bool) or not isinstance(s, int | np.integer) or s < 0:
                raise ValueError(f"models.step[{i}] must be a non-negative integer, got {s!r}")
        object.__setattr__(self, "method", method)
        object.__setattr__(self, "setting", setting)
        object.__setattr__(self, "step", tuple(int(s) for s in steps))

    def __len__(self) -> int:
        return len(self.method)

    def select(self, method: str | Sequence[str]) -> np.ndarray:
        """Indices `(n,)` of the models whose method is `method` (or one of several)."""
        names = {method} if isinstance(method, str) else set(method)
        return np.array([i for i, m in enumerate(self.method) if m in names], dtype=np.int64)


def check_values(x: object, y: object, models: Models | None = None) -> tuple:
    # C order: a reduction's summation order follows the memory layout, so a transposed view and
    # its copy would give lifts a last bit apart (found re-reading a toy study: experiment.reread).
    x, y = np.ascontiguousarray(x, dtype=np.float64), np.ascontiguousarray(y, dtype=np.float64)
    for name, arr in (("x", x), ("y", y)):
        if arr.ndim != 3:
            raise ValueError(f"{name} must have shape (M, S, P), got {arr.shape}")
        if 0 in arr.shape:
            raise ValueError(f"{name} must be non-empty on every axis, got {arr.shape}")
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape (M, S, P), got {x.shape}, {y.shape}")
    if models is not None and len(models) != x.shape[0]:
        raise ValueError(f"models has {len(models)} entries but x has M = {x.shape[0]} models")
    for name, arr in (("x", x), ("y", y)):
        bad = ~np.isfinite(arr)
        if bad.any():
            m, s, p = (int(i[0]) for i in np.nonzero(bad))
            which = f"model {m}" if models is None else (
                f"{models.method[m]} {models.setting[m]} at step {models.step[m]}")  # fmt: skip
            raise ValueError(
                f"{name} must be finite: {which} has {arr[m, s, p]} (seed index {s}, problem {p}; "
                f"{int(bad[m].sum())} of its {bad[m].size} values): its run went non-finite"
            )
    return x, y


def points(x: object, y: object) -> tuple[np.ndarray, np.ndarray]:
    """Each model's point: means over seeds and problems.

    Args:
        x, y: `(M, S, P)` per-problem values (module docstring).

    Returns:
        `(x̄, ȳ)`, each `(M,)`.

    Raises:
        ValueError: for shapes other than equal `(M, S, P)` or non-finite values.
    """
    x, y = check_values(x, y)
    return x.mean(axis=(1, 2)), y.mean(axis=(1, 2))


MEASURES = ("pass_at_k", "distinct_correct")
"""The diversity axes: pass@k at the largest k, and distinct correct solutions per problem."""


def gains_from_counts(
    base: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    *,
    seeds: Sequence[int],
    measure: str,
    k: int,
    reference: str,
) -> tuple[np.ndarray, np.ndarray, Models, list[dict[str, Any]]]:
    """Per-problem gains over the base model, in this module's layout, from evaluation counts.

    Args:
        base: the base model's record: ``n`` samples per problem, ``correct`` `(P,)` counts,
            ``distinct`` `(P,)` distinct correct solutions.
        records: one per (model, seed): ``label``, ``params``, ``setting``, ``step``, ``seed`` and
            the counts as `base`.
        measure: ``"pass_at_k"`` (the unbiased estimator at `k`, `theory.measures.pass_at_k`) or
            ``"distinct_correct"``.
        reference: the label the base model is filed under (its step 0 starts every path).

    Returns:
        ``(x, y, models, rows)``: `x` `(M, S, P)` pass@1 gains (correct / n minus the base's),
        `y` `(M, S, P)` gains in `measure`, the `Models` and one ``{"label", "params",
        "setting", "step"}`` per model (the base first, repeated over seeds).

    Raises:
        ValueError: an unknown `measure`, or a model missing some seed (both named).
    """
    if measure not in MEASURES:
        raise ValueError(f"measure: expected one of {MEASURES}, got {measure!r}")

    def per_problem(m: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        c = np.asarray(m["correct"], dtype=np.float64)
        if measure == "pass_at_k":
            y = np.array([pass_at_k(m["n"], int(ci), k) for ci in c])
        else:
            y = np.asarray(m["distinct"], dtype=np.float64)
        return c / m["n"], y

    bx, by = per_problem(base)
    groups: dict[tuple[str, str, int], dict[int, Mapping[str, Any]]] = {}
    rows = [{"label": reference, "params": {}, "setting": "base", "step": 0}]
    for m in records:
        key = (m["label"], m["setting"], m["step"])
        if key not in groups:
            groups[key] = {}
            rows.append({"label": m["label"], "params": m["params"], "setting": m["setting"],
                         "step": m["step"]})  # fmt: skip
        groups[key][m["seed"]] = m
    x, y = np.zeros((2, len(rows), len(seeds), len(bx)))
    for i, row in enumerate(rows[1:], start=1):
        per_seed = groups[(row["label"], row["setting"], row["step"])]
        for j, seed in enumerate(seeds):
            if seed not in per_seed:
                raise ValueError(
                    f"{row['label']} {row['setting']} step {row['step']}: no seed {seed}"
                )
            px, py = per_problem(per_seed[seed])
            x[i, j], y[i, j] = px - bx, py - by
    models = Models(*([r[f] for r in rows] for f in ("label", "setting", "step")))
    return x, y, models, rows
