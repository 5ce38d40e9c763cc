"""Figure 2: selection and reinforcement bias (seed 000, Props. B.2 and B.3), theory against RL.

Random trees. `NUM_TREES` trees from `theory.trees.random_instance`: `V = 3` actions, depth
`H = 3` (`M = 27` responses), base logits i.i.d. `Normal(0, 1)`, `|C| = 8` correct responses each;
the same trees serve every panel (drawn from `np.random.default_rng(seed)`).

(a) Selection bias (Prop. B.2). For each tree and each `N ∈ SAMPLE_SIZES`, `draws` independent
estimated rewards: sample `N` responses from `π_b`, `r̂(τ) = 1` iff `τ ∈ C` was sampled. Each `r̂`
is one prompt of a `per_prompt` environment whose correct set is the rewarded set, trained by the
simulator's exact mode (`toymdp.train`, population gradient of `E_π[r̂] − β·KL(π‖π_b)`, Adam)
for `exact_updates` steps; the event "`π(τ) > π_b(τ)`" is read off the trained policy. A draw that
rewards nothing has `r̂ ≡ 0`, whose optimum (and the exact mode's every iterate) is `π_b` itself:
it counts as "not increased" without training (a `TreeEnv` prompt needs a non-empty correct set).
The dots are the frequencies over draws, per correct `τ`; the curves are `1 − (1 − π_b(τ))^N`.
The largest total-variation distance between a trained policy and theory's closed form
(`theory.optimum.kl_regularized` with `r̂`) is reported in the figure.

(b, c, d) Reinforcement bias (Prop. B.3) and sharpening. Sampled GRPO (`toymdp.train`, registry
`grpo`, groups of `GROUP_SIZE`, one epoch, clipping 0.2, Adam at `RL_LR`) on the same trees
(`per_prompt`: one independent tabular policy per tree), with the k3 KL term at `kl_coef = β` and
without it (`kl_coef = 0`), over `seeds` seeds in one compiled program. (b) the final policy's gain
`π(τ) − π_b(τ)` on `C` against `π_b(τ)`: Prop. B.3 says it is `π_b(τ)·(e^{1/β}/Z − 1)`, i.e.
proportional to `π_b(τ)` (slope 1 on log-log axes). GRPO does not optimize Eq. 1 exactly: its
advantages are divided by the group's reward std, and the k3 term's gradient is that of the
per-token `KL(π_b‖π)`, so the fixed point's correctness differs from Lemma B.1's at the nominal
`β`. The solid lines therefore use the tilt `e^{1/β}/Z = P(π)/P(π_b)` that matches the trained
policy's correctness (the only free number of Prop. B.3 per tree); the dashed lines are Lemma B.1
at `β = kl_coef`. (c) normalized variance on `C` relative to the base, `V(π_t)/V(π_b)` (mean
over trees): with `r̂ = r` the KL optimum rescales `C` uniformly, `V(π*) = V(π_b)`, while GRPO
without KL sharpens (`V` grows); (d) correctness over training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import matplotlib.pyplot as plt
import numpy as np
from scipy.special import logsumexp

from theory import optimum, trees
from theory.measures import normalized_variance
from toymdp import train as T
from toymdp.engine import run_compiled
from toymdp.env import TreeEnv
from toymdp.experiments._plot import save
from toymdp.experiments._registry import register

NUM_ACTIONS, DEPTH, SKEW, CORRECT_SIZE = 3, 3, 1.0, 8
NUM_TREES = 6
BETA = 1.0
SAMPLE_SIZES = (1, 4, 16)
GROUP_SIZE = 16
RL_LR, EXACT_LR = 0.05, 0.1
#: `log π(τ) − log π_b(τ)` above this counts as "increased" (the smallest true gain of a rewarded
#: response here is ~0.3 nats, the loss of an unrewarded one ~0.1 nats: far from the threshold).
EVENT_MARGIN = 1e-3

#: Sizes by mode: estimated-reward draws per (tree, N), exact-mode steps, RL updates, RL seeds.
SIZES: dict[bool, dict[str, int]] = {
    False: {"draws": 48, "exact_updates": 300, "rl_updates": 600, "seeds": 8},
    True: {"draws": 8, "exact_updates": 100, "rl_updates": 60, "seeds": 2},
}


def random_trees(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The `NUM_TREES` trees: base logits `(T, N_int, V)`, base log-probs `(T, M)`, correct `(T, M)`."""
    insts = [
        trees.random_instance(rng, NUM_ACTIONS, DEPTH, SKEW, CORRECT_SIZE) for _ in range(NUM_TREES)
    ]
    log_pb = np.stack([i.log_pb for i in insts])
    logits = trees.logits_from_log_probs(log_pb, NUM_ACTIONS, DEPTH)
    return logits, log_pb, np.stack([i.correct for i in insts])


def estimated_rewards(
    rng: np.random.Generator, log_pb: np.ndarray, correct: np.ndarray, draws: int
) -> np.ndarray:
    """Prop. B.2's `r̂`: `(T, len(SAMPLE_SIZES), draws, M)` bool, `τ ∈ C` sampled among `N` from `π_b`."""
    t, m = log_pb.shape
    out = np.zeros((t, len(SAMPLE_SIZES), draws, m), dtype=bool)
    for i in range(t):
        pb = np.exp(log_pb[i])
        for j, n in enumerate(SAMPLE_SIZES):
            idx = rng.choice(m, size=(draws, n), p=pb / pb.sum())
            out[i, j, np.arange(draws)[:, None], idx] = True
    return out & correct[:, None, None, :]


def _final_log_probs(theta: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """Trajectory log-probs `(..., M)` (float64) of the tabular policy `logits + θ`."""
    return trees.trajectory_log_probs(
        np.asarray(logits, np.float64) + np.asarray(theta, np.float64), NUM_ACTIONS, DEPTH
    )


def _selection(
    logits: np.ndarray, log_pb: np.ndarray, r_hat: np.ndarray, updates: int
) -> dict[str, np.ndarray]:
    """Panel (a): train the exact mode on every non-empty `r̂` and record `π(τ) > π_b(τ)`."""
    flat = r_hat.reshape(-1, r_hat.shape[-1])  # (T·N·D, M)
    tree_of = np.repeat(np.arange(r_hat.shape[0]), flat.shape[0] // r_hat.shape[0])
    live = flat.any(axis=-1)
    env = TreeEnv(
        NUM_ACTIONS, DEPTH, flat[live], logits[tree_of[live]],
        np.ones(int(live.sum()), dtype=bool), sharing="per_prompt",
    )  # fmt: skip
    # The objective is a mean over prompts, so each prompt's gradient is 1/P of its own: Adam's
    # eps must sit far below that.
    config = T.TrainConfig(
        env, mode="exact", objective="kl", num_updates=updates, learning_rate=EXACT_LR,
        beta=BETA, adam_eps=1e-10,
    )  # fmt: skip
    train = T.make_train(config)
    theta = run_compiled(
        lambda s: train(s, jax.random.key(0))["params"]["prompt"], T.default_settings(config)
    )
    lp_pb = log_pb[tree_of]  # (T·N·D, M)
    lp = lp_pb.copy()
    lp[live] = _final_log_probs(theta, env.base_logits)
    star = lp_pb.copy()
    star[live] = optimum.kl_regularized(lp_pb[live], flat[live].astype(float), BETA)
    tv = 0.5 * np.abs(np.exp(lp) - np.exp(star)).sum(axis=-1)
    event = (lp - lp_pb) > EVENT_MARGIN
    event_star = (star - lp_pb) > EVENT_MARGIN
    shape = r_hat.shape
    return {
        "a/freq_trained": event.reshape(shape).mean(axis=2),  # (T, N, M)
        "a/freq_closed_form": event_star.reshape(shape).mean(axis=2),
        "a/tv_to_closed_form_max": np.asarray(tv.max()),
        "a/empty_draws": (~live).reshape(shape[:3]).sum(axis=2),  # (T, N)
    }


def _reinforcement(
    logits: np.ndarray, correct: np.ndarray, updates: int, seeds: int, seed: int
) -> dict[str, np.ndarray]:
    """Panels (b-d): sampled GRPO without and with the KL term, seeds × {0, β} in one program."""
    env = TreeEnv(
        NUM_ACTIONS, DEPTH, correct, logits, np.ones(len(correct), dtype=bool), "per_prompt"
    )
    config = T.TrainConfig(
        env, method="grpo", num_updates=updates, group_size=GROUP_SIZE, learning_rate=RL_LR,
        distinct_k=(1,), pass_k=(1,),
    )  # fmt: skip
    kl_coefs = np.array([0.0, BETA])
    settings = T.settings_grid(config, kl_coef=kl_coefs)
    train = jax.vmap(jax.vmap(T.make_train(config), (None, 0)), (0, None))

    def program(s: T.Settings, keys: jax.Array) -> dict[str, jax.Array]:
        out = train(s, keys)
        return {
            "correctness": out["exact"]["correctness"],  # (S, R, U + 1, T)
            "nvar": out["exact"]["normalized_variance"],
            "theta": out["params"]["prompt"],  # (S, R, T, N_int, V)
        }

    out = run_compiled(program, settings, T.seed_keys(seed, seeds))
    return {
        "b/kl_coef": kl_coefs,
        "b/correctness": out["correctness"],
        "b/normalized_variance": out["nvar"],
        "b/log_pi_final": _final_log_probs(out["theta"], env.base_logits),  # (S, R, T, M)
    }


def run(quick: bool, seed: int) -> dict[str, np.ndarray]:
    """Panels (a) and (b-d) (module docstring); deterministic given `quick` and `seed`."""
    size = SIZES[quick]
    rng = np.random.default_rng(seed)
    logits, log_pb, correct = random_trees(rng)
    r_hat = estimated_rewards(rng, log_pb, correct, size["draws"])
    return {
        "log_pb": log_pb,
        "correct": correct,
        "sample_sizes": np.asarray(SAMPLE_SIZES),
        "beta": np.asarray(BETA),
        "draws": np.asarray(size["draws"]),
        **_selection(logits, log_pb, r_hat, size["exact_updates"]),
        **_reinforcement(logits, correct, size["rl_updates"], size["seeds"], seed),
    }


# ------------------------------------------------------------------------------ derived numbers


def selection_theory(log_pb: np.ndarray, sample_sizes: np.ndarray) -> np.ndarray:
    """Prop. B.2: `1 − (1 − π_b(τ))^N`, shape `(len(N), ...)` for `log_pb` of shape `(...)`."""
    n = np.asarray(sample_sizes, dtype=float).reshape(-1, *([1] * np.ndim(log_pb)))
    return -np.expm1(n * np.log1p(-np.exp(log_pb)))


def base_correctness(results: dict[str, np.ndarray]) -> np.ndarray:
    """`P(π_b)` per tree, `(T,)`."""
    return np.exp(logsumexp(np.where(results["correct"], results["log_pb"], -np.inf), axis=-1))


def reinforcement_slopes(results: dict[str, np.ndarray], s: int = 1) -> np.ndarray:
    """Least-squares slope of `log(π(τ) − π_b(τ))` on `log π_b(τ)` over `τ ∈ C` with one intercept
    per tree, for each seed of setting `s` (default: with KL); `(R,)`. Prop. B.3 gives 1.

    Responses whose gain is not positive are left out (none with the KL term, in our runs).
    """
    lpb, c = results["log_pb"], results["correct"]
    gain = np.exp(results["b/log_pi_final"][s]) - np.exp(lpb)  # (R, T, M)
    slopes = []
    for g in gain:
        keep = c & (g > 0)
        xs, ys = [], []
        for t in range(len(lpb)):
            x, y = lpb[t][keep[t]], np.log(g[t][keep[t]])
            xs.append(x - x.mean())
            ys.append(y - y.mean())
        x, y = np.concatenate(xs), np.concatenate(ys)
        slopes.append(float(x @ y / (x @ x)))
    return np.asarray(slopes)


def variance_ratio(results: dict[str, np.ndarray]) -> np.ndarray:
    """`V(π_t)/V(π_b)` averaged over trees, `(S, R, U + 1)`."""
    v0 = normalized_variance(results["log_pb"], results["correct"])  # (T,)
    return (results["b/normalized_variance"] / v0).mean(axis=-1)


# ------------------------------------------------------------------------------------ figure

_TREE_COLORS = plt.get_cmap("tab10").colors


def plot(results: dict[str, np.ndarray], out_dir: Path) -> list[Path]:
    """Four panels: (a) selection bias, (b) reinforcement bias, (c) `V/V_b`, (d) correctness."""
    lpb, c = results["log_pb"], results["correct"]
    ns, beta = results["sample_sizes"], float(results["beta"])
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.3))

    ax = axes[0]
    grid = np.linspace(-7.5, -1e-3, 200)
    theory = selection_theory(grid, ns)
    shades = plt.get_cmap("viridis")(np.linspace(0.1, 0.8, len(ns)))
    x = np.exp(lpb[c])
    for j, n in enumerate(ns):
        ax.plot(np.exp(grid), theory[j], color=shades[j], lw=1.6, label=f"theory, N = {n}")
        ax.scatter(
            x, results["a/freq_trained"][:, j][c], s=14, color=shades[j],
            edgecolor="white", linewidth=0.4, zorder=3,
        )  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlim(np.exp(grid[0]), 1.0)
    ax.set_xlabel("base probability π_b(τ) of a correct response τ")
    ax.set_ylabel("P(π(τ) > π_b(τ)) after training on r̂")
    ax.set_title("(a) selection bias (Prop. B.2)")
    ax.legend(loc="upper left", fontsize=7.5, title="dots: exact-mode training", title_fontsize=7.5)
    ax.text(
        0.02, 0.5,
        f"{int(results['draws'])} draws of r̂ per tree and N\n"
        f"max TV(trained, closed form) = {float(results['a/tv_to_closed_form_max']):.1e}",
        transform=ax.transAxes, ha="left", va="center", fontsize=7,
    )  # fmt: skip

    ax = axes[1]
    final = np.exp(results["b/log_pi_final"][1])  # (R, T, M), with KL
    gain = final.mean(axis=0) - np.exp(lpb)
    p_sim = (final * c).sum(-1).mean(axis=0)  # (T,)
    p_b = base_correctness(results)
    star = optimum.kl_regularized(lpb, c.astype(float), beta)
    tilt_star = np.exp(star - lpb)[np.arange(len(lpb)), np.argmax(c, axis=-1)]
    line = np.array([np.exp(lpb[c]).min() * 0.7, np.exp(lpb[c]).max() * 1.4])
    for t in range(len(lpb)):
        col = _TREE_COLORS[t % 10]
        keep = c[t] & (gain[t] > 0)
        ax.scatter(np.exp(lpb[t][keep]), gain[t][keep], s=16, color=col, zorder=3)
        ax.plot(line, line * (p_sim[t] / p_b[t] - 1), color=col, lw=1.2)
        ax.plot(line, line * (tilt_star[t] - 1), color=col, lw=0.8, ls="--", alpha=0.7)
    slopes = reinforcement_slopes(results)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("base probability π_b(τ), τ ∈ C")
    ax.set_ylabel("gain π(τ) − π_b(τ) after GRPO + KL")
    ax.set_title(f"(b) reinforcement bias (Prop. B.3), kl_coef = β = {beta:g}")
    ax.plot([], [], color="0.3", lw=1.2, label="π_b·(P(π)/P(π_b) − 1): matched correctness")
    ax.plot([], [], color="0.3", lw=0.8, ls="--", label="π_b·(e^(1/β)/Z − 1): Lemma B.1 at β")
    ax.scatter([], [], s=16, color="0.3", label="GRPO + KL (mean of seeds), one colour per tree")
    ax.legend(loc="upper left", fontsize=7)
    ax.text(
        0.98, 0.03,
        f"log-log slope {slopes.mean():.2f} ± {slopes.std():.2f} (theory 1)",
        transform=ax.transAxes, ha="right", va="bottom", fontsize=7.5,
    )  # fmt: skip

    ratio = variance_ratio(results)  # (S, R, U + 1)
    corr = results["b/correctness"].mean(axis=-1)  # (S, R, U + 1)
    steps = np.arange(ratio.shape[-1])
    labels = ["GRPO, no KL", f"GRPO + KL (kl_coef = {beta:g})"]
    colors = ["#1f77b4", "#d62728"]
    for ax, series in ((axes[2], ratio), (axes[3], corr)):
        for s in range(series.shape[0]):
            mean, sd = series[s].mean(axis=0), series[s].std(axis=0)
            ax.plot(steps, mean, color=colors[s], label=labels[s])
            ax.fill_between(steps, mean - sd, mean + sd, color=colors[s], alpha=0.2, lw=0)
        ax.set_xlabel("update")
    axes[2].axhline(1.0, color="k", ls=":", lw=1, label="KL optimum, r̂ = r: V(π*) = V(π_b)")
    axes[2].set_yscale("log")
    axes[2].set_ylabel("normalized variance on C, V(π_t)/V(π_b)")
    axes[2].set_title("(c) sharpening on the correct set")
    axes[2].legend(fontsize=7.5, loc="upper left")
    axes[3].axhline(p_b.mean(), color="k", ls=":", lw=1, label="base policy")
    axes[3].plot(
        [], [], " ", label=f"Lemma B.1 optimum at β = {beta:g}: {(tilt_star * p_b).mean():.2f}"
    )
    axes[3].set_ylabel("correctness P(π_t) (mean over trees)")
    axes[3].set_ylim(0, 1.02)
    axes[3].set_title("(d) correctness over training")
    axes[3].legend(fontsize=7.5, loc="lower right")
    seeds = results["b/correctness"].shape[1]
    fig.text(
        0.5, -0.06,
        f"{len(lpb)} random trees (V = {NUM_ACTIONS}, H = {DEPTH}, M = {NUM_ACTIONS**DEPTH}, "
        f"|C| = {int(c[0].sum())}, base logits ~ N(0, {SKEW:g}²)).\n(a) exact-mode training "
        f"(population gradient, Adam lr {EXACT_LR:g}) of E[r̂] − β·KL to convergence, β = {beta:g}; "
        "an empty r̂ leaves π = π_b.\n(b-d) sampled GRPO "
        f"(G = {GROUP_SIZE}, Adam lr {RL_LR:g}, clip 0.2, {steps[-1]} updates, k3 KL to π_b), "
        f"mean ± sd over {seeds} seeds.\nGRPO normalizes advantages by the group std and its k3 "
        "term regularizes the per-token KL(π_b‖π), so its fixed point is not Lemma B.1's at the "
        "same β: (b) compares the shape (gain ∝ π_b) at matched correctness (solid) and the "
        "nominal-β optimum (dashed).",
        ha="center", va="top", fontsize=7.5,
    )  # fmt: skip
    # Fixed margins: `tight_layout` would draw the figure once more.
    fig.subplots_adjust(left=0.045, right=0.99, bottom=0.13, top=0.92, wspace=0.3)
    return save(fig, out_dir, "fig2_bias")


def summary(results: dict[str, np.ndarray]) -> dict[str, Any]:
    """Selection-bias agreement, the reinforcement-bias slope and `V/V_b` at the end of training."""
    c = results["correct"]
    theory = selection_theory(results["log_pb"], results["sample_sizes"])  # (N, T, M)
    freq = np.moveaxis(results["a/freq_trained"], 1, 0)  # (N, T, M)
    draws = int(results["draws"])
    err = (freq - theory)[:, c]
    se = np.sqrt(theory * (1 - theory) / draws)[:, c]
    slopes = reinforcement_slopes(results)
    ratio = variance_ratio(results)[:, :, -1]  # (S, R)
    corr = results["b/correctness"][:, :, -1].mean(axis=-1)  # (S, R)
    return {
        "selection_bias_mean_abs_error": float(np.abs(err).mean()),
        "selection_bias_within_2se": float(np.mean(np.abs(err) <= 2 * se + 1e-12)),
        "selection_bias_trained_equals_closed_form": bool(
            np.array_equal(results["a/freq_trained"], results["a/freq_closed_form"])
        ),
        "selection_tv_to_closed_form_max": float(results["a/tv_to_closed_form_max"]),
        "reinforcement_loglog_slope": {"mean": float(slopes.mean()), "sd": float(slopes.std())},
        "nvar_ratio_final": {
            f"kl_coef={k:g}": {"mean": float(r.mean()), "sd": float(r.std())}
            for k, r in zip(results["b/kl_coef"], ratio, strict=True)
        },
        "correctness_final": {
            f"kl_coef={k:g}": {"mean": float(r.mean()), "sd": float(r.std())}
            for k, r in zip(results["b/kl_coef"], corr, strict=True)
        },
        "base_correctness_mean": float(base_correctness(results).mean()),
    }


register(
    "bias",
    title="Selection and reinforcement bias: theory vs simulated RL on random trees",
    order=2,
    run=run,
    plot=plot,
    summary=summary,
)
