"""The lift's estimand: a model's distance above GRPO's attainable trade-off, bounded by construction.

GRPO's *attainable trade-off* is the upper concave hull of its models' points (every setting ×
checkpoint, and the base model at the origin of the gains), as a function of pass@1 on the hull's
pass@1 range. Why the hull: a mixture of two models (each problem answered by one or the other,
chosen at random with weights `w`, `1 − w`) has pass@1 and pass@k (and distinct correct solutions)
exactly `w·` one model's `+ (1 − w)·` the other's, so every point of a segment between two of
GRPO's models is attainable by GRPO, and the upper hull is the best of them. Carathéodory on the
line: a hull point is a mixture of at most two of the points.

The *lift* of a model is `ȳ_m − H(x̄_m)`: its gain in the measure minus the hull at its pass@1 gain,
inside the hull's range `[min(0, min x̄_ref), max x̄_ref]` (status ``"inside"``). **Above** it
(status ``"above"``: the model moved pass@1 further than any of GRPO's models, by `d = x̄_m −
x_max`) GRPO is credited with the hull's highest value on the window mirrored below the range's
end, `H(x) = max H on [max(x_min, x_max − d), x_max]` (lift v6; `Hull.read_at`). Why: it equals
the hull at the range's end (a model just above the range reads as one just inside it), it never
credits GRPO with less than its end point (where GRPO sharpens, its end is its lowest measure
near there), and it is continuous in GRPO's points: which of two GRPO models with nearly the same
top pass@1 counts as the end does not move it once `d` exceeds their gap. The flat continuation
from the end point alone (lift v4-v5) jumped by the two models' measure difference when noise
swapped them (5.7 points of pass@16 in the strong study's regime), and a lower end point lowered it
(adding a GRPO model made GRPO worse). A positive lift above the range says the model has more of
the measure than every GRPO model within `d` below the end, with more pass@1 besides; far above the
range the window holds GRPO's whole range and the lift compares with GRPO's best measure. **Below**
the range (less pass@1 than both the base and every GRPO model) there is no lift: the curve-free
check (`experiment.inference.dominance`) decides. A hull value is a weighted mean of GRPO's own
points, so a lift stays a difference of two means of the measure: inside `[−1, +1]` for pass@k (±100
points), whatever the noise.

Every table labels a model above the range (`range_label`): a positive lift says it *dominates*
GRPO's models near its end, a negative one that it has less of the measure than they do with
more pass@1, not that GRPO's training beats it (GRPO trained one checkpoint longer along its last
segment reads a negative lift).

Sources: the estimand of docs/statistics.md; the mixture argument is the one of randomized
decision rules (a convex combination of two achievable risk points is achievable).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ABOVE_RANGE", "ORIGIN", "Hull", "hull_values", "lifts", "range_label", "upper_hull"]

ORIGIN = -1
"""The vertex index of the base model's point `(0, 0)`, which every reference hull includes."""


@dataclass(frozen=True)
class Hull:
    """An upper concave hull as a function of pass@1.

    Attributes:
        vx, vy: `(n,)` its vertices, `vx` strictly increasing; the slopes between them decrease.
        index: `(n,)` each vertex's index into the points `upper_hull` was given (`ORIGIN`: the
            base model's point added there).
    """

    vx: np.ndarray
    vy: np.ndarray
    index: np.ndarray

    @property
    def x_min(self) -> float:
        return float(self.vx[0])

    @property
    def x_max(self) -> float:
        return float(self.vx[-1])

    @property
    def x_peak(self) -> float:
        """The pass@1 of the hull's highest vertex (the first, on a tie)."""
        return float(self.vx[int(np.argmax(self.vy))])

    def read_at(self, x: object) -> np.ndarray:
        """The pass@1 at which GRPO is read for a model at `x` (any shape): `x` itself inside the
        range; above it the point of the window `[max(x_min, 2·x_max − x), x_max]` (as far
        below the range's end as `x` is above it) where the hull is highest, `clip(x_peak, ...)`
        (the hull is concave); NaN below the range (module docstring)."""
        return _read_point(np.asarray(x, dtype=np.float64), self.x_min, self.x_max, self.x_peak)

    def __call__(self, x: object) -> np.ndarray:
        """`H(x)` elementwise (any shape): the hull on `[x_min, x_max]`, its highest value on the
        mirrored window above `x_max` (`read_at`; module docstring), NaN below `x_min`."""
        x = np.asarray(x, dtype=np.float64)
        r = self.read_at(x)
        return np.where(np.isnan(r), np.nan, np.interp(np.nan_to_num(r), self.vx, self.vy))

    def status(self, x: object) -> np.ndarray:
        """``"below"``, ``"inside"`` or ``"above"`` the hull's pass@1 range, elementwise."""
        x = np.asarray(x, dtype=np.float64)
        return np.where(x < self.vx[0], "below", np.where(x > self.vx[-1], "above", "inside"))

    def facet(self, x: float) -> tuple[int, int, float]:
        """The segment under the read point `read_at(x)` (inside the range or above it): the vertex
        positions `(i, j)` and the weight `w` of `j` (`H(x) = (1 − w)·vy[i] + w·vy[j]`); `i == j`,
        `w = 0` on a single-vertex hull."""
        if self.vx.size == 1:
            return 0, 0, 0.0
        r = float(self.read_at(x))
        j = int(np.clip(np.searchsorted(self.vx, r, side="left"), 1, self.vx.size - 1))
        i = j - 1
        return i, j, float((r - self.vx[i]) / (self.vx[j] - self.vx[i]))


def _read_point(x: np.ndarray, x_min: object, x_max: object, x_peak: object) -> np.ndarray:
    """`Hull.read_at`'s rule for hulls given by their range and highest vertex (scalars, or columns
    broadcast against `x`): `x` inside `[x_min, x_max]`, `clip(x_peak, max(x_min, 2·x_max − x),
    x_max)` above it, NaN below."""
    low = np.maximum(x_min, 2.0 * x_max - x)
    above = np.clip(x_peak, low, x_max)
    return np.where(x < x_min, np.nan, np.where(x > x_max, above, x))


ABOVE_RANGE = "above GRPO's pass@1 range"
"""The label of status ``"above"`` in every table."""


def range_label(status: str | None, sign: int, measure: str = "pass@k") -> str | None:
    """The tables' label of a model above the reference's pass@1 range (None for any other
    `status`): `ABOVE_RANGE`, then ``": dominates GRPO near its end"`` where the lift is
    established > 0 (`sign` +1: more pass@1 than any of GRPO's models and more of the measure than
    those near its end, module docstring) or ``": less <measure>, more pass@1 than GRPO near its
    end"`` where it is established < 0 (`sign` −1: a trade-off past GRPO's end, not a loss to
    GRPO's training).
    Who establishes the sign is the caller's (Holm in a confirmation, the interval in an
    exploratory table).

    Args:
        status: the estimand's status (``"inside"``, ``"above"``, ``"below"``) or None.
        sign: +1, −1 or 0 (not established).
        measure: the measure's name in the label (``"pass@k"``, ``"distinct correct"``).

    Raises:
        ValueError: a `sign` other than −1, 0, +1.
    """
    if sign not in (-1, 0, 1):
        raise ValueError(f"sign: expected -1, 0 or +1, got {sign!r}")
    if status != "above":
        return None
    if sign > 0:
        return f"{ABOVE_RANGE}: dominates GRPO near its end"
    if sign < 0:
        return f"{ABOVE_RANGE}: less {measure}, more pass@1 than GRPO near its end"
    return ABOVE_RANGE


def upper_hull(px: object, py: object) -> Hull:
    """The upper concave hull of the points `(px, py)` `(n,)` and the origin `(0, 0)` (the base
    model; module docstring), by Andrew's monotone chain (points on a segment are not vertices).

    Raises:
        ValueError: for mismatched or non-finite inputs.
    """
    px, py = np.asarray(px, dtype=np.float64), np.asarray(py, dtype=np.float64)
    if px.ndim != 1 or px.shape != py.shape:
        raise ValueError(f"px and py must be equal 1-D arrays, got {px.shape}, {py.shape}")
    if not (np.isfinite(px).all() and np.isfinite(py).all()):
        raise ValueError("px and py must be finite")
    xs, ys = np.append(px, 0.0), np.append(py, 0.0)
    idx = np.append(np.arange(px.size), ORIGIN)
    order = np.lexsort((-ys, xs))  # by pass@1, the highest measure first among ties
    hx: list[float] = []
    hy: list[float] = []
    hi: list[int] = []
    for k in order:
        x, y = xs[k], ys[k]
        if hx and x == hx[-1]:
            continue  # a tie in pass@1: the first (highest) is kept
        # Drop the last vertex while it lies on or below the chord from the one before it.
        while len(hx) >= 2 and (hx[-1] - hx[-2]) * (y - hy[-2]) >= (hy[-1] - hy[-2]) * (x - hx[-2]):
            hx.pop()
            hy.pop()
            hi.pop()
        hx.append(float(x))
        hy.append(float(y))
        hi.append(int(idx[k]))
    return Hull(np.array(hx), np.array(hy), np.array(hi, dtype=np.int64))


def hull_values(px: np.ndarray, py: np.ndarray, x: np.ndarray) -> np.ndarray:
    """`H_b(x[b])` for many point sets at once: `upper_hull(px[b], py[b])(x[b])` for every row `b`,
    equal to it bit for bit (the same comparisons build each hull, and each value is `np.interp`'s
    arithmetic on it); what `experiment.inference` reads every draw of the means with.

    Args:
        px, py: `(B, R)` the reference points of each of `B` sets (finite).
        x: `(B, T)` where each set's hull is read.

    Returns:
        `(B, T)`: the hull's value (the continuation above its range, `Hull.read_at`), NaN below it.
    """
    px, py, x = (np.asarray(a, dtype=np.float64) for a in (px, py, x))
    n_sets, n_points = px.shape
    xs = np.concatenate([px, np.zeros((n_sets, 1))], axis=1)
    ys = np.concatenate([py, np.zeros((n_sets, 1))], axis=1)
    order = np.lexsort((-ys, xs), axis=1)  # per set: by pass@1, the highest measure first on ties
    xs, ys = np.take_along_axis(xs, order, 1), np.take_along_axis(ys, order, 1)
    rows = np.arange(n_sets)
    hx = np.full((n_sets, n_points + 1), np.inf)  # each set's chain, padded with +inf
    hy = np.zeros((n_sets, n_points + 1))
    size = np.zeros(n_sets, dtype=np.int64)
    for k in range(n_points + 1):  # Andrew's monotone chain, every set in step (`upper_hull`)
        cx, cy = xs[:, k], ys[:, k]
        fresh = (size == 0) | (cx != hx[rows, np.maximum(size - 1, 0)])  # a tie keeps the first
        while True:
            two = fresh & (size >= 2)
            i1, i2 = np.maximum(size - 1, 0), np.maximum(size - 2, 0)
            x1, y1, x2, y2 = hx[rows, i1], hy[rows, i1], hx[rows, i2], hy[rows, i2]
            with np.errstate(invalid="ignore"):  # the +inf padding of a set with < 2 vertices
                pop = two & ((x1 - x2) * (cy - y2) >= (y1 - y2) * (cx - x2))
            if not pop.any():
                break
            hx[rows[pop], size[pop] - 1] = np.inf
            size = size - pop
        hx[rows[fresh], size[fresh]] = cx[fresh]
        hy[rows[fresh], size[fresh]] = cy[fresh]
        size = size + fresh
    x_min, last = hx[:, 0], size - 1
    x_max = hx[rows, last]
    top = np.where(np.arange(n_points + 1) < size[:, None], hy, -np.inf)
    x_peak = hx[rows, np.argmax(top, axis=1)]  # the highest vertex, the first on a tie
    r = _read_point(x, x_min[:, None], x_max[:, None], x_peak[:, None])  # `Hull.read_at`, per row
    # `np.interp(r, vx, vy)` on each set's vertices: r lies in [x_min, x_max] (or is NaN)
    j = (hx[:, None, :] <= r[:, :, None]).sum(-1) - 1  # vx[j] <= r < vx[j + 1]
    j = np.clip(j, 0, last[:, None])
    j1 = np.minimum(j + 1, last[:, None])
    xj, yj = np.take_along_axis(hx, j, 1), np.take_along_axis(hy, j, 1)
    xk, yk = np.take_along_axis(hx, j1, 1), np.take_along_axis(hy, j1, 1)
    exact = (j == last[:, None]) | (xj == r)
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = (yk - yj) / (xk - xj)
        value = slope * (r - xj) + yj
        again = slope * (r - xk) + yk  # numpy's fallback where the first form is not a number
    value = np.where(np.isnan(value), np.where(np.isnan(again) & (yj == yk), yj, again), value)
    return np.where(np.isnan(r), np.nan, np.where(exact, yj, value))


def lifts(px: object, py: object, ref: object) -> tuple[np.ndarray, np.ndarray, Hull]:
    """The lift of every point over the hull of the reference points `ref` (module docstring).

    Args:
        px, py: `(M,)` every model's mean pass@1 gain and measure gain.
        ref: `(R,)` the reference models' indices.

    Returns:
        `(lift (M,), status (M,), hull)`: lift NaN where the status is ``"below"``.
    """
    px, py = np.asarray(px, dtype=np.float64), np.asarray(py, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.int64)
    hull = upper_hull(px[ref], py[ref])
    return py - hull(px), hull.status(px), hull
