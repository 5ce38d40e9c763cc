"""Figure 1: the CaSP tree (seed 004, Fig. 5): which methods keep all six correct modes.

The tree has actions A..D, depth 3 (64 responses) and six correct responses ACD, ACB, BDC, BDA,
CAB, DBA (`toymdp.env.casp_env`). Each method trains a tabular policy by sampled RLVR
(`toymdp.train`, one update per group of `G` responses) and is scored on its final policy, exactly:
accuracy `P(π) = Σ_{τ∈C} π(τ)` and modes covered, the expected number of distinct correct
responses in 1,000 samples `Σ_{τ∈C} 1 − (1 − π(τ))^1000` (seed 004 Prop. 3).

The paper publishes none of its training settings, so these are choices (docs/formulas.md §4.10):

- Base policy: skewed towards BDC, as a language model's prior favours one solution: logit
  `+SKEW` on the BDC action at each of its three nodes (root→B, B→D, BD→C), 0 elsewhere. With
  `SKEW = 2`, `π_b(BDC) = 0.36`, `π_b(BDA) = 0.049`, the other four correct responses 0.006 each
  (accuracy 0.43).
- Adam (eps 1e-4) at learning rate 0.1, groups of `G = 8`, 120 updates of one epoch, no KL.
- Coefficients: the registry's (LM-scale) defaults are far too weak on this toy (CaSP α = 0.01,
  DS-GRPO γ = (0.02, 0.005) and entropy η = 0.01 all behave like GRPO), so the main comparison
  uses toy-scale values: entropy bonus η = 1 (trajectory form `Ã = A − η·log π_old(τ)`),
  CaSP α = 1 (its largest value: the sampled ratio's weight `1 − α·w_t` stays ≥ 0; λ_top1 = 1.1,
  N = 3, q = 0.8), DS-GRPO γ_p = 1, γ_n = γ_p/4 (the ratio of the registry defaults). Other
  methods use their registry defaults.

The grid: mode counts depend on the start, the optimizer and the learning rate at least as much as
on the method, so the focal methods (GRPO, entropy bonus, DS-GRPO, CaSP) are rerun over base skew
(uniform, skewed) × optimizer (Adam at lr 0.03, 0.1, 0.3; SGD at 1, 3, 10) × their coefficient, CaSP
also with its high-entropy mask off (quantile q = 0: every token is eligible). Each (method, cell)
is scored by the most modes any of its coefficients keeps at mean accuracy ≥ `ACCURACY_FLOOR` = 0.99
(`best_modes`). Settings (skew, lr, coefficients) are data: one compiled program per (registry
method, optimizer), GRPO, the entropy bonus and DS-GRPO all as `ds_grpo` settings (`DS_FAMILY`), all
compiled together into one XLA program.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.patches import Rectangle

from experiment.report import METHOD_COLORS
from theory import trees
from toymdp import policy
from toymdp import train as T
from toymdp.engine import train_over_envs
from toymdp.env import casp_env
from toymdp.experiments import _plot
from toymdp.experiments._registry import Results, register

STEM = "fig1_casp_tree"
SKEW = 2.0
LR = 0.1
GROUP_SIZE = 8
DISTINCT_K = 1000
#: Accuracy a setting must keep (mean over seeds) for its modes to count in the grid panels.
ACCURACY_FLOOR = 0.99
#: A mode "counts" in the threshold variant of modes covered if `π(τ) >= MODE_THRESHOLD`.
MODE_THRESHOLD = 1e-3
FOCAL = ("grpo", "entropy_bonus", "casp", "ds_grpo")
OTHERS = ("dsdr", "progrpo", "unlikeliness", "passk", "w_reinforce")
#: The swept coefficient of each focal method and its main (toy-scale) value.
COEF = {"entropy_bonus": ("eta", 1.0), "casp": ("alpha", 1.0), "ds_grpo": ("gamma_p", 1.0)}
COEF_GRID = {
    "grpo": (float("nan"),),
    "entropy_bonus": (0.1, 0.3, 1.0, 3.0),
    "ds_grpo": (0.1, 0.3, 1.0, 3.0),
    "casp": (0.1, 0.3, 1.0),
}
#: CaSP's high-entropy mask: the quantile `q` of the main setting and the mask switched off.
QUANTILES = (0.8, 0.0)
#: The grid of starting points and optimizers: base skew × optimizer × learning rate. SGD's
#: learning rates are larger: its steps scale with the gradient (≈ 1/G per response), Adam's not.
SKEWS = {"uniform": 0.0, "skewed": SKEW}
LRS = {"adam": (0.03, 0.1, 0.3), "sgd": (1.0, 3.0, 10.0)}
#: Series of the grid panels: (method, CaSP quantile) -> label.
SERIES = {
    ("grpo", 0.8): "GRPO",
    ("entropy_bonus", 0.8): "GRPO + entropy",
    ("ds_grpo", 0.8): "DS-GRPO",
    ("casp", 0.8): "CaSP (q 0.8)",
    ("casp", 0.0): "CaSP (q 0, no entropy mask)",
}
LABELS = {
    "grpo": "GRPO",
    "entropy_bonus": "GRPO + entropy",
    "casp": "CaSP",
    "ds_grpo": "DS-GRPO",
    "dsdr": "DSDR",
    "progrpo": "ProGRPO",
    "unlikeliness": "Unlikeliness",
    "passk": "Pass@k training",
    "w_reinforce": "W-REINFORCE",
}

#: One run setting: method, group ("main": the paper-style setting; "grid": the others), base
#: skew, optimizer, learning rate, coefficient (NaN: none), CaSP quantile.
Variant = tuple[str, str, float, str, float, float, float]


def base_logits(skew: float = SKEW) -> np.ndarray:
    """`(21, 4)` base logits: `+skew` on the BDC path's action at each of its nodes, else 0."""
    nodes, actions = trees.trajectory_nodes(4, 3)
    bdc = trees.trajectory_labels(4, 3).index("BDC")
    logits = np.zeros((trees.num_internal_nodes(4, 3), 4))
    logits[nodes[:, bdc], actions[:, bdc]] = skew
    return logits


#: GRPO, the entropy bonus and DS-GRPO run as `ds_grpo` settings `(γ_p, γ_n)` = (0, 0), (η, −η),
#: (γ, γ/4) in one compiled program per optimizer (compilation dominates this figure's time):
#: `A + γ_p·ℓ` on correct and `A − γ_n·ℓ` on incorrect responses is the trajectory-form entropy
#: bonus `A − η·ℓ` at (η, −η) (seed 000 Lemma B.4; tests/toymdp/test_experiment_multiplicity.py).
DS_FAMILY = {"grpo": (0.0, 0.0), "entropy_bonus": (1.0, -1.0), "ds_grpo": (1.0, 0.25)}


def _program(method: str) -> str:
    """The registry method whose compiled program trains `method`."""
    return "ds_grpo" if method in DS_FAMILY else method


def _coef_settings(method: str, value: float) -> dict[str, float]:
    if method in DS_FAMILY:
        v = 0.0 if np.isnan(value) else value
        return {"gamma_p": v * DS_FAMILY[method][0], "gamma_n": v * DS_FAMILY[method][1]}
    if np.isnan(value):
        return {}
    return {COEF[method][0]: value}


def variants(quick: bool = False) -> list[Variant]:
    """Every run setting (`Variant`), grouped by (method, optimizer) in first-seen order.

    The main setting (skewed base, Adam, lr `LR`, the method's main coefficient, q = 0.8) has
    group ``"main"``; the focal methods' grid over `SKEWS` × `LRS` × `COEF_GRID` (× `QUANTILES` for
    CaSP) has group ``"grid"``; the other methods run their main setting only (registry defaults).
    `quick`: the focal methods with Adam at lr `LR` and their main coefficients.
    """
    out: list[Variant] = []
    nan = float("nan")
    for m in FOCAL:
        main_coef = COEF[m][1] if m in COEF else nan
        coefs = (main_coef,) if quick else COEF_GRID[m]
        for opt, lrs in LRS.items():
            if quick and opt != "adam":
                continue
            lrs = lrs[1:2] if quick else lrs
            for skew in SKEWS.values():
                for lr in lrs:
                    for c in coefs:
                        for q in QUANTILES if m == "casp" else (0.8,):
                            is_main = (skew, opt, lr, q) == (SKEW, "adam", LR, 0.8) and (
                                c == main_coef or (np.isnan(c) and np.isnan(main_coef))
                            )
                            out.append((m, "main" if is_main else "grid", skew, opt, lr, c, q))
    if not quick:
        out += [(m, "main", SKEW, "adam", LR, nan, 0.8) for m in OTHERS]
    return out


def run(quick: bool, seed: int) -> dict[str, np.ndarray]:
    """Train every setting of `variants` × seeds on the CaSP tree; exact metrics of the final policy.

    Returns (`S` settings grouped by compiled program, `R` seeds, `U` updates, `M = 64`):
    ``variant/method``, ``variant/group``, ``variant/optimizer`` `(S,)` str; ``variant/skew``,
    ``variant/lr``, ``variant/coef``, ``variant/quantile`` `(S,)`; ``accuracy``, ``modes``
    `(S, R)`; ``final_prob`` `(S, R, M)`; ``curve/accuracy``, ``curve/modes`` `(S, U + 1)` (mean
    over seeds); ``base_prob`` `(M,)` (skewed base); ``correct`` `(M,)`; ``labels`` `(M,)` str;
    scalars ``num_updates``, ``group_size``, ``skew``, ``num_seeds``.
    """
    rows = variants(quick)
    groups = list(dict.fromkeys((_program(r[0]), r[3]) for r in rows))
    num_seeds, num_updates = (4, 40) if quick else (8, 120)
    env = casp_env(base_logits())
    configs = {
        (m, opt): T.TrainConfig(
            env, method=m, group_size=GROUP_SIZE, num_updates=num_updates, num_epochs=1,
            optimizer=opt, learning_rate=LR, distinct_k=(DISTINCT_K,), pass_k=(1,),
        )
        for m, opt in groups
    }  # fmt: skip
    nodes, actions = policy.tree_index(4, 3)
    correct = jnp.asarray(env.correct)

    # Everything JAX happens inside one traced function: building the trains and settings eagerly
    # would compile a few dozen tiny programs (constants of `make_train`, key splitting).
    def run_all(seed: jax.Array) -> dict[tuple, dict[str, jax.Array]]:
        keys = T.seed_keys(seed, num_seeds)
        out = {}
        for (m, opt), cfg in configs.items():
            sel = [r for r in rows if (_program(r[0]), r[3]) == (m, opt)]
            train = train_over_envs(cfg)

            def one(base: jax.Array, settings: T.Settings, key: jax.Array, train=train) -> dict:
                res = train(base, correct, settings, key)
                lp = policy.trajectory_log_probs(
                    policy.node_log_probs(T.policy_logits(res["params"], base)), nodes, actions
                )
                return {"exact": res["exact"], "final_prob": jnp.exp(lp[0])}

            fn = jax.vmap(jax.vmap(one, (None, None, 0)), (0, 0, None))  # settings, seeds
            bases = jnp.asarray(np.stack([base_logits(r[2])[None] for r in sel]), jnp.float32)
            settings = T.stack_settings([
                T.default_settings(
                    cfg, lr=r[4], **_coef_settings(r[0], r[5]),
                    **({"quantile": r[6]} if m == "casp" else {}),
                )
                for r in sel
            ])  # fmt: skip
            res = fn(bases, settings, keys)
            acc = res["exact"]["correctness"][..., 0]  # (S, R, U + 1)
            modes = res["exact"]["distinct_correct"][..., 0, 0]
            out[(m, opt)] = {
                "accuracy": acc[..., -1],
                "modes": modes[..., -1],
                "final_prob": res["final_prob"],
                "curve/accuracy": jnp.mean(acc, axis=1),
                "curve/modes": jnp.mean(modes, axis=1),
            }
        return out

    outs = jax.jit(run_all, compiler_options=T.FAST_COMPILE)(seed)
    order = [i for g in groups for i, r in enumerate(rows) if (_program(r[0]), r[3]) == g]
    rows = [rows[i] for i in order]
    results: dict[str, Any] = {
        f"variant/{name}": np.array([r[j] for r in rows])
        for j, name in enumerate(("method", "group", "skew", "optimizer", "lr", "coef", "quantile"))
    }
    for key in ("accuracy", "modes", "final_prob", "curve/accuracy", "curve/modes"):
        results[key] = np.concatenate([np.asarray(outs[g][key], np.float64) for g in groups])
    results["base_prob"] = np.exp(env.base_log_probs()[0])
    results["correct"] = env.correct[0]
    results["labels"] = np.array(trees.trajectory_labels(4, 3))
    results["num_updates"] = np.asarray(num_updates)
    results["group_size"] = np.asarray(GROUP_SIZE)
    results["skew"] = np.asarray(SKEW)
    results["num_seeds"] = np.asarray(num_seeds)
    return results


# ---- analysis -----------------------------------------------------------------------------------


def _index(results: Results, method: str, group: str = "main") -> np.ndarray:
    sel = (results["variant/method"] == method) & (results["variant/group"] == group)
    return np.flatnonzero(sel)


def cells() -> list[tuple[str, str, float]]:
    """The grid's cells `(skew name, optimizer, lr)`, in plotting order."""
    return [(k, opt, lr) for k in SKEWS for opt, lrs in LRS.items() for lr in lrs]


def best_modes(results: Results) -> dict[str, dict[tuple, dict[str, float] | None]]:
    """Per series (`SERIES`) and cell: the setting with the most modes (mean over seeds) among
    those whose mean accuracy is at least `ACCURACY_FLOOR`; None where no coefficient keeps it.

    Returns:
        ``{series label: {(skew name, optimizer, lr): {"modes", "accuracy", "coef"} | None}}``
        (cells the results hold; quick mode holds fewer).
    """
    acc = results["accuracy"].mean(axis=1)
    modes = results["modes"].mean(axis=1)
    out: dict[str, dict[tuple, dict[str, float] | None]] = {}
    for (method, q), label in SERIES.items():
        table: dict[tuple, dict[str, float] | None] = {}
        for skew_name, opt, lr in cells():
            sel = np.flatnonzero(
                (results["variant/method"] == method)
                & np.isclose(results["variant/quantile"], q)
                & np.isclose(results["variant/skew"], SKEWS[skew_name])
                & (results["variant/optimizer"] == opt)
                & np.isclose(results["variant/lr"], lr)
            )
            if sel.size == 0:
                continue
            ok = sel[acc[sel] >= ACCURACY_FLOOR]
            if ok.size == 0:
                table[(skew_name, opt, lr)] = None
                continue
            i = ok[np.argmax(modes[ok])]
            c = float(results["variant/coef"][i])
            table[(skew_name, opt, lr)] = {
                "modes": round(float(modes[i]), 3),
                "accuracy": round(float(acc[i]), 4),
                "coef": None if np.isnan(c) else c,
            }
        out[label] = table
    return out


def _modes_above(results: Results, idx: int) -> np.ndarray:
    """Per seed: correct responses with final `π(τ) >= MODE_THRESHOLD`, `(R,)`."""
    prob = results["final_prob"][idx][:, results["correct"]]
    return np.sum(prob >= MODE_THRESHOLD, axis=-1)


def _top_mode(results: Results, idx: int) -> tuple[np.ndarray, np.ndarray]:
    """Per seed: the most likely correct response (index into the correct set) and its mass."""
    prob = results["final_prob"][idx][:, results["correct"]]
    return np.argmax(prob, axis=-1), np.max(prob, axis=-1)


def _ms(x: np.ndarray) -> dict[str, float]:
    mean, sd = _plot.mean_and_spread(x)
    return {"mean": round(float(mean), 4), "sd": round(float(sd), 4)}


def _cell_name(cell: tuple) -> str:
    skew_name, opt, lr = cell
    return f"{skew_name}/{opt}/lr={lr:g}"


def summary(results: Results) -> dict[str, Any]:
    """Per method (main setting): accuracy, modes covered (in 1,000 samples, and `π ≥ 1e-3`), the
    share of seeds whose top correct mode is BDC and the top mode's mass (mean and sd over seeds);
    per series and grid cell the most modes kept at accuracy ≥ `ACCURACY_FLOOR` (`best_modes`);
    CaSP with and without its entropy mask at the main setting."""
    correct_labels = results["labels"][results["correct"]]
    bdc = int(np.flatnonzero(correct_labels == "BDC")[0])
    methods = [m for m in dict.fromkeys(results["variant/method"].tolist())]
    main = {}
    for m in methods:
        (i,) = _index(results, m)
        top, mass = _top_mode(results, i)
        main[m] = {
            "accuracy": _ms(results["accuracy"][i]),
            "modes_in_1000": _ms(results["modes"][i]),
            "modes_prob_ge_1e-3": _ms(_modes_above(results, i)),
            "top_mode_is_BDC": round(float(np.mean(top == bdc)), 4),
            "top_mode_mass": _ms(mass),
            "lr": float(results["variant/lr"][i]),
            **({COEF[m][0]: COEF[m][1]} if m in COEF else {}),
        }
    grid = {
        label: {_cell_name(c): v for c, v in table.items()}
        for label, table in best_modes(results).items()
    }
    mask = {}
    for q in QUANTILES:
        sel = np.flatnonzero(
            (results["variant/method"] == "casp")
            & np.isclose(results["variant/quantile"], q)
            & np.isclose(results["variant/skew"], SKEW)
            & (results["variant/optimizer"] == "adam")
            & np.isclose(results["variant/lr"], LR)
        )
        mask[f"q={q:g}"] = {
            f"alpha={results['variant/coef'][i]:g}": {
                "modes_in_1000": _ms(results["modes"][i]),
                "accuracy": _ms(results["accuracy"][i]),
            }
            for i in sel
        }
    return {
        "settings": {
            "base": f"logit +{float(results['skew']):g} on the BDC path (root B, B->D, BD->C)",
            "base_accuracy": round(float(results["base_prob"][results["correct"]].sum()), 4),
            "optimizer": f"Adam lr {LR:g} (eps 1e-4)",
            "group_size": int(results["group_size"]),
            "updates": int(results["num_updates"]),
            "seeds": int(results["num_seeds"]),
            "entropy_form": "trajectory (A - eta * log pi_old(tau))",
            "ds_gamma_n": "gamma_p / 4",
            "modes_metric": f"sum over C of 1 - (1 - pi)^{DISTINCT_K}; also count pi >= 1e-3",
            "policy_maps": "seed-averaged final trajectory probabilities",
            "grid": f"skew {dict(SKEWS)} x lr {dict(LRS)} x coefficient {COEF_GRID} "
            f"(CaSP also with quantile 0); modes of the best coefficient with mean accuracy "
            f">= {ACCURACY_FLOOR} (null: none)",
        },
        "main": main,
        "most_modes_at_accuracy_0.99": grid,
        "casp_entropy_mask_main_setting": mask,
    }


# ---- figure -------------------------------------------------------------------------------------

SERIES_COLORS = {
    "GRPO": METHOD_COLORS["grpo"],
    "GRPO + entropy": METHOD_COLORS["entropy_bonus"],
    "DS-GRPO": METHOD_COLORS["ds_grpo"],
    "CaSP (q 0.8)": METHOD_COLORS["casp"],
    "CaSP (q 0, no entropy mask)": "#ffbb78",
}


def plot(results: Results, out_dir: Path) -> list[Path]:
    """`fig1_casp_tree`: (a) accuracy vs modes covered per method at the main setting, (b, c) the
    most modes each method keeps at accuracy ≥ 0.99 over base skew × optimizer × lr, (d) every
    grid setting's accuracy against modes, (e) modes over training, (f) policy maps."""

    methods = [m for m in dict.fromkeys(results["variant/method"].tolist())]
    focal = [m for m in FOCAL if m in methods]
    colors = METHOD_COLORS
    fig = plt.figure(figsize=(14.5, 12.5))
    grid = fig.add_gridspec(3, 3, height_ratios=[1.0, 1.0, 1.25], hspace=0.5, wspace=0.3, top=0.93)

    ax = fig.add_subplot(grid[0, 0])
    for m in methods:
        (i,) = _index(results, m)
        x, y = results["modes"][i], results["accuracy"][i]
        ax.errorbar(
            x.mean(), y.mean(), xerr=x.std(), yerr=y.std(), fmt="o", color=colors[m],
            ms=7 if m in FOCAL else 5, capsize=2, label=LABELS[m],
        )  # fmt: skip
    ax.set_xlim(0.5, 6.3)
    ax.set_ylim(-0.02, 1.05)
    ax.axvline(6, color="0.7", lw=0.8, ls=":")
    ax.set_xlabel(f"modes covered (distinct correct in {DISTINCT_K} samples, of 6)")
    ax.set_ylabel("accuracy P(π)")
    ax.set_title(f"(a) main setting: skewed base, Adam lr {LR:g} (mean ± sd)")
    ax.legend(fontsize=7, loc="lower left", ncol=2)

    best = best_modes(results)
    for col, skew_name in ((1, "uniform"), (2, "skewed")):
        ax = fig.add_subplot(grid[0, col])
        shown = [c for c in cells() if c[0] == skew_name]
        for j, (label, table) in enumerate(best.items()):
            xs = np.arange(len(shown)) + 0.13 * (j - 2)
            ys = [
                np.nan if table.get(c) is None else table[c]["modes"]  # type: ignore[index]
                for c in shown
            ]
            ax.plot(xs, ys, "o", color=SERIES_COLORS[label], ms=6, label=label)
            for x, c in zip(xs, shown, strict=True):
                if c in table and table[c] is None:
                    ax.plot(x, 0.7, "x", color=SERIES_COLORS[label], ms=5)
        main_cell = [k for k, c in enumerate(shown) if c == ("skewed", "adam", LR)]
        for k in main_cell:
            ax.axvspan(k - 0.4, k + 0.4, color="0.92", zorder=0)
        ax.set_xticks(range(len(shown)), [f"{c[1]}\nlr {c[2]:g}" for c in shown], fontsize=7)
        ax.set_ylim(0.5, 6.3)
        ax.set_ylabel(f"most modes at accuracy ≥ {ACCURACY_FLOOR}")
        ax.set_title(
            f"({'bc'[col - 1]}) {skew_name} base: best coefficient per method" + (
                "\n(shaded: main setting; x: no setting reaches 0.99)" if main_cell
                else "\n(x: no setting reaches accuracy 0.99)"
            ), fontsize=9,
        )  # fmt: skip
        if col == 1:
            ax.legend(fontsize=7, loc="lower left")

    ax = fig.add_subplot(grid[1, 0])
    for (method, q), label in SERIES.items():
        sel = (results["variant/method"] == method) & np.isclose(results["variant/quantile"], q)
        ax.scatter(results["modes"][sel].mean(axis=1), results["accuracy"][sel].mean(axis=1), s=10,
                   color=SERIES_COLORS[label], label=label, alpha=0.8)  # fmt: skip
    ax.axhline(ACCURACY_FLOOR, color="0.5", lw=0.8, ls="--")
    ax.set_xlim(0.5, 6.3)
    ax.set_xlabel("modes covered (mean over seeds)")
    ax.set_ylabel("accuracy P(π) (mean over seeds)")
    ax.set_title("(d) every grid setting (skew × optimizer × lr × coefficient)")

    ax = fig.add_subplot(grid[1, 1])
    for m in methods:
        (i,) = _index(results, m)
        curve = results["curve/modes"][i]
        ax.plot(np.arange(curve.size), curve, color=colors[m], lw=2 if m in FOCAL else 1,
                label=LABELS[m])  # fmt: skip
    ax.set_xlabel("update")
    ax.set_ylabel("modes covered (of 6, mean over seeds)")
    ax.set_ylim(0.5, 6.3)
    ax.set_title("(e) modes covered during training, main setting")
    ax.legend(fontsize=6, ncol=2)

    sub = grid[1:, 2].subgridspec(5, 1, hspace=0.8)
    labels, correct = results["labels"], results["correct"]
    maps = [("base policy π_b (skewed)", results["base_prob"])]
    for m in focal:
        (i,) = _index(results, m)
        maps.append((f"{LABELS[m]} (seed mean)", results["final_prob"][i].mean(axis=0)))
    norm = LogNorm(vmin=1e-4, vmax=1.0)
    image = None
    for k, (title, prob) in enumerate(maps):
        ax = fig.add_subplot(sub[k])
        image = ax.imshow(np.clip(prob.reshape(4, 16), 1e-4, 1.0), cmap="viridis", norm=norm,
                          aspect="auto")  # fmt: skip
        for leaf in np.flatnonzero(correct):
            r, c = divmod(int(leaf), 16)
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, ec="red", lw=1.5))
        ax.set_yticks(range(4), list("ABCD"), fontsize=6)
        ax.set_xticks(range(16), [lab[1:] for lab in labels[:16]], fontsize=5)
        ax.set_title(f"(f) {title}", fontsize=8)
        ax.spines[:].set_visible(False)
    ax = fig.add_subplot(grid[2, :2])
    ax.axis("off")
    fig.colorbar(image, ax=ax, orientation="horizontal", fraction=0.08, location="top",
                 label="(f) π(τ), leaf probability (log scale; red box = correct; rows: 1st "
                 "action, columns: 2nd+3rd)")  # fmt: skip
    fig.suptitle(
        "CaSP tree (seed 004 Fig. 5): A..D, depth 3, correct ACD ACB BDC BDA CAB DBA.  "
        f"Main: logit +{float(results['skew']):g} on the BDC path, Adam lr {LR:g}, "
        f"G = {int(results['group_size'])}, {int(results['num_updates'])} updates, "
        f"{int(results['num_seeds'])} seeds; the paper publishes none of its settings.\n"
        "Main coefficients: entropy η = 1 (trajectory form), CaSP α = 1 (λ_top1 1.1, N 3, q 0.8), "
        "DS-GRPO γ_p = 1, γ_n = γ_p/4; others registry defaults. Grid: η, γ_p in {0.1, 0.3, 1, 3},"
        " α in {0.1, 0.3, 1} (q 0.8 and 0).",
        fontsize=9,
    )
    return _plot.save(fig, out_dir, STEM)


register(
    "casp_tree",
    title="CaSP tree: accuracy and modes covered per method; most modes at accuracy 0.99 over "
    "base skew x optimizer x lr (seed 004 Fig. 5)",
    order=1,
    run=run,
    plot=plot,
    summary=summary,
)
