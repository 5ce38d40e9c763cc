"""Figure 3: Theorem 3.4 / B.10 of seed 000 (differential smoothing vs the entropy bonus), closed forms only.

The theorem says: for every entropy-bonus optimum `π_ent` (`β > 0`, `η ≥ 0`, policy anchor) some
differential-smoothing (DS) optimum `π_DS` has `D(π_DS‖π_b) ≤ ε = D(π_ent‖π_b)`,
`P(π_DS) ≥ P(π_ent)` and `V(π_DS) ≤ V(π_ent)`. `theory/` found it false (docs/theorem_3_4.md).
This figure shows where, along the entropy-bonus family, on a random tree and on the minimal
counterexample (one step, `π_b = (0.4, 0.4, 0.2)`, `C = {τ1, τ3}`, `β = 0.1`, `η = 4`).

For each `η` (at fixed `β`) the DS counterpart is `theory.theorem_3_4.search_witness`'s point: the
DS optimum with `P ≥ P(π_ent)` and `V ≤ V(π_ent)` that needs the least budget `KL(π_DS‖π_b)`. A
witness exists iff that budget is `≤ ε`. Two proven conditions bracket it: `construction_margin > 0`
(the proof's construction works: sufficient) and `divergence_lower_bound ≤ ε` (necessary).

Nothing here trains: every number is a closed form or search from `theory/` (numpy, scipy).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FormatStrFormatter, LogLocator

from experiment.report import METHOD_COLORS
from theory import trees
from theory.measures import correctness, divergence
from theory.optimum import kl_regularized
from theory.theorem_3_4 import (
    DIVERGENCES,
    construction_margin,
    divergence_lower_bound,
    family_min_correctness,
    search_witness,
)
from toymdp.experiments._plot import save
from toymdp.experiments._registry import register

ENT_COLOR, DS_COLOR = METHOD_COLORS["entropy_bonus"], METHOD_COLORS["ds_grpo"]
CX_COLOR = "#000000"

#: The minimal counterexample of docs/theorem_3_4.md.
PIN_LOG_PB = np.log([0.4, 0.4, 0.2])
PIN_CORRECT = np.array([True, False, True])
PIN_BETA, PIN_ETA = 0.1, 4.0

#: The plotted random tree: V=3, H=3, sharp base policy (a sharper π_b gives counterexamples
#: at smaller η; docs/theorem_3_4.md), β = 0.3.
TREE_SHAPE, TREE_SKEW, TREE_BETA = (3, 3), 1.5, 0.3

FULL = {"tree_etas": 20, "pin_etas": 17, "count_trees": 8, "count_etas": 5}
QUICK = {"tree_etas": 7, "pin_etas": 6, "count_trees": 3, "count_etas": 3}
ETA_RANGE = (0.01, 30.0)
COUNT_BETAS = (0.1, 1.0)
COUNT_ETA_RANGE = (0.03, 10.0)


#: Search grid: the least-budget DS point sits on the boundary of the search square in every case
#: seen (docs/theorem_3_4.md), which this coarse grid already contains; `_search` falls back to
#: the default grid whenever the coarse one finds no witness and the proven bound cannot certify.
SEARCH_GRID = {"grid": 11, "zooms": 2}


def _search(log_pb, correct, beta: float, eta: float, kind: str = "kl") -> tuple[object, float]:
    """`search_witness` (coarse grid first) and `divergence_lower_bound`, for one (β, η)."""
    w = search_witness(log_pb, correct, beta, eta, kind, **SEARCH_GRID)
    bound = divergence_lower_bound(log_pb, correct, beta, eta, kind)
    if not w.found and not bound > w.epsilon:
        w = search_witness(log_pb, correct, beta, eta, kind)
    return w, bound


def _sweep(log_pb: np.ndarray, correct: np.ndarray, beta: float, etas: np.ndarray) -> dict:
    """Entropy-bonus optima over `etas` and their least-budget DS counterparts (KL(π‖π_b)).

    Returns per-`η` arrays `(n,)`: `ent_p, ent_v, ent_kl` (= ε), `margin`, `bound`, `ds_found`,
    `ds_kl` (least DS budget, realized), `ds_p`, `ds_v`, `ds_params` `(n, 3)` = `(β', γ_p, γ_n)`.
    """
    rows = []
    for eta in etas:
        w, bound = _search(log_pb, correct, beta, float(eta))
        rows.append(
            {
                "ent_p": w.p_ent,
                "ent_v": w.v_ent,
                "ent_kl": w.epsilon,
                "margin": construction_margin(log_pb, correct, beta, float(eta)),
                "bound": bound,
                "ds_found": w.found,
                "ds_kl": w.d_ds,
                "ds_p": w.p_ds,
                "ds_v": w.v_ds,
                "ds_params": np.asarray(w.params, dtype=np.float64),
            }
        )
    return {k: np.asarray([r[k] for r in rows]) for k in rows[0]}


def _tilt_frontier(log_pb: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(KL, P)` of the KL-regularized optima over β (η = 0, Lemma B.1): the most correctness any
    policy reaches within each KL budget (the tilt is the KL-projection onto `{P ≥ p}`)."""
    reward = correct.astype(np.float64)
    lp = np.stack([kl_regularized(log_pb, reward, b) for b in np.geomspace(0.02, 50.0, 60)])
    return divergence(lp, log_pb), correctness(lp, correct)


def _instance_results(prefix: str, log_pb, correct, beta: float, etas: np.ndarray) -> dict:
    sweep = _sweep(log_pb, correct, beta, etas)
    tilt_kl, tilt_p = _tilt_frontier(log_pb, correct)
    out = {f"{prefix}/{k}": v for k, v in sweep.items()}
    out.update(
        {
            f"{prefix}/log_pb": np.asarray(log_pb),
            f"{prefix}/correct": np.asarray(correct),
            f"{prefix}/beta": np.asarray(beta),
            f"{prefix}/eta": etas,
            f"{prefix}/tilt_kl": tilt_kl,
            f"{prefix}/tilt_p": tilt_p,
        }
    )
    return out


def _random_shape(rng: np.random.Generator) -> trees.TreeInstance:
    v, h = int(rng.integers(2, 5)), int(rng.integers(1, 4))
    m = v**h
    return trees.random_instance(
        rng, v, h, skew=float(rng.uniform(0.5, 2.5)), correct_size=int(rng.integers(1, m))
    )


def _counts(rng: np.random.Generator, num_trees: int, num_etas: int) -> dict:
    """Witness existence (KL) on a (tree, β, η) grid, decided by proven facts where possible:
    `margin > 0` → witness (no search); else a coarse `search_witness` (a witness it finds is
    realized and checked); else `bound > ε` certifies none; else the default search decides."""
    etas = np.geomspace(*COUNT_ETA_RANGE, num_etas)
    shape = (num_trees, len(COUNT_BETAS), num_etas)
    found, margin_pos, certified = (np.zeros(shape, bool) for _ in range(3))
    sizes = np.zeros((num_trees, 3), np.int64)
    for r in range(num_trees):
        inst = _random_shape(rng)
        sizes[r] = inst.num_actions, inst.depth, inst.correct.sum()
        for b, beta in enumerate(COUNT_BETAS):
            for e, eta in enumerate(etas):
                args = (inst.log_pb, inst.correct, beta, float(eta))
                if construction_margin(*args) > 0:
                    margin_pos[r, b, e] = found[r, b, e] = True
                    continue
                w = search_witness(*args, "kl", **SEARCH_GRID)
                if w.found:
                    found[r, b, e] = True
                elif divergence_lower_bound(*args, "kl") > w.epsilon:
                    certified[r, b, e] = True
                else:
                    found[r, b, e] = search_witness(*args, "kl").found
    return {
        "counts/beta": np.asarray(COUNT_BETAS),
        "counts/eta": etas,
        "counts/tree_shape": sizes,
        "counts/found": found,
        "counts/margin_pos": margin_pos,
        "counts/certified_none": certified,
    }


def run(quick: bool, seed: int) -> dict[str, np.ndarray]:
    """η sweeps on a random tree and on the minimal counterexample, the counterexample under all
    four divergences, and witness counts on random trees (see `summary`)."""
    sizes = QUICK if quick else FULL
    rng = np.random.default_rng(seed)
    tree = trees.random_instance(rng, *TREE_SHAPE, skew=TREE_SKEW)
    out = _instance_results(
        "tree", tree.log_pb, tree.correct, TREE_BETA, np.geomspace(*ETA_RANGE, sizes["tree_etas"])
    )
    pin_etas = np.union1d(np.geomspace(*ETA_RANGE, sizes["pin_etas"]), [PIN_ETA])
    out.update(_instance_results("pin", PIN_LOG_PB, PIN_CORRECT, PIN_BETA, pin_etas))
    pin = [_search(PIN_LOG_PB, PIN_CORRECT, PIN_BETA, PIN_ETA, k) for k in DIVERGENCES]
    out.update(
        {
            "pin4/kind": np.asarray(DIVERGENCES),
            "pin4/epsilon": np.asarray([w.epsilon for w, _ in pin]),
            "pin4/min_divergence": np.asarray([w.min_divergence for w, _ in pin]),
            "pin4/bound": np.asarray([b for _, b in pin]),
            "pin4/found": np.asarray([w.found for w, _ in pin]),
            "pin4/p_min": np.asarray(
                family_min_correctness(PIN_LOG_PB, PIN_CORRECT, PIN_BETA / (PIN_BETA + PIN_ETA))
            ),
        }
    )
    out.update(_counts(rng, sizes["count_trees"], sizes["count_etas"]))
    return out


# ---- figure ---------------------------------------------------------------------------------


def _getter(r: dict, prefix: str):
    return lambda k: r[f"{prefix}/{k}"]


def _points(
    ax,
    x: np.ndarray,
    y: np.ndarray,
    found: np.ndarray,
    margin: np.ndarray,
    xd: np.ndarray,
    yd: np.ndarray,
    labels: bool,
) -> None:
    """Entropy-bonus points (filled: margin > 0), their DS counterparts (filled: witness), a
    segment from each counterexample to its DS point, and × on the counterexamples."""
    for i in np.flatnonzero(~found):
        ax.plot([x[i], xd[i]], [y[i], yd[i]], color=CX_COLOR, lw=0.5, ls="--", alpha=0.5)
    kw = {"zorder": 3, "s": 22}
    ax.scatter(
        x[margin], y[margin], color=ENT_COLOR, **kw, label="π_ent, margin > 0" if labels else None
    )
    ax.scatter(
        x[~margin],
        y[~margin],
        facecolor="white",
        edgecolor=ENT_COLOR,
        **kw,
        label="π_ent, margin ≤ 0" if labels else None,
    )
    kw = {"zorder": 4, "s": 14, "marker": "s"}
    ax.scatter(
        xd[found], yd[found], color=DS_COLOR, **kw, label="DS witness (KL ≤ ε)" if labels else None
    )
    ax.scatter(
        xd[~found],
        yd[~found],
        facecolor="white",
        edgecolor=DS_COLOR,
        **kw,
        label="best DS point: KL > ε" if labels else None,
    )
    ax.scatter(
        x[~found],
        y[~found],
        marker="x",
        s=50,
        color=CX_COLOR,
        lw=1.3,
        zorder=5,
        label="counterexample: no DS witness" if labels else None,
    )


def _panel_budget(ax, r: dict, prefix: str, label_cx: bool) -> None:
    """(a) correctness vs KL budget: the entropy-bonus curve over η and each point's DS point."""
    g = _getter(r, prefix)
    found, margin = g("ds_found").astype(bool), g("margin") > 0
    x_max = 1.08 * max(g("ent_kl").max(), g("ds_kl").max())
    keep = g("tilt_kl") <= x_max
    ax.plot(
        g("tilt_kl")[keep],
        g("tilt_p")[keep],
        color="0.55",
        lw=1,
        ls=":",
        label="max P of any π at that KL (η = 0, β swept)",
    )
    ax.plot(
        g("ent_kl"),
        g("ent_p"),
        color=ENT_COLOR,
        lw=1.2,
        zorder=2,
        label="entropy bonus over η (β fixed)",
    )
    _points(ax, g("ent_kl"), g("ent_p"), found, margin, g("ds_kl"), g("ds_p"), labels=True)
    eta = g("eta")
    for i, ha in ((0, "right"), (eta.size - 1, "left")):
        ax.annotate(
            f" η={eta[i]:g} ",
            (g("ent_kl")[i], g("ent_p")[i]),
            fontsize=7,
            ha=ha,
            va="top",
            color=ENT_COLOR,
        )
    if label_cx:
        i = int(np.argmin(np.abs(eta - PIN_ETA)))
        ax.annotate(
            f"η={PIN_ETA:g}: ε = KL(π_ent‖π_b) = {g('ent_kl')[i]:.4f}, P(π_ent) = {g('ent_p')[i]:.4f}\n"
            f"every DS optimum with P ≥ P(π_ent), V ≤ V(π_ent)\n"
            f"needs KL ≥ {g('ds_kl')[i]:.4f} (at P = {g('ds_p')[i]:.4f})",
            (g("ent_kl")[i], g("ent_p")[i]),
            xytext=(0.03, 0.97),
            textcoords="axes fraction",
            fontsize=7,
            va="top",
            arrowprops={"arrowstyle": "->", "lw": 0.7},
        )
    ax.set_xlim(0, x_max)
    ax.set_xlabel("divergence budget KL(π‖π_b)  [nats]")
    ax.set_ylabel("correctness P(π)")


def _panel_variance(ax, r: dict, prefix: str) -> None:
    """(b) normalized variance vs correctness, the same points as (a)."""
    g = _getter(r, prefix)
    found, margin = g("ds_found").astype(bool), g("margin") > 0
    ax.plot(g("ent_p"), g("ent_v"), color=ENT_COLOR, lw=1.2, zorder=2)
    _points(ax, g("ent_p"), g("ent_v"), found, margin, g("ds_p"), g("ds_v"), labels=False)
    ax.set_yscale("log")
    ax.set_xlabel("correctness P(π)")
    ax.set_ylabel("normalized variance V(π) on C  (lower: more diverse)", fontsize=8)


def _panel_eta(ax, r: dict, prefix: str) -> None:
    """(c) budgets vs η: ε of π_ent and the least DS budget; shaded: margin > 0, no witness."""
    g = _getter(r, prefix)
    eta, found, margin = g("eta"), g("ds_found").astype(bool), g("margin") > 0
    edges = np.sqrt(eta[1:] * eta[:-1])
    lo = np.concatenate([[eta[0] / 1.3], edges])
    hi = np.concatenate([edges, [eta[-1] * 1.3]])
    for i in range(eta.size):
        if margin[i]:
            ax.axvspan(lo[i], hi[i], color=ENT_COLOR, alpha=0.13, lw=0)
        if not found[i]:
            ax.axvspan(lo[i], hi[i], color=CX_COLOR, alpha=0.10, lw=0)
    ax.plot(eta, g("ent_kl"), "o-", ms=3, color=ENT_COLOR, label="ε = KL(π_ent‖π_b)")
    ax.plot(
        eta,
        g("ds_kl"),
        "s-",
        ms=3,
        color=DS_COLOR,
        label="least KL of a DS optimum with P ≥ P(π_ent), V ≤ V(π_ent)",
    )
    ax.plot(eta, g("bound"), ":", color="0.25", lw=1.2, label="proven lower bound on that KL")
    ax.fill_between([], [], color=ENT_COLOR, alpha=0.3, label="margin > 0 (proof's construction)")
    ax.fill_between([], [], color=CX_COLOR, alpha=0.2, label="no DS witness (counterexample)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.set_xlim(lo[0], hi[-1])
    ax.set_xlabel(f"entropy bonus η  (β = {float(g('beta')):g} fixed)")
    ax.set_ylabel("KL budget  [nats]")


def plot(results: dict[str, np.ndarray], out_dir: Path) -> list[Path]:
    """Rows: the random tree, the minimal counterexample; columns (a), (b), (c) as above."""
    fig, axes = plt.subplots(2, 3, figsize=(14.5, 8.4))
    shape = results["tree/log_pb"].size
    n_c = int(results["tree/correct"].sum())
    rows = {
        "tree": f"random tree (V={TREE_SHAPE[0]}, H={TREE_SHAPE[1]}, M={shape}, |C|={n_c}, "
        f"base logits ~ N(0, {TREE_SKEW:g}²)), β={TREE_BETA:g}",
        "pin": f"minimal counterexample: one step, π_b=(0.4, 0.4, 0.2), C={{τ1, τ3}}, β={PIN_BETA:g}",
    }
    for row, (prefix, title) in enumerate(rows.items()):
        _panel_budget(axes[row, 0], results, prefix, label_cx=prefix == "pin")
        _panel_variance(axes[row, 1], results, prefix)
        _panel_eta(axes[row, 2], results, prefix)
        n = results[f"{prefix}/eta"].size
        n_no = int(np.sum(~results[f"{prefix}/ds_found"].astype(bool)))
        axes[row, 0].set_title(f"(a) correctness vs budget — {n_no}/{n} η without DS witness")
        axes[row, 1].set_title("(b) normalized variance vs correctness")
        axes[row, 2].set_title("(c) budget needed vs η")
        axes[row, 1].annotate(
            title,
            (0.5, 1.13),
            xycoords="axes fraction",
            ha="center",
            fontsize=10,
            fontweight="bold",
        )
    for ax in axes.flat:
        ax.grid(alpha=0.25)
        # Log-axis minor ticks are most of the drawing time and add little here.
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.yaxis.set_minor_locator(plt.NullLocator())
    handles, labels = [], []
    for ax in (axes[0, 0], axes[0, 2]):
        h, lab = ax.get_legend_handles_labels()
        handles, labels = handles + h, labels + lab
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.015), ncol=6, fontsize=7)
    fig.suptitle(
        "Theorem 3.4 / B.10 (seed 000): does DS dominate the entropy bonus? Closed forms from theory/ "
        "(policy anchor, r̂ = r, η swept log-spaced in [0.01, 30])",
        fontsize=10.5,
    )
    fig.text(
        0.5,
        -0.04,
        "Each green circle is an entropy-bonus optimum π_ent (η swept); its red square is the DS optimum with "
        "P ≥ P(π_ent) and V ≤ V(π_ent) that needs the least KL budget (theory.theorem_3_4.search_witness).\n"
        "A DS witness exists iff that KL ≤ ε = KL(π_ent‖π_b): then the square lies left of (a) and right of / "
        "below (b) its circle. × marks the η with none (each certified by the proven lower bound);\n"
        "dashed lines join them to their DS point. Filled circles: construction_margin > 0, the proven "
        "sufficient condition (the paper's construction is then a witness).",
        ha="center",
        fontsize=8,
    )
    # Fixed margins instead of tight_layout: one text layout pass less (text is most of the cost).
    fig.subplots_adjust(left=0.06, right=0.99, top=0.89, bottom=0.14, wspace=0.28, hspace=0.42)
    return save(fig, out_dir, "fig3_theorem_3_4")


def summary(results: dict[str, np.ndarray]) -> dict:
    """Counts of entropy-bonus points with and without a DS witness, and the minimal
    counterexample's numbers (all four divergences)."""
    out: dict[str, object] = {}
    for prefix in ("tree", "pin"):
        found = results[f"{prefix}/ds_found"].astype(bool)
        margin = results[f"{prefix}/margin"] > 0
        eps, bound = results[f"{prefix}/ent_kl"], results[f"{prefix}/bound"]
        out[prefix] = {
            "beta": float(results[f"{prefix}/beta"]),
            "points": int(found.size),
            "with_witness": int(found.sum()),
            "without_witness": int((~found).sum()),
            "margin_positive": int(margin.sum()),
            "margin_positive_without_witness": int((margin & ~found).sum()),
            "without_witness_certified_by_bound": int((~found & (bound > eps)).sum()),
        }
    i = int(np.argmin(np.abs(results["pin/eta"] - PIN_ETA)))
    out["minimal_counterexample"] = {
        "beta": PIN_BETA,
        "eta": PIN_ETA,
        "p_ent": float(results["pin/ent_p"][i]),
        "v_ent": float(results["pin/ent_v"][i]),
        "p_min_reachable_by_ds": float(results["pin4/p_min"]),
        "margin": float(results["pin/margin"][i]),
        **{
            str(k): {
                "epsilon": float(e),
                "min_over_ds": float(m),
                "proven_bound": float(b),
                "witness": bool(f),
            }
            for k, e, m, b, f in zip(
                results["pin4/kind"],
                results["pin4/epsilon"],
                results["pin4/min_divergence"],
                results["pin4/bound"],
                results["pin4/found"],
                strict=True,
            )
        },
    }
    found = results["counts/found"]  # (R, β, η)
    per_tree = 1.0 - found.reshape(found.shape[0], -1).mean(axis=1)
    out["random_trees"] = {
        "trees": int(found.shape[0]),
        "betas": [float(b) for b in results["counts/beta"]],
        "etas": [float(e) for e in results["counts/eta"]],
        "points": int(found.size),
        "without_witness": int((~found).sum()),
        "frac_without_witness_per_tree_mean": float(per_tree.mean()),
        "frac_without_witness_per_tree_sd": float(per_tree.std()),
        "frac_without_witness_by_beta": [
            float(1 - found[:, b].mean()) for b in range(found.shape[1])
        ],
        "margin_positive": int(results["counts/margin_pos"].sum()),
        "certified_none_by_bound": int(results["counts/certified_none"].sum()),
    }
    return out


register(
    "theorem_3_4",
    title="Theorem 3.4: DS vs the entropy bonus (correctness, budget, normalized variance)",
    order=3,
    run=run,
    plot=plot,
    summary=summary,
)
