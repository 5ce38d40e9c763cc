"""The crossed seeds × problems design: the sampling covariance of model means, and power.

Every model is evaluated on the same `P` problems under `S` seeds, so a model's point (its mean
over seeds and problems) shares a seed's effect with the run's other checkpoints and a problem's
effect with every model. The two-way random-effects model of one quantity, `v_sp = μ + a_s + b_p +
e_sp`, gives `Var(v̄) = σ²_a/S + σ²_b/P + σ²_e/(S·P)`; from the mean squares (`E MS_seed = P·σ²_a +
σ²_e`, `E MS_problem = S·σ²_b + σ²_e`, `E MS_e = σ²_e`) the unbiased estimate is `(MS_seed +
MS_problem − MS_e)/(S·P)`, with Satterthwaite's degrees of freedom. The same mean squares of
several quantities at once (their cross-products) give the covariance matrix of all their means
(`mean_covariance`), which `experiment.inference` draws from.

A component whose F test is not significant is pooled into the error (`crossed_variance`).

Sources: the expected mean squares of the two-way crossed layout without replication (Searle,
Casella & McCulloch 1992, ch. 4); Satterthwaite (1946); the power formula with t quantiles.
"""

from __future__ import annotations

import functools

import numpy as np
from scipy import special

__all__ = [
    "POOL_LEVEL",
    "covariance_root",
    "crossed_variance",
    "design_mde",
    "mean_covariance",
    "mean_interval",
    "minimum_detectable",
    "variance_components",
]


def _mean_squares(v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(MS_seed, MS_problem, MS_e)` of `v` `(..., S, P)`, `S, P ≥ 2`, each `(...)`."""
    s, p = v.shape[-2], v.shape[-1]
    row, col, mean = v.mean(-1), v.mean(-2), v.mean((-2, -1))
    ms_row = p * row.var(axis=-1, ddof=1)
    ms_col = s * col.var(axis=-1, ddof=1)
    resid = v - row[..., :, None] - col[..., None, :] + mean[..., None, None]
    return ms_row, ms_col, (resid**2).sum((-2, -1)) / ((s - 1) * (p - 1))


POOL_LEVEL = 0.25
"""The level of the preliminary F tests that decide whether a seed or problem effect is kept in
`crossed_variance` ("sometimes pool"; a liberal level, as Bozivich, Bancroft & Hartley 1956
advise). The statistics' one tuned constant."""


@functools.lru_cache(maxsize=256)
def _pool_critical(df_effect: int, df_error: int) -> float:
    """The pooling F test's critical value at `POOL_LEVEL` (cached: a study's analysis asks for the
    same few thousands of times, and scipy's wrapper costs a quarter of a re-read)."""
    return float(special.fdtri(df_effect, df_error, 1 - POOL_LEVEL))  # stats.f.ppf's kernel


def crossed_variance(v: object) -> tuple[np.ndarray, np.ndarray]:
    """The variance of the grand mean of `v` `(..., S, P)` and its degrees of freedom (module
    docstring). An effect whose F test (`MS/MS_e`) is not significant at `POOL_LEVEL` is pooled
    into the error: without the seed effect the estimate is `MS_problem/(S·P)` (the problems'
    variance of their seed means, `P − 1` degrees of freedom), without the problem effect
    `MS_seed/(S·P)` (`S − 1`), without both the cells' variance over `S·P`; with both
    `(MS_seed + MS_problem − MS_e)/(S·P)` with Satterthwaite's degrees of freedom. With one seed:
    the problems' variance over `P`, `P − 1`.

    Why pool: with 2-4 seeds the seed component is estimated from 1-3 degrees of freedom; always
    keeping it makes the interval a t with ~2 degrees of freedom, clipping it at 0 inflates the
    variance by ~40% (docs/statistics.md); pooling when it is not significant gives nominal
    coverage when seed effects are small and keeps them when they are not.

    Returns:
        `(var, df)`, each `(...)`, `var` in the squared units of `v`.

    Raises:
        ValueError: fewer than 2 problems.
    """
    v = np.asarray(v, dtype=np.float64)
    s, p = v.shape[-2], v.shape[-1]
    if p < 2:
        raise ValueError(f"v: {p} problem(s); the variance needs at least 2")
    if s == 1:
        return v[..., 0, :].var(axis=-1, ddof=1) / p, np.full(v.shape[:-2], p - 1.0)
    a, b, e = _mean_squares(v)
    df_a, df_b, df_e = s - 1, p - 1, (s - 1) * (p - 1)
    safe = np.where(e > 0, e, 1.0)
    keep_a = (e > 0) & (a / safe > _pool_critical(df_a, df_e))
    keep_b = (e > 0) & (b / safe > _pool_critical(df_b, df_e))
    both = (a + b - e) / (s * p)
    terms = (a**2 / df_a + b**2 / df_b + e**2 / df_e) / (s * p) ** 2
    df_both = both**2 / np.where(terms > 0, terms, 1.0)
    total = v.reshape(*v.shape[:-2], s * p).var(axis=-1, ddof=1) / (s * p)
    var = np.select([keep_a & keep_b, keep_b, keep_a], [both, b / (s * p), a / (s * p)], total)
    df = np.select([keep_a & keep_b, keep_b, keep_a], [df_both, float(df_b), float(df_a)],
                   float(s * p - 1))  # fmt: skip
    return var, df


def mean_interval(v: object, level: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The mean of `v` `(..., S, P)` over seeds and problems with its t interval at `level`
    (`crossed_variance`): `(mean, lo, hi)`, each `(...)`; the interval is the point where the
    variance is 0."""
    v = np.asarray(v, dtype=np.float64)
    var, df = crossed_variance(v)
    mean = v.mean((-2, -1))
    # stats.t.ppf's kernel (its wrapper differs only at a quantile of 0 or 1)
    half = special.stdtrit(np.where(np.isfinite(df), df, 1.0), 0.5 + level / 2) * np.sqrt(var)
    return mean, mean - half, mean + half


def covariance_root(v: object) -> np.ndarray:
    """A root `L` `(K, r)` of the covariance matrix of the grand means of `K` quantities `v`
    `(K, S, P)` measured on the same seeds and problems (`L Lᵀ` = `mean_covariance`): the mean
    squares' cross-products combined as in `crossed_variance`, `(MS_seed + MS_problem − MS_e)/(S·P)`,
    projected onto the positive semi-definite matrices (negative eigenvalues dropped: the
    unbiased combination can have them). With one seed: the problems' covariance over `P`.

    The matrix is `A D Aᵀ` with `A` `(K, m)` the centred seed, problem and residual effects
    (`m = S + P + S·P`) and `D` = ±1 on the diagonal; when `K > m` it is decomposed in the
    column space of `A` (a QR), so thousands of models cost no `K × K` eigenproblem.

    Raises:
        ValueError: `v` not 3-D or fewer than 2 problems.
    """
    v = np.asarray(v, dtype=np.float64)
    if v.ndim != 3 or v.shape[2] < 2:
        raise ValueError(f"v: expected shape (K, S, P) with P >= 2, got {v.shape}")
    k, s, p = v.shape
    mean = v.mean((1, 2))
    col = v.mean(1) - mean[:, None]  # (K, P) problem effects
    if s == 1:
        a, sign = col / np.sqrt((p - 1) * p), np.ones(p)
    else:
        row = v.mean(2) - mean[:, None]  # (K, S) seed effects
        resid = (v - v.mean(2, keepdims=True) - v.mean(1, keepdims=True)
                 + mean[:, None, None]).reshape(k, s * p)  # fmt: skip
        a = np.concatenate([row / np.sqrt((s - 1) * s), col / np.sqrt((p - 1) * p),
                            resid / np.sqrt((s - 1) * (p - 1) * s * p)], axis=1)  # fmt: skip
        sign = np.concatenate([np.ones(s + p), -np.ones(s * p)])
    if k <= a.shape[1]:
        basis, small = np.eye(k), (a * sign) @ a.T
    else:
        basis, r = np.linalg.qr(a)
        small = (r * sign) @ r.T
    w, u = np.linalg.eigh((small + small.T) / 2)
    keep = w > 1e-12 * max(float(w.max()), 1e-300)
    return (basis @ u[:, keep]) * np.sqrt(w[keep])


def mean_covariance(v: object) -> np.ndarray:
    """The covariance matrix `(K, K)` of the grand means of `K` quantities `v` `(K, S, P)`:
    `covariance_root`'s `L Lᵀ`."""
    root = covariance_root(v)
    return root @ root.T


def variance_components(v: object) -> np.ndarray:
    """The variance components `(σ²_seed, σ²_problem, σ²_e)` of `v` `(..., S, P)` by the method of
    moments clipped at 0: `((MS_seed − MS_e)/P, (MS_problem − MS_e)/S, MS_e)`; they plan designs
    (`design_mde`). With one seed the seed component is not identified (NaN) and the problems'
    variance is all `σ²_problem`.

    Returns:
        `(..., 3)` float64, in the squared units of `v`.
    """
    v = np.asarray(v, dtype=np.float64)
    s, p = v.shape[-2], v.shape[-1]
    if s == 1:
        var = v[..., 0, :].var(axis=-1, ddof=1)
        return np.stack([np.full_like(var, np.nan), var, np.zeros_like(var)], axis=-1)
    a, b, e = _mean_squares(v)
    return np.stack([np.maximum((a - e) / p, 0.0), np.maximum((b - e) / s, 0.0), e], axis=-1)


def minimum_detectable(
    se: object, df: object, *, alpha: float = 0.05, power: float = 0.8
) -> np.ndarray:
    """The true effect a two-sided t test at level `alpha` detects with probability `power`, given
    the estimate's standard error `se` and degrees of freedom `df` (any shape; NaN stays NaN):
    `(t_{1−α/2, df} + t_{power, df})·se`. With Holm over `n` tests pass `alpha/n` for the first
    test to be rejected."""
    se, df = np.asarray(se, dtype=np.float64), np.asarray(df, dtype=np.float64)
    ok = np.isfinite(se) & np.isfinite(df) & (df > 0)
    d = np.where(ok, df, 1.0)
    # scipy.special's t quantile: stats.t.ppf's own kernel, without its per-call wrapper
    quantiles = special.stdtrit(d, 1 - alpha / 2) + special.stdtrit(d, power)
    return np.where(ok, quantiles * se, np.nan)


def design_mde(
    components: object, seeds: object, problems: object, *, alpha: float = 0.05, power: float = 0.8
) -> np.ndarray:
    """The minimum detectable effect (`minimum_detectable`) of a comparison whose per-(seed,
    problem) values have the variance `components` `(..., 3)` (`variance_components`) in a design
    of `seeds` × `problems` (broadcast against `components[..., 0]`): the variance
    `σ²_seed/S + σ²_problem/P + σ²_e/(S·P)` with Satterthwaite's degrees of freedom from the
    expected mean squares. A NaN component (one seed) gives NaN.

    Raises:
        ValueError: `components` whose last axis is not 3, or seeds or problems below 2.
    """
    comp = np.asarray(components, dtype=np.float64)
    if comp.shape[-1:] != (3,):
        raise ValueError(f"components: expected shape (..., 3), got {comp.shape}")
    s, p = np.asarray(seeds, dtype=np.float64), np.asarray(problems, dtype=np.float64)
    if np.any(s < 2) or np.any(p < 2):
        raise ValueError(f"seeds, problems: need at least 2 each, got {seeds}, {problems}")
    va, vb, ve = comp[..., 0], comp[..., 1], comp[..., 2]
    a, b = p * va + ve, s * vb + ve
    var = va / s + vb / p + ve / (s * p)
    terms = (a**2 / (s - 1) + b**2 / (p - 1) + ve**2 / ((s - 1) * (p - 1))) / (s * p) ** 2
    both = var**2 / np.where(terms > 0, terms, 1.0)
    df = np.select([(va > 0) & (vb > 0), vb > 0, va > 0], [both, p - 1, s - 1], s * p - 1)
    return minimum_detectable(np.sqrt(var), df, alpha=alpha, power=power)
