"""Figure 6: pass@k minus base pass@k over k, GRPO vs DS-GRPO, on held-out and training prompts.

The shape of seed 000 §4.5's table (GRPO − Base and DS-GRPO − Base for K = 1..8192): there GRPO
gains at small k and loses to the base model at large k, while DS-GRPO keeps a gain at every k.

The toy dataset (`toy_dataset`, shared with figure 7). A tree with V = 4 actions and depth H = 3
(M = 64 responses) and 80 prompts, 16 for each solution multiplicity `|C| ∈ {1, 2, 4, 8, 16}`,
half of them held out. Correct sets are drawn by popularity: trajectory `τ` has weight
`∝ 1/rank(τ)` (Zipf, exponent 1, over a random order), so a few responses are correct for many
prompts (a skill that transfers) and most are correct for few. Each prompt's base policy is a
random tabular policy (logits i.i.d. Normal(0, 1)) tilted so that its correctness is exactly
`BASE_CORRECTNESS = 0.05`: every prompt is equally hard for the base model, whatever its
multiplicity. The policy is `sharing="factored"` (`toymdp.env`): a shared per-node component, the
only thing a held-out prompt sees, plus one per training prompt. `toymdp.env.multi_prompt_env` is
not used: its common trajectories are correct for *every* prompt, so sharpening onto them can only
help a held-out prompt, and the large-k loss the paper reports cannot appear.

Training: sampled RLVR (`toymdp.train`), groups of G = 8 per training prompt, U = 100 updates (quick: 30) of
one epoch, Adam at learning rate 0.1, no KL term, clipping 0.2. Every method is the registry's
`ds_grpo` with its `(γ_p, γ_n)` as data, so one compiled program runs all methods × seeds:
GRPO (0, 0), DS-GRPO (0.1, 0.05), DS-Positive (0.1, 0), DS-Negative (0, 0.05), and for figure 7
the global entropy bonus (η, −η) and penalty (−η, η) with η = 0.1, which are exactly the
trajectory-form `entropy_bonus` / `entropy_penalty` advantages `A − η·ℓ` / `A + η·ℓ` (seed 000
Lemma B.4; a test checks the equality). The coefficients are larger than seed 000's
(0.01..0.03, 0.002..0.01) because a toy response has `|ℓ| ≈ log 64 ≈ 4` nats, not hundreds:
`γ·|ℓ|` is about 0.2..0.4 of a unit advantage here.

pass@k of a prompt is exact, `1 − (1 − P(π))^k` (`toymdp.metrics`), averaged over prompts; the
spread is the standard deviation over training seeds (the dataset is fixed by `seed`).
"""

from __future__ import annotations

import functools
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from theory import trees
from toymdp import train as T
from toymdp.env import TreeEnv
from toymdp.experiments._plot import METHOD_COLORS, mean_and_spread, save
from toymdp.experiments._registry import register

NUM_ACTIONS, DEPTH = 4, 3
MULTIPLICITIES = (1, 2, 4, 8, 16)
BASE_CORRECTNESS = 0.05
ZIPF = 1.0
SKEW = 1.0
GROUP_SIZE, LEARNING_RATE = 8, 0.1
PASS_K = (1, 2, 4, 8, 16, 32, 64, 128, 256)
GAMMA_P, GAMMA_N, ETA = 0.1, 0.05, 0.1

#: `(γ_p, γ_n)` of `ds_grpo` for every method of figures 6 and 7.
METHODS: dict[str, tuple[float, float]] = {
    "grpo": (0.0, 0.0),
    "ds_grpo": (GAMMA_P, GAMMA_N),
    "ds_grpo_pos": (GAMMA_P, 0.0),
    "ds_grpo_neg": (0.0, GAMMA_N),
    "entropy_bonus": (ETA, -ETA),
    "entropy_penalty": (-ETA, ETA),
}
LABELS = {
    "grpo": "GRPO",
    "ds_grpo": "DS-GRPO",
    "ds_grpo_pos": "DS-Positive",
    "ds_grpo_neg": "DS-Negative",
    "entropy_bonus": "entropy bonus",
    "entropy_penalty": "entropy penalty",
}
FIG6_METHODS = ("grpo", "ds_grpo", "ds_grpo_pos", "ds_grpo_neg")

#: Sizes by mode: training and held-out prompts per multiplicity, updates, seeds.
SIZES = {
    False: {"per_size": 8, "num_updates": 100, "num_seeds": 8},
    True: {"per_size": 2, "num_updates": 30, "num_seeds": 2},
}


def toy_dataset(rng: np.random.Generator, per_size: int) -> TreeEnv:
    """The popularity toy dataset (module docstring): `per_size` training then `per_size`
    held-out prompts for each multiplicity in `MULTIPLICITIES`, training prompts first.

    Returns:
        A `TreeEnv` with `P = 2·per_size·len(MULTIPLICITIES)` prompts; every base policy has
        correctness `BASE_CORRECTNESS` exactly.
    """
    v, h = NUM_ACTIONS, DEPTH
    m = trees.num_trajectories(v, h)
    popularity = np.empty(m)
    popularity[rng.permutation(m)] = 1.0 / np.arange(1, m + 1) ** ZIPF
    popularity /= popularity.sum()
    sizes = np.tile(np.repeat(MULTIPLICITIES, per_size), 2)  # (P,)
    correct = np.zeros((sizes.size, m), dtype=bool)
    for p, size in enumerate(sizes):
        correct[p, rng.choice(m, size=size, replace=False, p=popularity)] = True
    log_pb = trees.trajectory_log_probs(
        np.stack([trees.random_base_logits(rng, v, h, SKEW) for _ in sizes]), v, h
    )  # (P, M)
    # Tilt: rescale the mass on C to BASE_CORRECTNESS and off C to the rest, keeping the
    # base policy's preferences within C and within its complement.
    masked = np.where(correct, log_pb, -np.inf)
    log_pc = np.logaddexp.reduce(masked, axis=-1, keepdims=True)
    log_pw = np.logaddexp.reduce(np.where(correct, -np.inf, log_pb), axis=-1, keepdims=True)
    tilted = np.where(
        correct,
        np.log(BASE_CORRECTNESS) + log_pb - log_pc,
        np.log1p(-BASE_CORRECTNESS) + log_pb - log_pw,
    )
    base = trees.logits_from_log_probs(tilted, v, h)
    train = np.arange(sizes.size) < sizes.size // 2
    return TreeEnv(v, h, correct, base, train, sharing="factored")


def multiplicities(per_size: int) -> np.ndarray:
    """`|C|` of every prompt of `toy_dataset(rng, per_size)`, `(P,)` int."""
    return np.tile(np.repeat(MULTIPLICITIES, per_size), 2)


@functools.lru_cache(maxsize=2)
def _train_all(quick: bool, seed: int) -> dict[str, np.ndarray]:
    sizes = SIZES[quick]
    env = toy_dataset(np.random.default_rng(seed), sizes["per_size"])
    config = T.TrainConfig(
        env,
        method="ds_grpo",
        group_size=GROUP_SIZE,
        num_updates=sizes["num_updates"],
        learning_rate=LEARNING_RATE,
        pass_k=PASS_K,
    )
    settings = T.stack_settings(
        [T.default_settings(config, gamma_p=gp, gamma_n=gn) for gp, gn in METHODS.values()]
    )
    keys = T.seed_keys(seed, sizes["num_seeds"])
    out = T.run_grid(config, settings, keys, fast_compile=quick)
    pass_at_k = np.asarray(out["exact"]["pass_at_k"], dtype=np.float64)  # (S, R, U+1, P, k)
    results = {
        "methods": np.array(list(METHODS)),
        "gamma_p": np.array([gp for gp, _ in METHODS.values()]),
        "gamma_n": np.array([gn for _, gn in METHODS.values()]),
        "pass_k": np.array(PASS_K),
        "multiplicity": multiplicities(sizes["per_size"]),
        "train_prompts": env.train_prompts.copy(),
        "base_pass_at_k": pass_at_k[0, 0, 0],  # (P, k)
        "pass_at_k": pass_at_k[:, :, -1],  # (S, R, P, k)
        "num_updates": np.array(sizes["num_updates"]),
        "num_seeds": np.array(sizes["num_seeds"]),
    }
    for arr in results.values():
        arr.setflags(write=False)
    return results


def train_all(quick: bool, seed: int) -> dict[str, np.ndarray]:
    """Train every method of `METHODS` on the toy dataset (one compiled program, memoized so
    figures 6 and 7 share one run).

    Returns:
        ``methods`` `(S,)`, ``pass_k`` `(k,)`, ``multiplicity`` and ``train_prompts`` `(P,)`,
        ``base_pass_at_k`` `(P, k)`, ``pass_at_k`` `(S, R, P, k)` of the final policies, and the
        sizes used. Arrays are read-only.
    """
    return _train_all(bool(quick), int(seed))


def select_methods(results: dict[str, np.ndarray], names: tuple[str, ...]) -> dict:
    """`results` restricted to the methods `names` (along the leading `S` axis)."""
    index = [list(results["methods"]).index(n) for n in names]
    per_method = {"methods", "gamma_p", "gamma_n", "pass_at_k"}
    return {k: (v[index] if k in per_method else v) for k, v in results.items()}


def gain_over_base(results: dict[str, np.ndarray], prompts: np.ndarray) -> np.ndarray:
    """pass@k − base pass@k, averaged over the selected prompts: `(S, R, k)`."""
    delta = results["pass_at_k"] - results["base_pass_at_k"]  # (S, R, P, k)
    return delta[:, :, prompts].mean(axis=2)


def run(quick: bool, seed: int) -> dict[str, np.ndarray]:
    """Results of figure 6 (the DS-GRPO family's part of `train_all`)."""
    return select_methods(train_all(quick, seed), FIG6_METHODS)


def _settings_text(results: dict[str, np.ndarray]) -> str:
    return (
        f"V={NUM_ACTIONS}, H={DEPTH} (64 responses); {results['multiplicity'].size} prompts, "
        f"|C| in {list(MULTIPLICITIES)}, half held out; base correctness {BASE_CORRECTNESS} "
        f"per prompt; shared + per-prompt policy; G={GROUP_SIZE}, U={int(results['num_updates'])}"
        f", Adam lr={LEARNING_RATE}; DS (γp, γn)=({GAMMA_P}, {GAMMA_N}); "
        f"mean ± sd over {int(results['num_seeds'])} seeds"
    )


def plot(results: dict[str, np.ndarray], out_dir: Path) -> list[Path]:
    """`fig6_passk`: pass@k − base pass@k against k, held-out (left) and training (right)."""
    ks = results["pass_k"]
    train = results["train_prompts"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, (title, prompts) in zip(
        axes, (("held-out prompts", ~train), ("training prompts", train)), strict=True
    ):
        gain = 100 * gain_over_base(results, prompts)  # (S, R, k)
        for i, name in enumerate(results["methods"]):
            mean, sd = mean_and_spread(gain[i])
            color = METHOD_COLORS[str(name)]
            ax.plot(ks, mean, "o-", ms=3, color=color, label=LABELS[str(name)])
            ax.fill_between(ks, mean - sd, mean + sd, color=color, alpha=0.2, lw=0)
        ax.axhline(0.0, color=METHOD_COLORS["base"], lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("k (samples per prompt)")
        ax.set_title(f"{title} ({int(prompts.sum())})")
    axes[0].set_ylabel("pass@k − base pass@k (percentage points)")
    axes[0].legend(loc="upper right")
    fig.suptitle("Fig. 6 — pass@k gain over the base policy (shape of seed 000 §4.5)")
    fig.tight_layout()
    fig.text(0.5, -0.06, _settings_text(results), ha="center", fontsize=7.5, wrap=True)
    return save(fig, out_dir, "fig6_passk")


def summary(results: dict[str, np.ndarray]) -> dict:
    """pass@k − base pass@k (points) at every k, per method, held-out and training: mean, sd."""
    train = results["train_prompts"]
    out: dict = {"pass_k": results["pass_k"].tolist()}
    for split, prompts in (("heldout", ~train), ("train", train)):
        gain = 100 * gain_over_base(results, prompts)
        out[f"{split}_base_pass_at_k"] = np.round(
            100 * results["base_pass_at_k"][prompts].mean(axis=0), 2
        ).tolist()
        for i, name in enumerate(results["methods"]):
            mean, sd = mean_and_spread(gain[i])
            out[f"{split}_gain/{name}"] = {
                "mean": np.round(mean, 2).tolist(),
                "sd": np.round(sd, 2).tolist(),
            }
    return out


register(
    "passk",
    title="pass@k minus base pass@k over k, GRPO vs DS-GRPO, held-out and training prompts",
    order=6,
    run=run,
    plot=plot,
    summary=summary,
)
