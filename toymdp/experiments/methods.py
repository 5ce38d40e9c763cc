"""Figure 5: every registry method (`shaping.METHODS`, 16) on random trees and on the multi-prompt toy.

Two environments of equal shapes, both from `toymdp.env.multi_prompt_env` (`V = 3`, `H = 3`,
`M = 27`, `P = 8` prompts of which the last 2 are held out, `|C| = 6` per prompt, base logits
i.i.d. `Normal(0, 1)`, `sharing="factored"`: a shared per-node component plus one per prompt):

- "random trees": `shared_size = 0`, every prompt's correct set is its own random draw (nothing
  transfers between prompts);
- "multi-prompt toy": `shared_size = 2`, two responses are correct for every prompt (a skill that
  transfers to held-out prompts), the other four are the prompt's own.

Training: sampled RLVR (`toymdp.train`), groups of `G = 8` per training prompt, `U` updates of one
epoch, Adam at learning rate 0.1, clipping 0.2, no KL term, over `R` seeds. Hyper-parameters are
the registry defaults except the trajectory-level log-probability coefficients, which are those of
figures 6 and 7 (`toymdp.experiments.passk`: `γ_p = 0.1`, `γ_n = 0.05`, `η = 0.1`), since a toy
response has `|log π| ≈ log 27 ≈ 3.3` nats where seed 000's defaults assume hundreds of tokens.

Metrics are exact (`toymdp.metrics`), averaged over the training prompts: correctness `P(π)`,
expected distinct correct responses in `K = 16` samples, normalized variance on `C` (lower = more
diverse) and trajectory entropy; held-out correctness of the toy goes to the summary.

Compilation dominates: one program per method (16). `toymdp.train.make_train` bakes its
environment's arrays into the program as constants, so two environments would cost 32 programs;
`train_over_envs` instead traces `make_train` with the environment's base logits and correct sets
as data (the two environments share every static field), and one program per method trains both.
A test checks it against `make_train` on the environment itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import matplotlib.pyplot as plt
import numpy as np

import shaping
from experiment.report import METHOD_COLORS
from toymdp import train as T
from toymdp.engine import run_compiled, train_over_envs
from toymdp.env import TreeEnv, multi_prompt_env
from toymdp.experiments import passk
from toymdp.experiments._plot import save
from toymdp.experiments._registry import register

NUM_ACTIONS, DEPTH, NUM_PROMPTS, NUM_HELDOUT, CORRECT_SIZE = 3, 3, 8, 2, 6
SHARED_SIZES = {"random trees": 0, "multi-prompt toy": 2}
GROUP_SIZE, LEARNING_RATE, DISTINCT_K = 8, 0.1, 16
METRICS = ("correctness", "distinct_correct", "normalized_variance", "entropy")
METRIC_LABELS = {
    "correctness": "correctness P(π)",
    "distinct_correct": f"distinct correct in K = {DISTINCT_K} samples",
    "normalized_variance": "normalized variance on C (↓ diverse)",
    "entropy": "entropy (nats)",
}

#: Overrides of the registry defaults (module docstring).
HYPER: dict[str, dict[str, float]] = {
    "ds_grpo": {"gamma_p": passk.GAMMA_P, "gamma_n": passk.GAMMA_N},
    "ds_grpo_pos": {"gamma_p": passk.GAMMA_P},
    "ds_grpo_neg": {"gamma_n": passk.GAMMA_N},
    "entropy_bonus": {"eta": passk.ETA},
    "entropy_penalty": {"eta": passk.ETA},
}

#: Quick mode compiles only these (16 compilations alone take longer than its 4 s budget).
QUICK_METHODS = ("grpo", "ds_grpo", "entropy_bonus", "casp")

SIZES: dict[bool, dict[str, int]] = {
    False: {"num_updates": 100, "num_seeds": 5},
    True: {"num_updates": 30, "num_seeds": 2},
}


def environments(rng: np.random.Generator) -> list[TreeEnv]:
    """The two environments (module docstring), in the order of `SHARED_SIZES`."""
    sizes = {
        "num_prompts": NUM_PROMPTS,
        "num_heldout": NUM_HELDOUT,
        "num_actions": NUM_ACTIONS,
        "depth": DEPTH,
        "correct_size": CORRECT_SIZE,
    }
    return [
        multi_prompt_env(rng, shared_size=shared, sharing="factored", **sizes)
        for shared in SHARED_SIZES.values()
    ]


def _prompt_means(x: jax.Array, train_prompts: np.ndarray) -> jax.Array:
    """`(..., P)` -> `(..., 2)`: means over training and held-out prompts."""
    return jax.numpy.stack(
        [x[..., train_prompts].mean(axis=-1), x[..., ~train_prompts].mean(axis=-1)], axis=-1
    )


def run_method(
    method: str, envs: Sequence[TreeEnv], num_updates: int, keys: jax.Array
) -> dict[str, np.ndarray]:
    """Train `method` on every environment × seed in one compiled program.

    Returns:
        `{metric: (E, R, U + 1, 2)}`, the last axis (training prompts, held-out prompts).
    """
    config = T.TrainConfig(
        envs[0], method=method, method_hyper=HYPER.get(method, {}), group_size=GROUP_SIZE,
        num_updates=num_updates, learning_rate=LEARNING_RATE, distinct_k=(DISTINCT_K,),
        pass_k=(1,),
    )  # fmt: skip
    train = jax.vmap(train_over_envs(config), (None, None, None, 0))  # seeds
    train = jax.vmap(train, (0, 0, None, None))  # environments
    train_prompts = envs[0].train_prompts
    base = np.stack([e.base_logits for e in envs]).astype(np.float32)
    correct = np.stack([e.correct for e in envs])

    def program(settings: T.Settings, keys: jax.Array) -> dict[str, jax.Array]:
        exact = train(base, correct, settings, keys)["exact"]
        out = {k: exact[k] for k in METRICS}
        out["distinct_correct"] = out["distinct_correct"][..., 0]
        return {k: _prompt_means(v, train_prompts) for k, v in out.items()}

    return run_compiled(program, T.default_settings(config), keys)


def run(quick: bool, seed: int) -> dict[str, np.ndarray]:
    """Every method (quick: `QUICK_METHODS`) on both environments; deterministic given the seed.

    Returns:
        `methods` `(16,)`, `envs` `(2,)`, `train_prompts` `(P,)`, and per metric
        `(methods, E, R, U + 1, 2)` (last axis: training, held-out prompts).
    """
    size = SIZES[quick]
    envs = environments(np.random.default_rng(seed))
    for env in envs[1:]:
        if env.train_prompts.tolist() != envs[0].train_prompts.tolist():
            raise ValueError("the environments must share their training prompts")
    names = QUICK_METHODS if quick else tuple(shaping.METHODS)
    keys = T.seed_keys(seed, size["num_seeds"])
    per = [run_method(m, envs, size["num_updates"], keys) for m in names]
    return {
        "methods": np.asarray(names),
        "envs": np.asarray(list(SHARED_SIZES)),
        "train_prompts": envs[0].train_prompts,
        **{k: np.stack([p[k] for p in per]).astype(np.float32) for k in METRICS},
    }


# ------------------------------------------------------------------------------------ figure


def _label(name: str) -> str:
    return passk.LABELS.get(name, name)


def plot(results: dict[str, np.ndarray], out_dir: Path) -> list[Path]:
    """Rows: environments. Columns: the four metrics over training (mean ± sd over seeds, training
    prompts), then the final error rate `1 − P(π)` against distinct correct and against normalized
    variance (the correctness-diversity trade-off map)."""
    names, envs = list(results["methods"]), list(results["envs"])
    n_up = results["correctness"].shape[3] - 1
    seeds = results["correctness"].shape[2]
    fig, axes = plt.subplots(len(envs), 6, figsize=(21, 4.0 * len(envs)), squeeze=False)
    steps = np.arange(n_up + 1)
    for e, env_name in enumerate(envs):
        for col, key in enumerate(METRICS):
            ax = axes[e, col]
            for i, name in enumerate(names):
                y = results[key][i, e, :, :, 0]  # (R, U + 1)
                mean, sd = y.mean(axis=0), y.std(axis=0)
                color = METHOD_COLORS.get(name, "0.5")
                ax.plot(steps, mean, color=color, lw=1.1, label=_label(name))
                ax.fill_between(steps, mean - sd, mean + sd, color=color, alpha=0.12, lw=0)
            ax.set_xlabel("update")
            ax.set_ylabel(METRIC_LABELS[key])
            ax.set_title(f"{env_name}: {METRIC_LABELS[key].split(' (')[0]}")
        final = {k: results[k][:, e, :, -1, 0] for k in METRICS}  # (methods, R)
        for col, key in ((4, "distinct_correct"), (5, "normalized_variance")):
            ax = axes[e, col]
            for i, name in enumerate(names):
                x, y = final[key][i], 1.0 - final["correctness"][i]
                ax.errorbar(
                    x.mean(), y.mean(), xerr=x.std(), yerr=y.std(), fmt="o", ms=5,
                    color=METHOD_COLORS.get(name, "0.5"), elinewidth=0.8,
                )  # fmt: skip
                ax.annotate(
                    _label(name), (x.mean(), y.mean()), fontsize=6.5,
                    xytext=(3, 3), textcoords="offset points",
                )  # fmt: skip
            ax.set_yscale("log")
            ax.invert_yaxis()  # up = more correct
            ax.set_xlabel(f"final {METRIC_LABELS[key]}")
            ax.set_ylabel("final error rate 1 − P(π) (log; up = more correct)")
            ax.set_title(f"{env_name}: trade-off after {n_up} updates")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=8, fontsize=8, bbox_to_anchor=(0.5, 1.06))
    fig.text(
        0.5, -0.02,
        f"Both environments: toymdp.env.multi_prompt_env, V = {NUM_ACTIONS}, H = {DEPTH}, "
        f"P = {NUM_PROMPTS} prompts ({NUM_HELDOUT} held out), |C| = {CORRECT_SIZE}, base logits "
        "~ N(0, 1), factored policy (shared + per-prompt logits); random trees: no shared correct "
        f"response; multi-prompt toy: {SHARED_SIZES['multi-prompt toy']} responses correct for "
        f"every prompt. Sampled RLVR, G = {GROUP_SIZE}, Adam lr {LEARNING_RATE:g}, clip 0.2, no "
        f"KL, {n_up} updates, mean ± sd over {seeds} seeds, training prompts.\nRegistry defaults "
        f"except γ_p = {passk.GAMMA_P:g}, γ_n = {passk.GAMMA_N:g} (DS-GRPO family) and "
        f"η = {passk.ETA:g} (trajectory-form entropy bonus/penalty). Metrics are exact (enumeration "
        "of all 27 responses).",
        ha="center", va="top", fontsize=8,
    )  # fmt: skip
    # Fixed margins: `tight_layout` would draw the figure once more (drawing is what costs here).
    fig.subplots_adjust(left=0.04, right=0.99, bottom=0.07, top=0.95, wspace=0.32, hspace=0.3)
    return save(fig, out_dir, "fig5_methods")


def summary(results: dict[str, np.ndarray]) -> dict[str, Any]:
    """Final metrics per environment and method (mean and sd over seeds, training prompts), and
    the toy's held-out correctness."""
    out: dict[str, Any] = {}
    for e, env_name in enumerate(results["envs"]):
        table = {}
        for i, name in enumerate(results["methods"]):
            row = {}
            for key in METRICS:
                v = results[key][i, e, :, -1, 0].astype(np.float64)
                row[key] = {"mean": round(float(v.mean()), 6), "sd": round(float(v.std()), 6)}
            if e == len(results["envs"]) - 1:
                h = results["correctness"][i, e, :, -1, 1].astype(np.float64)
                row["heldout_correctness"] = {"mean": float(h.mean()), "sd": float(h.std())}
            table[str(name)] = row
        out[str(env_name)] = table
    return out


register(
    "methods",
    title="All registry methods: correctness, distinct correct, normalized variance, entropy",
    order=5,
    run=run,
    plot=plot,
    summary=summary,
)
