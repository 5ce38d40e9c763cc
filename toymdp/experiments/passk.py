"""Figure 6: held-out trade-off frontiers of figure 5's methods against GRPO's own curve.

The question: does a shaping method buy more diversity (pass@k at large k, distinct correct
responses) per unit of correctness (pass@1) than GRPO's own trade-off? One coefficient per method
cannot answer it, so each method of figure 5 that acts on-policy is swept from no effect to
collapse (`sweep_doc`, run by `toymdp.sweep`), and each final point is compared with GRPO's
curve at the same held-out pass@1: GRPO's checkpoints along training, a `kl_coef` sweep and two
other learning rates
(`experiment.inference.lift_inference`: the lift at matched pass@1 over the concave hull of GRPO's
models, with its t interval over seeds × dataset draws).

The popularity toy dataset (`toy_dataset`; `toymdp.environments.popularity_dataset` is the same with its
constants as arguments). A tree with V = 4 actions and depth H = 3 (M = 64 responses), prompts for
each solution multiplicity `|C| ∈ {1, 2, 4, 8, 16}`, half held out. Correct sets are drawn by
popularity: trajectory `τ` has weight `∝ 1/rank(τ)` (Zipf, exponent 1, over a random order), so a
few responses are correct for many prompts (a skill that transfers) and most are correct for few.
Each prompt's base policy is a random tabular policy (logits i.i.d. Normal(0, 1)) tilted so that
its correctness is exactly the base correctness: every prompt is equally hard for the base model,
whatever its multiplicity. Figure 6 uses 0.02 (base pass@64 = 1 − 0.98^64 ≈ 0.73, leaving headroom
at large k). The policy is `sharing="factored"` (`toymdp.env`): a shared per-node component, the
only thing a held-out prompt sees, plus one per training prompt.

Training: sampled RLVR (`toymdp.train`), groups of G = 8 per training prompt, Adam, one epoch,
clipping 0.2. Trajectory-level log-probability coefficients (DS-GRPO's γ, the entropy η) are larger
than seed 000's because a toy response has `|ℓ| ≈ log 64 ≈ 4` nats, not hundreds.

Figure 7 (`toymdp.experiments.multiplicity`) still uses the fixed-coefficient run `train_all` on
the dataset with base correctness 0.05 (`BASE_CORRECTNESS`): GRPO (0, 0), DS-GRPO (0.1, 0.05),
DS-Positive (0.1, 0), DS-Negative (0, 0.05), and the global entropy bonus (η, −η) and penalty
(−η, η) with η = 0.1, all as `ds_grpo` settings, which are exactly the trajectory-form
`entropy_bonus` / `entropy_penalty` advantages `A − η·ℓ` / `A + η·ℓ` (seed 000 Lemma B.4; a test
checks the equality).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from experiment import estimand, inference
from experiment.report import METHOD_COLORS
from toymdp import environments, sweep, sweep_spec
from toymdp import train as T
from toymdp.env import TreeEnv
from toymdp.experiments._plot import save
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

#: Sizes by mode: training and held-out prompts per multiplicity, updates, seeds.
SIZES = {
    False: {"per_size": 2, "num_updates": 30, "num_seeds": 4},
    True: {"per_size": 2, "num_updates": 30, "num_seeds": 2},
}


def toy_dataset(rng: np.random.Generator, per_size: int) -> TreeEnv:
    """The popularity toy dataset (module docstring): `per_size` training then `per_size`
    held-out prompts for each multiplicity in `MULTIPLICITIES`, training prompts first;
    `toymdp.environments.popularity_dataset` with this module's constants.

    Returns:
        A `TreeEnv` with `P = 2·per_size·len(MULTIPLICITIES)` prompts; every base policy has
        correctness `BASE_CORRECTNESS` exactly.
    """
    spec = sweep_spec.parse_env(
        {"kind": "dataset", "num_actions": NUM_ACTIONS, "depth": DEPTH, "skew": SKEW,
         "zipf": ZIPF, "multiplicities": list(MULTIPLICITIES), "per_size": per_size,
         "base_correctness": BASE_CORRECTNESS}
    )  # fmt: skip
    return environments.popularity_dataset(rng, spec)


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


# ------------------------------------------------------------------------------ figure 6: frontier

#: The lift tables' diversity measures: pass@k at the largest k, distinct correct responses.
MEASURES = ("pass_at_k", "distinct_correct")
#: Coefficients swept from "no effect" to collapse (≥ 4 values); `grid`/`zip` as in
#: `toymdp.sweep`. Trajectory-level log-prob coefficients are toy-scale (module docstring).
#: DSDR's reward bonus `λ·min(s, σ)` is constant on this toy at the default cap σ = 0.5 (every
#: response of a group is equally novel), so σ = 1 and λ and the local-entropy weight move together.
#: Methods without a float diversity coefficient sweep their learning rate: Dr. GRPO, PSR, NSR, and
#: pass@k training and PKPO at k = 4 (`k` changes the compiled program, one compilation per value).
FRONTIER_METHODS: tuple[dict, ...] = (
    {"method": "diff_entropy", "zip": {"eta_pos": [0.03, 0.1, 0.3, 1.0], "eta_neg": [0.03, 0.1, 0.3, 1.0]}},
    {"method": "dsdr", "fixed": {"sigma": 1.0},
     "zip": {"lam": [0.1, 0.3, 1.0, 3.0], "lam_loc": [0.03, 0.1, 0.3, 1.0]}},
    {"method": "progrpo", "grid": {"alpha": [0.3, 1.0, 3.0, 10.0]}},
    {"method": "casp", "grid": {"alpha": [0.03, 0.1, 0.3, 1.0]}},
    {"method": "unlikeliness", "grid": {"beta_rank": [0.25, 0.5, 0.75, 1.0]}},
    {"method": "passk", "fixed": {"k": 4}, "grid": {"lr": [0.03, 0.1, 0.3, 1.0]}},
    {"method": "w_reinforce", "grid": {"lam": [0.03, 0.1, 0.3, 1.0]}},
    {"method": "dr_grpo", "grid": {"lr": [0.03, 0.1, 0.3, 1.0]}},
    {"method": "psr", "grid": {"lr": [0.03, 0.1, 0.3, 1.0]}},
    {"method": "nsr", "grid": {"lr": [0.03, 0.1, 0.3, 1.0]}},
    # The field's policy losses beside GRPO's surrogate that act on-policy (the others,
    # `shaping.OFF_POLICY_ONLY`, are GRPO here: one optimizer step per batch). Clip-Cov's band
    # starts at 0: toy covariances are O(1).
    {"method": "clip_cov", "fixed": {"clip_cov_lb": 0.0},
     "grid": {"clip_cov_ratio": [0.02, 0.05, 0.1, 0.2]}},
    {"method": "entropy_adv", "grid": {"alpha": [0.1, 0.4, 1.0, 3.0]}},
    {"method": "lite_ppo", "grid": {"lr": [0.03, 0.1, 0.3, 1.0]}},
    {"method": "grpo_passk", "grid": {"lr": [0.03, 0.1, 0.3, 1.0]}},
    {"method": "pkpo", "fixed": {"k": 4}, "grid": {"lr": [0.03, 0.1, 0.3, 1.0]}},
)  # fmt: skip
#: The family run as `ds_grpo` settings `(γ_p, γ_n, kl_coef, lr)` in ONE compiled program
#: (compilation dominates the budget): GRPO (0, 0), DS-GRPO (γ, γ/2), DS-Positive (γ, 0),
#: DS-Negative (0, γ), entropy bonus (η, −η) and penalty (−η, η), the last two exactly the
#: trajectory-form advantages `A ∓ η·ℓ` (seed 000 Lemma B.4; tests check every equality).
#: GRPO's reference: every checkpoint (every 2 updates) of a `kl_coef` sweep at lr 0.1 and of
#: lr 0.15, 0.2, 0.3 (which reach the pass@1 gains of methods that sharpen faster than GRPO at
#: lr 0.1; without them the reference's curve ends where GRPO at lr 0.1 stops).
FAMILY: dict[bool, tuple[tuple[str, dict[str, float], tuple[float, float, float, float]], ...]] = {
    False: (
        *(("grpo", {"kl_coef": k, "lr": 0.1}, (0.0, 0.0, k, 0.1)) for k in (0.0, 0.03, 0.1, 0.3, 1.0)),
        *(("grpo", {"kl_coef": 0.0, "lr": lr}, (0.0, 0.0, 0.0, lr)) for lr in (0.15, 0.2, 0.3)),
        *(("ds_grpo", {"gamma_p": g, "gamma_n": g / 2}, (g, g / 2, 0.0, 0.1)) for g in (0.1, 0.3, 1.0, 3.0)),
        *(("ds_grpo_pos", {"gamma_p": g}, (g, 0.0, 0.0, 0.1)) for g in (0.1, 0.3, 1.0, 3.0)),
        *(("ds_grpo_neg", {"gamma_n": g}, (0.0, g, 0.0, 0.1)) for g in (0.03, 0.1, 0.3, 1.0)),
        *(("entropy_bonus", {"eta": e}, (e, -e, 0.0, 0.1)) for e in (0.03, 0.1, 0.3, 1.0)),
        *(("entropy_penalty", {"eta": e}, (-e, e, 0.0, 0.1)) for e in (0.01, 0.03, 0.1, 0.3)),
    ),
    True: (
        ("grpo", {"kl_coef": 0.0, "lr": 0.1}, (0.0, 0.0, 0.0, 0.1)),
        ("grpo", {"kl_coef": 0.1, "lr": 0.1}, (0.0, 0.0, 0.1, 0.1)),
        ("grpo", {"kl_coef": 0.0, "lr": 0.3}, (0.0, 0.0, 0.0, 0.3)),
        *(("ds_grpo", {"gamma_p": g, "gamma_n": g / 2}, (g, g / 2, 0.0, 0.1)) for g in (0.1, 0.3, 1.0)),
        *(("entropy_bonus", {"eta": e}, (e, -e, 0.0, 0.1)) for e in (0.1, 1.0)),
    ),
}  # fmt: skip
FAMILY_LABEL = "ds_family"


def _family_entry(quick: bool) -> dict:
    rows = [v for _, _, v in FAMILY[quick]]
    names = ("gamma_p", "gamma_n", "kl_coef", "lr")
    return {"method": "ds_grpo", "label": FAMILY_LABEL,
            "zip": {n: [r[j] for r in rows] for j, n in enumerate(names)}}  # fmt: skip


def sweep_doc(quick: bool, seed: int) -> dict:
    """Figure 6's `toymdp.sweep` configuration (a parsed TOML document, `toymdp.sweep`'s keys).

    Full: V = 4, H = 3, three draws of the popularity dataset (2 training + 2 held-out prompts
    per multiplicity: 30 held-out prompts in all), base correctness 0.02 (base pass@64 ≈ 0.73),
    4 seeds, 24 updates, every method of figure 5 but those that differ from GRPO only
    off-policy (`shaping.OFF_POLICY_ONLY`: GRPO here, one optimizer step per batch). Quick: V = 3, H = 2, two draws, GRPO, DS-GRPO and the entropy bonus.
    The `FAMILY` entry is the reference here; `method_rows` gives every row its method's label.
    """
    if quick:
        env = {"num_actions": 3, "depth": 2, "draws": [seed, seed + 1], "multiplicities": [1, 2, 4],
               "per_size": 2, "base_correctness": 0.1}  # fmt: skip
        train = {"updates": 12, "pass_k": [1, 4, 16], "distinct_k": 8, "fast_compile": True}
        seeds, checkpoints = [0, 1], [4, 8, 12]
        methods = [_family_entry(True)]
        resamples = 200
    else:
        env = {"num_actions": NUM_ACTIONS, "depth": DEPTH,
               "draws": [3 * seed, 3 * seed + 1, 3 * seed + 2],
               "multiplicities": list(MULTIPLICITIES), "per_size": 2, "base_correctness": 0.02}  # fmt: skip
        train = {"updates": 24, "pass_k": [1, 4, 16, 64], "distinct_k": 64}
        seeds, checkpoints = [0, 1, 2, 3], list(range(2, 25, 2))
        methods = [_family_entry(False), *FRONTIER_METHODS]
        resamples = 1000
    env = {"kind": "dataset", "skew": SKEW, "zipf": ZIPF, **env}
    train = {"optimizer": "adam", "lr": LEARNING_RATE, "group_size": GROUP_SIZE, "epochs": 1,
             "kl_coef": 0.0, "seed": seed, **train}  # fmt: skip
    return {
        "seeds": seeds,
        "checkpoints": checkpoints,
        "reference": [FAMILY_LABEL],
        "env": env,
        "train": train,
        "methods": [dict(m) for m in methods],
        "frontier": {"num_resamples": resamples},
    }


def method_rows(cfg: Any, quick: bool) -> list:
    """`toymdp.sweep.all_rows(cfg)` with the `FAMILY` rows relabelled by their method (GRPO,
    DS-GRPO, ..., entropy penalty) and their own coefficients."""
    rows, out, j = sweep.all_rows(cfg), [], 0
    for r in rows:
        if r.label == FAMILY_LABEL:
            name, values, _ = FAMILY[quick][j]
            j += 1
            r = sweep.Run(name, name, dict(values), {})
        out.append(r)
    return out


def run(quick: bool, seed: int) -> dict[str, np.ndarray]:
    """Figure 6: the `sweep_doc` sweep (`toymdp.sweep.run_sweep`, one compiled program per
    method and non-float value).

    Returns:
        ``quick``, ``seed`` (to rebuild the configuration), ``row_order`` `(N,)`,
        ``train_prompts`` `(P,)`, and per `toymdp.sweep.METRICS` name `(N, D, R, T, P[, k])`.
    """
    cfg = sweep_spec.parse_config(sweep_doc(quick, seed), check_bounds=False)  # signed family
    res = sweep.run_sweep(cfg, progress=False)
    out = {k: np.asarray(v) for k, v in res.items() if k != "rows"}
    return {"quick": np.asarray(quick), "seed": np.asarray(seed), **out}


_ANALYSES: dict[tuple, tuple] = {}


def analysis(results: dict[str, np.ndarray]) -> tuple[Any, dict[str, Any], list[str]]:
    """`(config, toymdp.sweep.analyse(...), method labels)` of figure 6's results, GRPO's rows
    as the reference, each other row read at its final update (``paths=False``: the figure
    compares final points) (memoized: the plot and the summary share one analysis)."""
    key = (bool(results["quick"]), int(results["seed"]), results["correctness"].tobytes())
    if key not in _ANALYSES:
        quick = bool(results["quick"])
        cfg = sweep_spec.parse_config(sweep_doc(quick, int(results["seed"])), check_bounds=False)
        rows = method_rows(cfg, quick)
        cfg = dataclasses.replace(cfg, reference=("grpo",))
        res = dict(results)
        res["rows"] = [rows[int(i)] for i in results["row_order"]]
        _ANALYSES.clear()
        labels = list(dict.fromkeys(r.label for r in rows))
        _ANALYSES[key] = (cfg, sweep.analyse(cfg, res, paths=False), labels)
    return _ANALYSES[key]


def _measure(cfg: Any, metric: str) -> str:
    if metric == "pass_at_k":
        return f"pass@{max(cfg.train.pass_k)}"
    return f"distinct correct in K = {cfg.train.distinct_k}"


def best_lifts(result: inference.LiftResult) -> dict[str, int]:
    """Per non-reference method, the model index of its largest lift inside the reference's
    pass@1 range (methods with no point inside are left out)."""
    best: dict[str, int] = {}
    for i in range(len(result.models)):
        name = result.models.method[i]
        if i in set(result.reference.tolist()) or result.status[i] != "inside":
            continue
        if name not in best or result.lift[i] > result.lift[best[name]]:
            best[name] = i
    return best


def plot(results: dict[str, np.ndarray], out_dir: Path) -> list[Path]:
    """`fig6_frontier`: (a) held-out pass@k_max gain and (b) distinct-correct gain against pass@1
    gain (every method's points and hull, GRPO's hull over every checkpoint);
    (c) each method's best lift at matched pass@1 over GRPO's curve with its 95% CI."""
    cfg, res, labels = analysis(results)
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.4), gridspec_kw={"width_ratios": [1, 1, 0.8]})
    for ax, metric in zip(axes[:2], MEASURES, strict=True):
        lr: inference.LiftResult = res[metric]["lift"]
        sy = 100.0 if metric == "pass_at_k" else 1.0
        ref = lr.reference
        ax.scatter(100 * lr.x[ref], sy * lr.y[ref], s=8, color="0.65", zorder=2)
        ax.plot(100 * lr.hull.vx, sy * lr.hull.vy, color=METHOD_COLORS["grpo"], lw=2.5, zorder=4,
                label="GRPO's hull (every kl_coef, lr and checkpoint)")  # fmt: skip
        for label in labels:
            if label in cfg.reference:
                continue
            idx = lr.models.select(label)
            color = METHOD_COLORS.get(label, "0.3")
            ax.scatter(100 * lr.x[idx], sy * lr.y[idx], s=14, color=color, zorder=3)
            menv = estimand.upper_hull(lr.x[idx], lr.y[idx])
            ax.plot(100 * menv.vx, sy * menv.vy, color=color, lw=1.1, marker="", label=label)
        ax.axhline(0.0, color="0.8", lw=0.8, ls=":")
        unit = " (points)" if metric == "pass_at_k" else ""
        ax.set_xlabel("held-out pass@1 gain over the base policy (points)")
        ax.set_ylabel(f"held-out {_measure(cfg, metric)} gain{unit}")
        ax.set_title(f"({'ab'[MEASURES.index(metric)]}) {_measure(cfg, metric)} vs pass@1")
    axes[0].legend(fontsize=6.5, ncol=2, loc="lower left")
    ax = axes[2]
    lr = res["pass_at_k"]["lift"]
    best = best_lifts(lr)
    names = [n for n in labels if n in best]
    for j, name in enumerate(names):
        i = best[name]
        color = METHOD_COLORS.get(name, "0.3")
        ax.hlines(j, 100 * lr.lo[i], 100 * lr.hi[i], color=color, lw=1.5)
        ax.plot(100 * lr.lift[i], j, "o", color=color)
    ax.set_yticks(range(len(names)), [f"{n} ({lr.models.setting[best[n]]})" for n in names],
                  fontsize=6.5)  # fmt: skip
    ax.axvline(0.0, color=METHOD_COLORS["grpo"], lw=1)
    ax.invert_yaxis()
    ax.set_xlabel(
        f"lift over GRPO's curve at matched pass@1, {_measure(cfg, 'pass_at_k')} (points)"
    )
    ax.set_title("(c) best setting per method, 95% CI (seeds × draws; exploratory)")
    missing = sorted(set(labels) - set(names) - set(cfg.reference))
    d = res["pass_at_k"]["data"]
    fig.suptitle(
        f"Fig. 6 — held-out frontiers: base pass@1 {100 * d['base_x']:.1f}%, base "
        f"{_measure(cfg, 'pass_at_k')} {100 * d['base_y']:.1f}%; methods with no point inside GRPO's pass@1 "
        f"range: {', '.join(missing) or 'none'}",
        fontsize=10,
    )
    fig.text(
        0.5, -0.02,
        f"Popularity dataset (V = {cfg.env.num_actions}, H = {cfg.env.depth}), {len(cfg.env.draws)}"
        f" draws × {2 * cfg.env.per_size * len(cfg.env.multiplicities)} prompts (half held out), "
        f"base correctness {cfg.env.base_correctness} per prompt; Adam lr {cfg.train.lr:g}, "
        f"G = {cfg.train.group_size}, U = {cfg.train.updates}, {len(cfg.seeds)} seeds. Points: "
        "means over seeds and held-out prompts; lines: each method's upper concave hull (the "
        "origin included); GRPO: the hull of its models. CIs: experiment.inference.lift_inference "
        "(t, seeds × draws); exploratory, not corrected.",
        ha="center", va="top", fontsize=8,
    )  # fmt: skip
    fig.subplots_adjust(left=0.04, right=0.99, wspace=0.35)
    return save(fig, out_dir, "fig6_frontier")


def _r(v: float, scale: float = 100.0) -> float | None:
    return round(scale * float(v), 3) if np.isfinite(v) else None


def summary(results: dict[str, np.ndarray]) -> dict:
    """The lift table at pass@k_max and at distinct correct (points / counts): every
    non-reference model's gains, lift and 95% CI; GRPO's final gains; each method's best lift."""
    cfg, res, _ = analysis(results)
    out: dict[str, Any] = {"settings": {
        "draws": list(cfg.env.draws), "seeds": len(cfg.seeds), "updates": cfg.train.updates,
        "base_correctness": cfg.env.base_correctness,
        "reference": "grpo: every checkpoint of " + "; ".join(
            ", ".join(f"{k}={v:g}" for k, v in values.items())
            for name, values, _ in FAMILY[bool(results["quick"])] if name == "grpo"),
        "num_resamples": cfg.num_resamples, "units": "pass@k in points; distinct correct in counts",
    }}  # fmt: skip
    for metric in MEASURES:
        lr: inference.LiftResult = res[metric]["lift"]
        d = res[metric]["data"]
        scale = 100.0 if metric == "pass_at_k" else 1.0
        ref = set(lr.reference.tolist())
        rows = [i for i in range(len(lr.models)) if i not in ref]
        table = [
            {
                "method": lr.models.method[i], "setting": lr.models.setting[i],
                "pass1_gain": _r(lr.x[i]), "gain": _r(lr.y[i], scale),
                "lift": _r(lr.lift[i], scale), "lo": _r(lr.lo[i], scale),
                "hi": _r(lr.hi[i], scale), "status": str(lr.status[i]),
            }
            for i in rows
        ]  # fmt: skip
        final = [i for i in ref if lr.models.step[i] == cfg.train.updates]
        out[metric] = {
            "measure": _measure(cfg, metric),
            "base_pass1": _r(d["base_x"]),
            "base": _r(d["base_y"], scale),
            "grpo_final": {
                lr.models.setting[i]: {"pass1_gain": _r(lr.x[i]), "gain": _r(lr.y[i], scale)}
                for i in sorted(final)
            },
            "best": {n: table[rows.index(i)] for n, i in best_lifts(lr).items()},
            "lifts": table,
        }
    return out


register(
    "passk",
    title="Held-out frontiers: every method's pass@k and distinct correct vs pass@1, lifts over GRPO",
    order=6,
    run=run,
    plot=plot,
    summary=summary,
)
