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
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D

from experiment import covariance, estimand, frontier, inference, store

__all__ = [
    "LIFT_METHOD",
    "MEASURES",
    "METHOD_COLORS",
    "RESULTS_SCHEMA",
    "SPARE_COLORS",
    "axis_label",
    "frontier_figure",
    "lift_analysis",
    "lift_markdown",
    "method_colors",
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

#: One colour per method, shared by every figure so a method looks the same everywhere: every
#: registered method (`shaping.METHODS`) and the studies' own labels, no colour twice.
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
    "clip_cov": "#393b79",
    "kl_cov": "#6b6ecf",
    "clip_higher": "#637939",
    "top_entropy": "#8ca252",
    "adaptive_entropy": "#bd9e39",
    "outcome_ucb": "#843c39",
    "entropy_adv": "#d6616b",
    "lite_ppo": "#7b4173",
    "grpo_passk": "#ce6dbd",
    "gspo": "#e7ba52",
    "cispo": "#ffbb78",
    "dual_clip": "#c5b0d5",
    "pkpo": "#f7b6d2",
    "base": "#000000",
}

#: Colours for labels `METHOD_COLORS` does not name (a user's own methods), none of them there:
#: matplotlib's tab20b and tab20 colours that are left, then dark tones (`method_colors`).
SPARE_COLORS = (
    "#5254a3", "#9c9ede", "#b5cf6b", "#cedb9c", "#8c6d31", "#e7cb94", "#ad494a", "#e7969c",
    "#a55194", "#de9ed6", "#c7c7c7", "#2f4f4f", "#556b2f", "#8b4513", "#483d8b", "#008080",
    "#800000", "#4b0082", "#b8860b", "#006400",
)  # fmt: skip

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
    "(above GRPO's pass@1 range): the model's pass@1 lies above the reference's range by some "
    "distance d, and GRPO is credited with its best value within d below the range's end "
    "(`experiment.estimand`), so the model dominates GRPO's models near its end where the "
    "interval lies above 0, and has less of the measure (with more pass@1) where it lies below 0; n/a "
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


def method_colors(labels: Sequence[str]) -> dict[str, str]:
    """One colour per label of `labels`, none repeated: `METHOD_COLORS`' where it names the label
    (a method keeps its colour across figures), else the first colour of `SPARE_COLORS` that no
    other label of `labels` has, in the order of `labels`.

    Raises:
        ValueError: more labels without a colour of their own than `SPARE_COLORS` holds.
    """
    named = {lb: METHOD_COLORS[lb] for lb in labels if lb in METHOD_COLORS}
    spare = iter(c for c in SPARE_COLORS if c not in named.values())
    out: dict[str, str] = {}
    for lb in labels:
        if lb not in out:
            out[lb] = named[lb] if lb in named else next(spare, None)
            if out[lb] is None:
                raise ValueError(
                    f"labels: {len(labels)} labels, more than the {len(SPARE_COLORS)} spare "
                    f"colours can tell apart (first without one: {lb!r})"
                )
    return out


def _limits(lo: list[float], hi: list[float]) -> tuple[float, float]:
    """An axis range holding 0 and every interval `[lo, hi]`, with 5% of its span either side."""
    a, b = min(0.0, *lo), max(0.0, *hi)
    pad = 0.05 * (b - a) if b > a else 0.01
    return a - pad, b + pad


def frontier_figure(
    analysis: Mapping[str, Any],
    *,
    labels: Sequence[str],
    reference: Sequence[str],
    title: str,
    notes: Mapping[str, Mapping[str, str]] | None = None,
    columns: int = 5,
) -> plt.Figure:
    """The frontier figure as small multiples: per measure of `analysis` a block of panels, one
    per label of `labels` outside `reference` (in that order; one panel of the reference alone
    when every label is the reference's). Every panel draws the reference's
    models (grey points: every reference label together, gains over the base) and their upper
    concave hull (`experiment.estimand.upper_hull`, the origin included: what the lifts are
    measured against) in black, then the label's models in its colour (`method_colors`): its points,
    each training path (a thin line from the origin through its checkpoints) and its own hull with
    the t intervals of its vertices' points. The panels of a measure share both axes (pass@1
    gain across; the measure's gain up); every measure shares the pass@1 axis.

    Args:
        analysis: ``{measure: section}`` of `lift_analysis`.
        labels: the method labels in panel order (reference labels among them are skipped).
        reference: the reference labels (GRPO's).
        title: the figure's caption (design: problems, samples, seeds, checkpoints).
        notes: ``{measure: {label: text}}``, each panel's title after its label (a confirmation's
            verdict word; an exploration's picked setting); None: the labels alone.
        columns: panels per row.

    Returns:
        The figure (the caller closes it): one subfigure per measure, titled, holding one axes
        per label; ``fig.axes`` lists the panels measure by measure.

    Raises:
        ValueError: no labels; `columns` < 1; too many labels to colour
            (`method_colors`).
    """
    ref = list(reference)
    shown = [lb for lb in dict.fromkeys(labels) if lb not in ref]
    if not labels:
        raise ValueError("labels: empty (at least the reference's)")
    if columns < 1:
        raise ValueError(f"columns: {columns} (at least 1 panel per row)")
    colors = method_colors(shown)
    notes = notes or {}
    panels = shown or [None]  # a sweep of the reference alone: one panel, its models and hull
    ncol = min(columns, len(panels))
    nrow = -(-len(panels) // ncol)  # rows per measure
    blocks = len(analysis)
    width = max(2.7 * ncol + 0.4, 6.0)  # one or two panels: room for the title and the legend
    fig = plt.figure(figsize=(width, 2.5 * nrow * blocks + 0.9), layout="constrained")
    subfigs = fig.subfigures(blocks, 1, squeeze=False)[:, 0]
    everything = [m for a in analysis.values() for m in a["models"]]
    xlim = _limits([m["x_lo"] for m in everything], [m["x_hi"] for m in everything])
    for sub, (measure, a) in zip(subfigs, analysis.items(), strict=True):
        ms = a["models"]
        ylim = _limits([m["y_lo"] for m in ms], [m["y_hi"] for m in ms])
        ref_ms = [m for m in ms if m["label"] in ref]
        rx, ry = np.array([m["x"] for m in ref_ms]), np.array([m["y"] for m in ref_ms])
        ref_hull = estimand.upper_hull(rx, ry)
        sub.suptitle(f"{axis_label(measure, a['k'])} against pass@1 gain", fontsize=9)
        grid = sub.add_gridspec(nrow, ncol)
        first = None  # the block's axes share both axes (no sharing across subfigures: each
        # change of a limit shared with another subfigure redraws the whole figure)
        for i, label in enumerate(panels):
            col = i % ncol
            ax = sub.add_subplot(grid[i // ncol, col], sharex=first, sharey=first)
            first = first or ax
            ax.scatter(rx, ry, s=6, color="0.65", alpha=0.6, lw=0)
            ax.plot(ref_hull.vx, ref_hull.vy, "-", color="k", lw=1.8)
            if label is not None:
                _draw_label(ax, [m for m in ms if m["label"] == label], colors[label])
            ax.axhline(0, color="grey", lw=0.5)
            ax.axvline(0, color="grey", lw=0.5)
            ax.grid(alpha=0.3)
            note = notes.get(measure, {}).get(label)
            name = label or f"{', '.join(ref)} alone"
            text = name if not note else textwrap.fill(f"{name}: {note}", 40)
            ax.set_title(text, fontsize=7.5, loc="left")
            last_row = i + ncol >= len(panels)
            ax.tick_params(labelsize=7, labelleft=col == 0, labelbottom=last_row)
            if col == 0:
                ax.set_ylabel(axis_label(measure, a["k"]), fontsize=8)
            if last_row:
                ax.set_xlabel("pass@1 gain over the base model", fontsize=8)
        first.set_xlim(*xlim)  # every measure: the same pass@1 range
        first.set_ylim(*ylim)
    handles = [
        Line2D([], [], color="k", lw=1.8, label=f"{', '.join(ref)} (reference): hull"),
        Line2D([], [], color="0.65", marker="o", ls="", ms=3, label=f"{', '.join(ref)}: models"),
        Line2D([], [], color="0.3", lw=1.4, marker="o", ms=3, label="the method: hull, t CIs"),
        Line2D([], [], color="0.3", lw=0.7, alpha=0.4, label="training paths from the base"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=4 if ncol > 2 else 2, fontsize=7,
               frameon=False)  # fmt: skip
    fig.suptitle(textwrap.fill(title, int(width * 17)), fontsize=8)
    return fig


def _draw_label(ax: plt.Axes, pts: Sequence[Mapping[str, Any]], color: str) -> None:
    """One label's models on `ax`: points, training paths from the origin, hull, vertex CIs."""
    if not pts:
        return
    px, py = np.array([m["x"] for m in pts]), np.array([m["y"] for m in pts])
    ax.scatter(px, py, s=9, color=color, alpha=0.45, lw=0)
    for key in dict.fromkeys((m["setting"],) for m in pts if m["step"] > 0):
        trail = sorted((m for m in pts if (m["setting"],) == key), key=lambda m: m["step"])
        # Every training path starts at the base, the origin of the gains.
        ax.plot([0.0, *(m["x"] for m in trail)], [0.0, *(m["y"] for m in trail)], "-",
                color=color, alpha=0.3, lw=0.7)  # fmt: skip
    hull = estimand.upper_hull(px, py)
    ax.plot(hull.vx, hull.vy, "-", color=color, lw=1.4)
    vert = [m for m in pts if any(m["x"] == vx and m["y"] == vy
                                  for vx, vy in zip(hull.vx, hull.vy, strict=True))]  # fmt: skip
    ax.errorbar(
        [m["x"] for m in vert], [m["y"] for m in vert],
        xerr=[[m["x"] - m["x_lo"] for m in vert], [m["x_hi"] - m["x"] for m in vert]],
        yerr=[[m["y"] - m["y_lo"] for m in vert], [m["y_hi"] - m["y"] for m in vert]],
        fmt="o", ms=2.5, color=color, capsize=1.5, lw=0.7,
    )  # fmt: skip


def plot_frontier(
    analysis: Mapping[str, Any],
    path: str | os.PathLike[str],
    *,
    labels: Sequence[str],
    reference: Sequence[str],
    title: str,
    notes: Mapping[str, Mapping[str, str]] | None = None,
) -> None:
    """Write `frontier_figure` to `path` (PNG, or PDF by the suffix), whole and atomically
    (`experiment.store`), with no timestamp or version in its metadata: the same inputs give the
    same bytes."""
    fig = frontier_figure(analysis, labels=labels, reference=reference, title=title, notes=notes)
    fmt = Path(path).suffix.lstrip(".") or "png"
    meta = {"Software": None} if fmt == "png" else {"CreationDate": None, "Creator": None}
    buf = io.BytesIO()
    try:
        fig.savefig(buf, dpi=130, format=fmt, metadata=meta)
    finally:
        plt.close(fig)
    store.write_bytes(path, buf.getvalue())
