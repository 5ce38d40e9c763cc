"""Input checks shared by the closed forms and measures: every error names the argument and value."""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

#: Largest allowed |log Σ exp(log_p)| for a distribution given as log-probabilities.
NORMALIZATION_ATOL = 1e-6


def _real(value: object, name: str) -> float:
    if isinstance(value, bool | str | bytes):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None


def _show(value: object) -> str:
    arr = np.asarray(value)
    if arr.size <= 6:
        return repr(value)
    return f"array of shape {arr.shape}"


def as_float_array(value: object, name: str) -> np.ndarray:
    """Return `value` as a float64 array; reject NaN and +inf (``-inf`` means probability 0)."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an array of real numbers, got {value!r}") from None
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN: {_show(value)}")
    if np.isposinf(arr).any():
        raise ValueError(f"{name} contains +inf: {_show(value)}")
    return arr


def log_probs(value: object, name: str, *, require_finite: bool = False) -> np.ndarray:
    """Validate log-probabilities over the last axis `(..., M)`: no NaN, normalized to 1.

    Raises:
        ValueError: naming `name`, if `value` has NaN/+inf, is empty, is not normalized within
            `NORMALIZATION_ATOL`, or (with `require_finite`) gives some trajectory probability 0.
    """
    arr = as_float_array(value, name)
    if arr.ndim == 0 or arr.shape[-1] == 0:
        raise ValueError(
            f"{name} must have a non-empty last axis of trajectories, got shape {arr.shape}"
        )
    if require_finite and np.isneginf(arr).any():
        raise ValueError(f"{name} must give every trajectory positive probability (found -inf)")
    total = logsumexp(arr, axis=-1)
    worst = float(np.max(np.abs(total)))
    if not worst <= NORMALIZATION_ATOL:
        raise ValueError(
            f"{name} is not normalized: log Σ exp({name}) = {float(np.ravel(total)[np.argmax(np.abs(total))]):.3g}"
            f" (tolerance {NORMALIZATION_ATOL})"
        )
    return arr


def correct_mask(
    value: object, size: int, name: str = "correct", *, need_both: bool = False
) -> np.ndarray:
    """Validate a boolean correct-set mask of shape `(M,)` (or broadcastable batch `(..., M)`).

    Raises:
        ValueError: wrong last-axis length, non-boolean values, or (with `need_both`) a correct set that
            is empty or holds every trajectory.
    """
    arr = np.asarray(value)
    if arr.dtype != np.bool_:
        if not np.isin(arr, (0, 1)).all():
            raise ValueError(f"{name} must be a boolean mask, got values {_show(value)}")
        arr = arr.astype(bool)
    if arr.ndim == 0 or arr.shape[-1] != size:
        raise ValueError(
            f"{name} must have last axis of length {size} (trajectories), got shape {arr.shape}"
        )
    if need_both:
        if not arr.any(axis=-1).all():
            raise ValueError(
                f"{name} is empty: this quantity needs at least one correct trajectory"
            )
        if arr.all(axis=-1).any():
            raise ValueError(
                f"{name} is full: this quantity needs at least one incorrect trajectory"
            )
    return arr


def positive(value: float, name: str) -> float:
    """Return `value` as a float if it is finite and > 0, else raise ValueError naming it."""
    v = _real(value, name)
    if not np.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


def finite(value: float, name: str) -> float:
    """Return `value` as a float if it is finite, else raise ValueError naming it."""
    v = _real(value, name)
    if not np.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v
