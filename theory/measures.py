"""Exact measures of a distribution over trajectories (seed 000, Definition 3.3 and Theorem B.10).

All functions take log-probabilities over the last axis, shape `(..., M)`, and work in log space so
that a tree with `4**10` leaves and probabilities far below 1e-300 is handled exactly.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from scipy import special
from scipy.special import logsumexp

from theory._validate import correct_mask, log_probs

DivergenceKind = Literal["kl", "chi2"]


def _masked_logsumexp(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return logsumexp(np.where(mask, x, -np.inf), axis=-1)


def log_correctness(log_p: object, correct: object) -> np.ndarray:
    """`log P(π)`, with `P(π) = Σ_{τ∈C} π(τ)`; shape `(...)`. `-inf` for an empty correct set."""
    lp = log_probs(log_p, "log_p")
    c = correct_mask(correct, lp.shape[-1])
    return _masked_logsumexp(lp, c)


def correctness(log_p: object, correct: object) -> np.ndarray | float:
    """Correctness `P(π) = Σ_{τ∈C} π(τ)` (seed 000, Definition 3.3).

    Args:
        log_p: trajectory log-probabilities `(..., M)`, normalized.
        correct: boolean correct-set mask `(M,)` or `(..., M)`.

    Returns:
        Shape `(...)`, in `[0, 1]` (a float for 1-D input).

    Raises:
        ValueError: unnormalized or NaN `log_p`; mask of the wrong length.
    """
    out = np.exp(log_correctness(log_p, correct))
    return float(out) if np.ndim(out) == 0 else out


def normalized_variance(log_p: object, correct: object) -> np.ndarray | float:
    """Normalized variance of `π` on the correct set (seed 000, Definition 3.3; docs/formulas.md §1.9).

    With `q = π / P(π)` on `C`: `V(π) = |C|·Σ_{τ∈C} q(τ)² − 1`, the squared coefficient of variation
    of `q` over `C`. It is `0` iff `π` is uniform on `C`, at most `|C| − 1`; lower means more diverse.

    Args:
        log_p: `(..., M)` trajectory log-probabilities; correct: `(M,)` or `(..., M)` mask.

    Returns:
        Shape `(...)` (a float for 1-D input).

    Raises:
        ValueError: empty correct set, or `P(π) = 0` (then `q` is undefined); unnormalized `log_p`.
    """
    lp = log_probs(log_p, "log_p")
    c = correct_mask(correct, lp.shape[-1])
    if not np.any(c, axis=-1).all():
        raise ValueError(
            "correct is empty: normalized variance needs at least one correct trajectory"
        )
    log_p_c = _masked_logsumexp(lp, c)
    if np.isneginf(log_p_c).any():
        raise ValueError(
            "log_p puts zero mass on the correct set: normalized variance is undefined"
        )
    size = np.sum(c, axis=-1)
    log_sq = _masked_logsumexp(2.0 * lp, c)
    out = np.expm1(np.log(size) + log_sq - 2.0 * log_p_c)
    out = np.maximum(out, 0.0)  # rounding can give -1e-16 for a uniform q
    return float(out) if np.ndim(out) == 0 else out


def divergence(log_p: object, log_q: object, kind: DivergenceKind = "kl") -> np.ndarray | float:
    """`D(p‖q)` for `kind` in `{"kl", "chi2"}`, computed in log space (seed 000, Theorem B.10).

    - `"kl"`: `KL(p‖q) = Σ p·(log p − log q)` (terms with `p = 0` are 0; `+inf` if `q = 0 < p`);
    - `"chi2"`: `χ²(p‖q) = Σ p²/q − 1`.

    Call with swapped arguments for the reverse direction, e.g. `divergence(log_pb, log_pi, "kl")` is
    `KL(π_b‖π)`.

    Args:
        log_p, log_q: `(..., M)` normalized log-probabilities (broadcastable).

    Returns:
        Shape `(...)`, `>= 0` (a float for 1-D input).

    Raises:
        ValueError: unknown `kind`; NaN or unnormalized inputs; shapes that do not broadcast.
    """
    if kind not in ("kl", "chi2"):
        raise ValueError(f"kind must be 'kl' or 'chi2', got {kind!r}")
    lp = log_probs(log_p, "log_p")
    lq = log_probs(log_q, "log_q")
    try:
        np.broadcast_shapes(lp.shape, lq.shape)
    except ValueError:
        raise ValueError(
            f"log_p and log_q must have broadcastable shapes, got {lp.shape} and {lq.shape}"
        ) from None
    support = np.isfinite(lp)
    if kind == "kl":
        with np.errstate(invalid="ignore"):
            terms = np.where(support, np.exp(lp) * (lp - lq), 0.0)
        out = np.sum(terms, axis=-1)
    else:
        with np.errstate(invalid="ignore"):
            log_terms = np.where(support, 2.0 * lp - lq, -np.inf)
        with np.errstate(over="ignore"):  # an astronomically large χ² is +inf, which is correct
            out = np.expm1(logsumexp(log_terms, axis=-1))
    out = np.maximum(out, 0.0)
    return float(out) if np.ndim(out) == 0 else out


def entropy(log_p: object) -> np.ndarray | float:
    """Shannon entropy `−Σ p log p` in nats over the last axis; shape `(...)`."""
    lp = log_probs(log_p, "log_p")
    terms = np.where(np.isfinite(lp), np.exp(lp) * lp, 0.0)
    out = -np.sum(terms, axis=-1)
    return float(out) if np.ndim(out) == 0 else out


def expected_distinct(log_p: object, k: int, mask: object | None = None) -> np.ndarray | float:
    """Expected number of distinct items among `k` i.i.d. draws: `Σ_τ 1 − (1 − π(τ))^k`.

    Restricted to `mask` (e.g. the correct set) when given (seed 004, Prop. 3; seed 000's
    distinct-correct-solutions count).

    Args:
        log_p: `(..., M)` normalized log-probabilities. k: an integer `>= 1`, or `inf` for the
            limit: the number of items with `π(τ) > 0` (`log_p > −inf`, however small). mask:
            `(M,)` or `(..., M)` boolean.

    Returns:
        Shape `(...)` (a float for 1-D input), in `[0, M]`.

    Raises:
        ValueError: `k` not a number, NaN, `< 1`, `-inf` or finite non-integer; bad `log_p` or `mask`.
    """
    lp = log_probs(log_p, "log_p")
    try:
        kf = float(k)
    except (TypeError, ValueError):
        raise ValueError(f"k must be an integer >= 1 or inf, got {k!r}") from None
    if isinstance(k, str) or not (kf == np.inf or (kf >= 1 and kf == int(kf))):
        raise ValueError(f"k must be an integer >= 1 or inf, got {k!r}")
    if kf == np.inf:
        terms = np.isfinite(lp).astype(np.float64)
        if mask is not None:
            terms = np.where(correct_mask(mask, lp.shape[-1], "mask"), terms, 0.0)
        out = np.sum(terms, axis=-1)
        return float(out) if np.ndim(out) == 0 else out
    # 1 − (1 − p)^k = −expm1(k·log1p(−p)) stays accurate for tiny p.
    p = np.exp(lp)
    with np.errstate(divide="ignore"):  # p == 1 gives log1p(-1) = -inf, and the term is exactly 1
        terms = -np.expm1(k * np.log1p(-np.minimum(p, 1.0)))
    if mask is not None:
        terms = np.where(correct_mask(mask, lp.shape[-1], "mask"), terms, 0.0)
    out = np.sum(terms, axis=-1)
    return float(out) if np.ndim(out) == 0 else out


def pass_at_k(n: object, c: object, k: object) -> np.ndarray | float:
    """Unbiased pass@k estimator (Chen et al. 2021): `1 − C(n−c, k) / C(n, k)`.

    Computed in the stable product form `1 − Π_{i=n−c+1}^{n} (1 − k/i)`, and exactly 1 when `n − c < k`.
    Broadcasts over array inputs.

    Args:
        n: samples per problem; c: correct samples (`0 <= c <= n`); k: `1 <= k <= n`.

    Raises:
        TypeError: naming `n`, `c` or `k`, if it is not a number or an array of numbers (a
            string, None).
        ValueError: naming `n`, `c` or `k`, if they are not integers in those ranges.
    """
    n_arr, c_arr, k_arr = (np.asarray(v) for v in (n, c, k))
    for name, arr in (("n", n_arr), ("c", c_arr), ("k", k_arr)):
        if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
            raise TypeError(f"pass_at_k: {name} must be an integer or an array of integers, "
                            f"got {arr.tolist()!r} ({arr.dtype})")  # fmt: skip
        if not np.all(np.equal(np.mod(arr, 1), 0)):
            raise ValueError(f"{name} must be integer-valued, got {arr!r}")
    n_arr, c_arr, k_arr = np.broadcast_arrays(
        n_arr.astype(np.int64), c_arr.astype(np.int64), k_arr.astype(np.int64)
    )
    if (c_arr < 0).any() or (c_arr > n_arr).any():
        raise ValueError(f"c must satisfy 0 <= c <= n, got c={c_arr!r}, n={n_arr!r}")
    if (k_arr < 1).any() or (k_arr > n_arr).any():
        raise ValueError(f"k must satisfy 1 <= k <= n, got k={k_arr!r}, n={n_arr!r}")
    out = np.empty(n_arr.shape, dtype=np.float64)
    for idx in np.ndindex(n_arr.shape):
        nn, cc, kk = int(n_arr[idx]), int(c_arr[idx]), int(k_arr[idx])
        if nn - cc < kk:
            out[idx] = 1.0
        else:
            i = np.arange(nn - cc + 1, nn + 1, dtype=np.float64)
            out[idx] = -np.expm1(np.sum(np.log1p(-kk / i)))
    return float(out) if out.ndim == 0 else out


def pass_at_k_fast(n: int, c: np.ndarray, k: int) -> np.ndarray:
    """`pass_at_k` vectorized over the correct counts `c` (any shape; `n`, `k` scalars), for the
    calibration's millions of problems: `1 − C(n−c, k) / C(n, k)` with scipy's float binomials,
    exactly 1 where `n − c < k`. No argument checks; equal to `pass_at_k` to ~1e-12
    (`tests/theory/test_measures.py`)."""
    c = np.asarray(c)
    out = 1.0 - special.comb(n - c, k, exact=False) / special.comb(n, k, exact=False)
    return np.where(n - c < k, 1.0, out)
