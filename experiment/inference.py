"""One inference for every lift: the joint sampling distribution of all models' means, pushed
through the estimand (`experiment.estimand`).

`lift_inference` (exploratory tables, confirmations and the calibration alike):

1. The means of every model's pass@1 and measure gains, `2M` quantities measured on the same seeds
   × problems, have the covariance `experiment.covariance.mean_covariance` (the crossed design's
   mean squares).
2. `num_draws` draws of all `2M` means from the normal distribution with that covariance around
   the observed means (a parametric bootstrap; a fixed seed), and in each draw every model's lift
   over the hull of that draw's reference points.
3. The hull of noisy points rides up on their noise (a maximum), so the lift is biased low. The
   bias is estimated from the same draws, `mean(lift*) − lift` (Efron & Tibshirani 1993,
   ch. 10), and subtracted; the corrected hull value is kept inside the range of the reference's
   means, so the estimate stays a difference of two means of the measure (bounded).
4. The standard error is the draws' standard deviation (it sees a model's read point move
   between the hull's facets); the degrees of freedom are Satterthwaite's of the lift linearized
   on its facet (`experiment.covariance.crossed_variance` of its per-(seed, problem)
   contributions, which also give the variance components that plan designs); the interval is
   the corrected estimate ± the t quantile times the standard error, clipped to the measure's
   span; `p` is the two-sided t test of lift 0.

A model below the hull's pass@1 range has no lift; `dominance` is the curve-free check that
decides its claim (is one of GRPO's models better on both axes?). Above the range the hull is
continued (`experiment.estimand`, lift v6): a lift there has the same inference. `holm` adjusts a
family.
Calibrated by `experiment.calibration` (docs/statistics.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

from experiment import covariance, estimand
from experiment.frontier import Models, check_values, points

__all__ = [
    "NUM_DRAWS",
    "PROCEDURE",
    "SE_FLOOR",
    "Dominance",
    "LiftResult",
    "dominance",
    "holm",
    "lift_inference",
]

PROCEDURE = (
    "lift v6: concave hull of the reference, continued above its range by its best value on the "
    "mirrored window, crossed-covariance draws, bias-corrected; five claim words, supports and "
    "refutations Holm-adjusted"
)
"""The procedure's version, recorded in every results.json and study.json. v6 changes v5's lifts
above GRPO's pass@1 range only: GRPO is credited there with its hull's best value within the
model's distance below the range's end, not with the end point's value alone
(`experiment.estimand`: continuous in GRPO's points). v5 kept v4's lifts and changed the verdicts to
the five claim words of `experiment.study.claim_verdicts`."""

NUM_DRAWS = 2000
"""Draws of the means per analysis (Monte Carlo error of a bias or standard error: ~2% of the
standard error)."""

_CELLS = 2_000_000
"""How many (model, seed, problem) values `dominance` and the lifts' variances hold at once (16 MB
per array)."""

SE_FLOOR = 1e-6
"""A lift whose standard error is at most this (in the measure's units) is not tested (`p` NaN):
its model never left the base, up to float32 rounding (the toy's metrics)."""


@dataclass(frozen=True)
class LiftResult:
    """Lifts of every model over the reference's hull, with their inference (module docstring).

    Attributes (each `(M,)` unless said):
        models: the `Models`. reference: `(R,)` the reference models' indices.
        x, y: the points (means of the gains). lift: the bias-corrected estimate (NaN below).
        status: ``"inside"``, ``"below"`` or ``"above"`` the hull's pass@1 range.
        A reference model's fields are read against the hull of the reference's other settings
        (when it has others): how much its setting adds to GRPO's trade-off.
        lo, hi: the t interval at `level`. se: the draws' standard deviation. df: Satterthwaite's.
        p: two-sided p-value of lift 0 (NaN where `se` ≤ `SE_FLOOR` or below).
        bias: the subtracted bias estimate. inside_fraction: the share of draws with a lift (not
            below the range).
        components: `(M, 3)` variance components of the linearized lift (`design_mde`).
        hull: the reference's hull of the observed points. level, num_draws: as called.
        mean_draws: `(num_draws, 2M)` the draws of the means (`x̄` first, then `ȳ`), and
        lift_draws: `(num_draws, M)` each draw's lift over its own draw's hull (NaN below it;
            before the bias correction and the rescaling that makes `se`), with `keep_draws`;
            else None. What the interval is built from, for diagnosing it (e.g. a lift whose
            draws read another facet of GRPO's hull than the observed points do).
    """

    models: Models
    reference: np.ndarray
    x: np.ndarray
    y: np.ndarray
    lift: np.ndarray
    status: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    se: np.ndarray
    df: np.ndarray
    p: np.ndarray
    bias: np.ndarray
    inside_fraction: np.ndarray
    components: np.ndarray
    hull: estimand.Hull
    level: float
    num_draws: int
    mean_draws: np.ndarray | None = None
    lift_draws: np.ndarray | None = None


def _gradient(hull: estimand.Hull, ref: np.ndarray, m: int, px: np.ndarray, n: int) -> np.ndarray:
    """`(2n,)` the derivative of model `m`'s lift `ȳ_m − H(r)` with respect to every mean (`x̄`
    first, then `ȳ`) on the hull's facet under the read point `r = hull.read_at(x̄_m)` (the
    vertices held fixed): `r = x̄_m` inside the range; above it `r` is a vertex (its `ȳ` alone)
    or the mirrored window's edge `2·x̄_end − x̄_m` (`experiment.estimand`)."""
    g = np.zeros(2 * n)
    g[n + m] += 1.0
    x = float(px[m])
    r = float(hull.read_at(x))

    def mean_of(pos: int) -> int | None:  # the reference mean behind a vertex (None: the origin)
        k = int(hull.index[pos])
        return None if k == estimand.ORIGIN else int(ref[k])

    if x > hull.x_max and np.any(hull.vx == r):  # read on a vertex: its measure alone
        k = mean_of(int(np.flatnonzero(hull.vx == r)[0]))
        if k is not None:
            g[n + k] -= 1.0
        return g
    i, j, w = hull.facet(x)
    slope = 0.0 if i == j else (hull.vy[j] - hull.vy[i]) / (hull.vx[j] - hull.vx[i])
    if x > hull.x_max:  # r = 2·x̄_end − x̄_m
        g[m] += slope
        end = mean_of(hull.vx.size - 1)
        if end is not None:
            g[end] -= 2.0 * slope
    else:
        g[m] -= slope
    for pos, weight in ((i, 1.0 - w), (j, w)):
        k = mean_of(pos)
        if k is not None and weight != 0.0:  # the origin is fixed: the base's own gain
            g[n + k] -= weight
            g[k] += slope * weight
    return g


def lift_inference(
    x: object,
    y: object,
    models: Models,
    reference: str | Sequence[str] = "grpo",
    *,
    num_draws: int = NUM_DRAWS,
    level: float = 0.95,
    seed: int = 0,
    span: float = 1.0,
    keep_draws: bool = False,
) -> LiftResult:
    """Lift of every model over the reference's hull, with the inference of the module docstring.

    Args:
        x, y: `(M, S, P)` per-problem gains over the base model in pass@1 and in the measure
            (the problem axis crossed with the seeds: the same problems, or prompt sets, under
            every seed), `P ≥ 2`.
        models: the M models; reference: the reference method name(s).
        num_draws: ≥ 20. level: in (0, 1). seed: of the draws.
        span: the largest possible |lift| in the measure's units (1 for pass@k; the sample
            count for distinct correct solutions): intervals are clipped to ±span.
        keep_draws: also return the draws (`LiftResult.mean_draws`, `lift_draws`); the other
            fields are the same either way.

    Returns:
        A `LiftResult`.

    Raises:
        ValueError: naming the argument: shapes, no reference model, `num_draws` < 20, `level`
            outside (0, 1), `span` ≤ 0, `P < 2`.
    """
    x, y = check_values(x, y, models)
    ref = models.select(reference)
    if ref.size == 0:
        raise ValueError(
            f"reference: no model has method {reference!r}; methods: {sorted(set(models.method))}"
        )
    if isinstance(num_draws, bool) or not isinstance(num_draws, int) or num_draws < 20:
        raise ValueError(f"num_draws must be an integer >= 20, got {num_draws!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if not span > 0:
        raise ValueError(f"span must be > 0, got {span!r}")
    n, _, p = x.shape
    if p < 2:
        raise ValueError(f"x: {p} problem(s); the standard error needs at least 2")
    px, py = points(x, y)
    v = np.concatenate([x, y])  # (2M, S, P)
    root = covariance.covariance_root(v)  # (2M, r)
    rng = np.random.default_rng([seed, 37])
    draws = np.concatenate([px, py]) + rng.standard_normal((num_draws, root.shape[1])) @ root.T
    # A reference model is read against the hull of the reference's *other* settings (when it
    # has others): how much its setting adds to GRPO's trade-off (`experiment.study.reference_spread`).
    groups: dict[tuple[str, str], list[int]] = {}
    for i in ref:
        if models.step[i] > 0:
            groups.setdefault((models.method[i], models.setting[i]), []).append(int(i))
    apart = [g for g in groups.values() if len(groups) > 1 and np.setdiff1d(ref, g).size]
    rest = np.setdiff1d(np.arange(n), [i for g in apart for i in g])
    out = _over_hull(px, py, v, draws, root, ref, rest, level, span)
    for members in apart:
        sub = _over_hull(px, py, v, draws, root, np.setdiff1d(ref, members), np.array(members),
                         level, span)  # fmt: skip
        for key, arr in out.items():
            if key == "drawn":  # (num_draws, M): the members' columns
                arr[:, members] = sub[key][:, members]
            elif key != "hull":
                arr[members] = sub[key][members]
    return LiftResult(models, ref, px, py, out["lift"], out["status"], out["lo"], out["hi"],
                      out["se"], out["df"], out["p"], out["bias"], out["frac"], out["comp"],
                      out["hull"], float(level), num_draws, draws if keep_draws else None,
                      out["drawn"] if keep_draws else None)  # fmt: skip


def _over_hull(
    px: np.ndarray,
    py: np.ndarray,
    v: np.ndarray,
    draws: np.ndarray,
    root: np.ndarray,
    ref: np.ndarray,
    targets: np.ndarray,
    level: float,
    span: float,
) -> dict:
    """`lift_inference`'s arrays `(M,)` for the models `targets` over the hull of `ref` (NaN and
    ``"-"`` elsewhere), from the draws `(B, 2M)` of the means and their root `(2M, r)`."""
    n, num_draws = px.size, draws.shape[0]
    raw, status, hull = estimand.lifts(px, py, ref)
    status = np.where(np.isin(np.arange(n), targets), status, "-")
    inside = (status == "inside") | (status == "above")  # a lift is defined (lift v4)
    drawn = np.full((num_draws, n), np.nan)
    dx, dy = draws[:, :n], draws[:, n:]
    drawn[:, targets] = dy[:, targets] - estimand.hull_values(dx[:, ref], dy[:, ref],
                                                              dx[:, targets])  # fmt: skip
    fin = np.isfinite(drawn)
    count = fin.sum(0)
    mean_draw = np.where(fin, drawn, 0.0).sum(0) / np.maximum(count, 1)
    dev = np.where(fin, drawn - mean_draw, 0.0)
    sd = np.where(count >= 2, np.sqrt((dev**2).sum(0) / np.maximum(count - 1, 1)), np.nan)
    # Each lift's draws are rescaled so that their linearized variance, g'Σg, is the crossed
    # design's estimate of its linearized contributions (`crossed_variance`: sometimes pool, the
    # calibrated one); the draws keep what the linearization misses (the hull's facets, its bias).
    df = np.full(n, np.nan)
    comp = np.full((n, 3), np.nan)
    scale = np.full(n, np.nan)
    read = np.flatnonzero(inside & (count >= 2))
    chunk = max(1, _CELLS // max(v.shape[1] * v.shape[2], 1))
    for start in range(0, read.size, chunk):  # a few models' contributions at a time
        ms = read[start : start + chunk]
        grads = [_gradient(hull, ref, int(m), px, n) for m in ms]
        nzs = [np.flatnonzero(g) for g in grads]  # at most 6 means enter a lift
        c = np.stack(
            [np.einsum("k,ksp->sp", g[nz], v[nz]) for g, nz in zip(grads, nzs, strict=True)]
        )
        var, df[ms] = covariance.crossed_variance(c)
        comp[ms] = covariance.variance_components(c)
        for k, (m, g) in enumerate(zip(ms, grads, strict=True)):
            lin = float(np.sum((g @ root) ** 2))
            scale[m] = np.sqrt(var[k] / lin) if lin > 0 else 0.0
    bias = np.where(inside, (mean_draw - raw) * scale, np.nan)
    se = np.where(inside, sd * scale, np.nan)
    # The corrected hull value stays inside the range of the reference's means (and the base's).
    low, high = min(0.0, float(py[ref].min())), max(0.0, float(py[ref].max()))
    lift = np.where(inside, np.clip(raw - np.nan_to_num(bias), py - high, py - low), np.nan)
    ok = inside & (se > SE_FLOOR) & np.isfinite(df)
    dfs = np.where(ok, df, 1.0)
    # stats.t's ppf and sf by their kernels (the wrappers differ only at a quantile of 0 or 1)
    half = np.where(ok, special.stdtrit(dfs, 0.5 + level / 2) * np.where(ok, se, 0.0), 0.0)
    return {
        "lift": lift, "status": status, "se": se, "bias": bias, "comp": comp, "hull": hull,
        "drawn": drawn,
        "lo": np.where(inside, np.clip(lift - half, -span, span), np.nan),
        "hi": np.where(inside, np.clip(lift + half, -span, span), np.nan),
        "df": np.where(ok, df, np.nan), "frac": count / num_draws,
        "p": np.where(ok, 2 * special.stdtr(dfs, -np.abs(lift) / np.where(ok, se, 1.0)), np.nan),
    }  # fmt: skip


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
    var, df = covariance.crossed_variance(d)
    mean = d.mean(axis=(-2, -1))
    pos = var > 0
    t = mean / np.sqrt(np.where(pos, var, 1.0))
    # t's survival function as stats.t.sf computes it (scipy.special.stdtr), without its wrapper
    return np.where(pos, special.stdtr(np.where(pos, df, 1.0), -t), np.where(mean > 0, 0.0, 1.0))


def dominance(x: object, y: object, models: Models, reference: str | Sequence[str]) -> Dominance:
    """A curve-free check of each model against the reference's own models (the base included):
    is some reference model better in pass@1 *and* in the measure? For each pair the one-sided
    paired t tests of both differences (`crossed_variance`) are combined by intersection-union
    (the larger p: Berger 1982), and a model's p is the smallest pair's times the number of
    reference models (Bonferroni): a small p says "GRPO, stopped or tuned somewhere, beats this
    model on both axes".

    Args:
        x, y: `(M, S, P)` per-problem gains in pass@1 and in the measure.
        models: the M models; reference: the reference's method name(s).

    Raises:
        ValueError: shapes that differ, no reference model.
    """
    x, y = check_values(x, y, models)
    ref = models.select(reference)
    if ref.size == 0:
        raise ValueError(f"reference: no model has method {reference!r}")
    index = np.full(x.shape[0], -1)
    dx, dy, p = (np.full(x.shape[0], np.nan) for _ in range(3))
    others = np.setdiff1d(np.arange(x.shape[0]), ref)
    # A few models at a time: (chunk, R, S, P) differences, each reference model minus the model.
    chunk = max(1, _CELLS // max(ref.size * x.shape[1] * x.shape[2], 1))
    for start in range(0, others.size, chunk):
        ms = others[start : start + chunk]
        ddx, ddy = x[ref][None] - x[ms][:, None], y[ref][None] - y[ms][:, None]
        pr = np.maximum(_one_sided_p(ddx), _one_sided_p(ddy))  # (chunk, R)
        for k, m in enumerate(ms):
            b = int(np.argmin(pr[k]))  # the first of equals: the lowest index
            index[m], dx[m], dy[m] = ref[b], ddx[k, b].mean(), ddy[k, b].mean()
            p[m] = min(1.0, ref.size * float(pr[k, b]))
    return Dominance(index, dx, dy, p)


def holm(p: object) -> np.ndarray:
    """Holm's step-down adjusted p-values of a family `(n,)` (NaN entries are not part of the
    family and stay NaN): reject test `i` at family-wise level `α` iff its adjusted p ≤ `α`.
    Source: Holm (1979)."""
    p = np.asarray(p, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    if ok.size:
        order = ok[np.argsort(p[ok], kind="stable")]
        adj = np.maximum.accumulate((order.size - np.arange(order.size)) * p[order])
        out[order] = np.minimum(adj, 1.0)
    return out
