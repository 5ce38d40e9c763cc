"""Degenerate inputs of `theory.optimum` and `theory.measures` (issue 13 item 8): a normalized
finite answer (the correct limit) or a named error, never NaN, an overflow or a solver failure."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp

from theory import measures, optimum

LPB = np.log([0.5, 0.3, 0.2])
C = np.array([True, False, True])

# Any finite float64 reward; any positive finite β, subnormals included.
huge = st.floats(-1e308, 1e308, allow_nan=False, allow_infinity=False)
any_beta = st.floats(5e-324, 1e308, allow_nan=False, allow_infinity=False)
logits = st.lists(st.floats(-30, 30), min_size=2, max_size=6)


def _log_softmax(x) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    return x - logsumexp(x)


def _sound(log_pi: np.ndarray, scale: float = 0.0) -> None:
    """Finite where it should be, and normalized to float64's rounding at the exponents' `scale`
    (the largest |exponent| before normalizing: its last bit moves the whole normalizer), and
    never worse than 1e-6 (the huge-exponent paths shift the exponents first)."""
    assert not np.isnan(log_pi).any() and not np.isposinf(log_pi).any()
    tol = min(max(1e-9, 16 * np.finfo(float).eps * scale), 1e-6)
    assert abs(logsumexp(log_pi)) < tol


# --- kl_regularized ---------------------------------------------------------------------------


def test_kl_regularized_huge_reward_and_subnormal_beta_give_the_limit() -> None:
    # Both were NaN: r/β overflowed to inf and inf − inf = NaN.
    np.testing.assert_array_equal(
        optimum.kl_regularized(LPB, [1e308, 0, 0], 0.5), [0.0, -np.inf, -np.inf]
    )
    np.testing.assert_array_equal(
        optimum.kl_regularized(LPB, [1.0, 0, 0], 1e-320), [0.0, -np.inf, -np.inf]
    )
    # β → 0 with a tie: the best trajectories share the mass in proportion to π_b.
    out = optimum.kl_regularized(LPB, [1.0, 0.0, 1.0], 1e-320)
    np.testing.assert_allclose(np.exp(out), [5 / 7, 0.0, 2 / 7], rtol=1e-14)
    # A huge reward on a trajectory π_b never takes must not push the others to NaN.
    lpb = np.array([-np.inf, np.log(0.6), np.log(0.4)])
    out = optimum.kl_regularized(lpb, [1e308, 1.0, -1e308], 0.5)
    np.testing.assert_array_equal(out, [-np.inf, 0.0, -np.inf])


def test_kl_regularized_keeps_pi_b_among_ties_when_r_over_beta_is_large() -> None:
    # r/β = 1e20 swallowed log π_b in the direct form, giving uniform weights on the tie.
    out = optimum.kl_regularized(LPB, [1e20, 1e20, 0.0], 1.0)
    np.testing.assert_allclose(np.exp(out), [0.625, 0.375, 0.0], rtol=1e-12)


@settings(max_examples=150, deadline=None)
@given(logits, st.data(), any_beta)
def test_kl_regularized_is_normalized_for_any_finite_input(x, data, beta) -> None:
    lpb = _log_softmax(x)
    r = np.array(data.draw(st.lists(huge, min_size=lpb.size, max_size=lpb.size)))
    out = optimum.kl_regularized(lpb, r, beta)
    _sound(out)
    assert out[np.argmax(r)] > -np.inf  # the best trajectory keeps mass


@settings(max_examples=60, deadline=None)
@given(logits, st.data(), st.floats(0.05, 20))
def test_kl_regularized_shifted_form_equals_the_direct_one(x, data, beta) -> None:
    lpb = _log_softmax(x)
    r = np.array(data.draw(st.lists(st.floats(-3, 3), min_size=lpb.size, max_size=lpb.size)))
    direct = optimum.kl_regularized(lpb, r, beta)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(optimum, "DIRECT_EXPONENT_LIMIT", -1.0)  # always take the shifted form
        shifted = optimum.kl_regularized(lpb, r, beta)
    np.testing.assert_allclose(shifted, direct, atol=1e-12)


# --- entropy_regularized ----------------------------------------------------------------------


def test_entropy_regularized_limits() -> None:
    # π ∝ π_b^{1−η/β}·e^{r/β}: with η/β = 1e310 the least likely trajectory wins.
    np.testing.assert_array_equal(
        optimum.entropy_regularized(LPB, [1, 0, 0], 1e-300, 1e10, "base"), [-np.inf, -np.inf, 0.0]
    )
    np.testing.assert_array_equal(
        optimum.entropy_regularized(LPB, [1, 0, 0], 1e-300, -1e10, "base"), [0.0, -np.inf, -np.inf]
    )
    np.testing.assert_array_equal(
        optimum.entropy_regularized(LPB, [1e308, 0, 0], 0.5, 0.1, "base"), [0.0, -np.inf, -np.inf]
    )


@settings(max_examples=150, deadline=None)
@given(
    logits,
    st.data(),
    any_beta,
    st.floats(-1e308, 1e308),
    st.sampled_from(["policy", "base"]),
)
def test_entropy_regularized_is_normalized_or_names_the_parameters(
    x, data, beta, eta, anchor
) -> None:
    lpb = _log_softmax(x)
    r = np.array(data.draw(st.lists(huge, min_size=lpb.size, max_size=lpb.size)))
    if anchor == "policy" and beta + eta <= 0:
        with pytest.raises(ValueError, match="beta \\+ eta"):
            optimum.entropy_regularized(lpb, r, beta, eta, anchor)
        return
    try:
        out = optimum.entropy_regularized(lpb, r, beta, eta, anchor)
    except ValueError as err:  # only where β and η are both near the float64 maximum
        assert "beta=" in str(err) and "eta=" in str(err) and "overflow" in str(err)
        assert max(beta, abs(eta)) > 1e300
        return
    with np.errstate(over="ignore"):  # the exponents' size (Lemma B.4's two anchors)
        if anchor == "policy":
            scale = (beta * np.abs(lpb).max() + np.abs(r).max()) / (beta + eta)
        else:
            scale = abs(1.0 - eta / beta) * np.abs(lpb).max() + np.abs(r).max() / beta
    _sound(out, float(scale))


@settings(max_examples=60, deadline=None)
@given(
    logits,
    st.data(),
    st.floats(0.05, 20),
    st.floats(-0.9, 3),
    st.sampled_from(["policy", "base"]),
)
def test_entropy_regularized_fallback_equals_the_direct_form(x, data, beta, eta, anchor) -> None:
    lpb = _log_softmax(x)
    r = np.array(data.draw(st.lists(st.floats(-3, 3), min_size=lpb.size, max_size=lpb.size)))
    eta = eta * beta
    direct = optimum.entropy_regularized(lpb, r, beta, eta, anchor)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(optimum, "DIRECT_EXPONENT_LIMIT", -1.0)
        fallback = optimum.entropy_regularized(lpb, r, beta, eta, anchor)
    np.testing.assert_allclose(fallback, direct, atol=1e-10)


# --- differential smoothing ---------------------------------------------------------------------


def _ds_limit(lpb: np.ndarray, c: np.ndarray, beta: float, gamma_n: float) -> np.ndarray:
    """`γ_p → ∞` (policy anchor): uniform on C with mass `min(1, |C|/e)`, the rest off C in
    proportion to `π_b^{β/(β−γ_n)}` (the entropy term dominates on C)."""
    mass = min(1.0, c.sum() / np.e)
    off = beta / (beta - gamma_n) * lpb[~c]
    out = np.empty(lpb.shape)
    out[c] = np.log(mass / c.sum())
    out[~c] = np.log1p(-mass) + off - logsumexp(off)
    return out


def test_differential_smoothing_huge_gamma_p_is_the_limit() -> None:
    # Was "Failed to converge after 200 iterations" from brentq.
    out = optimum.differential_smoothing(LPB, C, 1.0, 1e300)
    np.testing.assert_allclose(out, _ds_limit(LPB, C, 1.0, 0.0), atol=1e-12)
    lpb = _log_softmax([0.3, -1.0, 2.0, 0.1, -0.5])
    c = np.array([True, False, False, True, False])
    np.testing.assert_allclose(
        optimum.differential_smoothing(lpb, c, 0.7, 1e300, 0.3), _ds_limit(lpb, c, 0.7, 0.3),
        atol=1e-12,
    )  # fmt: skip
    # Approached continuously: γ_p = 1e10 is within 1e-8 of the limit.
    np.testing.assert_allclose(
        optimum.differential_smoothing(lpb, c, 0.7, 1e10, 0.3), _ds_limit(lpb, c, 0.7, 0.3),
        atol=1e-8,
    )  # fmt: skip
    assert np.isfinite(optimum.ds_multiplier(LPB, C, 1.0, 1e300))


def test_differential_smoothing_subnormal_beta_is_the_kl_limit() -> None:
    # Was "The function value at x=inf is NaN" (policy) and NaN (base).
    want = np.array([np.log(5 / 7), -np.inf, np.log(2 / 7)])
    for anchor in ("policy", "base"):
        out = optimum.differential_smoothing(LPB, C, 1e-320, 0.0, anchor=anchor)
        np.testing.assert_allclose(out, want, atol=1e-14)


@settings(max_examples=150, deadline=None)
@given(
    logits,
    st.data(),
    any_beta,
    st.floats(-1e308, 1e308),
    st.floats(-1e308, 1e308),
    st.sampled_from(["policy", "base"]),
)
def test_differential_smoothing_is_normalized_or_names_the_parameters(
    x, data, beta, gamma_p, gamma_n, anchor
) -> None:
    lpb = _log_softmax(x)
    c = np.array(data.draw(st.lists(st.booleans(), min_size=lpb.size, max_size=lpb.size)))
    try:
        out = optimum.differential_smoothing(lpb, c, beta, gamma_p, gamma_n, anchor)
    except ValueError as err:
        msg = str(err)
        if anchor == "policy" and (beta + gamma_p <= 0 or gamma_n >= beta):
            assert "gamma_" in msg and "beta" in msg
            return
        assert "beta=" in msg and "gamma_p=" in msg and "overflow" in msg
        assert max(beta, abs(gamma_p), abs(gamma_n)) > 1e300
        return
    _sound(out)


@settings(max_examples=60, deadline=None)
@given(logits, st.data(), st.floats(0.05, 20), st.floats(-0.9, 3), st.floats(-1, 0.9))
def test_differential_smoothing_slow_paths_equal_the_fast_ones(x, data, beta, gp, gn) -> None:
    lpb = _log_softmax(x)
    c = np.array(data.draw(st.lists(st.booleans(), min_size=lpb.size, max_size=lpb.size)))
    gp, gn = gp * beta, gn * beta
    fast = optimum._ds_policy_by_lambda(lpb, c, beta, gp, gn)
    slow = optimum._ds_policy_by_mass(lpb, c, beta, gp, gn)
    assert fast is not None
    np.testing.assert_allclose(slow[0], fast[0], atol=1e-10)
    np.testing.assert_allclose(slow[1], fast[1], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(
        optimum._ds_base_by_mass(lpb, c, beta, gp, gn),
        optimum.differential_smoothing(lpb, c, beta, gp, gn, anchor="base"),
        atol=1e-10,
    )


# --- objective and measures -----------------------------------------------------------------------


def test_objective_is_minus_inf_where_pi_leaves_the_support_of_pi_b() -> None:
    half = np.log([0.5, 0.5])
    assert optimum.objective(half, [0.0, -np.inf], [0.0, 0.0], 1.0) == -np.inf  # was NaN
    # d = β cancels the log π_b terms: J = Σ π·(r − β·log π) = 0.5 + log 2 here.
    assert optimum.objective(half, [0.0, -np.inf], [1.0, 0.0], 1.0, 0.0, 1.0) == pytest.approx(
        0.5 + np.log(2.0)
    )
    assert optimum.objective(half, [0.0, -np.inf], [0.0, 0.0], 1.0, 0.0, 2.0) == np.inf


def test_expected_distinct_at_k_inf_counts_the_support() -> None:
    lp = np.array([0.0, -1e300, -np.inf])  # the middle trajectory has probability > 0
    assert measures.expected_distinct(lp, np.inf) == 2.0  # was OverflowError
    assert measures.expected_distinct(LPB, np.inf, mask=C) == 2.0
    # Huge finite k approaches the limit from below.
    assert measures.expected_distinct(LPB, 10**6) == pytest.approx(3.0)


@pytest.mark.parametrize("k", [np.nan, -np.inf, "3", None, 2.5, 0])
def test_expected_distinct_names_a_bad_k(k) -> None:
    with pytest.raises(ValueError, match=r"k must be an integer >= 1 or inf"):
        measures.expected_distinct(LPB, k)


def test_divergence_names_shapes_that_do_not_broadcast() -> None:
    with pytest.raises(ValueError, match=r"log_p and log_q .*\(3,\) and \(2,\)"):
        measures.divergence(LPB, np.log([0.5, 0.5]))


@pytest.mark.parametrize("beta", ["x", None, [1.0, 2.0], True])
def test_non_numeric_beta_is_named(beta) -> None:
    from theory import optimum

    with pytest.raises(ValueError, match="beta must be a real number"):
        optimum.kl_regularized(np.log([0.5, 0.5]), [1.0, 0.0], beta)
