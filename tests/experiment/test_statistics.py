"""The statistics against slow references and their promises: `experiment.covariance`,
`experiment.estimand`, `experiment.inference` (issue 37)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from experiment import covariance as Cv
from experiment import estimand as E
from experiment import frontier as F
from experiment import inference as I
from experiment import report

# ------------------------------------------------------------------------------ the hull


def slow_hull(px: list[float], py: list[float], x: float) -> float:
    """`H(x)` from the definition: the best mixture of two of the points (the origin included)
    with pass@1 exactly `x`; above their pass@1 range its largest value on the mirrored window
    `[2·x_max − x, x_max]` (a maximum of a piecewise-linear function: at the window's ends or at a
    point's pass@1 inside it); NaN below it."""
    pts = [*zip(px, py, strict=True), (0.0, 0.0)]
    x_max, x_min = max(p[0] for p in pts), min(p[0] for p in pts)
    if x < x_min:
        return math.nan
    if x > x_max:
        low = max(x_min, 2 * x_max - x)
        cands = [low, x_max, *(p[0] for p in pts if low <= p[0] <= x_max)]
        return max(slow_hull(px, py, c) for c in cands)
    best = -math.inf
    for (x0, y0), (x1, y1) in itertools.product(pts, pts):
        if x0 == x == x1:
            best = max(best, y0, y1)
        elif x0 <= x <= x1 and x0 < x1:
            best = max(best, y0 + (y1 - y0) * (x - x0) / (x1 - x0))
    return best


def test_hand_computed_hull():
    # The origin, (1, 2), (2, 2.5) and (3, 1); (1.5, 1) lies under the hull, (2, 2.5) is a vertex.
    h = E.upper_hull([1.0, 2.0, 3.0, 1.5], [2.0, 2.5, 1.0, 1.0])
    np.testing.assert_array_equal(h.vx, [0.0, 1.0, 2.0, 3.0])
    np.testing.assert_array_equal(h.vy, [0.0, 2.0, 2.5, 1.0])
    np.testing.assert_array_equal(h.index, [E.ORIGIN, 0, 1, 2])
    assert h(0.5) == pytest.approx(1.0) and h(2.5) == pytest.approx(1.75)
    # Above the range: the highest value on the window mirrored below the end (3).
    assert h(3.2) == pytest.approx(1.3) and h(3.5) == pytest.approx(1.75) and h(9.0) == 2.5
    assert np.isnan(h(-0.1)) and h.read_at(3.5) == 2.5 and h.facet(3.5) == (2, 3, 0.5)
    assert list(h.status([-1.0, 1.0, 4.0])) == ["below", "inside", "above"]
    # A point on a segment is not a vertex; a tie in pass@1 keeps the highest.
    h = E.upper_hull([1.0, 2.0, 2.0], [1.0, 2.0, 0.0])
    np.testing.assert_array_equal(h.vx, [0.0, 2.0])


# Coordinates on a coarse grid, so that ties in pass@1, points on a segment and reads at a vertex
# happen (each a branch of the chain or of np.interp), and wide values besides.
_coord = st.one_of(st.integers(-4, 8).map(lambda v: v / 4),
                   st.floats(-3.0, 5.0, allow_nan=False, allow_subnormal=False))  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(1, 4), st.data())
def test_hull_values_is_every_sets_hull_bit_for_bit(n_sets, n_points, n_reads, data):
    """The batched hull (`estimand.hull_values`, what every draw of the means is read with) equals
    `upper_hull(px[b], py[b])(x[b])` for each set, to the bit: inside, above and below the range,
    at vertices, with ties and collinear points."""
    px, py = (np.array(data.draw(st.lists(st.lists(_coord, min_size=n_points, max_size=n_points),
                                          min_size=n_sets, max_size=n_sets)))
              for _ in range(2))  # fmt: skip
    reads = data.draw(st.lists(st.lists(_coord, min_size=n_reads, max_size=n_reads),
                               min_size=n_sets, max_size=n_sets))  # fmt: skip
    x = np.array(reads)
    x[:, 0] = px[:, 0]  # one read at a point of the set
    got = E.hull_values(px, py, x)
    want = np.stack([E.upper_hull(px[b], py[b])(x[b]) for b in range(n_sets)])
    np.testing.assert_array_equal(got, want)


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match="px and py"):
        E.upper_hull([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        E.upper_hull([np.nan], [1.0])
    models = F.Models(["grpo", "m"], ["a", "b"], [1, 1])
    x = np.zeros((2, 2, 3))
    with pytest.raises(ValueError, match="reference"):
        I.lift_inference(x, x, models, "nope")
    with pytest.raises(ValueError, match="num_draws"):
        I.lift_inference(x, x, models, num_draws=5)
    with pytest.raises(ValueError, match="level"):
        I.lift_inference(x, x, models, level=1.5)
    with pytest.raises(ValueError, match="problem"):
        I.lift_inference(np.zeros((2, 2, 1)), np.zeros((2, 2, 1)), models)
    # A run that went non-finite (a method of one's own with NaN advantages) is named, not "x".
    y = np.zeros((2, 2, 3))
    y[1, 1, 2] = np.nan
    with pytest.raises(ValueError, match=r"y must be finite: m b at step 1 has nan \(seed index "
                                         r"1, problem 2; 1 of its 6 values\)"):  # fmt: skip
        I.lift_inference(x, y, models)


coords = st.floats(-1.0, 1.0, allow_nan=False, allow_subnormal=False)
point_sets = st.lists(st.tuples(coords, coords), min_size=1, max_size=9)


@settings(max_examples=80, deadline=None)
@given(point_sets, st.lists(coords, min_size=1, max_size=8))
def test_hull_matches_the_slow_reference(pts, queries):
    px, py = (list(c) for c in zip(*pts, strict=True))
    h = E.upper_hull(px, py)
    for q in queries:
        want = slow_hull(px, py, q)
        got = float(h(q))
        if math.isnan(want):
            assert math.isnan(got)
        else:
            assert got == pytest.approx(want, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(point_sets)
def test_hull_is_concave_and_above_every_point(pts):
    px, py = (np.array(c) for c in zip(*pts, strict=True))
    h = E.upper_hull(px, py)
    assert np.all(np.diff(h.vx) > 0)
    slopes = np.diff(h.vy) / np.diff(h.vx)
    assert np.all(np.diff(slopes) <= 1e-9 * (1 + np.abs(slopes[1:])))
    assert np.all(py <= h(px) + 1e-12)


# ------------------------------------------------------------------------------ the inference

gains = st.floats(-0.3, 0.3, allow_nan=False, allow_subnormal=False)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(gains, gains), min_size=2, max_size=6),
    st.lists(st.tuples(gains, gains), min_size=1, max_size=4),
    st.floats(0.0, 0.6),
    st.integers(0, 2**16),
)
def test_every_lift_is_bounded_and_inside_its_interval(ref_pts, method_pts, noise, seed):
    """Random model points (straddling the base, tiny pass@1 ranges, huge noise): no lift outside
    [-100, +100] points and no interval that misses its estimate. The per-problem values are
    probabilities' differences (pass@k gains of a base at 0.5), so every gain lies in [-1, 1]."""
    rng = np.random.default_rng(seed)
    pts = [(0.0, 0.0), *ref_pts, *method_pts]
    s, p = 3, 8
    x = np.stack([np.clip(mx + noise * rng.standard_normal((s, p)), -0.5, 0.5) for mx, _ in pts])
    y = np.stack([np.clip(my + noise * rng.standard_normal((s, p)), -0.5, 0.5) for _, my in pts])
    x[0], y[0] = 0.0, 0.0
    n_ref = 1 + len(ref_pts)
    models = F.Models(["grpo"] * n_ref + ["m"] * len(method_pts),
                      ["base"] + [f"r{i}" for i in range(len(ref_pts))]
                      + [f"m{i}" for i in range(len(method_pts))],
                      [0] + [1] * (len(pts) - 1))  # fmt: skip
    res = I.lift_inference(x, y, models, num_draws=60, seed=seed)
    ok = np.isfinite(res.lift)
    assert np.all(np.abs(res.lift[ok]) <= 1.0)
    assert np.all(res.lo[ok] <= res.lift[ok]) and np.all(res.lift[ok] <= res.hi[ok])
    assert np.all(np.abs(res.lo[ok]) <= 1.0) and np.all(np.abs(res.hi[ok]) <= 1.0)
    assert np.all((res.status != "below") == ok)  # lift v4: a lift inside the range and above it


def slow_draws(x, y, ref, num_draws, seed):
    """`lift_inference`'s uncorrected draws by a plain loop: the crossed covariance of every pair
    of means from its definition, its PSD root, one draw at a time through `slow_hull`."""
    v = np.concatenate([x, y])
    k, s, p = v.shape
    cov = np.zeros((k, k))
    for i in range(k):
        for j in range(k):
            a, b = v[i], v[j]
            ra, rb = a.mean(1) - a.mean(), b.mean(1) - b.mean()
            ca, cb = a.mean(0) - a.mean(), b.mean(0) - b.mean()
            ea = a - a.mean(1, keepdims=True) - a.mean(0, keepdims=True) + a.mean()
            eb = b - b.mean(1, keepdims=True) - b.mean(0, keepdims=True) + b.mean()
            ms = (p * (ra * rb).sum() / (s - 1) + s * (ca * cb).sum() / (p - 1)
                  - (ea * eb).sum() / ((s - 1) * (p - 1)))  # fmt: skip
            cov[i, j] = ms / (s * p)
    w, q = np.linalg.eigh(cov)
    np.testing.assert_allclose((q * np.clip(w, 0, None)) @ q.T, Cv.mean_covariance(v),
                               atol=1e-12)  # fmt: skip
    # The same root as the fast path (an eigenvector's sign is arbitrary, so the draws of two
    # decompositions differ): from here on the loop is the reference.
    root = Cv.covariance_root(v)
    rng = np.random.default_rng([seed, 37])
    z = rng.standard_normal((num_draws, root.shape[1]))
    n = x.shape[0]
    out = np.empty((num_draws, n))
    for b in range(num_draws):
        d = np.concatenate([x.mean((1, 2)), y.mean((1, 2))]) + root @ z[b]
        for m in range(n):
            out[b, m] = d[n + m] - slow_hull([d[i] for i in ref], [d[n + i] for i in ref], d[m])
    return out


def test_lift_inference_equals_a_plain_loop():
    """The fast path's draws and its bias and standard error, recomputed by `slow_draws` and the
    rescaling to the crossed-design variance of the linearized lift (`crossed_variance`)."""
    rng = np.random.default_rng(3)
    s, p = 3, 10
    # GRPO's base and three checkpoints; two models inside its range, two above it.
    means = [(0, 0), (0.02, -0.02), (0.04, -0.05), (0.06, -0.09), (0.03, -0.01), (0.05, -0.05),
             (0.075, -0.06), (0.2, -0.03)]  # fmt: skip
    n = len(means)
    x = np.stack([mx + 0.05 * rng.standard_normal((s, p)) for mx, _ in means])
    y = np.stack([my + 0.08 * rng.standard_normal((s, p)) for _, my in means])
    x[0], y[0] = 0.0, 0.0
    models = F.Models(["grpo"] * 4 + ["m"] * 4, ["base", "a", "a", "a", "b", "c", "d", "e"],
                      [0, 1, 2, 3, 1, 1, 1, 1])  # fmt: skip
    res = I.lift_inference(x, y, models, num_draws=50, seed=5)
    drawn = slow_draws(x, y, [0, 1, 2, 3], 50, 5)
    px, py = x.mean((1, 2)), y.mean((1, 2))
    assert list(res.status[4:]) == ["inside", "inside", "above", "above"]
    for m in range(4, n):
        if res.status[m] == "below":
            continue
        raw = py[m] - slow_hull(list(px[:4]), list(py[:4]), px[m])
        ok = np.isfinite(drawn[:, m])
        # The linearized lift: central differences of the slow reference in every mean.
        means, g, eps = np.concatenate([px, py]), np.zeros(2 * n), 1e-7
        for k in range(2 * n):
            d = np.zeros(2 * n)
            d[k] = eps
            up, dn = means + d, means - d
            g[k] = ((up[n + m] - slow_hull(list(up[:4]), list(up[n:n + 4]), up[m]))
                    - (dn[n + m] - slow_hull(list(dn[:4]), list(dn[n:n + 4]), dn[m]))) / (2 * eps)  # fmt: skip
        v = np.concatenate([x, y])
        var, df = Cv.crossed_variance(np.einsum("k,ksp->sp", g, v))
        w, q = np.linalg.eigh(Cv.mean_covariance(v))
        keep = w > 1e-12 * w.max()
        scale = np.sqrt(var / np.sum((g @ (q[:, keep] * np.sqrt(w[keep]))) ** 2))
        assert res.bias[m] == pytest.approx((drawn[ok, m].mean() - raw) * scale, rel=1e-7)
        assert res.se[m] == pytest.approx(drawn[ok, m].std(ddof=1) * scale, rel=1e-7)
        assert res.df[m] == pytest.approx(df)
        assert res.inside_fraction[m] == pytest.approx(ok.mean())
    # keep_draws returns those draws and changes nothing else.
    kept = I.lift_inference(x, y, models, num_draws=50, seed=5, keep_draws=True)
    assert res.mean_draws is None and res.lift_draws is None
    assert kept.mean_draws.shape == (50, 2 * n) and kept.lift_draws.shape == (50, n)
    np.testing.assert_allclose(kept.lift_draws[:, 4:], drawn[:, 4:], rtol=1e-9, atol=1e-12)
    for f in dataclasses.fields(I.LiftResult):
        if f.name not in ("models", "hull", "mean_draws", "lift_draws"):
            np.testing.assert_array_equal(getattr(kept, f.name), getattr(res, f.name), f.name)


def test_kept_draws_read_a_reference_setting_against_the_other_settings():
    """With two GRPO settings each setting's models are read against the other's hull, draw by
    draw too: `lift_draws` of a reference model is its drawn measure minus the drawn hull of the
    other setting's points (`estimand.hull_values`), and the others' over the whole reference."""
    rng = np.random.default_rng(8)
    means = [(0, 0), (0.02, -0.01), (0.05, -0.04), (0.03, -0.03), (0.06, -0.08), (0.04, 0.0)]
    x = np.stack([mx + 0.04 * rng.standard_normal((3, 12)) for mx, _ in means])
    y = np.stack([my + 0.06 * rng.standard_normal((3, 12)) for _, my in means])
    x[0], y[0] = 0.0, 0.0
    models = F.Models(["grpo"] * 5 + ["m"], ["base", "a", "a", "b", "b", "c"], [0, 1, 2, 1, 2, 2])
    res = I.lift_inference(x, y, models, num_draws=40, seed=2, keep_draws=True)
    n, d = len(means), res.mean_draws
    for m, ref in ((1, [0, 3, 4]), (2, [0, 3, 4]), (3, [0, 1, 2]), (4, [0, 1, 2]),
                   (5, [0, 1, 2, 3, 4])):  # fmt: skip
        want = d[:, n + m] - E.hull_values(d[:, ref], d[:, [n + i for i in ref]], d[:, [m]])[:, 0]
        np.testing.assert_array_equal(res.lift_draws[:, m], want)


def test_lift_table_reads_a_model_above_the_range_against_the_hull_s_end():
    rng = np.random.default_rng(0)
    x = np.array([0.0, 0.2, 0.5]).reshape(3, 1, 1) + 0.01 * rng.standard_normal((3, 2, 3))
    y = np.array([0.0, 0.1, 0.2]).reshape(3, 1, 1) + 0.01 * rng.standard_normal((3, 2, 3))
    x[0], y[0] = 0.0, 0.0
    models = F.Models(["grpo", "grpo", "m"], ["a", "a", "b"], [0, 5, 5])
    rows = [{"label": "grpo", "setting": "a", "step": t} for t in (0, 5)]
    rows.append({"label": "m", "setting": "b", "step": 5})
    section, res = report.lift_analysis(x, y, models, rows, "grpo", k=4, num_resamples=20)
    assert res.status[2] == "above" and section["procedure"] == I.PROCEDURE
    # Above GRPO's range (pass@1 0.5 > 0.2) the hull's end value: a lift near 0.2 - 0.1.
    assert abs(res.lift[2] - (y[2].mean() - y[1].mean())) < 0.05
    table = report.lift_markdown({"pass_at_k": section}, "intro")
    assert "(above GRPO's pass@1 range" in table and "n/a" not in table
    assert table.count("\n| m |") == 1 and "| grpo |" not in table


def test_a_reference_setting_is_read_against_the_others():
    """GRPO's own models are read against the hull of GRPO's other settings: a dominant setting
    shows a positive lift there, a dominated one a negative lift."""
    rng = np.random.default_rng(2)
    means = [(0, 0), (0.02, -0.01), (0.04, -0.02), (0.02, -0.05), (0.04, -0.08)]
    x = np.stack([mx + 0.01 * rng.standard_normal((4, 200)) for mx, _ in means])
    y = np.stack([my + 0.01 * rng.standard_normal((4, 200)) for _, my in means])
    x[0], y[0] = 0.0, 0.0
    models = F.Models(["grpo"] * 5, ["base", "good", "good", "bad", "bad"], [0, 1, 2, 1, 2])
    res = I.lift_inference(x, y, models, num_draws=200)
    assert res.lift[1] > 0.02 and res.lift[2] > 0.03 and res.lo[2] > 0
    assert res.lift[3] < -0.02 and res.hi[3] < 0


def test_a_model_that_never_left_the_base_is_not_tested():
    """All-zero gains (up to rounding) give no p-value rather than a t ratio of two roundings."""
    rng = np.random.default_rng(0)
    x = rng.normal(0.05, 0.1, (5, 2, 12))
    y = rng.normal(-0.02, 0.1, (5, 2, 12))
    x[0], y[0] = 0.0, 0.0
    x[4], y[4] = 1e-19 * rng.normal(size=(2, 12)), 1e-19 * rng.normal(size=(2, 12))
    models = F.Models(["grpo"] * 4 + ["m"], ["base", *"abc", "e"], [0, 2, 3, 4, 4])
    res = I.lift_inference(x, y, models, num_draws=50)
    if res.status[4] == "inside":
        assert np.isnan(res.p[4]) and res.se[4] <= I.SE_FLOOR


# ------------------------------------------------------------------------------ the crossed design


def test_crossed_variance_is_unbiased_for_the_grand_mean():
    """Under the two-way random-effects model with real seed, problem and noise components, the
    estimate averages to the grand mean's variance over repeated designs (3 Monte Carlo SE), and
    with one seed it is the plain variance of the mean."""
    rng = np.random.default_rng(0)
    s, p, n = 8, 30, 4000
    c = (rng.normal(0, 1.0, (n, s, 1)) + rng.normal(0, 2.0, (n, 1, p))
         + rng.normal(0, 3.0, (n, s, p)))  # fmt: skip
    var, df = Cv.crossed_variance(c)
    truth = 1.0 / s + 4.0 / p + 9.0 / (s * p)
    assert abs(var.mean() - truth) <= 3 * var.std() / np.sqrt(n)
    assert np.all(df > 1)
    one = rng.normal(size=(5, 1, 7))
    v1, d1 = Cv.crossed_variance(one)
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
    comp = Cv.variance_components(c)
    assert comp.shape == (n, 3) and np.all(comp >= 0)
    truth = np.array([2.25, 4.0, 9.0])
    assert np.all(np.abs(comp.mean(0) - truth) <= 3 * comp.std(0) / np.sqrt(n) + 0.02 * truth)
    var = 2.25 / s + 4.0 / p + 9.0 / (s * p)
    mde = Cv.design_mde(truth, s, p)
    assert mde > Cv.minimum_detectable(np.sqrt(var), 1e6)  # t quantiles above the normal ones
    assert mde < Cv.minimum_detectable(np.sqrt(var), s - 1)  # df above the seeds' alone
    one = Cv.variance_components(rng.normal(size=(2, 1, 5)))
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
    assert Cv.design_mde(comp, s, p) == pytest.approx(_design_mde_loop(comp, s, p), rel=1e-9)


def test_design_mde_names_bad_input():
    with pytest.raises(ValueError, match="components"):
        Cv.design_mde([1.0, 2.0], 3, 4)
    with pytest.raises(ValueError, match="seeds, problems"):
        Cv.design_mde([1.0, 2.0, 3.0], 1, 4)


def test_holm_equals_the_step_down_rule():
    rng = np.random.default_rng(1)
    for _ in range(50):
        p = rng.uniform(0, 0.2, rng.integers(1, 8))
        adj = I.holm(p)
        order = np.argsort(p)
        n = p.size
        for alpha in (0.01, 0.05, 0.1):
            reject = np.zeros(n, bool)
            for rank, i in enumerate(order):  # step down: stop at the first acceptance
                if p[i] > alpha / (n - rank):
                    break
                reject[i] = True
            np.testing.assert_array_equal(adj <= alpha, reject)
    assert np.isnan(I.holm([0.01, np.nan])[1]) and I.holm([0.01, np.nan])[0] == 0.01


def test_dominance_holds_its_level_and_finds_a_dominated_model():
    """`dominance` under its null: a method path equal to a reference path (its models are draws
    from the reference models' distributions, so none is dominated by its own twin's checkpoint),
    simulated in `experiment.calibration`'s strong design; the rate of p ≤ 0.05 stays under 5%
    (Monte Carlo error accounted for). A path that moves less and sharpens more than GRPO's lies
    below GRPO's early checkpoints on both axes, and is found there."""
    from experiment import calibration as C

    d = C.DESIGNS["narrow"]
    at = tuple(range(len(d.checkpoints)))
    paths = [("grpo", f"r{i}", a, b, at, 1.0) for i, (a, b) in enumerate(d.ref_settings)]
    paths += [("twin", "t", *d.ref_settings[1], at, 1.0), ("worse", "w", -0.4, 0.6, at, 1.0)]
    rng = np.random.default_rng(7)
    hits, found = [], []
    for _ in range(40):
        x, y, models = C.simulate(d, paths, rng, seeds=8, problems=512)
        dom = I.dominance(x, y, models, "grpo")
        ref = np.asarray(models.method) == "grpo"
        assert (dom.index[ref] == -1).all() and np.isnan(dom.p[ref]).all()
        methods = np.asarray(models.method)
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


def test_the_stalled_reference_of_the_strong_study_gives_sane_lifts():
    """The strong LLM study's exploration (pin 2): GRPO settings whose pass@1 barely moved, method
    models near the base. The old procedure read +66 to +124 points there (issue 37); the hull's
    lifts stay within the spread of the data: |lift| < 20 points, intervals under ±25."""
    for seed in range(3):
        x, y, models = _stalled_reference_study(seed)
        res = I.lift_inference(x, y, models, num_draws=400, seed=seed)
        ok = np.isfinite(res.lift)
        assert np.all(np.abs(res.lift[ok]) < 0.2), res.lift
        assert np.all(res.hi[ok] - res.lo[ok] < 0.5)
