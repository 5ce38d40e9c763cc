"""Checkers for seed 000, App. B: the closed-form optima and the two biases behind diversity collapse.

- `lemma_b1`: the KL-regularized optimum `π* ∝ π_b·exp(r̂/β)`;
- `prop_b2_selection_bias`: `P(π*(τ) > π_b(τ)) = 1 − (1 − π_b(τ))^N` under the `N`-sample reward `r̂`;
- `prop_b3_reinforcement_bias`: with `r̂ = r` the gain on `C` is `π_b(τ)·(e^{1/β}/Z − 1)`;
- `lemma_b4`: the entropy-bonus/penalty optimum, both anchors;
- `lemma_b5`: the differential-smoothing optimum, both anchors;
- `eq19_anchor_equivalence`: policy-anchored and base-anchored problems share optima under a map.
  Exact for the entropy bonus; for differential smoothing the map depends on the instance and gives
  `β' ≤ 0` on about a quarter of random instances with `γ_p ∈ [0, 2β]`, `γ_n ∈ [0, β)`; where the
  optimum pins the exponents of `π_b` no base-anchored problem has that optimum (a counterexample).

Each closed form of `theory.optimum` is compared with a direct numerical maximization of
`theory.optimum.objective` (Newton's method on the simplex, `numerical_optimum`) and with the
stationarity condition of the Lagrangian, `∂J/∂π(τ) = λ` for every `τ` (the objectives are strictly
concave on the simplex where the closed forms apply, so stationarity with full support is optimality).

Instances come from `theory.trees.random_instance`: `V ∈ 2..4`, `H ∈ 1..3` (`M ≤ 64`), base-policy
skew in `[0, 3]`, a correct set holding both kinds, and `β` log-uniform in `[0.05, 5]`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import logsumexp
from scipy.stats import binom

from theory.checks._registry import CheckResult, register
from theory.measures import normalized_variance
from theory.optimum import (
    differential_smoothing,
    ds_anchor_map,
    ds_multiplier,
    entropy_regularized,
    kl_regularized,
    objective,
)
from theory.trees import (
    TreeInstance,
    logits_from_log_probs,
    random_instance,
    trajectory_log_probs,
)

SOURCE = "seed 000, App. B"

#: max |closed-form π − numerical π|; Newton stops at a decrement of 1e-24 (~1e-12 in π).
TOL_PROB = 1e-8
#: J(numerical) may exceed J(closed form) by at most this (relative to 1 + |J|): rounding only.
TOL_OBJECTIVE = 1e-10
#: max spread of `∂J/∂π(τ)` over τ, relative to the size of its terms (exact arithmetic gives 0).
TOL_STATIONARITY = 1e-9
#: Log-probability agreement of two closed forms that should coincide exactly.
TOL_EXACT = 1e-9
#: Two-sided binomial tail probability below which a Monte Carlo frequency contradicts the claim
#: (the two-sided tail of 5 standard errors of a normal).
MC_ALPHA = 5.7e-7
#: Reward draws per instance in the Monte Carlo of Prop. B.2 (standard error <= 0.011).
MC_DRAWS = 2000
#: An instance's incorrect base mass is kept >= this, so a rewarded trajectory's gain
#: `−log(1 − (1 − e^{−1/β})·π_b(not rewarded))` is >= ~2e-4 and resolvable in float64.
MIN_INCORRECT_MASS = 1e-3
#: `log π*(τ) − log π_b(τ)` above this counts as "π* > π_b" (float64 rounding is ~1e-15).
EVENT_MARGIN = 1e-12


# ----------------------------------------------------------------------------------- instances


def draw_instance(
    rng: np.random.Generator, *, max_depth: int = 3, min_incorrect_mass: float = 0.0
) -> TreeInstance:
    """A random tree (`V ∈ 2..4`, `H ∈ 1..max_depth`, skew in `[0, 3]`) with both kinds of trajectory.

    The correct-set size is uniform in `1..M−1`. Instances whose incorrect base mass is below
    `min_incorrect_mass` are redrawn (the bias checks need a resolvable gain; see `MIN_INCORRECT_MASS`).
    """
    while True:
        v = int(rng.integers(2, 5))
        h = int(rng.integers(1, max_depth + 1))
        m = v**h
        inst = random_instance(rng, v, h, float(rng.uniform(0.0, 3.0)), int(rng.integers(1, m)))
        if np.exp(logsumexp(inst.log_pb[~inst.correct])) >= min_incorrect_mass:
            return inst


def draw_beta(rng: np.random.Generator) -> float:
    """`β` log-uniform in `[0.05, 5]`."""
    return float(np.exp(rng.uniform(np.log(0.05), np.log(5.0))))


def _draw_reward(rng: np.random.Generator, inst: TreeInstance) -> tuple[str, np.ndarray]:
    """A reward for Lemmas B.1/B.4, which hold for any `r̂`: the verifier's `r`, an `N`-sample `r̂`, or reals."""
    kind = ("verifier", "estimated", "real")[int(rng.integers(3))]
    r = inst.correct.astype(float)
    if kind == "estimated":
        pb = np.exp(inst.log_pb)
        sampled = np.zeros(r.size, dtype=bool)
        sampled[rng.choice(r.size, size=int(rng.integers(1, 9)), p=pb / pb.sum())] = True
        r = r * sampled
    elif kind == "real":
        r = rng.normal(size=r.size)
    return kind, r


def ds_coefficients(correct: np.ndarray, gamma_p: float, gamma_n: float) -> np.ndarray:
    """Per-trajectory coefficient `c` of `−c·log ρ` in the DS reward: `γ_p` on `C`, `−γ_n` off `C`; `(M,)`."""
    return np.where(correct, gamma_p, -gamma_n)


# ------------------------------------------------------------------------ numerical maximization


def lagrangian_gradient(
    log_pi: np.ndarray,
    log_pb: np.ndarray,
    reward: np.ndarray,
    beta: float,
    coef_policy: object = 0.0,
    coef_base: object = 0.0,
) -> np.ndarray:
    """`∂J/∂π(τ) = r − d·log π_b + β·log π_b − (c + β)·(log π + 1)`, shape `(M,)`, for the `J` of
    `theory.optimum.objective` (`c = coef_policy`, `d = coef_base`).

    At an interior maximizer it equals the Lagrange multiplier `λ` of `Σ π = 1` for every `τ`
    (seed 000, proofs of Lemmas B.1, B.4, B.5).
    """
    c = np.asarray(coef_policy, dtype=float)
    d = np.asarray(coef_base, dtype=float)
    return reward + (beta - d) * log_pb - (c + beta) * (log_pi + 1.0)


def _stationarity_residual(grad: np.ndarray, *terms: np.ndarray) -> float:
    """Spread of `grad` over trajectories, relative to the magnitude of the terms that built it."""
    scale = 1.0 + max(float(np.max(np.abs(t))) for t in terms)
    return float(np.ptp(grad)) / scale


def numerical_optimum(
    log_pb: np.ndarray,
    reward: np.ndarray,
    beta: float,
    coef_policy: object = 0.0,
    coef_base: object = 0.0,
    *,
    max_iter: int = 500,
) -> np.ndarray:
    """Maximize `objective(π, log_pb, reward, beta, coef_policy, coef_base)` numerically; `log π`, `(M,)`.

    Newton's method for a concave function under the constraint `Σ π = 1`, from the uniform
    distribution (Boyd & Vandenberghe, Convex Optimization, Alg. 10.1, feasible start), with a
    backtracking line search that keeps `π > 0`. It uses only `J`'s gradient (`lagrangian_gradient`)
    and its Hessian `diag(−(c + β)/π)`, never a closed form, so it checks them independently. Works in
    probabilities, where `π(τ)` of 1e-30 keeps full relative precision (logit-space L-BFGS stalls on
    these instances: it saturates at a vertex or needs thousands of iterations).

    Requires `c + β > 0` everywhere (the objective is then strictly concave on the simplex).
    """
    lpb = np.asarray(log_pb, dtype=float)
    r = np.asarray(reward, dtype=float)
    c = np.broadcast_to(np.asarray(coef_policy, dtype=float), lpb.shape)
    d = np.broadcast_to(np.asarray(coef_base, dtype=float), lpb.shape)
    curvature = c + beta
    if not np.all(curvature > 0):
        raise ValueError("coef_policy + beta must be > 0 for the objective to be concave")

    def value(p: np.ndarray) -> float:
        lp = np.log(p)
        return float(np.sum(p * (r - c * lp - d * lpb - beta * (lp - lpb))))

    p = np.full(lpb.size, 1.0 / lpb.size)
    f = value(p)
    for _ in range(max_iter):
        g = lagrangian_gradient(np.log(p), lpb, r, beta, c, d)
        # Newton step with Σ Δ = 0: Δ = (p/k)·(g − ν), ν the weighted mean making Σ Δ = 0.
        w = p / curvature
        nu = np.sum(w * g) / np.sum(w)
        step = w * (g - nu)
        decrement = float(
            np.sum(step * (g - nu))
        )  # = Δᵀ(−∇²J)Δ = ∇Jᵀ Δ: twice the gap, to 2nd order
        if decrement <= 1e-24:
            break
        shrinking = step < 0
        t = 1.0
        if shrinking.any():
            t = min(1.0, 0.99 * float(np.min(-p[shrinking] / step[shrinking])))
        # Far from the optimum, backtrack until J rises enough; close to it (quadratic convergence)
        # J's change is below float64 resolution, so full steps are taken.
        if decrement > 1e-12:
            while True:
                f_new = value(p + t * step)
                if f_new >= f + 0.25 * t * decrement or t < 1e-12:
                    break
                t *= 0.5
            if f_new <= f:
                break
        # The floor only guards log(0) after many shrinking steps; no optimum here is below 1e-300.
        p = np.maximum(p + t * step, 1e-300)
        p /= p.sum()
        f = value(p)
    return np.log(p)


class _Tally:
    """Accumulates residuals (against per-quantity tolerances) and counted failures over trials."""

    def __init__(self, tolerances: dict[str, float]) -> None:
        self.tolerances = tolerances
        self.max = dict.fromkeys(tolerances, 0.0)
        self.failures: dict[str, int] = {}
        self.violations = 0
        self.first_violation: dict[str, Any] | None = None

    def add(
        self,
        residuals: dict[str, float],
        context: dict[str, Any],
        failures: dict[str, int] | None = None,
    ) -> None:
        failed = {k: int(v) for k, v in (failures or {}).items() if v}
        bad = bool(failed)
        for key, value in residuals.items():
            self.max[key] = max(self.max[key], float(value))
            bad |= not value <= self.tolerances[key]  # NaN counts as a violation
        for key, count in failed.items():
            self.failures[key] = self.failures.get(key, 0) + count
        if bad:
            self.violations += 1
            if self.first_violation is None:
                self.first_violation = {
                    **context,
                    **{k: float(v) for k, v in residuals.items()},
                    **failed,
                }

    def result(self, trials: int, **extra: Any) -> CheckResult:
        details: dict[str, Any] = {
            **{f"max_{k}": v for k, v in self.max.items()},
            "tolerances": self.tolerances,
            "failures": self.failures,
            **extra,
        }
        if self.first_violation is not None:
            details["first_violation"] = self.first_violation
        return CheckResult(
            trials=trials,
            violations=self.violations,
            max_residual=max(self.max.values()),
            details=details,
        )


def _compare_with_numeric(
    lp_closed: np.ndarray,
    lpb: np.ndarray,
    reward: np.ndarray,
    beta: float,
    coef_policy: object = 0.0,
    coef_base: object = 0.0,
) -> dict[str, float]:
    """Probability residual, objective gap and stationarity residual of a closed-form optimum."""
    lp_num = numerical_optimum(lpb, reward, beta, coef_policy, coef_base)
    j_closed = objective(lp_closed, lpb, reward, beta, coef_policy, coef_base)
    j_num = objective(lp_num, lpb, reward, beta, coef_policy, coef_base)
    grad = lagrangian_gradient(lp_closed, lpb, reward, beta, coef_policy, coef_base)
    c = np.asarray(coef_policy, dtype=float)
    d = np.asarray(coef_base, dtype=float)
    return {
        "prob_residual": float(np.max(np.abs(np.exp(lp_closed) - np.exp(lp_num)))),
        "objective_gap": max(0.0, (j_num - j_closed) / (1.0 + abs(j_closed))),
        "stationarity_residual": _stationarity_residual(
            grad, reward, (beta - d) * lpb, (c + beta) * (lp_closed + 1.0)
        ),
    }


_NUMERIC_TOLERANCES = {
    "prob_residual": TOL_PROB,
    "objective_gap": TOL_OBJECTIVE,
    "stationarity_residual": TOL_STATIONARITY,
}


# ------------------------------------------------------------------------------------- Lemma B.1


@register(
    "lemma_b1",
    source=f"{SOURCE}, Lemma B.1",
    claim="argmax E_π[r̂] − β·KL(π‖π_b) is π_b·exp(r̂/β)/Z (any r̂, β > 0)",
    trials=50,
)
def check_lemma_b1(rng: np.random.Generator, trials: int) -> CheckResult:
    """Closed form vs Newton's method on `objective` (`numerical_optimum`), plus stationarity
    (`log π − log π_b − r̂/β` constant) and realizability: the tabular tree policy returned by
    `logits_from_log_probs` must give back the optimum's trajectory distribution.
    """
    tally = _Tally({**_NUMERIC_TOLERANCES, "realization_residual": TOL_EXACT})
    for _ in range(trials):
        inst = draw_instance(rng)
        beta = draw_beta(rng)
        kind, reward = _draw_reward(rng, inst)
        lpb = inst.log_pb
        lp = kl_regularized(lpb, reward, beta)
        res = _compare_with_numeric(lp, lpb, reward, beta)
        logits = logits_from_log_probs(lp, inst.num_actions, inst.depth)
        back = trajectory_log_probs(logits, inst.num_actions, inst.depth)
        res["realization_residual"] = float(np.max(np.abs(back - lp)))
        tally.add(res, {"M": inst.num_trajectories, "beta": beta, "reward": kind})
    return tally.result(trials)


# -------------------------------------------------------------------------------------- Prop. B.2


def selection_bias_frequencies(
    log_pb: np.ndarray,
    correct: np.ndarray,
    beta: float,
    num_samples: int,
    draws: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, int]:
    """Monte Carlo of Prop. B.2: frequency over `draws` of `π*(τ) > π_b(τ)`, shape `(M,)`.

    Each draw samples `num_samples` trajectories from `π_b`, sets `r̂ = 1` on the sampled correct
    ones, and solves Lemma B.1 with `r̂`. Also returns the number of (draw, correct τ) pairs where
    "`π*(τ) > π_b(τ)`" differs from "`τ` was sampled", the mechanism of the proof (it holds per draw
    whenever some trajectory is unrewarded).
    """
    m = log_pb.size
    pb = np.exp(log_pb)
    idx = rng.choice(m, size=(draws, num_samples), p=pb / pb.sum())  # (K, N)
    sampled = np.zeros((draws, m), dtype=bool)
    sampled[np.arange(draws)[:, None], idx] = True
    r_hat = (sampled & correct).astype(float)  # (K, M)
    lp_star = kl_regularized(log_pb, r_hat, beta)  # (K, M)
    event = (lp_star - log_pb) > EVENT_MARGIN
    mismatches = int(np.sum((event != sampled)[:, correct]))
    return event.mean(axis=0), mismatches


@register(
    "prop_b2_selection_bias",
    source=f"{SOURCE}, Prop. B.2",
    claim="τ ∈ C: P(π*(τ) > π_b(τ)) = 1 − (1 − π_b(τ))^N under the N-sample r̂, increasing in π_b(τ)",
    trials=20,
)
def check_prop_b2(rng: np.random.Generator, trials: int) -> CheckResult:
    """Monte Carlo (`MC_DRAWS` reward draws per instance) against the closed form, per correct τ.

    A frequency violates the claim if its two-sided binomial tail under the claimed probability is
    below `MC_ALPHA` (5 standard errors); monotonicity fails if a less likely correct trajectory's
    frequency exceeds a likelier one's by more than 5 standard errors of each. The per-draw mechanism
    (`π* > π_b` iff sampled) must hold exactly. Instances keep incorrect base mass >=
    `MIN_INCORRECT_MASS`: if every trajectory were rewarded, `π* = π_b` and the claim's event is empty.
    """
    draws = MC_DRAWS
    violations = 0
    max_abs = 0.0
    max_z = 0.0
    min_tail = 1.0
    mismatches_total = 0
    first: dict[str, Any] | None = None
    for _ in range(trials):
        inst = draw_instance(rng, min_incorrect_mass=MIN_INCORRECT_MASS)
        beta = draw_beta(rng)
        n = int(rng.integers(1, 9))
        freq, mismatches = selection_bias_frequencies(
            inst.log_pb, inst.correct, beta, n, draws, rng
        )
        pb_c = np.exp(inst.log_pb[inst.correct])
        claimed = -np.expm1(n * np.log1p(-pb_c))  # 1 − (1 − π_b)^N, accurate for tiny π_b
        observed = freq[inst.correct]
        count = np.rint(observed * draws)
        tail = np.minimum(
            1.0,
            2.0 * np.minimum(binom.cdf(count, draws, claimed), binom.sf(count - 1, draws, claimed)),
        )
        se = np.sqrt(claimed * (1.0 - claimed) / draws)
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(se > 0, np.abs(observed - claimed) / se, 0.0)
        # Monotonicity: order correct trajectories by π_b; a later (likelier) one may not fall
        # below an earlier one by more than the noise of both.
        order = np.argsort(pb_c, kind="stable")
        obs_sorted, se_sorted = observed[order], se[order]
        drop = obs_sorted[:, None] - obs_sorted[None, :]  # [i, j]: i less likely than j when i < j
        noise = 5.0 * (se_sorted[:, None] + se_sorted[None, :]) + 1.0 / draws
        upper = np.triu(np.ones_like(drop, dtype=bool), k=1)
        non_monotone = int(np.sum((drop > noise) & upper))
        claimed_increasing = bool(np.all(np.diff(claimed[order]) >= 0))
        max_abs = max(max_abs, float(np.max(np.abs(observed - claimed))))
        max_z = max(max_z, float(np.max(z)))
        min_tail = min(min_tail, float(np.min(tail)))
        mismatches_total += mismatches
        bad = bool(np.any(tail < MC_ALPHA)) or non_monotone > 0 or mismatches > 0
        bad |= not claimed_increasing
        if bad:
            violations += 1
            if first is None:
                first = {
                    "M": inst.num_trajectories,
                    "beta": beta,
                    "N": n,
                    "min_tail": float(np.min(tail)),
                    "non_monotone_pairs": non_monotone,
                    "per_draw_mismatches": mismatches,
                }
    details: dict[str, Any] = {
        "draws_per_instance": draws,
        "max_abs_frequency_error": max_abs,
        "max_z_score": max_z,
        "min_binomial_tail": min_tail,
        "alpha": MC_ALPHA,
        "per_draw_mismatches": mismatches_total,
    }
    if first is not None:
        details["first_violation"] = first
    return CheckResult(trials, violations, max_abs, details=details)


# -------------------------------------------------------------------------------------- Prop. B.3


@register(
    "prop_b3_reinforcement_bias",
    source=f"{SOURCE}, Prop. B.3",
    claim="r̂ = r: π*(τ) − π_b(τ) = π_b(τ)(e^{1/β}/Z − 1) > 0 on C; incorrect τ lose π_b(τ)(1 − 1/Z)",
    trials=100,
)
def check_prop_b3(rng: np.random.Generator, trials: int) -> CheckResult:
    """`kl_regularized(log π_b, r, β)` against the stated gains, with `Z = P_b·e^{1/β} + 1 − P_b`
    computed independently; the gain's sign on each side; and the ranking of gains by `π_b` on `C`.

    Residuals are of `log π* − log π_b` (relative errors of `π*`) and of the gains in probability.
    Also reported: `V(π*) − V(π_b)`, which is 0 (the optimum rescales `C` uniformly, so the
    sharpening is in absolute, not relative, gains).
    """
    tally = _Tally({"log_ratio_residual": TOL_EXACT, "gain_residual": TOL_EXACT})
    max_var_change = 0.0
    for _ in range(trials):
        inst = draw_instance(rng, min_incorrect_mass=MIN_INCORRECT_MASS)
        beta = draw_beta(rng)
        lpb, c = inst.log_pb, inst.correct
        lp = kl_regularized(lpb, c.astype(float), beta)
        log_zc = 1.0 / beta + logsumexp(lpb[c])
        log_z = np.logaddexp(log_zc, logsumexp(lpb[~c]))
        log_ratio = lp - lpb
        stated = np.where(c, 1.0 / beta - log_z, -log_z)
        pb = np.exp(lpb)
        gain = np.exp(lp) - pb
        stated_gain = pb * np.expm1(stated)
        gains_c = gain[c][np.argsort(pb[c], kind="stable")]
        res = {
            "log_ratio_residual": float(np.max(np.abs(log_ratio - stated))),
            "gain_residual": float(np.max(np.abs(gain - stated_gain))),
        }
        failures = {
            "sign_errors": np.sum(log_ratio[c] <= 0) + np.sum(log_ratio[~c] >= 0),
            "ranking_errors": np.sum(np.diff(gains_c) < -TOL_EXACT),
        }
        tally.add(res, {"M": inst.num_trajectories, "beta": beta}, failures)
        max_var_change = max(
            max_var_change, abs(normalized_variance(lp, c) - normalized_variance(lpb, c))
        )
    return tally.result(trials, max_normalized_variance_change=max_var_change)


# ------------------------------------------------------------------------------------- Lemma B.4


@register(
    "lemma_b4",
    source=f"{SOURCE}, Lemma B.4",
    claim="entropy-shaped optimum: π_b^{β/(β+η)}e^{r/(β+η)} (policy), π_b^{1−η/β}e^{r/β} (base)",
    trials=30,
)
def check_lemma_b4(rng: np.random.Generator, trials: int) -> CheckResult:
    """`entropy_regularized` for both anchors, an entropy bonus (`η > 0`) and penalty (`η < 0`; policy
    anchor with `β + η ≥ 0.1β` so the problem stays concave), vs `numerical_optimum` and
    the stationarity condition. Four closed forms per trial.
    """
    tally = _Tally(_NUMERIC_TOLERANCES)
    for _ in range(trials):
        inst = draw_instance(rng)
        beta = draw_beta(rng)
        kind, reward = _draw_reward(rng, inst)
        for anchor in ("policy", "base"):
            bonus = beta * float(rng.uniform(0.05, 2.0))
            penalty = -beta * float(rng.uniform(0.05, 0.9 if anchor == "policy" else 2.0))
            for eta in (bonus, penalty):
                lp = entropy_regularized(inst.log_pb, reward, beta, eta, anchor)
                coefs = {"coef_policy": eta} if anchor == "policy" else {"coef_base": eta}
                res = _compare_with_numeric(lp, inst.log_pb, reward, beta, **coefs)
                context = {"M": inst.num_trajectories, "beta": beta, "eta": eta, "anchor": anchor}
                tally.add(res, {**context, "reward": kind})
    return tally.result(trials)


# ------------------------------------------------------------------------------------- Lemma B.5


@register(
    "lemma_b5",
    source=f"{SOURCE}, Lemma B.5",
    claim="differential-smoothing optimum (Eq. 4), policy anchor via the multiplier λ, base anchor in closed form",
    trials=30,
)
def check_lemma_b5(rng: np.random.Generator, trials: int) -> CheckResult:
    """`differential_smoothing` for both anchors with `γ_n = 0` (Eq. 3) and `0 < γ_n < β`
    (`γ_p ∈ [0, 2β]`), vs `numerical_optimum` and stationarity. For the policy anchor the
    multiplier from `ds_multiplier` must itself satisfy `∂J/∂π(τ) = λ` for every `τ`.
    """
    tally = _Tally({**_NUMERIC_TOLERANCES, "multiplier_residual": TOL_STATIONARITY})
    for _ in range(trials):
        inst = draw_instance(rng)
        beta = draw_beta(rng)
        lpb, c = inst.log_pb, inst.correct
        reward = c.astype(float)
        gamma_p = beta * float(rng.uniform(0.0, 2.0))
        for anchor in ("policy", "base"):
            for gamma_n in (0.0, beta * float(rng.uniform(0.05, 0.9))):
                lp = differential_smoothing(lpb, c, beta, gamma_p, gamma_n, anchor)
                coef = ds_coefficients(c, gamma_p, gamma_n)
                coefs = {"coef_policy": coef} if anchor == "policy" else {"coef_base": coef}
                res = _compare_with_numeric(lp, lpb, reward, beta, **coefs)
                if anchor == "policy":
                    lam = ds_multiplier(lpb, c, beta, gamma_p, gamma_n)
                    grad = lagrangian_gradient(lp, lpb, reward, beta, coef)
                    res["multiplier_residual"] = float(np.max(np.abs(grad - lam))) / (
                        1.0 + abs(lam) + float(np.max(np.abs(beta * lpb)))
                    )
                else:
                    res["multiplier_residual"] = 0.0
                context = {
                    "M": inst.num_trajectories,
                    "beta": beta,
                    "gamma_p": gamma_p,
                    "gamma_n": gamma_n,
                    "anchor": anchor,
                }
                tally.add(res, context)
    return tally.result(trials)


# -------------------------------------------------------------------------------------- Eq. 19


def ds_base_to_policy(
    log_pb: np.ndarray, correct: np.ndarray, beta_b: float, gamma_p_b: float, gamma_n_b: float
) -> tuple[float, float, float] | None:
    """Policy-anchored DS parameters with the same optimum as base-anchored `(β', γ_p', γ_n')`.

    The inverse of `theory.optimum.ds_anchor_map`. With `κ_C = 1 − γ_p'/β'`, `κ_N = 1 + γ_n'/β'` and
    `log Z'` the base-anchored normalizer, matching the closed forms of Lemma B.5 gives
    `λ = β·(log Z' − 1)/κ_N` and

        β = κ_C / (1/β' − (log Z' − 1)·(1 − κ_C/κ_N)),   γ_p = β/κ_C − β,   γ_n = β − β/κ_N.

    Returns None where no concave policy-anchored problem exists (`κ_C ≤ 0`, `κ_N ≤ 0` or `β ≤ 0`).
    """
    k_c = 1.0 - gamma_p_b / beta_b
    k_n = 1.0 + gamma_n_b / beta_b
    if k_c <= 0 or k_n <= 0:
        return None
    log_z = logsumexp(np.where(correct, k_c * log_pb + 1.0 / beta_b, k_n * log_pb))
    denom = 1.0 / beta_b - (log_z - 1.0) * (1.0 - k_c / k_n)
    if not denom > 0:
        return None
    beta = k_c / denom
    return beta, beta / k_c - beta, beta - beta / k_n


def _log_gap(lp: np.ndarray, other: np.ndarray) -> float:
    """`max |lp − other|` relative to `1 + max |lp|`: log-probabilities of −1e3 carry ~1e-13 rounding."""
    return float(np.max(np.abs(lp - other))) / (1.0 + float(np.max(np.abs(lp))))


def _identifiable(log_pb: np.ndarray, correct: np.ndarray) -> bool:
    """Whether the exponents of `π_b` on `C` and off `C` are pinned by an optimum (`log π_b` varies on both)."""
    return bool(np.ptp(log_pb[correct]) > 1e-6 and np.ptp(log_pb[~correct]) > 1e-6)


def _fit_base_form(lp: np.ndarray, lpb: np.ndarray, c: np.ndarray) -> tuple[float, float, float]:
    """Least-squares fit of `log π = κ_C log π_b + o_C` on `C` and `κ_N log π_b + o_N` off `C`;
    returns `(κ_C, κ_N, o_C − o_N)`: a base-anchored problem needs `o_C − o_N = 1/β' > 0`."""
    k_c, o_c = np.polyfit(lpb[c], lp[c], 1)
    k_n, o_n = np.polyfit(lpb[~c], lp[~c], 1)
    return float(k_c), float(k_n), float(o_c - o_n)


def _rounded(x: np.ndarray) -> list[float]:
    return [round(float(v), 6) for v in x]


def _counterexample_record(
    lpb: np.ndarray, c: np.ndarray, beta: float, gamma_p: float, gamma_n: float
) -> dict[str, Any]:
    """JSON facts about a DS instance whose `ds_anchor_map` gives `β' ≤ 0`."""
    lp = differential_smoothing(lpb, c, beta, gamma_p, gamma_n, "policy")
    beta_b, gp_b, gn_b = ds_anchor_map(lpb, c, beta, gamma_p, gamma_n)
    k_c, k_n, offset = _fit_base_form(lp, lpb, c)
    return {
        "M": int(lpb.size),
        "pi_b": _rounded(np.exp(lpb)),
        "correct": [bool(v) for v in c],
        "beta": beta,
        "gamma_p": gamma_p,
        "gamma_n": gamma_n,
        "lambda": float(ds_multiplier(lpb, c, beta, gamma_p, gamma_n)),
        "mapped_base_params": [float(beta_b), float(gp_b), float(gn_b)],
        "policy_optimum": _rounded(np.exp(lp)),
        # The optimum is exactly ∝ π_b^κ_C·e^o on C and π_b^κ_N off C; a base-anchored problem
        # gives o = 1/β' > 0, and κ_C, κ_N, o are pinned when log π_b varies on both sets.
        "fitted_exponents_on_off_C": [k_c, k_n],
        "fitted_offset_equals_1_over_beta_prime": offset,
    }


#: A hand-sized instance where Eq. 19 has no base-anchored counterpart: the depth-2 binary tree with
#: π_b = (0.4, 0.1, 0.3, 0.2), C = {AA, AB}, β = 1, γ_p = γ_n = 0.5 (β' ≈ −5.56).
EQ19_EXAMPLE = {
    "pi_b": (0.4, 0.1, 0.3, 0.2),
    "correct": (True, True, False, False),
    "beta": 1.0,
    "gamma_p": 0.5,
    "gamma_n": 0.5,
}


@register(
    "eq19_anchor_equivalence",
    source=f"{SOURCE}, Eq. 19 (App. B.3)",
    claim="policy-anchored and base-anchored shaping share optima under a re-parameterization",
    trials=100,
)
def check_eq19(rng: np.random.Generator, trials: int) -> CheckResult:
    """(a) Entropy bonus/penalty: policy `(β, η)` equals base `(β + η, η)` exactly, and `ds_anchor_map`
    with `γ_p = η, γ_n = −η` returns that map. (b) DS with paper-range parameters (`γ_p ∈ [0, 2β]`,
    `γ_n ∈ [0, β)`): `ds_anchor_map` gives `(β', γ_p', γ_n')`; where `β' > 0` the base-anchored optimum
    must equal the policy-anchored one (else a violation) and `ds_base_to_policy` must map back.
    Where `β' ≤ 0` and `log π_b` varies both on and off `C` (so an optimum pins the exponents of
    `π_b` and the offset `1/β'`), no base-anchored problem of the form (18) (`β' > 0`) has this
    optimum: a counterexample to the paper's claim, counted in `counterexamples` (status
    "counterexample", not a violation); `details` gives the rate, the smallest instance found and a
    hand-sized worked example (`EQ19_EXAMPLE`). `β' ≤ 0` without pinned exponents is only counted
    in `details`, as another parameterization might exist there. (c) The reverse map on base-anchored paper-range parameters; where it has no concave
    policy-anchored preimage the instance is counted in `details`, not as a violation.
    """
    tally = _Tally(
        {
            "entropy_map_residual": TOL_EXACT,
            "ds_map_residual": TOL_EXACT,
            "round_trip_residual": 1e-7,
            "reverse_map_residual": TOL_EXACT,
        }
    )
    counterexamples = nonpositive = pinned = 0
    by_gamma_n = {"gamma_n=0": [0, 0], "gamma_n>0": [0, 0]}  # [beta' <= 0, trials]
    reverse_missing = 0
    minimal: dict[str, Any] | None = None
    for _ in range(trials):
        inst = draw_instance(rng)
        beta = draw_beta(rng)
        lpb, c = inst.log_pb, inst.correct
        res = dict.fromkeys(tally.tolerances, 0.0)

        # (a) the entropy bonus / penalty: an instance-free map.
        eta = beta * float(rng.uniform(-0.9, 2.0))
        reward = c.astype(float)
        lp_pol = entropy_regularized(lpb, reward, beta, eta, "policy")
        lp_base = entropy_regularized(lpb, reward, beta + eta, eta, "base")
        lp_ds = differential_smoothing(lpb, c, beta, eta, -eta, "policy")
        mapped = np.array(ds_anchor_map(lpb, c, beta, eta, -eta))
        res["entropy_map_residual"] = max(
            _log_gap(lp_pol, lp_base),
            _log_gap(lp_pol, lp_ds),
            float(np.max(np.abs(mapped - [beta + eta, eta, -eta]))) / (1.0 + abs(beta + eta)),
        )

        # (b) differential smoothing, policy → base.
        gamma_p = beta * float(rng.choice([0.0, rng.uniform(0.0, 2.0)], p=[0.2, 0.8]))
        gamma_n = beta * float(rng.choice([0.0, rng.uniform(0.0, 1.0)], p=[0.3, 0.7]))
        key = "gamma_n=0" if gamma_n == 0 else "gamma_n>0"
        by_gamma_n[key][1] += 1
        lp_pol = differential_smoothing(lpb, c, beta, gamma_p, gamma_n, "policy")
        beta_b, gp_b, gn_b = ds_anchor_map(lpb, c, beta, gamma_p, gamma_n)
        pinned += _identifiable(lpb, c)
        if np.isfinite(beta_b) and beta_b > 0:
            lp_base = differential_smoothing(lpb, c, beta_b, gp_b, gn_b, "base")
            res["ds_map_residual"] = _log_gap(lp_pol, lp_base)
            back = ds_base_to_policy(lpb, c, beta_b, gp_b, gn_b)
            res["round_trip_residual"] = (
                np.inf
                if back is None
                else float(np.max(np.abs(np.subtract(back, (beta, gamma_p, gamma_n)))))
                / (1.0 + beta)
            )
        else:
            nonpositive += 1
            by_gamma_n[key][0] += 1
            # Only where the optimum pins the exponents is there provably no base-anchored
            # counterpart; otherwise another parameterization than Eq. 19 might still exist.
            if _identifiable(lpb, c):
                counterexamples += 1
                if minimal is None or lpb.size < minimal["M"]:
                    minimal = _counterexample_record(lpb, c, beta, gamma_p, gamma_n)

        # (c) base → policy on base-anchored paper-range parameters.
        beta_b = draw_beta(rng)
        gp_b = beta_b * float(rng.uniform(0.0, 0.95))
        gn_b = beta_b * float(rng.uniform(0.0, 1.0))
        pre = ds_base_to_policy(lpb, c, beta_b, gp_b, gn_b)
        if pre is None:
            reverse_missing += 1
        else:
            lp_b = differential_smoothing(lpb, c, beta_b, gp_b, gn_b, "base")
            lp_p = differential_smoothing(lpb, c, *pre, "policy")
            res["reverse_map_residual"] = _log_gap(lp_b, lp_p)
        tally.add(
            res, {"M": inst.num_trajectories, "beta": beta, "gamma_p": gamma_p, "gamma_n": gamma_n}
        )
    out = tally.result(
        trials,
        beta_prime_nonpositive=nonpositive,
        beta_prime_nonpositive_fraction=nonpositive / trials,
        trials_with_pinned_exponents=pinned,
        beta_prime_nonpositive_and_pinned=counterexamples,
        beta_prime_nonpositive_by_gamma_n={
            k: {"count": v[0], "of": v[1]} for k, v in by_gamma_n.items()
        },
        reverse_map_without_policy_preimage=reverse_missing,
        smallest_counterexample_found=minimal,
        worked_example=_counterexample_record(
            np.log(EQ19_EXAMPLE["pi_b"]),
            np.array(EQ19_EXAMPLE["correct"]),
            EQ19_EXAMPLE["beta"],
            EQ19_EXAMPLE["gamma_p"],
            EQ19_EXAMPLE["gamma_n"],
        ),
    )
    out.counterexamples = counterexamples
    return out
