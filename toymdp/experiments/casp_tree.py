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
  (accuracy 0.43). With a uniform base, GRPO keeps 4.5 of 6 modes at lr 0.1 (the simulator
  engineer's finding): there is no single dominant mode to collapse to.
- Adam (eps 1e-4) at learning rate 0.1, groups of `G = 8`, 150 updates of one epoch, no KL.
- Coefficients: the registry's (LM-scale) defaults are far too weak on this toy (CaSP α = 0.01,
  DS-GRPO γ = (0.02, 0.005) and entropy η = 0.01 all behave like GRPO), so the main comparison
  uses toy-scale values: entropy bonus η = 1 (trajectory form `Ã = A − η·log π_old(τ)`),
  CaSP α = 1 (its largest value: the sampled ratio's weight `1 − α·w_t` stays ≥ 0; λ_top1 = 1.1,
  N = 3, q = 0.8), DS-GRPO γ_p = 1, γ_n = γ_p/4 (the ratio of the registry defaults). Other
  methods use their registry defaults.

Sensitivity: every focal method is rerun at learning rates 0.03..1 and over its coefficient; all
settings of one method share one compiled program (settings are data), and all methods are
compiled together into one XLA program.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from theory import trees
from toymdp import policy
from toymdp import train as T
from toymdp.env import casp_env
from toymdp.experiments import _plot
from toymdp.experiments._registry import Results, register

STEM = "fig1_casp_tree"
SKEW = 2.0
LR = 0.1
GROUP_SIZE = 8
DISTINCT_K = 1000
#: A mode "counts" in the threshold variant of modes covered if `π(τ) >= MODE_THRESHOLD`.
MODE_THRESHOLD = 1e-3
FOCAL = ("grpo", "entropy_bonus", "casp", "ds_grpo")
OTHERS = ("dsdr", "progrpo", "unlikeliness", "passk", "w_reinforce")
#: The swept coefficient of each focal method and its main (toy-scale) value.
COEF = {"entropy_bonus": ("eta", 1.0), "casp": ("alpha", 1.0), "ds_grpo": ("gamma_p", 1.0)}
COEF_GRID = {
    "entropy_bonus": (0.01, 0.1, 0.3, 1.0),
    "casp": (0.01, 0.1, 0.3, 1.0),
    "ds_grpo": (0.02, 0.1, 0.3, 1.0, 3.0),
}
#: Learning rates of the lr sweep, and the methods swept (the entropy bonus's η sweep shows its
#: trade-off; its lr sweep is left out to keep the run inside its time budget).
LR_GRID = (0.03, 0.1, 0.3, 1.0)
LR_SWEPT = ("grpo", "casp", "ds_grpo")
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


def base_logits(skew: float = SKEW) -> np.ndarray:
    """`(21, 4)` base logits: `+skew` on the BDC path's action at each of its nodes, else 0."""
    nodes, actions = trees.trajectory_nodes(4, 3)
    bdc = trees.trajectory_labels(4, 3).index("BDC")
    logits = np.zeros((trees.num_internal_nodes(4, 3), 4))
    logits[nodes[:, bdc], actions[:, bdc]] = skew
    return logits


def _coef_settings(method: str, value: float) -> dict[str, float]:
    if method == "ds_grpo":
        return {"gamma_p": value, "gamma_n": value / 4}
    return {COEF[method][0]: value}


def variants(quick: bool = False) -> list[tuple[str, str, float, float]]:
    """`(method, group, lr, coefficient)` of every run setting; group in {main, lr, coef}.

    The main setting of each method appears once (group ``"main"``); the sweeps hold the others.
    `coefficient` is NaN for methods without a swept coefficient. `quick`: the focal methods
    only, with the sweeps cut to their two ends.
    """
    methods = FOCAL if quick else FOCAL + OTHERS
    out = []
    for m in methods:
        main_coef = COEF[m][1] if m in COEF else float("nan")
        out.append((m, "main", LR, main_coef))
        lrs, coefs = LR_GRID, COEF_GRID.get(m, ())
        if quick:
            lrs, coefs = lrs[-1:], coefs[:1]
        if m in LR_SWEPT:
            out += [(m, "lr", lr, main_coef) for lr in lrs if lr != LR]
        out += [(m, "coef", LR, c) for c in coefs if c != main_coef]
    return out


def run(quick: bool, seed: int) -> dict[str, np.ndarray]:
    """Train every method's settings × seeds on the CaSP tree; exact metrics of the final policy.

    Returns (`S` settings in `variants` order, `R` seeds, `U` updates, `M = 64`):
    ``variant/method``, ``variant/group`` `(S,)` str; ``variant/lr``, ``variant/coef`` `(S,)`;
    ``accuracy``, ``modes`` `(S, R)`; ``final_prob`` `(S, R, M)`; ``curve/accuracy``,
    ``curve/modes`` `(S, U + 1)` (mean over seeds); ``base_prob`` `(M,)`; ``correct`` `(M,)`;
    ``labels`` `(M,)` str; scalars ``num_updates``, ``group_size``, ``skew``, ``num_seeds``.
    """
    rows = variants(quick)
    methods = tuple(dict.fromkeys(r[0] for r in rows))
    num_seeds, num_updates = (8, 40) if quick else (32, 150)
    env = casp_env(base_logits())
    configs = {
        m: T.TrainConfig(
            env, method=m, group_size=GROUP_SIZE, num_updates=num_updates, num_epochs=1,
            optimizer="adam", learning_rate=LR, distinct_k=(DISTINCT_K,), pass_k=(1,),
        )
        for m in methods
    }  # fmt: skip
    nodes, actions = policy.tree_index(4, 3)

    # Everything JAX happens inside one traced function: building the trains and settings eagerly
    # would compile a few dozen tiny programs (constants of `make_train`, key splitting).
    def run_all(seed: jax.Array) -> dict[str, dict[str, jax.Array]]:
        keys = T.seed_keys(seed, num_seeds)
        base = jnp.asarray(env.base_logits, jnp.float32)
        out = {}
        for m, cfg in configs.items():
            train = jax.vmap(jax.vmap(T.make_train(cfg), (None, 0)), (0, None))
            settings = T.stack_settings([
                T.default_settings(cfg, lr=lr, **({} if np.isnan(c) else _coef_settings(m, c)))
                for (mm, _, lr, c) in rows
                if mm == m
            ])  # fmt: skip
            res = train(settings, keys)
            logits = T.policy_logits(res["params"], base)  # (S, R, 1, N_int, V)
            lp = policy.trajectory_log_probs(policy.node_log_probs(logits), nodes, actions)
            acc = res["exact"]["correctness"][..., 0]  # (S, R, U + 1)
            modes = res["exact"]["distinct_correct"][..., 0, 0]
            out[m] = {
                "accuracy": acc[..., -1],
                "modes": modes[..., -1],
                "final_prob": jnp.exp(lp[..., 0, :]),
                "curve/accuracy": jnp.mean(acc, axis=1),
                "curve/modes": jnp.mean(modes, axis=1),
            }
        return out

    outs = jax.jit(run_all, compiler_options=T.FAST_COMPILE)(seed)
    results: dict[str, Any] = {
        "variant/method": np.array([r[0] for r in rows]),
        "variant/group": np.array([r[1] for r in rows]),
        "variant/lr": np.array([r[2] for r in rows]),
        "variant/coef": np.array([r[3] for r in rows]),
    }
    for key in ("accuracy", "modes", "final_prob", "curve/accuracy", "curve/modes"):
        results[key] = np.concatenate([np.asarray(outs[m][key], np.float64) for m in methods])
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


def _sweep(results: Results, method: str, axis: str) -> tuple[np.ndarray, np.ndarray]:
    """Indices of `method`'s runs along `axis` ("lr" or "coef", main included), sorted by value."""
    idx = np.concatenate([_index(results, method, "main"), _index(results, method, axis)])
    values = results[f"variant/{axis}"][idx]
    order = np.argsort(values)
    return idx[order], values[order]


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


def summary(results: Results) -> dict[str, Any]:
    """Per method (main settings): accuracy, modes covered (in 1,000 samples, and `π ≥ 1e-3`),
    the share of seeds whose top correct mode is BDC and the top mode's mass; the sensitivity
    sweeps' mean modes and accuracy. Mean and sd over seeds."""
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
    sens: dict[str, Any] = {}
    for axis in ("lr", "coef"):
        for m in methods:
            idx, values = _sweep(results, m, axis)
            if idx.size < 2:
                continue
            name = "lr" if axis == "lr" else COEF[m][0]
            sens[f"{m} vs {name}"] = {
                f"{v:g}": {
                    "modes_in_1000": round(float(results["modes"][i].mean()), 3),
                    "accuracy": round(float(results["accuracy"][i].mean()), 3),
                }
                for i, v in zip(idx, values, strict=True)
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
        },
        "main": main,
        "sensitivity": sens,
    }


# ---- figure -------------------------------------------------------------------------------------


def _coef_label(method: str) -> str:
    return {"entropy_bonus": "η", "casp": "α", "ds_grpo": "γ_p (γ_n = γ_p/4)"}[method]


def plot(results: Results, out_dir: Path) -> list[Path]:
    """`fig1_casp_tree`: (a) accuracy vs modes covered per method, (b-e) sensitivity to the learning
    rate and to each method's coefficient, (f) modes over training, (g) policy maps."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm
    from matplotlib.patches import Rectangle

    methods = [m for m in dict.fromkeys(results["variant/method"].tolist())]
    focal = [m for m in FOCAL if m in methods]
    colors = _plot.METHOD_COLORS
    fig = plt.figure(figsize=(13.5, 12.5))
    grid = fig.add_gridspec(3, 3, height_ratios=[1.0, 1.0, 1.25], hspace=0.45, wspace=0.3, top=0.93)

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
    ax.set_title("(a) final policy, main settings (mean ± sd)")
    ax.legend(fontsize=7, loc="lower left", ncol=2)

    panels = [
        (grid[0, 1], "lr", "modes", "(b) modes covered vs learning rate"),
        (grid[0, 2], "lr", "accuracy", "(c) accuracy vs learning rate"),
        (grid[1, 0], "coef", "modes", "(d) modes covered vs coefficient"),
        (grid[1, 1], "coef", "accuracy", "(e) accuracy vs coefficient"),
    ]
    for spec, axis, key, title in panels:
        ax = fig.add_subplot(spec)
        for m in focal:
            idx, values = _sweep(results, m, axis)
            if idx.size < 2:
                continue
            mean = results[key][idx].mean(axis=1)
            sd = results[key][idx].std(axis=1)
            label = LABELS[m] if axis == "lr" else f"{LABELS[m]} ({_coef_label(m)})"
            ax.errorbar(values, mean, yerr=sd, marker="o", ms=4, capsize=2, color=colors[m],
                        label=label)  # fmt: skip
        ax.set_xscale("log")
        ax.set_xlabel("Adam learning rate" if axis == "lr" else "coefficient (method's own)")
        ax.set_ylabel("modes covered (of 6)" if key == "modes" else "accuracy P(π)")
        ax.set_ylim((0.5, 6.3) if key == "modes" else (-0.02, 1.05))
        ax.set_title(title)
        ax.legend(fontsize=7)

    ax = fig.add_subplot(grid[1, 2])
    for m in methods:
        (i,) = _index(results, m)
        curve = results["curve/modes"][i]
        ax.plot(np.arange(curve.size), curve, color=colors[m], lw=2 if m in FOCAL else 1,
                label=LABELS[m])  # fmt: skip
    ax.set_xlabel("update")
    ax.set_ylabel("modes covered (of 6, mean over seeds)")
    ax.set_ylim(0.5, 6.3)
    ax.set_title("(f) modes covered during training")
    ax.legend(fontsize=6, ncol=2)

    sub = grid[2, :].subgridspec(3, 2, hspace=0.7, wspace=0.12)
    labels, correct = results["labels"], results["correct"]
    maps = [("base policy π_b", results["base_prob"])]
    for m in focal:
        (i,) = _index(results, m)
        maps.append((f"{LABELS[m]} (seed mean)", results["final_prob"][i].mean(axis=0)))
    norm = LogNorm(vmin=1e-4, vmax=1.0)
    image = None
    for k, (title, prob) in enumerate(maps):
        ax = fig.add_subplot(sub[k // 2, k % 2])
        image = ax.imshow(np.clip(prob.reshape(4, 16), 1e-4, 1.0), cmap="viridis", norm=norm,
                          aspect="auto")  # fmt: skip
        for leaf in np.flatnonzero(correct):
            r, c = divmod(int(leaf), 16)
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, ec="red", lw=1.8))
        ax.set_yticks(range(4), list("ABCD"))
        ax.set_xticks(range(16), [lab[1:] for lab in labels[:16]], fontsize=6)
        ax.set_ylabel("1st action")
        ax.set_title(f"(g) {title}", fontsize=9)
        ax.spines[:].set_visible(False)
    ax = fig.add_subplot(sub[2, 1])
    ax.axis("off")
    fig.colorbar(image, ax=ax, orientation="horizontal", fraction=0.5,
                 label="π(τ), leaf probability (log scale; red box = correct)")  # fmt: skip

    fig.suptitle(
        "CaSP tree (seed 004 Fig. 5): A..D, depth 3, correct ACD ACB BDC BDA CAB DBA.  "
        f"Base: logit +{float(results['skew']):g} on the BDC path; Adam lr {LR:g}, "
        f"G = {int(results['group_size'])}, {int(results['num_updates'])} updates, "
        f"{int(results['num_seeds'])} seeds.\nMain coefficients: entropy η = 1 (trajectory form), "
        "CaSP α = 1 (λ_top1 1.1, N 3, q 0.8), DS-GRPO γ_p = 1, γ_n = 0.25; others registry "
        "defaults.  Maps in (g): columns = 2nd+3rd action.",
        fontsize=9,
    )
    return _plot.save(fig, out_dir, STEM)


register(
    "casp_tree",
    title="CaSP tree: accuracy and modes covered per method (seed 004 Fig. 5)",
    order=1,
    run=run,
    plot=plot,
    summary=summary,
)
