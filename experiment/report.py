"""One results schema, the lift analysis, the lift table and the frontier figure of both sweeps.

Every sweep's ``results.json`` (toy and LLM) holds the keys of `results_header` (``schema``: the
version `RESULTS_SCHEMA`, ``leg``, ``numerics``, ``config``, ``methods``, ``reference``, ``seeds``,
``checkpoints``) and a ``frontier`` table: per diversity measure of `MEASURES`, what
`lift_analysis` returns. `validate_results` checks a document against that schema. Each leg adds
its own data (the toy ``runs``, the LLM ``settings`` and ``models``).

The method colours of every figure (`METHOD_COLORS`) live here too.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np

from experiment import covariance, estimand, frontier, inference, store

__all__ = [
    "LIFT_METHOD",
    "MEASURES",
    "METHOD_COLORS",
    "RESULTS_SCHEMA",
    "axis_label",
    "lift_analysis",
    "lift_markdown",
    "plot_frontier",
    "results_header",
    "validate_results",
]

RESULTS_SCHEMA = "sharpening.sweep/3"
"""The version of the results.json schema (bumped when a required key changes meaning). 3: the lift
is over the reference's concave hull (`experiment.estimand`) with one inference
(`experiment.inference`): ``hull`` replaces ``curve``/``curves`` per measure, ``procedure`` names
the procedure's version, ``lift_bias`` per model; 2: quadratics fitted to the reference."""

MEASURES = frontier.MEASURES

#: One colour per method, shared by every figure so a method looks the same everywhere.
METHOD_COLORS = {
    "grpo": "#1f77b4",
    "dr_grpo": "#aec7e8",
    "ds_grpo": "#d62728",
    "ds_grpo_pos": "#ff9896",
    "ds_grpo_neg": "#e377c2",
    "entropy_bonus": "#2ca02c",
    "entropy_penalty": "#98df8a",
    "diff_entropy": "#bcbd22",
    "dsdr": "#9467bd",
    "progrpo": "#8c564b",
    "casp": "#ff7f0e",
    "unlikeliness": "#17becf",
    "passk": "#7f7f7f",
    "w_reinforce": "#c49c94",
    "psr": "#dbdb8d",
    "nsr": "#9edae5",
    "base": "#000000",
}

LIFT_METHOD = (
    "the reference is the upper concave hull of GRPO's models (every setting and checkpoint, and "
    "the base): a mixture of two of its models attains every point between them, so the hull is "
    "GRPO's attainable trade-off and a lift lies in [-100, +100] points; the hull's upward bias "
    "(a maximum of noisy points) is estimated from draws of all models' means (their crossed "
    "seeds × problems covariance) and subtracted; CI: t interval, the draws' standard deviation "
    "with Satterthwaite's degrees of freedom (`experiment.inference`, calibrated by `python -m "
    "experiment calibrate`); p: two-sided test of lift 0, per comparison (exploratory: not "
    "corrected for the many comparisons); MDE: the lift this comparison detects with 80% power "
    "at 0.05"
)
"""How the lifts of `lift_analysis` are computed, in words, for the tables' intros."""

LIFT_STATUS = (
    "(above GRPO's pass@1 range): the model's pass@1 lies above the reference's range, where its "
    "hull is continued at its end point's value (`experiment.estimand`), so its lift compares it "
    "with GRPO's end point: it dominates that point where the interval "
    "lies above 0, and has less of the measure and more pass@1 where it lies below 0; n/a "
    "(below): below the base's and every reference model's pass@1 (no lift); inside: the share "
    "of the draws of the means with a lift"
)
"""What a lift table's status marks and its ``inside`` column mean, for the tables' intros."""

_MODEL_KEYS = {
    "label": str, "setting": str, "step": int, "reference": bool, "status": str,
    "x": (float, type(None)), "y": (float, type(None)), "lift": (float, type(None)),
    "lift_lo": (float, type(None)), "lift_hi": (float, type(None)),
    "lift_se": (float, type(None)), "lift_df": (float, type(None)), "lift_p": (float, type(None)),
    "inside_fraction": (float, type(None)),
}  # fmt: skip
_HEADER_KEYS = {
    "schema": str, "leg": str, "numerics": str, "config": dict, "methods": dict,
    "reference": list, "seeds": list, "checkpoints": list, "frontier": dict,
}  # fmt: skip


def results_header(
    leg: str,
    *,
    numerics_tag: str,
    config: Mapping[str, Any],
    methods: Mapping[str, str],
    reference: Sequence[str],
    seeds: Sequence[int],
    checkpoints: Sequence[int],
) -> dict[str, Any]:
    """The schema's shared keys of a results.json (module docstring); `methods` maps each label
    to its `shaping.METHODS` name."""
    return {
        "schema": RESULTS_SCHEMA,
        "leg": leg,
        "numerics": numerics_tag,
        "config": dict(config),
        "methods": dict(methods),
        "reference": list(reference),
        "seeds": [int(s) for s in seeds],
        "checkpoints": [int(c) for c in checkpoints],
    }


def validate_results(doc: Mapping[str, Any]) -> None:
    """Check a results.json document against the schema (module docstring).

    Raises:
        ValueError: naming the first missing or mistyped key (``frontier.pass_at_k.models[3].lift``).
    """

    def need(where: str, value: object, kind: type | tuple[type, ...]) -> None:
        if isinstance(value, bool) and kind in (int, float):
            raise ValueError(f"{where}: expected {kind}, got {value!r}")
        if not isinstance(value, kind):
            raise ValueError(f"{where}: expected {kind}, got {type(value).__name__} {value!r}")

    for key, kind in _HEADER_KEYS.items():
        if key not in doc:
            raise ValueError(f"{key}: missing")
        need(key, doc[key], kind)
    if doc["schema"] != RESULTS_SCHEMA:
        raise ValueError(f"schema: expected {RESULTS_SCHEMA!r}, got {doc['schema']!r}")
    missing = sorted(set(doc["reference"]) - set(doc["methods"]))
    if missing:
        raise ValueError(f"reference: {missing} are not method labels")
    if set(doc["frontier"]) != set(MEASURES):
        raise ValueError(
            f"frontier: expected the measures {list(MEASURES)}, got {list(doc['frontier'])}"
        )
    for measure, a in doc["frontier"].items():
        for key, kind in (("level", float), ("num_resamples", int), ("models", list),
                          ("procedure", str), ("hull", list)):  # fmt: skip
            need(f"frontier.{measure}.{key}", a.get(key), kind)
        for i, m in enumerate(a["models"]):
            for key, kind in _MODEL_KEYS.items():
                if key not in m:
                    raise ValueError(f"frontier.{measure}.models[{i}].{key}: missing")
                need(f"frontier.{measure}.models[{i}].{key}", m[key], kind)
            if m["label"] not in doc["methods"]:
                raise ValueError(f"frontier.{measure}.models[{i}].label: unknown {m['label']!r}")


def _num(v: float) -> float | None:
    return float(v) if np.isfinite(v) else None


def lift_analysis(
    x: np.ndarray,
    y: np.ndarray,
    models: frontier.Models,
    rows: Sequence[Mapping[str, Any]],
    reference: str | Sequence[str],
    *,
    k: int | None,
    num_resamples: int,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[dict[str, Any], inference.LiftResult]:
    """Lift of every model over the reference's hull (`experiment.estimand`) with its inference
    (`experiment.inference.lift_inference`: `num_resamples` draws of the means), the t interval
    of every model's point (`experiment.covariance.mean_interval`) and the curve-free check of
    `experiment.inference.dominance`.

    Args:
        x, y: `(M models, S seeds, P problems)` per-problem gains over the base in pass@1 and in
            the measure (the problem axis crossed with the seeds).
        models: the (label, setting, step) of each of the M models.
        rows: one mapping per model merged into its record (e.g. label, params, setting, step).
        k: the k of pass@k (None for distinct correct; its lifts are clipped to twice the
            largest per-problem gain instead of ±1).

    Returns:
        ``(section, lift)``: the results.json record ``{"k", "level", "num_resamples",
        "procedure" (`experiment.inference.PROCEDURE`), "hull" ([[x, y], ...] the reference's
        vertices), "models": [{**row, x, y, x_lo, x_hi, y_lo, y_hi, lift, lift_lo, lift_hi,
        lift_se, lift_df, lift_p, lift_bias, lift_var (the variance components of the lift, or
        null), status, inside_fraction, reference, dominated_by (the curve-free check of
        `_dominator`, null for reference models)}]}`` (NaN written as null) and the `LiftResult`.

    Raises:
        ValueError: as `lift_inference` (shapes, no reference model, num_resamples < 20, P < 2).
    """
    x, y = frontier.check_values(x, y, models)  # float64, C order: layout-free reductions
    span = 1.0 if k is not None else max(2.0 * float(np.abs(y).max()), 1e-12)
    res = inference.lift_inference(x, y, models, reference, num_draws=num_resamples, level=level,
                                   seed=seed, span=span)  # fmt: skip
    _, x_lo, x_hi = covariance.mean_interval(x, level)
    _, y_lo, y_hi = covariance.mean_interval(y, level)
    ref = set(res.reference.tolist())
    dom = inference.dominance(x, y, models, reference)
    section = {
        "k": k,
        "level": level,
        "num_resamples": num_resamples,
        "procedure": inference.PROCEDURE,
        "hull": [[float(a), float(b)] for a, b in zip(res.hull.vx, res.hull.vy, strict=True)],
        "models": [
            {
                **row,
                "x": _num(res.x[i]),
                "y": _num(res.y[i]),
                "x_lo": _num(x_lo[i]),
                "x_hi": _num(x_hi[i]),
                "y_lo": _num(y_lo[i]),
                "y_hi": _num(y_hi[i]),
                "lift": _num(res.lift[i]),
                "lift_lo": _num(res.lo[i]),
                "lift_hi": _num(res.hi[i]),
                "lift_se": _num(res.se[i]),
                "lift_df": _num(res.df[i]),
                "lift_p": _num(res.p[i]),
                "lift_bias": _num(res.bias[i]),
                "lift_var": _components(res.components[i]),
                "status": str(res.status[i]),
                "inside_fraction": float(res.inside_fraction[i]),
                "reference": bool(i in ref),
                "dominated_by": _dominator(dom, models, i),
            }
            for i, row in enumerate(rows)
        ],
    }
    return section, res


def _dominator(dom: inference.Dominance, models: frontier.Models, i: int) -> dict | None:
    """Model `i`'s `experiment.inference.dominance` record for results.json: the reference model
    (``setting``, ``step``), ``dx``, ``dy`` (reference minus model) and ``p`` (Bonferroni over the
    reference's models), or None for a reference model."""
    r = int(dom.index[i])
    if r < 0:
        return None
    return {"setting": models.setting[r], "step": int(models.step[r]), "dx": float(dom.dx[i]),
            "dy": float(dom.dy[i]), "p": float(dom.p[i])}  # fmt: skip


def _components(v: np.ndarray) -> list[float] | None:
    """A lift's variance components `(σ²_seed, σ²_problem, σ²_e)` for results.json (None outside
    the reference's range)."""
    return None if not np.all(np.isfinite(v)) else [float(c) for c in v]


def axis_label(measure: str, k: int | None) -> str:
    """The y-axis name of a measure: ``"pass@16 gain"`` or ``"distinct correct / problem gain"``."""
    return f"pass@{k} gain" if measure == "pass_at_k" else "distinct correct / problem gain"


def lift_markdown(analysis: Mapping[str, Any], intro: str) -> str:
    """Markdown tables of the lifts at matched pass@1 with their CIs and p-values, per comparison
    (exploratory: no correction for the many comparisons; percentage points for pass@k, solutions
    per problem for distinct correct) and the minimum detectable lift at 80% power
    (`experiment.covariance.minimum_detectable`), after the paragraph `intro`.

    Args:
        analysis: ``{measure: section}`` of `lift_analysis` (results.json's ``frontier``).
    """
    parts = [intro]
    for measure, a in analysis.items():
        scale = 100.0 if measure == "pass_at_k" else 1.0
        unit = "percentage points" if measure == "pass_at_k" else "solutions per problem"
        pct = round(100 * a["level"])
        parts.append(f"\n### {axis_label(measure, a['k'])} ({unit}; pass@1 in percentage points)\n")
        parts.append(
            f"| method | setting | step | pass@1 gain | gain | lift [{pct}% CI] | p | MDE | inside |\n"
            "|---|---|---|---|---|---|---|---|---|"
        )
        for m in a["models"]:
            if m["reference"]:
                continue
            if m["status"] in ("inside", "above") and m["lift"] is not None:
                cell = f"{scale * m['lift']:+.2f}"
                if m["lift_lo"] is not None:
                    cell += f" [{scale * m['lift_lo']:+.2f}, {scale * m['lift_hi']:+.2f}]"
                sign = 0
                if m["lift_lo"] is not None and m["lift_lo"] > 0:
                    sign = 1
                elif m["lift_hi"] is not None and m["lift_hi"] < 0:
                    sign = -1
                what = "pass@k" if measure == "pass_at_k" else "distinct correct"
                above = estimand.range_label(m["status"], sign, what)
                cell += f" ({above})" if above else ""
            else:
                cell = f"n/a ({m['status']})"
            pv = "" if m.get("lift_p") is None else f"{m['lift_p']:.3f}"
            mde = (
                ""
                if m.get("lift_se") is None
                else (
                    f"{scale * float(covariance.minimum_detectable(m['lift_se'], m['lift_df'])):.2f}"
                )
            )
            parts.append(
                f"| {m['label']} | {m['setting']} | {m['step']} | {100 * m['x']:+.1f} | "
                f"{scale * m['y']:+.2f} | {cell} | {pv} | {mde} | {m['inside_fraction']:.2f} |"
            )
    return "\n".join(parts) + "\n"


def plot_frontier(
    analysis: Mapping[str, Any],
    path: str | os.PathLike[str],
    *,
    labels: Sequence[str],
    reference: Sequence[str],
    title: str,
) -> None:
    """The frontier figure: per measure, every model's point (gain over the base) on its training
    path (a thin line from the origin through its checkpoints), each label's upper concave hull
    (`experiment.estimand.upper_hull`, the origin included) in its colour with the t intervals of
    its vertices' points, and the reference's hull (every reference label together: what the lifts
    are measured against) in black.

    Args:
        analysis: ``{measure: section}`` of `lift_analysis`.
        labels: the method labels in legend order.
        title: the figure's caption (design: problems, samples, seeds, checkpoints).
    """
    ref = list(reference)
    groups = [ref, *([lb] for lb in labels if lb not in ref)]
    fig, axes = plt.subplots(1, len(analysis), figsize=(5.2 * len(analysis), 4.2), squeeze=False)
    for ax, (measure, a) in zip(axes[0], analysis.items(), strict=True):
        ms = a["models"]
        for i, group in enumerate(groups):
            is_ref = group is ref
            pts = [m for m in ms if m["label"] in group]
            px = np.array([m["x"] for m in pts])
            py = np.array([m["y"] for m in pts])
            c = "k" if is_ref else f"C{i}"
            ax.scatter(px, py, s=10, color=c, alpha=0.35, lw=0)
            paths = dict.fromkeys((m["label"], m["setting"]) for m in pts if m["step"] > 0)
            for path_key in paths:
                trail = sorted(
                    (m for m in pts if (m["label"], m["setting"]) == path_key),
                    key=lambda m: m["step"],
                )
                # Every training path starts at the base, the origin of the gains.
                ax.plot([0.0, *(m["x"] for m in trail)], [0.0, *(m["y"] for m in trail)], "-",
                        color=c, alpha=0.25, lw=0.7)  # fmt: skip
            hull = estimand.upper_hull(px, py)
            name = f"{', '.join(group)} (reference)" if is_ref else group[0]
            ax.plot(hull.vx, hull.vy, "-", color=c, lw=2.5 if is_ref else 1.5,
                    label=f"{name}: hull" if is_ref else name)  # fmt: skip
            vert = [m for m in pts if any(m["x"] == vx and m["y"] == vy
                                          for vx, vy in zip(hull.vx, hull.vy, strict=True))]  # fmt: skip
            ax.errorbar(
                [m["x"] for m in vert], [m["y"] for m in vert],
                xerr=[[m["x"] - m["x_lo"] for m in vert], [m["x_hi"] - m["x"] for m in vert]],
                yerr=[[m["y"] - m["y_lo"] for m in vert], [m["y_hi"] - m["y"] for m in vert]],
                fmt="o", ms=3, color=c, capsize=2, lw=0.8,
            )  # fmt: skip
        ax.axhline(0, color="grey", lw=0.5)
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_xlabel("pass@1 gain over the base model")
        ax.set_ylabel(axis_label(measure, a["k"]))
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()  # written whole and atomically (`experiment.store`): never half a figure
    fig.savefig(buf, dpi=130, format=Path(path).suffix.lstrip(".") or "png")
    plt.close(fig)
    store.write_bytes(path, buf.getvalue())
