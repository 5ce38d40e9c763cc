"""`experiment.frontier` against slow references: hand-computed envelopes, a plain bootstrap loop."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from experiment import frontier as F
from experiment import report

# ------------------------------------------------------------------------------ slow reference


def slow_envelope(px: list[float], py: list[float], x: float) -> float:
    """`E(x)` from the definition: Pareto vertices by pairwise dominance, then a linear scan."""
    if x < min(px) or x > max(px):
        return math.nan
    pts = sorted(set(zip(px, py, strict=True)))
    vertices = [
        (a, b) for a, b in pts if not any((c >= a and d >= b) and (c, d) != (a, b) for c, d in pts)
    ]
    vertices.sort()
    if x <= vertices[0][0]:
        return vertices[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(vertices):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    raise AssertionError("x beyond the last vertex")


def slow_bootstrap(x, y, ref, seed_idx, problem_idx):
    """`(B, M)` lifts by explicit indexing and the slow envelope."""
    out = np.empty((seed_idx.shape[0], x.shape[0]))
    for b in range(seed_idx.shape[0]):
        bx, by = [], []
        for m in range(x.shape[0]):
            sx = sy = 0.0
            for s in seed_idx[b]:
                for p in problem_idx[b]:
                    sx += x[m, s, p]
                    sy += y[m, s, p]
            n = seed_idx.shape[1] * problem_idx.shape[1]
            bx.append(sx / n)
            by.append(sy / n)
        rx, ry = [bx[i] for i in ref], [by[i] for i in ref]
        for m in range(x.shape[0]):
            out[b, m] = by[m] - slow_envelope(rx, ry, bx[m])
    return out


# ------------------------------------------------------------------------------ envelopes


def test_hand_computed_envelope():
    # GRPO along training: base (0, 0), then (0.2, 0.05), (0.4, 0.02), (0.5, -0.06);
    # (0.3, 0.0) is dominated by (0.4, 0.02).
    px = [0.0, 0.2, 0.3, 0.4, 0.5]
    py = [0.0, 0.05, 0.0, 0.02, -0.06]
    env = F.upper_envelope(px, py)
    np.testing.assert_array_equal(env.vx, [0.2, 0.4, 0.5])
    np.testing.assert_array_equal(env.vy, [0.05, 0.02, -0.06])
    assert (env.x_min, env.x_max) == (0.0, 0.5)
    got = env([-0.1, 0.0, 0.1, 0.3, 0.45, 0.5, 0.6])
    want = [np.nan, 0.05, 0.05, 0.035, -0.02, -0.06, np.nan]
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert env.status([-0.1, 0.3, 0.6]).tolist() == ["below", "inside", "above"]


def test_hand_computed_lift():
    lift, status = F.lift([0.0, 0.2, 0.4], [0.0, 0.1, 0.0], [0.3, 0.1, 0.5], [0.08, 0.2, 0.0])
    np.testing.assert_allclose(lift[:2], [0.08 - 0.05, 0.2 - 0.1])
    assert np.isnan(lift[2]) and status.tolist() == ["inside", "inside", "above"]


def test_ties_keep_the_highest_point():
    env = F.upper_envelope([0.1, 0.1, 0.2], [0.3, 0.5, 0.1])
    np.testing.assert_array_equal(env.vx, [0.1, 0.2])
    np.testing.assert_array_equal(env.vy, [0.5, 0.1])


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match="px and py"):
        F.upper_envelope([], [])
    with pytest.raises(ValueError, match="finite"):
        F.upper_envelope([0.0, np.nan], [0.0, 1.0])
    with pytest.raises(ValueError, match=r"x must have shape \(M, S, P\)"):
        F.points(np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"models\.step"):
        F.Models(["grpo"], ["a"], [-1])
    with pytest.raises(ValueError, match="equal lengths"):
        F.Models(["grpo"], ["a", "b"], [0])
    models = F.Models(["grpo", "ds"], ["a", "b"], [0, 1])
    with pytest.raises(ValueError, match="reference: no model"):
        F.bootstrap_lift(np.zeros((2, 1, 2)), np.zeros((2, 1, 2)), models, "casp")
    with pytest.raises(ValueError, match="models has 2 entries"):
        F.bootstrap_lift(np.zeros((3, 1, 2)), np.zeros((3, 1, 2)), models)
    with pytest.raises(ValueError, match="level"):
        F.bootstrap_lift(np.zeros((2, 1, 2)), np.zeros((2, 1, 2)), models, level=1.5)


coords = st.floats(-1.0, 1.0, allow_nan=False).map(lambda v: round(v, 3))
point_sets = st.lists(st.tuples(coords, coords), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(point_sets, st.lists(coords, min_size=1, max_size=8))
def test_envelope_matches_the_slow_reference(pts, queries):
    px, py = [p[0] for p in pts], [p[1] for p in pts]
    env = F.upper_envelope(px, py)
    for q in queries:
        want = slow_envelope(px, py, q)
        got = float(env(q))
        assert (math.isnan(want) and math.isnan(got)) or got == pytest.approx(want, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(point_sets)
def test_envelope_dominates_every_point_and_is_monotone(pts):
    px, py = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    env = F.upper_envelope(px, py)
    assert np.all(env(px) >= py - 1e-12)
    grid = np.linspace(env.x_min, env.x_max, 41)
    assert np.all(np.diff(env(grid)) <= 1e-12)
    assert np.all(np.diff(env.vx) > 0) and np.all(np.diff(env.vy) < 0)
    # Adding a point never lowers the envelope.
    more = F.upper_envelope(np.append(px, 0.0), np.append(py, 0.0))
    inside = grid[(grid >= more.x_min) & (grid <= more.x_max)]
    assert np.all(more(inside) >= env(inside) - 1e-12)


@settings(max_examples=30, deadline=None)
@given(point_sets)
def test_lift_of_the_reference_against_itself(pts):
    px, py = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    lifts, status = F.lift(px, py, px, py)
    assert (status == "inside").all() and np.all(lifts <= 1e-12)
    env = F.upper_envelope(px, py)
    vertex_lift, _ = F.lift(px, py, env.vx, env.vy)
    np.testing.assert_allclose(vertex_lift, 0.0, atol=1e-12)


# ------------------------------------------------------------------------------ bootstrap


def _toy_data(rng: np.random.Generator, m: int = 5, s: int = 3, p: int = 7):
    x = rng.uniform(0, 1, (m, s, p))
    y = 0.5 - 0.4 * x + rng.normal(0, 0.1, (m, s, p))
    models = F.Models(["grpo", "grpo", "grpo", "ds", "casp"][:m], ["a", "a", "b", "c", "d"][:m],
                      [0, 10, 10, 10, 10][:m])  # fmt: skip
    return x, y, models


def test_resampled_points_match_explicit_indexing():
    rng = np.random.default_rng(1)
    x, y, _ = _toy_data(rng)
    si, pi = F.bootstrap_indices(np.random.default_rng(2), 6, 3, 7)
    bx, by = F.resampled_points(x, y, si, pi)
    for b in range(6):
        sub = x[:, si[b]][:, :, pi[b]]
        np.testing.assert_allclose(bx[b], sub.mean(axis=(1, 2)), rtol=1e-12)
        np.testing.assert_allclose(by[b], y[:, si[b]][:, :, pi[b]].mean(axis=(1, 2)), rtol=1e-12)


def test_bootstrap_matches_a_plain_loop_on_a_fixed_seed():
    x, y, models = _toy_data(np.random.default_rng(3))
    res = F.bootstrap_lift(x, y, models, "grpo", num_resamples=40, seed=7)
    si, pi = F.bootstrap_indices(np.random.default_rng(7), 40, 3, 7)
    slow = slow_bootstrap(x, y, [0, 1, 2], si, pi)
    for m in range(5):
        col = slow[:, m]
        kept = col[np.isfinite(col)]
        assert res.inside_fraction[m] == pytest.approx(kept.size / 40)
        if kept.size:
            assert res.lo[m] == pytest.approx(np.quantile(kept, 0.025), abs=1e-12)
            assert res.hi[m] == pytest.approx(np.quantile(kept, 0.975), abs=1e-12)
    px, py = x.mean(axis=(1, 2)), y.mean(axis=(1, 2))
    for m in range(5):
        want = py[m] - slow_envelope(list(px[:3]), list(py[:3]), px[m])
        got = res.lift[m]
        assert (math.isnan(want) and math.isnan(got)) or got == pytest.approx(want, abs=1e-12)


def test_paired_bootstrap_cancels_shared_problem_noise():
    """Two models that differ by a constant on every problem: the paired interval is a point."""
    rng = np.random.default_rng(4)
    base = rng.uniform(0, 1, (1, 4, 50))
    x = np.concatenate([base, base + 0.1, base + 0.05])  # grpo, grpo later, method
    y = np.concatenate([base * 0 + 0.3, base * 0 + 0.1, base * 0 + 0.3])
    models = F.Models(["grpo", "grpo", "m"], ["a", "a", "b"], [0, 5, 5])
    res = F.bootstrap_lift(x, y, models, num_resamples=200, seed=0)
    # The method's pass@1 sits halfway between GRPO's two points in every replicate.
    assert res.lift[2] == pytest.approx(0.3 - 0.2)
    assert res.lo[2] == pytest.approx(0.1) and res.hi[2] == pytest.approx(0.1)
    assert res.inside_fraction[2] == 1.0


def test_lift_table_lists_outside_models_without_extrapolating():
    x = np.array([0.0, 0.2, 0.5]).reshape(3, 1, 1) * np.ones((3, 2, 3))
    y = np.array([0.0, 0.1, 0.2]).reshape(3, 1, 1) * np.ones((3, 2, 3))
    models = F.Models(["grpo", "grpo", "m"], ["a", "a", "b"], [0, 5, 5])
    rows = [{"label": "grpo", "setting": "a", "step": t} for t in (0, 5)]
    rows.append({"label": "m", "setting": "b", "step": 5})
    section, res = report.lift_analysis(x, y, models, rows, "grpo", k=4, num_resamples=20)
    assert res.status[2] == "above"
    table = report.lift_markdown({"pass_at_k": section}, "intro")
    assert "| m | b | 5 | +50.0 | +20.00 | n/a (above) |" in table
    assert table.count("\n| m |") == 1 and "| grpo |" not in table


def test_curve_lift_equals_a_plain_loop():
    """`curve_lift` against a slow reference: explicit means, a least-squares fit through the
    origin by the normal equations, the delta method by a loop of one-sided differences of the
    lifts in every model's every cell, and the crossed-layout variance by sums of squares."""
    rng = np.random.default_rng(3)
    m, s, p = 6, 3, 40
    x = rng.normal(0.05, 0.1, (m, s, p)) + rng.normal(0, 0.05, (m, s, 1))  # seed effects
    y = rng.normal(-0.02, 0.1, (m, s, p)) + rng.normal(0, 0.05, (1, 1, p))  # problem effects
    models = F.Models(["grpo"] * 4 + ["m", "m"], list("abcdef"), [1, 2, 3, 4, 1, 2])
    res = F.curve_lift(x, y, models, num_resamples=20, seed=11)

    def lifts(xm, ym):  # xm, ym: (M,) points
        a = np.stack([xm[:4], xm[:4] ** 2], axis=1)
        beta = np.linalg.solve(a.T @ a, a.T @ ym[:4])
        vertex = -beta[0] / (2 * beta[1])  # a turn between the base and the nearest point: a line
        if min(0, xm[:4].max()) < vertex < max(0, xm[:4].min()):  # (no base among the 4)
            beta = np.array([xm[:4] @ ym[:4] / (xm[:4] @ xm[:4]), 0.0])
        return ym - (beta[0] * xm + beta[1] * xm**2)

    est = lifts(x.mean((1, 2)), y.mean((1, 2)))
    inside = res.status == "inside"
    np.testing.assert_allclose(res.lift[inside], est[inside], rtol=1e-10)
    h = 1e-7  # the per-cell contribution: d lift / d (one cell's value) times S·P
    contrib = np.zeros((m, s, p))
    for j in range(m):
        for v, arr in ((0, x), (1, y)):
            xm, ym = x.mean((1, 2)), y.mean((1, 2))
            xp, yp = xm.copy(), ym.copy()
            (xp if v == 0 else yp)[j] += h
            d = (lifts(xp, yp) - lifts(xm, ym)) / h  # (M,)
            contrib += d[:, None, None] * arr[j][None]
    for i in np.flatnonzero(inside):
        c = contrib[i]
        row, col, mu = c.mean(1), c.mean(0), c.mean()
        ss_row = p * ((row - mu) ** 2).sum()
        ss_col = s * ((col - mu) ** 2).sum()
        ss_e = ((c - row[:, None] - col[None, :] + mu) ** 2).sum()
        ms_row, ms_col, ms_e = ss_row / (s - 1), ss_col / (p - 1), ss_e / ((s - 1) * (p - 1))
        crit_row = stats.f.ppf(0.75, s - 1, (s - 1) * (p - 1))
        crit_col = stats.f.ppf(0.75, p - 1, (s - 1) * (p - 1))
        if ms_row / ms_e > crit_row and ms_col / ms_e > crit_col:
            var = (ms_row + ms_col - ms_e) / (s * p)
        elif ms_col / ms_e > crit_col:
            var = ms_col / (s * p)
        elif ms_row / ms_e > crit_row:
            var = ms_row / (s * p)
        else:
            var = c.var(ddof=1) / (s * p)
        assert res.se[i] == pytest.approx(np.sqrt(var), rel=1e-5)
        half = stats.t.ppf(0.975, res.df[i]) * res.se[i]
        assert res.lo[i] == pytest.approx(est[i] - half, rel=1e-8, abs=1e-12)
        assert res.p[i] == pytest.approx(2 * stats.t.sf(abs(est[i]) / res.se[i], res.df[i]))
    assert np.isnan(res.lift[~inside]).all() and np.isnan(res.se[~inside]).all()


def test_crossed_variance_is_unbiased_for_the_grand_mean():
    """Under the two-way random-effects model with real seed, problem and noise components, the
    estimate averages to the grand mean's variance over repeated designs (3 Monte Carlo SE), and
    with one seed it is the plain variance of the mean."""
    rng = np.random.default_rng(0)
    s, p, n = 8, 30, 4000
    c = (rng.normal(0, 1.0, (n, s, 1)) + rng.normal(0, 2.0, (n, 1, p))
         + rng.normal(0, 3.0, (n, s, p)))  # fmt: skip
    var, df = F.crossed_variance(c)
    truth = 1.0 / s + 4.0 / p + 9.0 / (s * p)
    assert abs(var.mean() - truth) <= 3 * var.std() / np.sqrt(n)
    assert np.all(df > 1)
    one = rng.normal(size=(5, 1, 7))
    v1, d1 = F.crossed_variance(one)
    np.testing.assert_allclose(v1, one[:, 0].var(axis=1, ddof=1) / 7)
    assert np.all(d1 == 6)


def test_variance_components_recover_the_model_and_plan_the_same_variance():
    """Method-of-moments components average to the true `(σ²_seed, σ²_problem, σ²_e)` (3 Monte
    Carlo SE, clipping at 0 aside: components far from 0), and `design_mde` at the design's own
    size is `minimum_detectable` of the true grand-mean variance."""
    rng = np.random.default_rng(1)
    s, p, n = 6, 40, 3000
    c = (rng.normal(0, 1.5, (n, s, 1)) + rng.normal(0, 2.0, (n, 1, p))
         + rng.normal(0, 3.0, (n, s, p)))  # fmt: skip
    comp = F.variance_components(c)
    assert comp.shape == (n, 3) and np.all(comp >= 0)
    truth = np.array([2.25, 4.0, 9.0])
    assert np.all(np.abs(comp.mean(0) - truth) <= 3 * comp.std(0) / np.sqrt(n) + 0.02 * truth)
    var = 2.25 / s + 4.0 / p + 9.0 / (s * p)
    mde = F.design_mde(truth, s, p)
    assert mde > F.minimum_detectable(np.sqrt(var), 1e6)  # t quantiles above the normal ones
    assert mde < F.minimum_detectable(np.sqrt(var), s - 1)  # df above the seeds' alone
    one = F.variance_components(rng.normal(size=(2, 1, 5)))
    assert np.all(np.isnan(one[:, 0])) and np.all(one[:, 2] == 0)


def _design_mde_loop(comp, s, p, alpha=0.05, power=0.8):
    """A scalar restatement of `design_mde` (expected mean squares, then Satterthwaite)."""
    va, vb, ve = comp
    var = va / s + vb / p + ve / (s * p)
    if va > 0 and vb > 0:
        ms = [(p * va + ve, s - 1), (s * vb + ve, p - 1), (ve, (s - 1) * (p - 1))]
        df = var**2 / sum((m / (s * p)) ** 2 / d for m, d in ms)
    else:
        df = p - 1 if vb > 0 else s - 1 if va > 0 else s * p - 1
    return (stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df)) * math.sqrt(var)


# Components of 0 or at least 1e-9 (a variance of pass@k gains; subnormal ones underflow when
# squared in Satterthwaite's formula, in the loop as in the vectorized code, differently).
COMPONENT = st.one_of(st.just(0.0), st.floats(1e-9, 1e-2))


@given(st.tuples(COMPONENT, COMPONENT, COMPONENT), st.integers(2, 30), st.integers(2, 500))
def test_design_mde_equals_a_scalar_restatement(comp, s, p):
    """Equal to the loop. (Not monotone in P: with a seed component, more problems shrink the
    variance but also the Satterthwaite df, toward the seeds' S − 1.)"""
    assert F.design_mde(comp, s, p) == pytest.approx(_design_mde_loop(comp, s, p), rel=1e-9)


def test_design_mde_names_bad_input():
    with pytest.raises(ValueError, match="components"):
        F.design_mde([1.0, 2.0], 3, 4)
    with pytest.raises(ValueError, match="seeds, problems"):
        F.design_mde([1.0, 2.0, 3.0], 1, 4)


def test_holm_equals_the_step_down_rule():
    rng = np.random.default_rng(1)
    for _ in range(50):
        p = rng.uniform(0, 0.2, rng.integers(1, 8))
        adj = F.holm(p)
        order = np.argsort(p)
        n = p.size
        for alpha in (0.01, 0.05, 0.1):
            reject = np.zeros(n, bool)
            for rank, i in enumerate(order):  # step down: stop at the first acceptance
                if p[i] > alpha / (n - rank):
                    break
                reject[i] = True
            np.testing.assert_array_equal(adj <= alpha, reject)
    assert np.isnan(F.holm([0.01, np.nan])[1]) and F.holm([0.01, np.nan])[0] == 0.01


def test_a_model_that_never_left_the_base_is_not_tested():
    """All-zero gains (up to rounding) give no p-value rather than a t ratio of two roundings."""
    rng = np.random.default_rng(0)
    x = rng.normal(0.05, 0.1, (5, 2, 12))
    y = rng.normal(-0.02, 0.1, (5, 2, 12))
    x[4], y[4] = 1e-19 * rng.normal(size=(2, 12)), 1e-19 * rng.normal(size=(2, 12))
    models = F.Models(["grpo"] * 4 + ["m"], [*"abcd", "e"], [1, 2, 3, 4, 4])
    res = F.curve_lift(x, y, models, num_resamples=10)
    assert res.status[4] == "inside"  # pass@1 gain 0: the base, inside every reference range
    assert np.isnan(res.p[4]) and res.se[4] <= F.SE_FLOOR
    assert np.isfinite(res.p[:4][res.status[:4] == "inside"]).all()


def test_per_setting_curve_is_the_max_of_single_setting_curves():
    """`curve_lift(per_setting=True)`: each lift is the smallest of the lifts over each reference
    setting's own curve among the settings whose pass@1 range reaches the model (a slow loop of
    single-setting `curve_lift` calls); with one reference setting it equals the pooled curve."""
    rng = np.random.default_rng(3)
    m, s, p = 8, 3, 40
    steps = [0, 1, 2, 3, 1, 2, 3, 2]
    sets = ["base", "a", "a", "a", "b", "b", "b", "x"]
    meth = ["grpo"] * 7 + ["m"]
    x = (
        rng.normal(0, 0.02, (m, s, p))
        + np.array([0, 0.02, 0.04, 0.06, 0.01, 0.03, 0.05, 0.03])[:, None, None]
    )
    y = (
        rng.normal(0, 0.02, (m, s, p))
        + np.array([0, -0.02, -0.05, -0.09, 0, -0.01, -0.03, -0.01])[:, None, None]
    )
    x[0], y[0] = 0.0, 0.0
    models = F.Models(meth, sets, steps)
    res = F.curve_lift(x, y, models, "grpo", per_setting=True, num_resamples=10)
    px, _ = F.points(x, y)
    singles = []
    for keep in ("a", "b"):
        idx = [i for i in range(m) if sets[i] in (keep, "base") or meth[i] == "m"]
        sub = F.Models([meth[i] for i in idx], [sets[i] for i in idx], [steps[i] for i in idx])
        r = F.curve_lift(x[idx], y[idx], sub, "grpo", num_resamples=10)
        own = px[[i for i in range(m) if sets[i] == keep]]
        reach = min(0.0, own.min()) <= px[-1] <= own.max()
        singles.append(r.lift[-1] if reach else np.inf)
    assert res.lift[-1] == pytest.approx(min(singles), abs=1e-12)
    one = F.Models([*meth[:4], "m"], [*sets[:4], "x"], [*steps[:4], 2])
    idx = [0, 1, 2, 3, 7]
    a = F.curve_lift(x[idx], y[idx], one, "grpo", per_setting=True, num_resamples=10)
    b = F.curve_lift(x[idx], y[idx], one, "grpo", num_resamples=10)
    np.testing.assert_allclose(a.lift, b.lift, equal_nan=True)
    np.testing.assert_allclose(a.se, b.se, equal_nan=True)


def test_below_the_base_only_a_setting_that_went_there_is_read():
    """A setting's curve covers its own pass@1 range on either side of the base: a model below
    the base is measured against the setting whose path went below it, never against another
    setting's quadratic extrapolated there (which rose steeply in the strong study's fourth
    confirmation)."""
    rng = np.random.default_rng(5)
    m, s, p = 8, 4, 60
    steps = [0, 1, 2, 3, 1, 2, 3, 2]
    sets = ["base", "up", "up", "up", "back", "back", "back", "x"]
    meth = ["grpo"] * 7 + ["m"]
    mx = np.array([0, 0.02, 0.035, 0.045, -0.005, -0.012, -0.02, -0.01])
    my = np.array([0, -0.03, -0.07, -0.12, -0.06, -0.12, -0.18, -0.09])
    x = rng.normal(0, 0.01, (m, s, p)) + mx[:, None, None]
    y = rng.normal(0, 0.01, (m, s, p)) + my[:, None, None]
    x[0], y[0] = 0.0, 0.0
    models = F.Models(meth, sets, steps)
    res = F.curve_lift(x, y, models, "grpo", per_setting=True, num_resamples=10)
    idx = [0, 4, 5, 6, 7]  # the base, the setting that went below it, the model
    sub = F.Models([meth[i] for i in idx], [sets[i] for i in idx], [steps[i] for i in idx])
    alone = F.curve_lift(x[idx], y[idx], sub, "grpo", num_resamples=10)
    assert res.status[-1] == "inside"
    assert res.lift[-1] == pytest.approx(alone.lift[-1], abs=1e-12)
    # "up"'s quadratic, read below the base, would give another (here: far lower) lift
    px, py = F.points(x, y)
    beta_up, _ = F.setting_curve(px[1:4], py[1:4])
    assert py[-1] - F.curve_at(beta_up, px[-1]) != pytest.approx(res.lift[-1], abs=0.01)


def test_a_setting_curve_that_turns_in_the_gap_before_its_first_point_is_a_line():
    """`setting_curve`: checkpoints clustered far from the base with a steep local slope give a
    quadratic that rises into a hump between the base and the cluster (no data there): a line
    through the base instead; spread points (or a turn among them) keep the quadratic; the base's
    own point does not close the gap."""
    px = np.array([0.0215, 0.0224, 0.0234])  # the strong LLM study's KL setting
    py = np.array([-0.0226, -0.0382, -0.0485])
    quad = F.fit_curve(px, py, 2)
    assert 0 < -quad[0] / (2 * quad[1]) < px.min()  # the hump's top in the gap
    beta, degree = F.setting_curve(px, py)
    assert degree == 1 and beta.shape == (1,)
    np.testing.assert_allclose(beta, [px @ py / (px @ px)], rtol=1e-12)
    assert F.curve_at(beta, 0.01) < 0 < F.curve_at(quad, 0.01)
    with_base = F.setting_curve(np.r_[0.0, px], np.r_[0.0, py])
    np.testing.assert_allclose(with_base[0], beta, rtol=1e-12)
    spread = np.array([0.01, 0.03, 0.06])
    for y in (-(spread**2) * 20, spread - 10 * spread**2):  # no turn; a turn among the points
        beta, degree = F.setting_curve(spread, y)
        assert degree == 2
        np.testing.assert_allclose(beta, F.fit_curve(spread, y, 2), rtol=1e-12)
    assert F.setting_curve(-px, py)[1] == 1  # the same on the side of lost pass@1


def test_dominance_holds_its_level_and_finds_a_dominated_model():
    """`dominance` under its null: a method path equal to a reference path (its models are draws
    from the reference models' distributions, so none is dominated by its own twin's checkpoint),
    simulated in `experiment.calibration`'s strong design; the rate of p ≤ 0.05 stays under 5%
    (Monte Carlo error accounted for). A path that moves less and sharpens more than GRPO's lies
    below GRPO's early checkpoints on both axes, and is found there."""
    from experiment import calibration as C

    d = C.STRESS_DESIGNS["strong_two_paths"]
    twin = ("twin", *d.ref_settings[1])
    worse = ("worse", -0.3, 0.6)  # at (1.2, −12), (2.3, −20), (3.2, −25): under GRPO
    rng = np.random.default_rng(7)
    hits, found = [], []
    for _ in range(40):
        study = C.simulate(d, [twin, worse], rng)
        dom = F.dominance(study.x, study.y, study.models, "grpo")
        ref = np.asarray(study.models.method) == "grpo"
        assert (dom.index[ref] == -1).all() and np.isnan(dom.p[ref]).all()
        methods = np.asarray(study.models.method)
        hits.extend(dom.p[methods == "twin"] <= 0.05)
        found.extend(dom.p[methods == "worse"] <= 0.05)
        w = np.flatnonzero(methods == "worse")
        assert (dom.dx[w][dom.p[w] <= 0.05] > 0).all() and (dom.dy[w][dom.p[w] <= 0.05] > 0).all()
    rate = float(np.mean(hits))
    assert rate <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / len(hits)), rate
    assert np.mean(found) > 0.5


def _stalled_reference_study(seed: int) -> tuple[np.ndarray, np.ndarray, F.Models]:
    """GRPO's three settings as in the strong LLM study under numerics pin 2 (exploration): two
    whose pass@1 barely moves while pass@16 falls 7-14 points (steep, noisy quadratics) and one
    that moves; four method models near the base's pass@1. `(M, 3 seeds, 128 problems)` gains."""
    rng = np.random.default_rng(seed)
    specs = [("grpo", "base", 0, 0.0, 0.0)]
    for name, xs, ys in (("default", (0.003, -0.002, 0.004), (-0.10, -0.13, -0.14)),
                         ("kl", (0.007, -0.004, 0.010), (-0.09, -0.12, -0.07)),
                         ("lr", (0.023, 0.018, 0.031), (-0.07, -0.08, -0.11))):  # fmt: skip
        specs += [
            ("grpo", name, st, mx, my) for st, mx, my in zip((50, 100, 150), xs, ys, strict=True)
        ]
    for i, (mx, my) in enumerate(((0.004, -0.12), (0.009, -0.13), (0.001, -0.10), (0.006, -0.10))):
        specs.append(("m", f"s{i}", 50, mx, my))
    x, y = np.zeros((2, len(specs), 3, 128))
    for m, (_, _, step, mx, my) in enumerate(specs):
        if step:
            x[m] = mx + rng.normal(0, 0.01, (3, 1)) + rng.normal(0, 0.08, (3, 128))
            y[m] = my + rng.normal(0, 0.02, (3, 1)) + rng.normal(0, 0.3, (3, 128))
    return x, y, F.Models(*zip(*[s[:3] for s in specs], strict=True))


def test_a_noisier_contending_curve_widens_the_corrected_interval():
    """The maximum's bias correction (`_max_bias`) can move a lift by several of the active
    curve's standard errors when a contending setting's curve is much noisier (the strong LLM
    study's exploration under numerics pin 2 read +100-point lifts with 10-point intervals).
    The corrected lift's standard error is at least the spread of the contenders' minimum, so
    the correction stays within its own error; with the active curve's error alone it did not."""
    ratios_old, ratios_new = [], []
    for seed in range(12):
        x, y, models = _stalled_reference_study(seed)
        kw = {"per_setting": True, "num_resamples": 20}
        raw = F.curve_lift(x, y, models, "grpo", bias_correct=False, **kw)
        fixed = F.curve_lift(x, y, models, "grpo", bias_correct=True, **kw)
        ok = (fixed.status == "inside") & (np.asarray(models.method) == "m")
        shift = np.abs(fixed.lift - raw.lift)[ok]
        assert np.all(fixed.se[ok] >= raw.se[ok])
        ratios_old += list(shift / raw.se[ok])
        ratios_new += list(shift / fixed.se[ok])
    assert max(ratios_old) > 3.0  # the flaw: shifts of 3-4 standard errors here
    assert max(ratios_new) <= 1.5
