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


#: Largest |exponent| (`r/β` and the like) for which the closed forms are evaluated as written;
#: their rounding error in `log π` is about `|exponent|·eps`, 2e-10 at this bound. Beyond it (or where
#: the direct form overflows) the reward is shifted by its maximum first, which is exact in the limit.
DIRECT_EXPONENT_LIMIT = 1e6


def _broken(log_pi: np.ndarray) -> bool:
    """True when a computed optimum is unusable: NaN (from `inf − inf`) anywhere."""
    return bool(np.isnan(log_pi).any())


def _reward_gap(r: np.ndarray, lpb: np.ndarray) -> np.ndarray:
    """`r − max r` over the trajectories with `π_b > 0`, broadcast to `(..., M)`; `≤ 0` there.

    The maximizer keeps an exponent of exactly 0, so the optimum stays finite however large `r`
    or `1/β` is; a gap that overflows is `−inf`, the correct limit `π*(τ) → 0`.
    """
    r, lpb = np.broadcast_arrays(r, lpb)
    support = np.isfinite(lpb)
    top = np.max(np.where(support, r, -np.inf), axis=-1, keepdims=True)
    with np.errstate(over="ignore"):
        return np.where(support, r - top, -np.inf)


def _over_sum(num: float | np.ndarray, a: float, b: float) -> float | np.ndarray:
    """`num / (a + b)` for `a + b > 0`, also when `a + b` overflows (halving is exact there)."""
    if np.isfinite(a + b):
        return num / (a + b)
    return (0.5 * num) / (0.5 * a + 0.5 * b)


def _overflow(where: str, **params: float) -> ValueError:
    shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
    return ValueError(
        f"{where}: the optimum's exponents overflow float64 for {shown}; "
        "bring these parameters closer to the scale of log_pb"
    )


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

    Any finite reward and `beta > 0` (subnormal included) give a normalized result: where `r/β`
    overflows or exceeds `DIRECT_EXPONENT_LIMIT`, `log π* = log π_b + (r − max r)/β`, renormalized
    (the limit `β → 0` puts all mass on the best trajectories, in proportion to `π_b`).
    """
    lpb = log_probs(log_pb, "log_pb")
    beta = positive(beta, "beta")
    r = _reward(reward, lpb.shape[-1])
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = r / beta
        out = _normalize(lpb + scaled)
    if not _broken(out) and not np.max(np.abs(scaled)) > DIRECT_EXPONENT_LIMIT:
        return out
    with np.errstate(over="ignore"):
        gap = _reward_gap(r, lpb) / beta
    return _normalize(np.where(np.isfinite(lpb), lpb + gap, -np.inf))


def entropy_regularized(
    log_pb: object, reward: object, beta: float, eta: float, anchor: Anchor = "policy"
) -> np.ndarray:
    """Optimum with an entropy-shaped reward (seed 000, Lemma B.4; docs/formulas.md §1.5).

    - `anchor="policy"`: reward `r − η·log π(τ)`; `π ∝ π_b^{β/(β+η)}·exp(r/(β+η))`.
    - `anchor="base"`: reward `r − η·log π_b(τ)`; `π ∝ π_b^{1−η/β}·exp(r/β)`.

    `η > 0` is an entropy bonus, `η < 0` an entropy penalty.

    Args:
        log_pb: `(..., M)` base log-probabilities, all finite (a softmax policy has full support).
        reward: `(M,)` or `(..., M)` finite rewards. beta: `> 0`. eta: finite.

    Returns:
        `log π*`, shape `(..., M)`.

    Where the exponents overflow or exceed `DIRECT_EXPONENT_LIMIT` the same optimum is computed
    with the reward shifted by its maximum and the scale `1/(β+η)` (policy) or `1/β` (base) applied
    last, so huge rewards, huge `η/β` and subnormal `β` still give a normalized result.

    Raises:
        ValueError: `beta <= 0`; policy anchor with `beta + eta <= 0` (the objective is then not
            concave and has no maximizer in the interior); bad `log_pb`, `reward` or `anchor`;
            parameters so extreme that even the shifted exponents overflow (e.g. `β` and `−η`
            both near the float64 maximum), naming `beta` and `eta`.
    """
    lpb = log_probs(log_pb, "log_pb", require_finite=True)
    beta = positive(beta, "beta")
    eta = finite(eta, "eta")
    r = _reward(reward, lpb.shape[-1])
    policy = _anchor(anchor) == "policy"
    if policy and beta + eta <= 0:
        raise ValueError(
            f"beta + eta must be > 0 for the policy-anchored problem, got beta={beta}, eta={eta}"
        )
    with np.errstate(over="ignore", invalid="ignore"):
        if policy:
            x = (beta * lpb + r) / (beta + eta)
        else:
            x = (1.0 - eta / beta) * lpb + r / beta
        out = _normalize(x)
    if not _broken(out) and not np.max(np.abs(x)) > DIRECT_EXPONENT_LIMIT:
        return out
    gap = _reward_gap(r, lpb)
    with np.errstate(over="ignore", invalid="ignore"):
        if policy:
            x = _over_sum(beta, beta, eta) * lpb + _over_sum(gap, beta, eta)
        else:
            coef = 1.0 - eta / beta
            x = _tilted(lpb, coef, np.ones(lpb.shape, bool))[0] + gap / beta
        out = _normalize(x)
        if _broken(out) and not policy:
            # Both terms are ±huge (|η|/β and r/β overflow): they are compared at the scale of
            # β·x, where the leading orders may cancel and rounding decides between near-ties.
            y = (beta - eta) * lpb + gap
            out = _normalize((y - np.max(y, axis=-1, keepdims=True)) / beta)
    if _broken(out):
        raise _overflow("entropy_regularized", beta=beta, eta=eta)
    return out


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


#: Largest `|log Σ π|` left by Brent's root in `λ` before the optimum is recomputed by masses.
_MASS_TOLERANCE = 1e-9


def _softplus(x: float | np.ndarray) -> float | np.ndarray:
    return np.logaddexp(0.0, x)


def _ds_policy_by_lambda(
    lpb: np.ndarray, c: np.ndarray, beta: float, gamma_p: float, gamma_n: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """`(log π, λ)` with `λ` from Brent's method on `Σ π = 1`; `None` when that fails or is off.

    Accurate while `β + γ_p` and `β − γ_n` are of similar size; with one of them `10^12` times the
    other the bracket is too wide for `brentq`, or `λ/s` loses the digits that matter.
    """
    with np.errstate(all="ignore"):
        a, s = _ds_policy_parts(lpb, c, beta, gamma_p, gamma_n)
        cb = np.broadcast_to(c, a.shape)
        a_c = logsumexp(np.where(cb, a, -np.inf), axis=-1)
        a_n = logsumexp(np.where(cb, -np.inf, a), axis=-1)
        lam = np.empty(a_c.shape)
        try:
            for idx in np.ndindex(a_c.shape):
                lam[idx] = _solve_multiplier(
                    float(a_c[idx]), float(a_n[idx]), beta + gamma_p, beta - gamma_n
                )
        except (RuntimeError, ValueError):  # brentq: no convergence, or NaN at a bracket end
            return None
        x = a - lam[..., None] / s
        if not np.all(np.abs(logsumexp(x, axis=-1)) <= _MASS_TOLERANCE):
            return None
    # The root is accurate to ~1e-14; renormalizing removes what is left.
    return _normalize(x), lam


def _ds_policy_by_mass(
    lpb: np.ndarray, c: np.ndarray, beta: float, gamma_p: float, gamma_n: float
) -> tuple[np.ndarray, np.ndarray]:
    """`(log π, λ)` of the policy-anchored DS optimum through the mass `t = π(C)` (slow, robust).

    Within each set the optimum is `softmax(w·log π_b)` with `w_C = β/s_C`, `w_N = β/s_N` (the rest
    of the exponent is constant there), so only `t` is unknown. With `L = logsumexp(w·log π_b)`
    over a set, `λ = 1 + s_C·(L_C − 1 − log t) = s_N·(L_N − 1 − log(1 − t))`; this is solved for
    the log-odds `ℓ = log(t/(1 − t))` after dividing by `max(s_C, s_N)`, so neither a huge `γ_p`
    nor a subnormal `β` overflows, and a mass far below 1e-308 keeps its log (`−softplus(ℓ)`).
    """
    # `s_C = h_c/k`, `s_N = h_n/k`: halved (exactly) only where a sum overflows.
    k = 1.0 if np.isfinite(beta + gamma_p) and np.isfinite(beta - gamma_n) else 0.5
    h_c, h_n = k * beta + k * gamma_p, k * beta - k * gamma_n
    scale = max(h_c, h_n)
    with np.errstate(over="ignore"):
        shift = k / scale  # the 1/s_C of the exponent on C, over max(s_C, s_N); may be inf
    z = np.where(c, _over_sum(beta, beta, gamma_p), _over_sum(beta, beta, -gamma_n)) * lpb
    cb = np.broadcast_to(c, z.shape)
    l_c = logsumexp(np.where(cb, z, -np.inf), axis=-1)
    l_n = logsumexp(np.where(cb, -np.inf, z), axis=-1)
    logit = np.empty(l_c.shape)
    lam = np.empty(l_c.shape)
    for idx in np.ndindex(l_c.shape):
        lc, ln = float(l_c[idx]), float(l_n[idx])
        if np.isneginf(lc):  # no correct trajectory: all the mass is off C
            logit[idx] = -np.inf
        elif np.isneginf(ln) or np.isinf(shift):  # C holds all the mass, or all but < 1e-308
            logit[idx] = np.inf
        else:
            logit[idx] = _solve_logit(lc - 1.0, ln - 1.0, h_c / scale, h_n / scale, shift)
        if np.isneginf(logit[idx]):
            lam[idx] = h_n / k * (ln - 1.0 + float(_softplus(logit[idx])))
        else:
            lam[idx] = 1.0 + h_c / k * (lc - 1.0 + float(_softplus(-logit[idx])))
    ell = logit[..., None]
    with np.errstate(invalid="ignore"):  # an empty set's side is −inf − (−inf): masked out
        out = np.where(
            cb, z - l_c[..., None] - _softplus(-ell), z - l_n[..., None] - _softplus(ell)
        )
    return _normalize(out), lam


def _solve_logit(b_c: float, b_n: float, u_c: float, u_n: float, shift: float) -> float:
    """Root `ℓ` of `u_C·(b_C + softplus(−ℓ)) + shift = u_N·(b_N + softplus(ℓ))` (decreasing in `ℓ`)."""

    def f(ell: float) -> float:
        return float(u_c * (b_c + _softplus(-ell)) + shift - u_n * (b_n + _softplus(ell)))

    lo, hi = -1.0, 1.0
    while f(lo) < 0 and lo > -1e300:
        lo *= 2.0
    while f(hi) > 0 and hi < 1e300:
        hi *= 2.0
    if not f(lo) >= 0 >= f(hi):
        raise ValueError(f"no root in [{lo:g}, {hi:g}]")
    return brentq(f, lo, hi, xtol=1e-14, rtol=4 * np.finfo(float).eps, maxiter=500)


def _ds_policy(
    lpb: np.ndarray, c: np.ndarray, beta: float, gamma_p: float, gamma_n: float
) -> tuple[np.ndarray, np.ndarray]:
    fast = _ds_policy_by_lambda(lpb, c, beta, gamma_p, gamma_n)
    return fast if fast is not None else _ds_policy_by_mass(lpb, c, beta, gamma_p, gamma_n)


def ds_multiplier(
    log_pb: object, correct: object, beta: float, gamma_p: float, gamma_n: float = 0.0
) -> np.ndarray | float:
    """The Lagrange multiplier `λ` of the policy-anchored DS optimum (seed 000, Lemma B.5).

    `log π = (1 + β log π_b − γ_p − β − λ)/(β + γ_p)` on `C` and
    `(β log π_b + γ_n − β − λ)/(β − γ_n)` off `C`; `λ` is the unique root of `Σ π = 1`.
    Shape `(...)` (a float for 1-D input); `±inf` where `|λ|` exceeds the float64 range (huge
    `γ_p` or `−γ_n`). Errors as in `differential_smoothing`.
    """
    lpb = log_probs(log_pb, "log_pb", require_finite=True)
    c = correct_mask(correct, lpb.shape[-1])
    beta, gamma_p, gamma_n = _ds_check(beta, gamma_p, gamma_n, "policy")
    lam = _ds_policy(lpb, c, beta, gamma_p, gamma_n)[1]
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
      scalar equation: the sums over each set are computed once). When that root fails or leaves
      `Σ π` off 1 (e.g. `γ_p = 1e300`, or a subnormal `β`), the same optimum is solved for the mass
      of `C` instead (`_ds_policy_by_mass`); `γ_p → ∞` tends to `π` uniform on `C` with mass
      `min(1, |C|/e)`.
    - base: `π ∝ e^{1/β}·π_b^{1−γ_p/β}` on `C`, `π ∝ π_b^{1+γ_n/β}` off `C` (multiplied through by
      `β` and shifted by the maximum first where the exponents overflow or exceed
      `DIRECT_EXPONENT_LIMIT`).

    Args:
        log_pb: `(..., M)` base log-probabilities, all finite. correct: `(M,)` or `(..., M)` mask.
        beta: `> 0`. gamma_p, gamma_n: finite (`≥ 0` in the paper; other values are allowed where the
            problem stays concave).

    Returns:
        `log π*`, shape `(..., M)`, normalized for every finite `beta > 0`, `gamma_p`, `gamma_n`
        in the valid range.

    Raises:
        ValueError: `beta <= 0`; policy anchor with `gamma_n >= beta` or `beta + gamma_p <= 0`
            (non-concave); bad `log_pb`, `correct` or `anchor`; parameters so extreme that even the
            rescaled problem overflows float64 (naming `beta`, `gamma_p`, `gamma_n`).
    """
    lpb = log_probs(log_pb, "log_pb", require_finite=True)
    c = correct_mask(correct, lpb.shape[-1])
    beta, gamma_p, gamma_n = _ds_check(beta, gamma_p, gamma_n, anchor)
    if anchor == "policy":
        return _ds_policy(lpb, c, beta, gamma_p, gamma_n)[0]
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.where(c, (1.0 - gamma_p / beta) * lpb + 1.0 / beta, (1.0 + gamma_n / beta) * lpb)
        out = _normalize(x)
    if not _broken(out) and not np.max(np.abs(x)) > DIRECT_EXPONENT_LIMIT:
        return out
    out = _ds_base_by_mass(lpb, c, beta, gamma_p, gamma_n)
    if _broken(out):
        raise _overflow("differential_smoothing", beta=beta, gamma_p=gamma_p, gamma_n=gamma_n)
    return out


def _tilted(lpb: np.ndarray, coef: float, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(coef·(log π_b − m), m)` on `mask` (`−inf` off it), `m` the row's max (coef > 0) or min
    (coef < 0) of `log π_b` on `mask`: the exponent is `≤ 0` and 0 at the extreme, even for
    `coef = ±inf`."""
    pick = np.max if coef >= 0 else np.min
    fill = -np.inf if coef >= 0 else np.inf
    m = pick(np.where(mask, lpb, fill), axis=-1, keepdims=True)
    with np.errstate(over="ignore", invalid="ignore"):
        d = lpb - m
        z = np.where(d == 0, 0.0, coef * d)
    return np.where(mask, z, -np.inf), m


def _ds_base_by_mass(
    lpb: np.ndarray, c: np.ndarray, beta: float, gamma_p: float, gamma_n: float
) -> np.ndarray:
    """The base-anchored DS optimum as within-set softmaxes and the log-odds of `C` (slow, robust).

    `log π = coef_S·log π_b + [1/β on C]`, `coef_C = 1 − γ_p/β`, `coef_N = 1 + γ_n/β`; the log-odds
    of the set masses is `(1 + q_C·m_C − q_N·m_N)/β + R_C − R_N` with `q = β·coef` (finite where
    `coef` overflows), `m` the extremes of `_tilted` and `R` the within-set log-sum-exps.
    """
    with np.errstate(over="ignore"):
        coef_c, coef_n = 1.0 - gamma_p / beta, 1.0 + gamma_n / beta
    lpb, cb = np.broadcast_arrays(lpb, c)
    z_c, m_c = _tilted(lpb, coef_c, cb)
    z_n, m_n = _tilted(lpb, coef_n, ~cb)
    r_c, r_n = logsumexp(z_c, axis=-1), logsumexp(z_n, axis=-1)
    with np.errstate(over="ignore", invalid="ignore"):
        head = 1.0 + np.where(np.isfinite(r_c), (beta - gamma_p) * m_c[..., 0], 0.0)
        head = head - np.where(np.isfinite(r_n), (beta + gamma_n) * m_n[..., 0], 0.0)
        ell = np.where(np.isneginf(r_c), -np.inf, np.where(np.isneginf(r_n), np.inf, head / beta))
        ell = (ell + np.where(np.isfinite(r_c - r_n), r_c - r_n, 0.0))[..., None]
        out = np.where(
            cb, z_c - r_c[..., None] - _softplus(-ell), z_n - r_n[..., None] - _softplus(ell)
        )
    return _normalize(out)


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
        Shape `(...)` (a float for 1-D input); `−inf` when `π` puts mass where `π_b` has none
        (`KL = ∞`), unless `d = β` cancels the `log π_b` terms there (then finite), `+inf` if `d > β`.
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
        # Where π > 0 = π_b the two log π_b terms are inf − inf; together they are (β − d)·log π_b.
        weight = np.where(beta - d == 0, 0.0, (beta - d) * lpb)
        off = support & np.isneginf(lpb)
        per = np.where(off, np.where(weight == 0, p * (r - (c + beta) * lp), weight), per)
    out = np.sum(per, axis=-1)
    return float(out) if np.ndim(out) == 0 else out
