"""Closed-form optima of regularized RL objectives over trajectory distributions (seed 000, App. B).

Every function takes and returns log-probabilities over trajectories, shape `(M,)` or batched
`(..., M)` (parameters are scalars shared by the batch). The objectives are

    J(π) = E_{τ~π}[ r̃(τ) ] − β·KL(π ‖ π_b),

over all distributions on trajectories (in a tree MDP each is a tabular policy), with a shaped reward
`r̃` that may depend on `log π` ("policy"-anchored) or on `log π_b` ("base"-anchored).
`objective` evaluates `J` for any `π`, so each closed form can be checked against direct maximization.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from scipy.optimize import brentq
from scipy.special import logsumexp

from theory._validate import as_float_array, correct_mask, finite, log_probs, positive

Anchor = Literal["policy", "base"]


def _normalize(x: np.ndarray) -> np.ndarray:
    return x - logsumexp(x, axis=-1, keepdims=True)


def _anchor(anchor: str) -> str:
    if anchor not in ("policy", "base"):
        raise ValueError(f"anchor must be 'policy' or 'base', got {anchor!r}")
    return anchor


def _reward(reward: object, size: int) -> np.ndarray:
    r = as_float_array(reward, "reward")
    if not np.isfinite(r).all():
        raise ValueError("reward must be finite")
    if r.ndim == 0 or r.shape[-1] != size:
        raise ValueError(
            f"reward must have last axis of length {size} (trajectories), got shape {r.shape}"
        )
    return r


def kl_regularized(log_pb: object, reward: object, beta: float) -> np.ndarray:
    """Optimum of `E_π[r] − β·KL(π‖π_b)`: `π*(τ) = π_b(τ)·exp(r(τ)/β) / Z` (seed 000, Lemma B.1).

    Args:
        log_pb: base-policy log-probabilities `(..., M)`, normalized (−inf allowed: stays 0).
        reward: per-trajectory reward `(M,)` or `(..., M)`, finite (the verifier's `r`, or the
            estimated `r̂` of Prop. B.2).
        beta: KL coefficient, `> 0`.

    Returns:
        `log π*`, shape of the broadcast of `log_pb` and `reward`.

    Raises:
        ValueError: `beta <= 0`; unnormalized/NaN `log_pb`; reward of the wrong length or non-finite.
    """
    lpb = log_probs(log_pb, "log_pb")
    beta = positive(beta, "beta")
    r = _reward(reward, lpb.shape[-1])
    return _normalize(lpb + r / beta)


def entropy_regularized(
    log_pb: object, reward: object, beta: float, eta: float, anchor: Anchor = "policy"
) -> np.ndarray:
    """Optimum with an entropy-shaped reward (seed 000, Lemma B.4; FORMULAS.md §1).

    - `anchor="policy"`: reward `r − η·log π(τ)`; `π ∝ π_b^{β/(β+η)}·exp(r/(β+η))`.
    - `anchor="base"`: reward `r − η·log π_b(τ)`; `π ∝ π_b^{1−η/β}·exp(r/β)`.

    `η > 0` is an entropy bonus, `η < 0` an entropy penalty.

    Args:
        log_pb: `(..., M)` base log-probabilities, all finite (a softmax policy has full support).
        reward: `(M,)` or `(..., M)` finite rewards. beta: `> 0`. eta: finite.

    Returns:
        `log π*`, shape `(..., M)`.

    Raises:
        ValueError: `beta <= 0`; policy anchor with `beta + eta <= 0` (the objective is then not
            concave and has no maximizer in the interior); bad `log_pb`, `reward` or `anchor`.
    """
    lpb = log_probs(log_pb, "log_pb", require_finite=True)
    beta = positive(beta, "beta")
    eta = finite(eta, "eta")
    r = _reward(reward, lpb.shape[-1])
    if _anchor(anchor) == "policy":
        if beta + eta <= 0:
            raise ValueError(
                f"beta + eta must be > 0 for the policy-anchored problem, got beta={beta}, eta={eta}"
            )
        return _normalize((beta * lpb + r) / (beta + eta))
    return _normalize((1.0 - eta / beta) * lpb + r / beta)


def _ds_check(
    beta: float, gamma_p: float, gamma_n: float, anchor: str
) -> tuple[float, float, float]:
    beta = positive(beta, "beta")
    gamma_p = finite(gamma_p, "gamma_p")
    gamma_n = finite(gamma_n, "gamma_n")
    if _anchor(anchor) == "policy":
        if beta + gamma_p <= 0:
            raise ValueError(
                f"beta + gamma_p must be > 0 for the policy-anchored problem, got beta={beta}, gamma_p={gamma_p}"
            )
        if gamma_n >= beta:
            raise ValueError(
                f"gamma_n must be < beta for the policy-anchored problem to be concave, got gamma_n={gamma_n}, beta={beta}"
            )
    return beta, gamma_p, gamma_n


def _ds_policy_parts(
    lpb: np.ndarray, c: np.ndarray, beta: float, gamma_p: float, gamma_n: float
) -> tuple[np.ndarray, np.ndarray]:
    """Unnormalized `a` and scale `s` with `log π = a − λ/s` at the Lagrangian's stationary point."""
    s_c, s_n = beta + gamma_p, beta - gamma_n
    a = np.where(c, (beta * lpb + 1.0) / s_c - 1.0, beta * lpb / s_n - 1.0)
    s = np.where(c, s_c, s_n)
    return a, np.broadcast_to(s, a.shape)


def _solve_multiplier(a_c: float, a_n: float, s_c: float, s_n: float) -> float:
    """Root `λ` of `exp(a_c − λ/s_c) + exp(a_n − λ/s_n) = 1` (log-sum-exp form; decreasing in λ)."""
    if np.isneginf(a_c):
        return s_n * a_n
    if np.isneginf(a_n):
        return s_c * a_c

    def g(lam: float) -> float:
        return float(np.logaddexp(a_c - lam / s_c, a_n - lam / s_n))

    lo = min(s_c * a_c, s_n * a_n)
    hi = max(s_c * a_c, s_n * a_n) + max(s_c, s_n) * np.log(2.0)
    return brentq(g, lo, hi, xtol=1e-14, rtol=4 * np.finfo(float).eps, maxiter=200)


def ds_multiplier(
    log_pb: object, correct: object, beta: float, gamma_p: float, gamma_n: float = 0.0
) -> np.ndarray | float:
    """The Lagrange multiplier `λ` of the policy-anchored DS optimum (seed 000, Lemma B.5).

    `log π = (1 + β log π_b − γ_p − β − λ)/(β + γ_p)` on `C` and
    `(β log π_b + γ_n − β − λ)/(β − γ_n)` off `C`; `λ` is the unique root of `Σ π = 1`.
    Shape `(...)` (a float for 1-D input). Errors as in `differential_smoothing`.
    """
    lpb = log_probs(log_pb, "log_pb", require_finite=True)
    c = correct_mask(correct, lpb.shape[-1])
    beta, gamma_p, gamma_n = _ds_check(beta, gamma_p, gamma_n, "policy")
    a, _ = _ds_policy_parts(lpb, c, beta, gamma_p, gamma_n)
    c = np.broadcast_to(c, a.shape)
    a_c = logsumexp(np.where(c, a, -np.inf), axis=-1)
    a_n = logsumexp(np.where(c, -np.inf, a), axis=-1)
    lam = np.empty(a_c.shape)
    for idx in np.ndindex(a_c.shape):
        lam[idx] = _solve_multiplier(
            float(a_c[idx]), float(a_n[idx]), beta + gamma_p, beta - gamma_n
        )
    return float(lam) if lam.ndim == 0 else lam


def differential_smoothing(
    log_pb: object,
    correct: object,
    beta: float,
    gamma_p: float,
    gamma_n: float = 0.0,
    anchor: Anchor = "policy",
) -> np.ndarray:
    """Optimum of the differential-smoothing objective (seed 000, Eq. 4 / Lemma B.5; `γ_n = 0` is Eq. 3).

    Reward `r̃ = r − γ_p·log ρ(τ)` on the correct set `C` and `r + γ_n·log ρ(τ)` off it, with
    `ρ = π` (`anchor="policy"`) or `ρ = π_b` (`anchor="base"`), and `r = 1[τ ∈ C]`.

    - policy: `log π = (1 + β log π_b − γ_p − β − λ)/(β + γ_p)` on `C`,
      `(β log π_b + γ_n − β − λ)/(β − γ_n)` off `C`, `λ` from `Σ π = 1` (Brent's method on a
      scalar equation: the sums over each set are computed once);
    - base: `π ∝ e^{1/β}·π_b^{1−γ_p/β}` on `C`, `π ∝ π_b^{1+γ_n/β}` off `C`.

    Args:
        log_pb: `(..., M)` base log-probabilities, all finite. correct: `(M,)` or `(..., M)` mask.
        beta: `> 0`. gamma_p, gamma_n: finite (`≥ 0` in the paper; other values are allowed where the
            problem stays concave).

    Returns:
        `log π*`, shape `(..., M)`.

    Raises:
        ValueError: `beta <= 0`; policy anchor with `gamma_n >= beta` or `beta + gamma_p <= 0`
            (non-concave); bad `log_pb`, `correct` or `anchor`.
    """
    lpb = log_probs(log_pb, "log_pb", require_finite=True)
    c = correct_mask(correct, lpb.shape[-1])
    beta, gamma_p, gamma_n = _ds_check(beta, gamma_p, gamma_n, anchor)
    if anchor == "base":
        return _normalize(
            np.where(c, (1.0 - gamma_p / beta) * lpb + 1.0 / beta, (1.0 + gamma_n / beta) * lpb)
        )
    a, s = _ds_policy_parts(lpb, c, beta, gamma_p, gamma_n)
    lam = np.asarray(ds_multiplier(lpb, c, beta, gamma_p, gamma_n))
    # The root is accurate to ~1e-14; renormalizing removes what is left.
    return _normalize(a - lam[..., None] / s)


def ds_anchor_map(
    log_pb: object, correct: object, beta: float, gamma_p: float, gamma_n: float = 0.0
) -> tuple[np.ndarray | float, float, float]:
    """Base-anchored DS parameters with the same optimum as the policy-anchored ones (seed 000, Eq. 19).

    Matching the two closed forms term by term (exponent of `π_b` on `C`, off `C`, and the log-odds
    offset between the sets) gives, with `s_C = β + γ_p`, `s_N = β − γ_n` and `λ` the policy-anchored
    multiplier (`ds_multiplier`):

        1/β' = (1 − λ)/s_C + λ/s_N,   γ_p' = β'·(1 − β/s_C),   γ_n' = β'·(β/s_N − 1).

    For the entropy bonus (`γ_p = η`, `γ_n = −η`, so `s_C = s_N = β + η`) this is the
    instance-free map `(β, η) → (β + η, η)`. In general `β'` depends on the instance through `λ`, and it
    can be `≤ 0` (about a quarter of random instances with `γ_p ∈ [0, 2β]`, `γ_n ∈ [0, β)`; see the
    checker `eq19_anchor_equivalence`); then, when `log π_b` is not constant on `C` nor off `C`, no
    base-anchored problem of the form (18) has this optimum.

    Returns:
        `(beta', gamma_p', gamma_n')`; `beta'` has shape `(...)` for batched `log_pb` (then
        `gamma_p'`, `gamma_n'` are arrays too); `beta'` is `inf` where `1/β'` is 0.

    Raises:
        ValueError: a correct set that is empty or full (the offset between the sets, which pins
            `β'`, is then undefined and the map is not unique); otherwise as `differential_smoothing`.
    """
    lpb = log_probs(log_pb, "log_pb", require_finite=True)
    correct_mask(correct, lpb.shape[-1], need_both=True)
    lam = np.asarray(ds_multiplier(lpb, correct, beta, gamma_p, gamma_n))
    s_c, s_n = beta + gamma_p, beta - gamma_n
    inv = (1.0 - lam) / s_c + lam / s_n
    with np.errstate(divide="ignore"):
        beta_new = 1.0 / inv
    gp = beta_new * (1.0 - beta / s_c)
    gn = beta_new * (beta / s_n - 1.0)
    if beta_new.ndim == 0:
        return float(beta_new), float(gp), float(gn)
    return beta_new, gp, gn


def objective(
    log_pi: object,
    log_pb: object,
    reward: object,
    beta: float,
    coef_policy: object = 0.0,
    coef_base: object = 0.0,
) -> np.ndarray | float:
    """`J(π) = Σ_τ π(τ)·[r(τ) − c(τ)·log π(τ) − d(τ)·log π_b(τ)] − β·KL(π‖π_b)`.

    Covers every objective of App. B: Lemma B.1 (`c = d = 0`), Lemma B.4 (`c = η` or `d = η`),
    Lemma B.5 (`c = γ_p` on `C`, `−γ_n` off `C`; or the same in `d`).

    Args:
        log_pi, log_pb: `(..., M)` normalized log-probabilities. reward, coef_policy, coef_base:
            scalars or `(..., M)` arrays. beta: `> 0`.

    Returns:
        Shape `(...)` (a float for 1-D input).
    """
    lp = log_probs(log_pi, "log_pi")
    lpb = log_probs(log_pb, "log_pb")
    beta = positive(beta, "beta")
    r = _reward(reward, lp.shape[-1])
    c = as_float_array(coef_policy, "coef_policy")
    d = as_float_array(coef_base, "coef_base")
    p = np.exp(lp)
    support = np.isfinite(lp)
    with np.errstate(invalid="ignore"):
        per = np.where(support, p * (r - c * lp - d * lpb - beta * (lp - lpb)), 0.0)
    out = np.sum(per, axis=-1)
    return float(out) if np.ndim(out) == 0 else out
