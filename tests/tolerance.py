"""Float tolerances derived from the arithmetic: the dtype's unit roundoff and the reduction size.

Two legal kernels (another SIMD width, another block or thread split) compute the same sum of `n`
terms in different orders. Each ordering's result lies within ``γ(n-1) · Σ|x_i|`` of the exact
sum, with ``γ(m) = m·u / (1 - m·u)`` and ``u`` the unit roundoff of the dtype (Higham, *Accuracy
and Stability of Numerical Algorithms*, 2nd ed., §4.2, Eq. 4.4), so the two results differ by at
most ``2·γ(n-1) · Σ|x_i|``. A chain of reductions of sizes n1, n2, ... is bounded by ``γ(n1 + n2 +
...)`` to first order (Lemma 3.3 there), so `n` is the sum of the chained reduction lengths.

Every test that compares two float computations that may legally round differently takes its
tolerance from `sum_tol` or `assert_close` here, and says what `n` and the scale are.
"""

from __future__ import annotations

from typing import Any

import numpy as np

UNIT_ROUNDOFF: dict[str, float] = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
}
"""u = half the distance from 1 to the next float, by dtype name."""


def unit_roundoff(dtype: Any) -> float:
    """`UNIT_ROUNDOFF` of a numpy/torch/JAX dtype or its name (``"float32"``, ``torch.bfloat16``).

    Raises:
        KeyError: `dtype` is not a floating dtype of the table.
    """
    name = str(dtype).removeprefix("torch.")
    if name not in UNIT_ROUNDOFF:
        name = np.dtype(dtype).name
    return UNIT_ROUNDOFF[name]


def gamma(n: int, dtype: Any) -> float:
    """Higham's ``γ(n) = n·u / (1 - n·u)``; needs ``n·u < 1``.

    Raises:
        ValueError: ``n·u >= 1`` (no bound at this size).
    """
    nu = max(int(n), 0) * unit_roundoff(dtype)
    if nu >= 1:
        raise ValueError(f"n={n}: n·u = {nu:.3g} >= 1, no rounding-error bound")
    return nu / (1 - nu)


def sum_tol(dtype: Any, n: int, scale: float = 1.0) -> float:
    """Largest difference of two orderings of a sum of `n` terms in `dtype`, whose absolute values
    sum to at most `scale`: ``2·γ(n-1)·scale``."""
    return 2 * gamma(max(n - 1, 1), dtype) * float(scale)


def assert_close(
    actual: Any,
    expected: Any,
    *,
    dtype: Any,
    n: int,
    scale: float | None = None,
    elementwise: bool = False,
) -> None:
    """Assert ``|actual - expected| <= sum_tol(dtype, n, scale)`` (torch or numpy arrays).

    `scale` bounds Σ|x_i| of each compared sum; default ``max(max|expected|, 1)`` (sums without
    heavy cancellation, whose terms are O(1)); with `elementwise` each element's own
    ``max(|expected_i|, 1)`` (for results whose magnitudes vary widely, e.g. gradients of layers
    of different sizes).
    """
    a = np.asarray(_numpy(actual), dtype=np.float64)
    e = np.asarray(_numpy(expected), dtype=np.float64)
    assert a.shape == e.shape, f"shapes differ: {a.shape} vs {e.shape}"
    if scale is not None:
        s = np.full_like(e, float(scale))
    elif elementwise:
        s = np.maximum(np.abs(e), 1.0)
    else:
        s = np.full_like(e, max(float(np.max(np.abs(e), initial=0.0)), 1.0))
    tol = sum_tol(dtype, n) * s
    excess = np.abs(a - e) - tol
    if excess.size and float(excess.max()) > 0:
        i = np.unravel_index(int(np.argmax(excess)), excess.shape)
        raise AssertionError(
            f"|difference| {abs(a[i] - e[i]):.3g} at {i} > {tol[i]:.3g} = 2·γ({n - 1})·{s[i]:.3g}"
            f" for {dtype}"
        )


def _numpy(x: Any) -> Any:
    if hasattr(x, "detach"):
        return x.detach().cpu().double().numpy()
    return x


DATA_PARALLEL_N = 512
"""Reduction length bounding one training step of the llm tests' tiny models, single process vs.
data parallel: the per-parameter gradient sums the step's tokens (rows x positions: 2 x 4 rows of
at most ~40 positions), then the hidden, MLP and vocabulary widths (16, 32, <= 130); the all-reduce
over 2 ranks adds one level. AdamW's step divides by the gradient's own scale, so parameters move by
at most lr x the gradient's relative error per step: within this bound relative to
max(|parameter|, 1)."""
