"""Trade-off frontiers: does a method buy more pass@k (diversity) per unit of pass@1 than GRPO?

A *model* is one trained policy: a method, one of its settings (a coefficient value, a learning
rate, ...) and a checkpoint (training step). Each model is evaluated on the same `P` problems
(prompts) under the same `S` seeds (training seeds in the toy, sampling or training seeds for a
language model), which makes every comparison *paired*. The data layout, with named axes:

- ``x``: `(M, S, P)` float, the per-problem correctness measure (pass@1 of problem `p` for model
  `m` under seed `s`), or its gain over the base policy;
- ``y``: `(M, S, P)` float, the per-problem diversity measure (pass@k at a large `k`, or the
  expected number of distinct correct solutions), or its gain over the base policy;
- ``models``: `Models`, per model its ``method``, ``setting`` (a label such as ``"eta=0.1"``)
  and ``step``, each a length-`M` sequence.

A model's *point* is `(x̄_m, ȳ_m)`, the means over seeds and problems (`points`).

The upper envelope (`Envelope`, `upper_envelope`). Of a set of points, the monotone upper
envelope as a function of pass@1 is `E(x) =` the most pass@k reachable by a point of the set
with pass@1 at least `x`, with linear interpolation between the Pareto-optimal points
(vertices: no other point has both more pass@1 and more pass@k). So `E` is non-increasing, it lies
on or above every point of the set (a dominated point lies below the vertex that dominates it,
and the interpolant between consecutive vertices is at least the later vertex's value), and
it is defined on `[min x, max x]` of the set: below the first vertex it is flat (that vertex
has more of both), beyond the largest pass@1 it is undefined. The concave hull was not chosen:
it assumes that mixtures of two policies are available, which training does not give.
The linear interpolant is above the staircase between vertices, so it favours the reference
and a positive lift against it is conservative.

The reference curve is the envelope of the reference method's models (GRPO: every checkpoint
along training, including step 0 (the base policy), and every setting of its `kl_coef` or
learning-rate sweep). The *lift at matched pass@1* of a model is `ȳ_m − E_ref(x̄_m)`; it is
NaN, with status ``"above"`` or ``"below"``, when `x̄_m` lies outside the reference's pass@1
range (no extrapolation).

The bootstrap (`bootstrap_lift`) resamples seeds and problems with replacement, the same
resampled indices for every model (paired), recomputes every point, the reference envelope and
every lift, and reports percentile intervals. Replicates where a model falls outside the
resampled reference range are left out of its interval, and the fraction kept is reported.

Sources: pass@k as an unbiased per-problem estimate (Chen et al. 2021); the question of
diversity per unit of correctness and GRPO's own trade-off as the baseline: issue 11,
`docs/formulas.md` §5.1 (pass@k); the percentile bootstrap (Efron & Tibshirani 1993, ch. 13).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from theory.measures import pass_at_k

STATUSES = ("inside", "below", "above")


@dataclass(frozen=True)
class Models:
    """Metadata of `M` models, one entry per model (validated on construction).

    Attributes:
        method: `(M,)` method names (e.g. ``"grpo"``, ``"ds_grpo"``).
        setting: `(M,)` labels of the setting within the method (e.g. ``"kl_coef=0.05"``).
        step: `(M,)` non-negative training steps (checkpoints).

    Raises:
        ValueError: naming the field, for lengths that differ, an empty method name or a
            negative or non-integer step.
    """

    method: tuple[str, ...]
    setting: tuple[str, ...]
    step: tuple[int, ...]

    def __init__(self, method: Sequence[str], setting: Sequence[str], step: Sequence[int]):
        method, setting = tuple(str(m) for m in method), tuple(str(s) for s in setting)
        steps = tuple(step)
        if not (len(method) == len(setting) == len(steps)):
            raise ValueError(
                f"models: method, setting and step must have equal lengths, got "
                f"{len(method)}, {len(setting)}, {len(steps)}"
            )
        for i, name in enumerate(method):
            if not name:
                raise ValueError(f"models.method[{i}] is empty")
        for i, s in enumerate(steps):
            if isinstance(s, bool) or not isinstance(s, int | np.integer) or s < 0:
                raise ValueError(f"models.step[{i}] must be a non-negative integer, got {s!r}")
        object.__setattr__(self, "method", method)
        object.__setattr__(self, "setting", setting)
        object.__setattr__(self, "step", tuple(int(s) for s in steps))

    def __len__(self) -> int:
        return len(self.method)

    def select(self, method: str | Sequence[str]) -> np.ndarray:
        """Indices `(n,)` of the models whose method is `method` (or one of several)."""
        names = {method} if isinstance(method, str) else set(method)
        return np.array([i for i, m in enumerate(self.method) if m in names], dtype=np.int64)


def _check_values(x: object, y: object, models: Models | None = None) -> tuple:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    for name, arr in (("x", x), ("y", y)):
        if arr.ndim != 3:
            raise ValueError(f"{name} must have shape (M, S, P), got {arr.shape}")
        if 0 in arr.shape:
            raise ValueError(f"{name} must be non-empty on every axis, got {arr.shape}")
        if not np.isfinite(arr).all():
            raise ValueError(f"{name} must be finite")
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape (M, S, P), got {x.shape}, {y.shape}")
    if models is not None and len(models) != x.shape[0]:
        raise ValueError(f"models has {len(models)} entries but x has M = {x.shape[0]} models")
    return x, y


def points(x: object, y: object) -> tuple[np.ndarray, np.ndarray]:
    """Each model's point: means over seeds and problems.

    Args:
        x, y: `(M, S, P)` per-problem values (module docstring).

    Returns:
        `(x̄, ȳ)`, each `(M,)`.

    Raises:
        ValueError: for shapes other than equal `(M, S, P)` or non-finite values.
    """
    x, y = _check_values(x, y)
    return x.mean(axis=(1, 2)), y.mean(axis=(1, 2))


@dataclass(frozen=True)
class Envelope:
    """A monotone upper envelope (module docstring).

    Attributes:
        vx, vy: `(n,)` the Pareto-optimal vertices, `vx` strictly increasing, `vy` strictly
            decreasing.
        x_min, x_max: the range of pass@1 where the envelope is defined (`x_max = vx[-1]`).
    """

    vx: np.ndarray
    vy: np.ndarray
    x_min: float
    x_max: float

    def __call__(self, x: object) -> np.ndarray:
        """`E(x)` elementwise (any shape); NaN outside `[x_min, x_max]`."""
        x = np.asarray(x, dtype=np.float64)
        # np.interp is flat left of vx[0]: the first vertex dominates those pass@1 values.
        value = np.interp(x, self.vx, self.vy)
        return np.where((x >= self.x_min) & (x <= self.x_max), value, np.nan)

    def status(self, x: object) -> np.ndarray:
        """``"below"``, ``"inside"`` or ``"above"`` the range, elementwise."""
        x = np.asarray(x, dtype=np.float64)
        return np.where(x < self.x_min, "below", np.where(x > self.x_max, "above", "inside"))


def upper_envelope(px: object, py: object) -> Envelope:
    """The monotone upper envelope of points `(px[i], py[i])` (module docstring).

    Args:
        px, py: `(n,)` finite coordinates, `n >= 1`.

    Returns:
        The `Envelope` (vertices sorted by pass@1).

    Raises:
        ValueError: for empty, mismatched or non-finite inputs.
    """
    px, py = np.asarray(px, dtype=np.float64), np.asarray(py, dtype=np.float64)
    if px.ndim != 1 or px.shape != py.shape or px.size == 0:
        raise ValueError(
            f"px and py must be equal non-empty 1-D arrays, got {px.shape}, {py.shape}"
        )
    if not (np.isfinite(px).all() and np.isfinite(py).all()):
        raise ValueError("px and py must be finite")
    # Sweep from the largest pass@1 down (ties: largest pass@k first); a point is a vertex when
    # its pass@k beats every point with at least its pass@1.
    order = np.lexsort((-py, -px))
    vx, vy, best = [], [], -np.inf
    for i in order:
        if py[i] > best:
            vx.append(px[i])
            vy.append(py[i])
            best = py[i]
    return Envelope(np.array(vx[::-1]), np.array(vy[::-1]), float(px.min()), float(px.max()))


def lift(ref_x: object, ref_y: object, x: object, y: object) -> tuple[np.ndarray, np.ndarray]:
    """Lift at matched pass@1 over the reference envelope: `y − E_ref(x)`.

    Args:
        ref_x, ref_y: `(n,)` the reference points. x, y: `(m,)` the points to compare.

    Returns:
        `(lift, status)`, each `(m,)`: lift NaN where status is ``"below"``/``"above"``.

    Raises:
        ValueError: from `upper_envelope`, or for `x`, `y` of different shapes.
    """
    env = upper_envelope(ref_x, ref_y)
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape, got {x.shape}, {y.shape}")
    return y - env(x), env.status(x)


def bootstrap_indices(
    rng: np.random.Generator, num_resamples: int, num_seeds: int, num_problems: int
) -> tuple[np.ndarray, np.ndarray]:
    """Resampled seed and problem indices, drawn in this order (so a slow loop can reuse them).

    Returns:
        `(seed_idx (B, S), problem_idx (B, P))` int64, uniform with replacement.
    """
    seed_idx = rng.integers(0, num_seeds, size=(num_resamples, num_seeds))
    problem_idx = rng.integers(0, num_problems, size=(num_resamples, num_problems))
    return seed_idx, problem_idx


def _counts(idx: np.ndarray, n: int) -> np.ndarray:
    """`(B, n)` how often each index occurs in each row of `idx` `(B, n)`."""
    b = idx.shape[0]
    flat = idx + n * np.arange(b)[:, None]
    return np.bincount(flat.ravel(), minlength=b * n).reshape(b, n).astype(np.float64)


def resampled_points(
    x: np.ndarray, y: np.ndarray, seed_idx: np.ndarray, problem_idx: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Every model's point under each resample: `(B, M)` each.

    A resample's mean over the resampled seeds × problems is `w_s · v · w_p / (S·P)` with `w` the
    index counts, which avoids materializing `(B, M, S, P)`.
    """
    s, p = x.shape[1], x.shape[2]
    ws, wp = _counts(seed_idx, s), _counts(problem_idx, p)
    scale = 1.0 / (s * p)
    bx = np.einsum("bs,msp,bp->bm", ws, x, wp, optimize=True) * scale
    by = np.einsum("bs,msp,bp->bm", ws, y, wp, optimize=True) * scale
    return bx, by


@dataclass(frozen=True)
class LiftResult:
    """Lifts of every model over the reference envelope, with paired bootstrap intervals.

    Attributes:
        models: the `Models` (length `M`).
        reference: indices `(n,)` of the reference models.
        x, y: `(M,)` the points.
        lift: `(M,)` point estimate (NaN outside the reference range).
        status: `(M,)` ``"inside"``, ``"below"`` or ``"above"`` the reference range.
        lo, hi: `(M,)` the percentile interval (NaN when no replicate fell inside the range).
        inside_fraction: `(M,)` fraction of replicates where the model fell inside the range.
        level: the interval's coverage (e.g. 0.95). num_resamples: `B`.
        se, df, p: `(M,)` standard error, degrees of freedom and two-sided p-value of lift 0
            (`curve_lift`; None for the bootstrap).
        components: `(M, 3)` the variance components of the lift's per-(seed, problem)
            contributions (`variance_components`; `curve_lift`; None for the bootstrap).
    """

    models: Models
    reference: np.ndarray
    x: np.ndarray
    y: np.ndarray
    lift: np.ndarray
    status: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    inside_fraction: np.ndarray
    level: float
    num_resamples: int
    se: np.ndarray | None = None
    df: np.ndarray | None = None
    p: np.ndarray | None = None
    components: np.ndarray | None = None


def _lifts_of(bx: np.ndarray, by: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """`(B, M)` lifts, one reference envelope per replicate."""
    out = np.empty_like(bx)
    for b in range(bx.shape[0]):
        env = upper_envelope(bx[b, ref], by[b, ref])
        out[b] = by[b] - env(bx[b])
    return out


def _check_lift_args(
    models: Models,
    reference: str | Sequence[str],
    num_resamples: object,
    level: float,
    *,
    min_resamples: int = 1,
) -> np.ndarray:
    """The reference models' indices, after checking the arguments every lift procedure takes.

    Raises:
        ValueError: naming the argument: no reference model, `num_resamples` not an integer >=
            `min_resamples`, `level` outside (0, 1).
    """
    ref = models.select(reference)
    if ref.size == 0:
        raise ValueError(
            f"reference: no model has method {reference!r}; methods: {sorted(set(models.method))}"
        )
    if (
        isinstance(num_resamples, bool)
        or not isinstance(num_resamples, int)
        or num_resamples < min_resamples
    ):
        need = "a positive integer" if min_resamples == 1 else f"an integer >= {min_resamples}"
        raise ValueError(f"num_resamples must be {need}, got {num_resamples!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    return ref


def bootstrap_lift(
    x: object,
    y: object,
    models: Models,
    reference: str | Sequence[str] = "grpo",
    *,
    num_resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
    resample_seeds: bool = True,
    resample_problems: bool = True,
) -> LiftResult:
    """Lift at matched pass@1 of every model over the reference method's envelope, with a paired
    percentile bootstrap over seeds and problems (module docstring).

    Args:
        x, y: `(M, S, P)` per-problem correctness and diversity values (or gains over the base).
        models: metadata of the `M` models.
        reference: the reference method name(s) (default ``"grpo"``).
        num_resamples: `B >= 1`. level: interval coverage in (0, 1). seed: the bootstrap RNG.
        resample_seeds, resample_problems: turn off one axis (e.g. one seed only).

    Returns:
        A `LiftResult`.

    Raises:
        ValueError: naming the argument: bad shapes, no reference model, `num_resamples < 1`,
            `level` outside (0, 1).
    """
    x, y = _check_values(x, y, models)
    ref = _check_lift_args(models, reference, num_resamples, level)
    _, s, p = x.shape
    px, py = points(x, y)
    env = upper_envelope(px[ref], py[ref])
    est, status = py - env(px), env.status(px)
    seed_idx, problem_idx = bootstrap_indices(np.random.default_rng(seed), num_resamples, s, p)
    if not resample_seeds:
        seed_idx = np.broadcast_to(np.arange(s), seed_idx.shape)
    if not resample_problems:
        problem_idx = np.broadcast_to(np.arange(p), problem_idx.shape)
    bx, by = resampled_points(x, y, seed_idx, problem_idx)
    lifts = _lifts_of(bx, by, ref)  # (B, M)
    lo, hi = percentile_interval(lifts, level)
    inside = np.mean(np.isfinite(lifts), axis=0)
    return LiftResult(models, ref, px, py, est, status, lo, hi, inside, float(level), num_resamples)


def percentile_interval(samples: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval over the leading (replicate) axis, ignoring NaN replicates.

    Args:
        samples: `(B, ...)`. level: coverage in (0, 1).

    Returns:
        `(lo, hi)` of shape `samples.shape[1:]`; NaN where every replicate is NaN.
    """
    samples = np.asarray(samples, dtype=np.float64)
    alpha = (1.0 - level) / 2.0
    lo = np.full(samples.shape[1:], np.nan)
    hi = np.full(samples.shape[1:], np.nan)
    ok = np.isfinite(samples).any(axis=0)
    if ok.any():
        kept = samples[:, ok]
        lo[ok] = np.nanquantile(kept, alpha, axis=0)
        hi[ok] = np.nanquantile(kept, 1.0 - alpha, axis=0)
    return lo, hi


def fit_curve(px: np.ndarray, py: np.ndarray, degree: int = 2) -> np.ndarray:
    """Least-squares polynomial through the origin (the base model, whose gains are 0):
    `y = Σ_j β_j x^j`, j = 1..degree, fitted to the points `(px, py)` `(n,)` (or `(B, n)`, one
    fit per row). Returns `β` `(degree,)` (or `(B, degree)`)."""
    px, py = np.atleast_2d(px), np.atleast_2d(py)
    design = px[..., None] ** np.arange(1, degree + 1)  # (B, n, degree)
    beta = np.stack([np.linalg.lstsq(a, b, rcond=None)[0] for a, b in zip(design, py, strict=True)])
    return beta if beta.shape[0] > 1 else beta[0]


def setting_curve(px: np.ndarray, py: np.ndarray, degree: int = 2) -> tuple[np.ndarray, int]:
    """One reference setting's curve through the base and its points `(px, py)` `(n,)`: the
    `fit_curve` of `degree`, or a line through the base when that quadratic turns (its vertex)
    in the gap between the base and the setting's nearest point, where no data shapes it.
    Returns `(β, the degree used)`.

    Why: a setting whose checkpoints cluster far from the base (GRPO with a KL penalty that stops
    moving pass@1) gets a quadratic with a large curvature from the cluster's local slope, whose
    hump between the base and the cluster rose 5 points above every other setting in the strong
    LLM study and set the lifts there with standard errors of 8-14 points (docs/statistics.md)."""
    beta = fit_curve(px, py, degree)
    if degree != 2 or beta[1] == 0:
        return beta, degree
    vertex = -beta[0] / (2 * beta[1])
    moved = px[px != 0]  # the base's own point (0, 0) shapes nothing: every curve passes there
    if moved.size == 0:
        return beta, degree
    lo, hi = min(0.0, moved.max()), max(0.0, moved.min())  # the gap; empty if they straddle 0
    return (fit_curve(px, py, 1), 1) if lo < vertex < hi else (beta, degree)


def curve_at(beta: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The fitted curve `Σ_j β_j x^j` at `x` (`beta` `(degree,)` with any `x`, or `(B, degree)` with
    `x` `(B, m)`)."""
    beta = np.asarray(beta, dtype=np.float64)
    powers = np.asarray(x, dtype=np.float64)[..., None] ** np.arange(1, beta.shape[-1] + 1)
    return np.einsum("...d,...md->...m", beta, powers) if beta.ndim == 2 else powers @ beta


def _curve_lifts(px: np.ndarray, py: np.ndarray, ref: np.ndarray, degree: int) -> np.ndarray:
    """`(M,)` lifts over the curve fitted to the reference points (`setting_curve`; no range
    check)."""
    return py - curve_at(setting_curve(px[ref], py[ref], degree)[0], px)


def _lift_jacobian(px: np.ndarray, py: np.ndarray, ref: np.ndarray, degree: int) -> np.ndarray:
    """`(M, 2, M)` derivatives of every lift with respect to every point's x̄ and ȳ (central
    differences; the lifts are linear in ȳ and polynomial in x̄, so step 1e-6 is exact to ~1e-10)."""
    m, h = px.size, 1e-6
    jac = np.zeros((m, 2, m))
    jac[np.arange(m), 1, np.arange(m)] = 1.0  # ∂ lift_m / ∂ ȳ_m (the curve's own part below)
    for j in range(m):
        e = np.zeros(m)
        e[j] = h
        jac[:, 0, j] = (_curve_lifts(px + e, py, ref, degree)
                        - _curve_lifts(px - e, py, ref, degree)) / (2 * h)  # fmt: skip
        if j in ref:
            jac[:, 1, j] = (_curve_lifts(px, py + e, ref, degree)
                            - _curve_lifts(px, py - e, ref, degree)) / (2 * h)  # fmt: skip
    return jac


def setting_groups(ref: np.ndarray, models: Models, degree: int = 2) -> list[np.ndarray]:
    """The reference models `ref` grouped by (method, setting), the base (step 0) left out (it is
    the origin every curve passes through); groups with fewer than `degree` models are dropped
    (all of `ref` when none is left)."""
    trained = [i for i in ref if models.step[i] > 0]
    keys = {i: (models.method[i], models.setting[i]) for i in trained}
    groups = [np.array([i for i in trained if keys[i] == key])
              for key in dict.fromkeys(keys.values())]  # fmt: skip
    return [g for g in groups if g.size >= degree] or [np.asarray(ref)]


def max_curve_at(
    betas: Sequence[np.ndarray],
    x_max: Sequence[float],
    x: object,
    x_min: Sequence[float] | None = None,
) -> np.ndarray:
    """The pointwise maximum at `x` of the curves `betas` (`curve_at`), each defined on
    ``[x_min, x_max]`` (`x_min` None: from −∞); beyond every `x_max`, the curve reaching
    furthest."""
    x = np.asarray(x, dtype=np.float64)
    lows = [-np.inf] * len(betas) if x_min is None else list(x_min)
    vals = np.stack([np.where((x <= xm) & (x >= xl), curve_at(np.asarray(b), x), -np.inf)
                     for b, xm, xl in zip(betas, x_max, lows, strict=True)])  # fmt: skip
    far = int(np.argmax(x_max))
    return np.where(np.isfinite(vals.max(0)), vals.max(0), curve_at(np.asarray(betas[far]), x))


@dataclass
class _PerSetting:
    """The per-setting curves' lifts: `lifts` `(G, M)` against each setting's curve, `reach`
    `(G, M)` whether the model's pass@1 is within the setting's range, `active` `(M,)` the
    setting whose curve is the maximum there, and the Jacobians computed so far."""

    groups: list[np.ndarray]
    betas: list[np.ndarray]
    degrees: list[int]
    x_min: np.ndarray
    x_max: np.ndarray
    lifts: np.ndarray
    reach: np.ndarray
    active: np.ndarray
    jacobians: dict[int, np.ndarray]


def _per_setting(
    px: np.ndarray, py: np.ndarray, ref: np.ndarray, models: Models, degree: int
) -> _PerSetting:
    groups = setting_groups(ref, models, degree)
    betas, degrees = map(list, zip(*(setting_curve(px[g], py[g], degree) for g in groups),
                                   strict=True))  # fmt: skip
    # Each setting's own pass@1 range, from the base (0) to its furthest point on either side:
    # a curve is never read where its setting's path did not go (before 2026-11-26 it was read
    # from -inf, so below the base other settings' quadratics were extrapolated).
    x_min = np.array([min(0.0, px[g].min()) for g in groups])
    x_max = np.array([px[g].max() for g in groups])
    lifts = np.stack([py - curve_at(b, px) for b in betas])  # (G, M), as `_curve_lifts`
    reach = (px[None, :] <= x_max[:, None]) & (px[None, :] >= x_min[:, None])
    active = np.where(reach, lifts, np.inf).argmin(0)  # the highest curve: the smallest lift
    active = np.where(reach.any(0), active, int(np.argmax(x_max)))
    return _PerSetting(groups, betas, degrees, x_min, x_max, lifts, reach, active, {})


def _jacobian_of(ps: _PerSetting, k: int, px: np.ndarray, py: np.ndarray) -> np.ndarray:
    if k not in ps.jacobians:  # the setting's curve keeps its degree under the small steps
        ps.jacobians[k] = _lift_jacobian(px, py, ps.groups[k], ps.degrees[k])
    return ps.jacobians[k]


def _max_curve_lifts(
    px: np.ndarray, py: np.ndarray, ref: np.ndarray, models: Models, degree: int
) -> tuple[np.ndarray, np.ndarray]:
    """`curve_lift`'s ``per_setting`` lifts `(M,)` over the pointwise maximum of one curve per
    reference (method, setting) (`setting_groups`), each defined on its setting's own pass@1
    range (`_per_setting`), and their `(M, 2, M)` Jacobian (the active setting's)."""
    ps = _per_setting(px, py, ref, models, degree)
    return _active_lifts(ps, px, py, degree)


def _active_lifts(
    ps: _PerSetting, px: np.ndarray, py: np.ndarray, degree: int
) -> tuple[np.ndarray, np.ndarray]:
    jac = np.zeros((px.size, 2, px.size))
    for k in np.unique(ps.active):  # only the settings some model is measured against
        rows = ps.active == k
        jac[rows] = _jacobian_of(ps, int(k), px, py)[rows]
    return ps.lifts[ps.active, np.arange(px.size)], jac


CONTENDER_SE = 3.0
"""A reference setting other than the maximum contends for it at a model's pass@1 when its lift
is within this many standard errors of the smallest (`_max_bias`)."""

MAX_BIAS_DRAWS = 4000
"""Normal draws of the contending lifts per model in `_max_bias`."""


def _max_bias(
    ps: _PerSetting,
    px: np.ndarray,
    py: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    se: np.ndarray,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """`(M,)` the estimated bias of the per-setting lift, ``E[min_k L̂_k] − min_k L_k`` (≤ 0): the
    maximum of noisy curves rides up on their noise when several settings are close. Plug-in
    (bootstrap) estimate: the contending settings' lifts are drawn jointly normal around the
    estimates, with the crossed-design covariance of their linearized contributions
    (`crossed_variance` of sums and differences), and the mean of the draws' minimum is
    compared with the minimum of the estimates (Efron & Tibshirani 1993, ch. 10, bias
    correction). 0 where one setting alone contends.

    Also returns `(M,)` the standard deviation of the draws' minimum (NaN where no correction):
    the spread of the estimator the correction assumes. A contending curve much noisier than the
    active one (a setting whose pass@1 barely moved, so its quadratic is steep: the strong LLM
    study under numerics pin 2) moves the correction by many of the active curve's standard
    errors, so the interval must widen with it (`curve_lift`); before 2026-11-26 it did not, and
    exploratory lifts of +100 points with 10-point intervals were read there."""
    bias = np.zeros(px.size)
    spread = np.full(px.size, np.nan)
    for m in range(px.size):
        if not np.isfinite(se[m]) or se[m] <= SE_FLOOR:
            continue
        near = ps.reach[:, m] & (ps.lifts[:, m] - ps.lifts[ps.active[m], m] < CONTENDER_SE * se[m])
        ks = np.flatnonzero(near)
        if ks.size < 2:
            continue
        jacs = [_jacobian_of(ps, int(k), px, py)[m] for k in ks]  # each (2, M)
        c = np.stack(
            [np.einsum("j,jsp->sp", jm[0], x) + np.einsum("j,jsp->sp", jm[1], y) for jm in jacs]
        )  # fmt: skip  (K, S, P)
        cov = np.diag(crossed_variance(c)[0])
        for a in range(ks.size):
            for b in range(a + 1, ks.size):
                plus = crossed_variance(c[a] + c[b])[0]
                minus = crossed_variance(c[a] - c[b])[0]
                cov[a, b] = cov[b, a] = (plus - minus) / 4
        w, v = np.linalg.eigh(cov)
        root = v * np.sqrt(np.clip(w, 0.0, None))
        draws = ps.lifts[ks, m] + rng.standard_normal((MAX_BIAS_DRAWS, ks.size)) @ root.T
        low = draws.min(1)
        bias[m] = low.mean() - ps.lifts[ks, m].min()
        spread[m] = low.std()
    return bias, spread


def _near_drop(
    ps: _PerSetting, px: np.ndarray, x: np.ndarray, z: float, se: np.ndarray, drop_se: float
) -> np.ndarray:
    """`(M,)` the setting (index into `ps.groups`, -1 for none) near the end of whose reach a
    model's pass@1 lies: within `z` standard errors (its own and the edge's, combined), where
    that setting's curve is above every curve reaching further by more than `drop_se` times the
    model's lift standard error `se` `(M,)` (the largest such drop when several): the maximum of
    the per-setting curves drops there, and which side a model is measured on is decided by
    noise. A drop within the lift's own noise is ignored: switching sides moves the estimate by
    the drop, which the interval then absorbs (two near-identical settings make such drops at
    every edge)."""
    se_x = np.sqrt(crossed_variance(x)[0])  # (M,) of each model's mean pass@1 gain
    near = np.full(px.size, -1)
    biggest = np.zeros(px.size)
    finite = np.isfinite(se)  # no lift anyway where not (outside the range)
    for k, g in enumerate(ps.groups):
        further = np.flatnonzero(ps.x_max > ps.x_max[k])
        if further.size == 0:
            continue
        at = ps.x_max[k]
        rest = max_curve_at([ps.betas[j] for j in further], ps.x_max[further], at,
                            ps.x_min[further])  # fmt: skip
        drop = float(curve_at(ps.betas[k], at) - rest)
        if drop <= 0:
            continue
        edge = g[int(np.argmax(px[g]))]
        close = np.abs(px - at) < z * np.sqrt(se_x**2 + se_x[edge] ** 2)
        hit = close & finite & (drop > drop_se * np.where(finite, se, 0.0)) & (drop > biggest)
        near[hit], biggest[hit] = k, drop
    return near


def _both_sides(
    ps: _PerSetting,
    m: int,
    k: int,
    px: np.ndarray,
    py: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    level: float,
) -> tuple[float, float, float, float, float]:
    """Model `m` at the drop where setting `k`'s reach ends (`_near_drop`): its lift against
    `k`'s curve, against the highest curve reaching further and against the active one (the
    maximum at its pass@1, when another), each with its delta-method t interval. Returns
    `(lo, hi, p, se, df)`: the union of the intervals, the intersection-union p-value (the
    largest, when every lift has the same sign; else 1: lift 0 is rejected only when it is
    rejected whichever side the model is on; Berger 1982, "Multiparameter hypothesis testing
    and acceptance sampling"), the largest standard error and the smallest degrees of
    freedom."""
    further = np.flatnonzero(ps.x_max > ps.x_max[k])
    j = int(further[np.argmin(ps.lifts[further, m])])  # the highest curve past the edge
    sides = []
    for c in dict.fromkeys((k, j, int(ps.active[m]))):  # and the one the estimate uses
        jm = _jacobian_of(ps, c, px, py)[m]  # (2, M)
        contrib = np.einsum("j,jsp->sp", jm[0], x) + np.einsum("j,jsp->sp", jm[1], y)
        var, df = crossed_variance(contrib)
        se_c, lift = float(np.sqrt(var)), float(ps.lifts[c, m])
        half = stats.t.ppf(0.5 + level / 2, df) * se_c
        p_c = 2 * stats.t.sf(abs(lift) / se_c, df) if se_c > SE_FLOOR else np.nan
        sides.append((lift - half, lift + half, p_c, se_c, float(df), lift))
    lo, hi, ps_, se, df, lifts = (np.array(v) for v in zip(*sides, strict=True))
    p = float(ps_.max()) if np.all(np.sign(lifts) == np.sign(lifts[0])) else 1.0
    return float(lo.min()), float(hi.max()), p, float(se.max()), float(df.min())


EDGE_Z = 2.0
"""The tables' `curve_lift` ``edge_z``: a model within 2 standard errors of a drop of the
reference's maximum curve is tested on both sides of it (docs/statistics.md: calibrated in the
`short_dominant` design)."""

EDGE_DROP = 2.0
"""The tables' `curve_lift` ``edge_drop``: only a drop larger than 2 lift standard errors counts
(with 0, two near-identical settings' tiny drops caught 59-67% of the null models of the
`reproduce` and `study` designs; with 2, 5-8%)."""

SE_FLOOR = 1e-6
"""A lift whose standard error is at most this (in the measure's units) is not tested (`p` NaN):
its model never left the base, up to rounding (the toy's metrics are float32: unit roundoff
6e-8, and a model that never moved shows gains of ~1e-8; any real error is ≥ 1e-4)."""

POOL_LEVEL = 0.25
"""The level of the preliminary F tests that decide whether a seed or problem effect is kept in
`crossed_variance` (a liberal level, as Bozivich, Bancroft & Hartley 1956 advise for pooling)."""


def _mean_squares(c: np.ndarray) -> tuple[np.ndarray, ...]:
    """The two-way layout's mean squares of `c` `(..., S, P)` (`S ≥ 2`, `P ≥ 2`): seeds, problems,
    residual and total (`crossed_variance`)."""
    s, p = c.shape[-2], c.shape[-1]
    row, col, mean = c.mean(-1), c.mean(-2), c.mean((-2, -1))
    ms_row = p * row.var(axis=-1, ddof=1)
    ms_col = s * col.var(axis=-1, ddof=1)
    resid = c - row[..., :, None] - col[..., None, :] + mean[..., None, None]
    ms_e = (resid**2).sum((-2, -1)) / ((s - 1) * (p - 1))
    ms_tot = c.reshape(*c.shape[:-2], s * p).var(axis=-1, ddof=1)
    return ms_row, ms_col, ms_e, ms_tot


def variance_components(c: np.ndarray) -> np.ndarray:
    """The variance components `(σ²_seed, σ²_problem, σ²_e)` of `c` `(..., S, P)` under
    `crossed_variance`'s two-way model, by the method of moments clipped at 0:
    `((MS_seed − MS_e)/P, (MS_problem − MS_e)/S, MS_e)`. With one seed the seed component is not
    identified (NaN) and the problems' variance is all `σ²_problem` (`σ²_e` = 0). They plan designs
    (`design_mde`); the test itself uses `crossed_variance`. Source: as `crossed_variance`.

    Returns:
        `(..., 3)` float64, in the squared units of `c`.
    """
    c = np.asarray(c, dtype=np.float64)
    s, p = c.shape[-2], c.shape[-1]
    if s == 1:
        v = c[..., 0, :].var(axis=-1, ddof=1)
        return np.stack([np.full_like(v, np.nan), v, np.zeros_like(v)], axis=-1)
    ms_row, ms_col, ms_e, _ = _mean_squares(c)
    return np.stack([np.maximum((ms_row - ms_e) / p, 0.0), np.maximum((ms_col - ms_e) / s, 0.0),
                     ms_e], axis=-1)  # fmt: skip


def design_mde(
    components: object, seeds: object, problems: object, *, alpha: float = 0.05, power: float = 0.8
) -> np.ndarray:
    """The minimum detectable lift (`minimum_detectable`) of a comparison whose per-(seed, problem)
    contributions have the variance `components` `(..., 3)` (`variance_components`), in a design of
    `seeds` × `problems` (broadcast against `components[..., 0]`): the variance of the mean
    `σ²_seed/S + σ²_problem/P + σ²_e/(S·P)` with the degrees of freedom `crossed_variance` would
    use, from the expected mean squares `E MS_seed = P·σ²_seed + σ²_e`, `E MS_problem =
    S·σ²_problem + σ²_e`, `E MS_e = σ²_e`: Satterthwaite's when both effects are present, `P − 1`
    without the seed effect, `S − 1` without the problem effect. A NaN component (one seed) gives
    NaN. Source: as `crossed_variance`; the power formula of `minimum_detectable`.

    Raises:
        ValueError: `components` whose last axis is not 3, or seeds or problems below 2.
    """
    comp = np.asarray(components, dtype=np.float64)
    if comp.shape[-1:] != (3,):
        raise ValueError(f"components: expected shape (..., 3), got {comp.shape}")
    s = np.asarray(seeds, dtype=np.float64)
    p = np.asarray(problems, dtype=np.float64)
    if np.any(s < 2) or np.any(p < 2):
        raise ValueError(f"seeds, problems: need at least 2 each, got {seeds}, {problems}")
    va, vb, ve = comp[..., 0], comp[..., 1], comp[..., 2]
    ms_row, ms_col = p * va + ve, s * vb + ve
    var = va / s + vb / p + ve / (s * p)
    terms = (ms_row**2 / (s - 1) + ms_col**2 / (p - 1) + ve**2 / ((s - 1) * (p - 1))) / (s * p) ** 2
    both = var**2 / np.where(terms > 0, terms, 1.0)
    df = np.select([(va > 0) & (vb > 0), vb > 0, va > 0], [both, p - 1, s - 1], s * p - 1)
    return minimum_detectable(np.sqrt(var), df, alpha=alpha, power=power)


def crossed_variance(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Variance of the grand mean of `c` `(..., S, P)` over a crossed seeds × problems design, and
    its degrees of freedom. The two-way random-effects model `c_sp = μ + a_s + b_p + e_sp` gives
    `Var(c̄) = σ²_a/S + σ²_b/P + σ²_e/(S·P)`; from the mean squares (`E MS_seed = P·σ²_a + σ²_e`,
    `E MS_problem = S·σ²_b + σ²_e`, `E MS_e = σ²_e`) the unbiased estimate is
    `(MS_seed + MS_problem − MS_e)/(S·P)`. An effect whose F test (`MS/MS_e`) is not significant at
    `POOL_LEVEL` is pooled into the error ("sometimes pool"): without the seed effect the estimate
    is `MS_problem/(S·P)` (the problems' variance of their seed means, `P − 1` degrees of
    freedom), without the problem effect `MS_seed/(S·P)`, without both `MS_total/(S·P)`. With both,
    the degrees of freedom are Satterthwaite's. With one seed: the problems' `var/P`, `P − 1`.

    Why: a seed's effect (a run's place along its path) is shared by all its problems and a
    problem's by all seeds; resampling only problems misses the first, resampling both counts the
    evaluation noise twice, and with 2-4 seeds the seed component is estimated from 1-3 degrees
    of freedom, so clipping it at 0 inflates the variance by ~40% and always keeping it makes the
    interval a t with ~2 degrees of freedom (issue 20's calibration, docs/statistics.md). Source:
    the expected mean squares of the two-way crossed layout without replication (Searle, Casella
    & McCulloch 1992, ch. 4); the Satterthwaite (1946) approximation.

    Returns:
        `(var, df)`, each `(...)`.
    """
    s, p = c.shape[-2], c.shape[-1]
    if s == 1:
        return c[..., 0, :].var(axis=-1, ddof=1) / p, np.full(c.shape[:-2], p - 1.0)
    ms_row, ms_col, ms_e, ms_tot = _mean_squares(c)
    df_row, df_col, df_e = s - 1, p - 1, (s - 1) * (p - 1)
    safe = np.where(ms_e > 0, ms_e, 1.0)
    keep_row = (ms_e > 0) & (ms_row / safe > stats.f.ppf(1 - POOL_LEVEL, df_row, df_e))
    keep_col = (ms_e > 0) & (ms_col / safe > stats.f.ppf(1 - POOL_LEVEL, df_col, df_e))
    both = (ms_row + ms_col - ms_e) / (s * p)
    terms = (ms_row**2 / df_row + ms_col**2 / df_col + ms_e**2 / df_e) / (s * p) ** 2
    df_both = both**2 / np.where(terms > 0, terms, 1.0)
    var = np.select([keep_row & keep_col, keep_col, keep_row],
                    [both, ms_col / (s * p), ms_row / (s * p)], ms_tot / (s * p))  # fmt: skip
    df = np.select([keep_row & keep_col, keep_col, keep_row],
                   [df_both, float(df_col), float(df_row)], float(s * p - 1))  # fmt: skip
    return var, df


def curve_lift(
    x: object,
    y: object,
    models: Models,
    reference: str | Sequence[str] = "grpo",
    *,
    degree: int = 2,
    num_resamples: int = 200,
    level: float = 0.95,
    seed: int = 0,
    per_setting: bool = False,
    bias_correct: bool = False,
    edge_z: float = 0.0,
    edge_drop: float = EDGE_DROP,
) -> LiftResult:
    """Lift at matched pass@1 over a smooth reference curve: a polynomial through the origin fitted
    to the reference models' points (means over seeds and problems), with a t interval whose
    standard error is the delta method's over the crossed seeds × problems design.

    With `per_setting`, one polynomial per reference (method, setting) (its checkpoints), each
    defined on its setting's own pass@1 range (from the base to its furthest point, on either
    side of the base), and the curve is their pointwise maximum (GRPO's
    best setting at each pass@1); a lift's error is the delta method's of the setting that is the
    maximum there. The pooled curve lies below that maximum when the settings' trade-offs differ
    (`experiment.calibration.STRESS_DESIGNS`: +3.8 points of bias with a dominated setting); the
    maximum rides up on noise when settings are near-identical (−0.5 in the reproduce design).

    The lifts are a smooth function of all models' points; linearized, each lift is the grand
    mean of per-(seed, problem) contributions `c_sp = Σ_m (∂lift/∂x̄_m)·x_msp + (∂lift/∂ȳ_m)·y_msp`
    (the same seed index couples a run's checkpoints; the same problem couples every model), whose
    variance `crossed_variance` estimates with Satterthwaite degrees of freedom; `p` is the
    two-sided t test of lift 0.

    Why not `bootstrap_lift` (the envelope): the envelope of noisy points rides on their upward
    noise, so its lifts are biased low (about −0.9 points in the LLM design), and its resampling
    over seeds *and* problems counts the per-seed evaluation noise twice. Why not a problem
    bootstrap of this curve: it misses the seeds' effects, and with 128 problems its replicates
    have heavy tails (the fit through a few noisy points), so its sd overstates the error by ~20%.
    Calibrated by `experiment.calibration` (docs/statistics.md).

    Args:
        x, y: `(M, S, P)` per-problem gains over the base model (the curve passes through 0);
            `P ≥ 2`, and the problem axis must be crossed with the seeds (the same problems, or
            the same prompt sets, under every seed).
        models, reference: as `bootstrap_lift`. degree: of the polynomial (1: a line).
        num_resamples: problem bootstrap replicates for `inside_fraction` only. seed: its RNG.
        per_setting: the maximum of per-setting curves (above) instead of one pooled curve.
        bias_correct: with `per_setting`, subtract the estimated bias of the maximum of the
            settings' noisy curves (`_max_bias`: the lift is biased low where several settings'
            curves are close), and take as standard error at least the spread of their
            minimum (a noisier contender widens the interval).
        edge_z: with `per_setting` and > 0 (the tables use 2): a model whose pass@1 is
            within `edge_z` standard errors of the end of a setting's reach where the maximum
            drops by more than `edge_drop` lift standard errors (`_near_drop`; the
            `short_dominant` calibration design) is tested on both sides of the drop (status
            ``"edge"``, `_both_sides`): the union of its two intervals, the
            intersection-union p-value; the estimate is the active curve's, uncorrected.

    Returns:
        A `LiftResult` with `status` ``"inside"``, ``"below"``/``"above"`` the reference's
        pass@1 range or ``"edge"`` (`edge_z`), `se`, `df` and `p` `(M,)` (NaN outside; `p`
        NaN where `se` ≤ `SE_FLOOR`) and the `variance_components` `(M, 3)` of each lift (NaN
        outside the range), which plan designs (`design_mde`).

    Raises:
        ValueError: as `bootstrap_lift`, fewer reference points than `degree`, or `P < 2`.
    """
    x, y = _check_values(x, y, models)
    ref = _check_lift_args(models, reference, num_resamples, level, min_resamples=2)
    if ref.size < degree:
        raise ValueError(f"reference: {ref.size} models cannot fit a degree-{degree} curve")
    _, s, p = x.shape
    if p < 2:
        raise ValueError(f"x: {p} problem(s); the standard error needs at least 2")
    px, py = points(x, y)
    lo_x, hi_x = min(0.0, px[ref].min()), px[ref].max()
    status = np.where(px < lo_x, "below", np.where(px > hi_x, "above", "inside"))
    inside = status == "inside"
    ps = None
    if per_setting:
        ps = _per_setting(px, py, ref, models, degree)
        est, jac = _active_lifts(ps, px, py, degree)
        est = np.where(inside, est, np.nan)
    else:
        est = np.where(inside, _curve_lifts(px, py, ref, degree), np.nan)
        jac = _lift_jacobian(px, py, ref, degree)  # (M, 2, M)
    contrib = np.einsum("mj,jsp->msp", jac[:, 0], x) + np.einsum("mj,jsp->msp", jac[:, 1], y)
    var, df = crossed_variance(contrib)
    comp = np.where(inside[:, None], variance_components(contrib), np.nan)
    se = np.where(inside, np.sqrt(var), np.nan)
    df = np.where(inside, df, np.nan)
    if ps is not None and bias_correct:
        rng = np.random.default_rng([seed, 20])
        bias, spread = _max_bias(ps, px, py, x, y, se, rng)
        est = est - np.where(inside, bias, 0.0)
        # The corrected estimate's error is at least the spread of the contenders' minimum.
        se = np.where(inside & (spread > se), spread, se)
    half = stats.t.ppf(0.5 + level / 2, np.where(inside, df, 1.0)) * se
    # A model whose every per-cell contribution is 0 (e.g. one that never left the base) has
    # standard error 0 up to rounding: no test, p NaN.
    ok = inside & (se > SE_FLOOR)
    pval = np.where(ok, 2 * stats.t.sf(np.abs(est) / np.where(ok, se, 1.0),
                                       np.where(ok, df, 1.0)), np.nan)  # fmt: skip
    lo, hi = est - half, est + half
    if ps is not None and edge_z > 0:
        edge_of = np.where(ok, _near_drop(ps, px, x, edge_z, se, edge_drop), -1)
        status = np.where(edge_of >= 0, "edge", status)
        for m in np.flatnonzero(edge_of >= 0):  # tested on both sides of the drop
            lo[m], hi[m], pval[m], se[m], df[m] = _both_sides(
                ps, int(m), int(edge_of[m]), px, py, x, y, level
            )
            # The active curve's plain lift: the maximum's bias correction assumes the curves
            # contend smoothly, which they do not across a drop, and could move the estimate
            # out of its own interval.
            est[m] = ps.lifts[ps.active[m], m]
    _, problem_idx = bootstrap_indices(np.random.default_rng(seed), num_resamples, s, p)
    seed_idx = np.broadcast_to(np.arange(s), (num_resamples, s))
    bx, _ = resampled_points(x, y, seed_idx, problem_idx)  # (B, M)
    frac = np.mean((bx >= np.minimum(0.0, bx[:, ref].min(1, keepdims=True)))
                   & (bx <= bx[:, ref].max(1, keepdims=True)), axis=0)  # fmt: skip
    return LiftResult(models, ref, px, py, est, status, lo, hi, frac,
                      float(level), num_resamples, se=se, df=df, p=pval,
                      components=comp)  # fmt: skip


def minimum_detectable(
    se: object, df: object, *, alpha: float = 0.05, power: float = 0.8
) -> np.ndarray:
    """The true lift a two-sided t test at level `alpha` detects with probability `power`, given
    the estimate's standard error `se` and degrees of freedom `df` (any shape, NaN stays NaN):
    `(t_{1−α/2, df} + t_{power, df})·se` (the usual normal-approximation power formula with t
    quantiles). With Holm over `n` tests pass `alpha/n` for the first test to be rejected."""
    se, df = np.asarray(se, dtype=np.float64), np.asarray(df, dtype=np.float64)
    ok = np.isfinite(se) & np.isfinite(df) & (df > 0)
    d = np.where(ok, df, 1.0)
    out = (stats.t.ppf(1 - alpha / 2, d) + stats.t.ppf(power, d)) * se
    return np.where(ok, out, np.nan)


@dataclass(frozen=True)
class Dominance:
    """`dominance`'s answer, each `(M,)`: the reference model that most clearly has more of both
    measures (`index`, −1 for reference models), its pass@1 and measure differences over the model
    (`dx`, `dy`: reference minus model), and the p-value of "it does not dominate", Bonferroni-
    adjusted over the reference models tried (`p`; NaN for reference models)."""

    index: np.ndarray
    dx: np.ndarray
    dy: np.ndarray
    p: np.ndarray


def _one_sided_p(d: np.ndarray) -> np.ndarray:
    """`(...)` p of `mean(d) ≤ 0` against `> 0` for crossed seeds × problems differences `d`
    `(..., S, P)` (`crossed_variance`'s t; 0 or 1 where the variance is 0)."""
    var, df = crossed_variance(d)
    mean = d.mean(axis=(-2, -1))
    pos = var > 0
    t = mean / np.sqrt(np.where(pos, var, 1.0))
    return np.where(pos, stats.t.sf(t, np.where(pos, df, 1.0)), np.where(mean > 0, 0.0, 1.0))


def dominance(x: object, y: object, models: Models, reference: str | Sequence[str]) -> Dominance:
    """A curve-free check of each model against the reference's own models (the base included):
    is some reference model better in pass@1 *and* in the measure? For each pair the one-sided
    paired t tests of both differences (`crossed_variance`'s standard error over seeds and
    problems) are combined by intersection-union (the larger p: Berger 1982), and a model's
    p is the smallest pair's, times the number of reference models (Bonferroni), so that a small
    p says "GRPO, stopped or tuned somewhere, beats this model on both axes" at that level
    whatever the shape of GRPO's curve between its points.

    Args:
        x, y: `(M, S, P)` per-problem gains in pass@1 and in the measure (as `curve_lift`).
        models: the M models; reference: the reference's method name(s).

    Raises:
        ValueError: shapes that differ, no reference model.
    """
    x, y = _check_values(x, y, models)
    ref = _check_lift_args(models, reference, 1, 0.5)
    m_all = x.shape[0]
    index = np.full(m_all, -1)
    dx, dy, p = (np.full(m_all, np.nan) for _ in range(3))
    for m in np.setdiff1d(np.arange(m_all), ref):
        ddx, ddy = x[ref] - x[m], y[ref] - y[m]  # (R, S, P): each reference model minus m
        pr = np.maximum(_one_sided_p(ddx), _one_sided_p(ddy))
        b = int(np.argmin(pr))  # the first of equals: the lowest index
        index[m], dx[m], dy[m] = ref[b], ddx[b].mean(), ddy[b].mean()
        p[m] = min(1.0, ref.size * float(pr[b]))
    return Dominance(index, dx, dy, p)


def holm(p: object) -> np.ndarray:
    """Holm's step-down adjusted p-values of a family of tests `(n,)` (NaN entries are not part of
    the family and stay NaN): reject test `i` at family-wise level `α` iff its adjusted p ≤ `α`.
    Source: Holm (1979), "A simple sequentially rejective multiple test procedure"."""
    p = np.asarray(p, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    if ok.size:
        order = ok[np.argsort(p[ok], kind="stable")]
        n = order.size
        adj = np.maximum.accumulate((n - np.arange(n)) * p[order])
        out[order] = np.minimum(adj, 1.0)
    return out


MEASURES = ("pass_at_k", "distinct_correct")
"""The diversity axes: pass@k at the largest k, and distinct correct solutions per problem."""


def gains_from_counts(
    base: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    *,
    seeds: Sequence[int],
    measure: str,
    k: int,
    reference: str,
) -> tuple[np.ndarray, np.ndarray, Models, list[dict[str, Any]]]:
    """Per-problem gains over the base model, in this module's layout, from evaluation counts.

    Args:
        base: the base model's record: ``n`` samples per problem, ``correct`` `(P,)` counts,
            ``distinct`` `(P,)` distinct correct solutions.
        records: one per (model, seed): ``label``, ``params``, ``setting``, ``step``, ``seed`` and
            the counts as `base`.
        measure: ``"pass_at_k"`` (the unbiased estimator at `k`, `theory.measures.pass_at_k`) or
            ``"distinct_correct"``.
        reference: the label the base model is filed under (its step 0 starts every path).

    Returns:
        ``(x, y, models, rows)``: `x` `(M, S, P)` pass@1 gains (correct / n minus the base's),
        `y` `(M, S, P)` gains in `measure`, the `Models` and one ``{"label", "params",
        "setting", "step"}`` per model (the base first, repeated over seeds).

    Raises:
        ValueError: an unknown `measure`, or a model missing some seed (both named).
    """
    if measure not in MEASURES:
        raise ValueError(f"measure: expected one of {MEASURES}, got {measure!r}")

    def per_problem(m: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        c = np.asarray(m["correct"], dtype=np.float64)
        if measure == "pass_at_k":
            y = np.array([pass_at_k(m["n"], int(ci), k) for ci in c])
        else:
            y = np.asarray(m["distinct"], dtype=np.float64)
        return c / m["n"], y

    bx, by = per_problem(base)
    groups: dict[tuple[str, str, int], dict[int, Mapping[str, Any]]] = {}
    rows = [{"label": reference, "params": {}, "setting": "base", "step": 0}]
    for m in records:
        key = (m["label"], m["setting"], m["step"])
        if key not in groups:
            groups[key] = {}
            rows.append({"label": m["label"], "params": m["params"], "setting": m["setting"],
                         "step": m["step"]})  # fmt: skip
        groups[key][m["seed"]] = m
    x, y = np.zeros((2, len(rows), len(seeds), len(bx)))
    for i, row in enumerate(rows[1:], start=1):
        per_seed = groups[(row["label"], row["setting"], row["step"])]
        for j, seed in enumerate(seeds):
            if seed not in per_seed:
                raise ValueError(
                    f"{row['label']} {row['setting']} step {row['step']}: no seed {seed}"
                )
            px, py = per_problem(per_seed[seed])
            x[i, j], y[i, j] = px - bx, py - by
    models = Models(*([r[f] for r in rows] for f in ("label", "setting", "step")))
    return x, y, models, rows
