"""Hypothesis tests of CaSP's candidate-level analysis (seed 004: Lemma 2, Proposition 3)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.special import log_softmax, softmax

from theory.checks import CHECKERS
from theory.checks.casp import (
    distinct_count_enumerated,
    distinct_count_monte_carlo,
    softmax_jacobian,
)
from theory.measures import expected_distinct

LOGIT = st.floats(-6.0, 6.0, allow_nan=False, allow_infinity=False)


def logit_vectors(min_size=2, max_size=12):
    return hnp.arrays(np.float64, st.integers(min_size, max_size), elements=LOGIT)


@given(z=logit_vectors(), data=st.data())
def test_lemma_2_softmax_jacobian(z, data):
    y = data.draw(st.integers(0, z.size - 1))
    p = softmax(z)
    jac = softmax_jacobian(z)
    h = 1e-5
    fd = (softmax(z + np.eye(z.size) * h, axis=-1) - softmax(z - np.eye(z.size) * h, axis=-1)).T
    assert np.max(np.abs(fd / (2 * h) - jac)) <= 1e-7
    others = np.arange(z.size) != y
    assert abs(jac[y, y] - p[y] * (1 - p[y])) <= 1e-15
    np.testing.assert_allclose(jac[y, others], -p[y] * p[others], rtol=1e-12, atol=1e-300)
    # Raising the sampled logit lowers every other probability in proportion to it.
    np.testing.assert_allclose(jac[others, y], -p[others] * p[y], rtol=1e-12, atol=1e-300)


@given(
    z=logit_vectors(3),
    data=st.data(),
    adv=st.floats(-3.0, -0.01),
    eta=st.floats(1e-3, 1.0),
)
def test_lemma_2_negative_update_raises_alternatives_in_proportion(z, data, adv, eta):
    y = data.draw(st.integers(0, z.size - 1))
    p = softmax(z)
    dz = eta * adv * softmax_jacobian(z)[y] / p[y]  # ascent on A·p_y/p_old at p_old = p_y
    others = np.arange(z.size) != y
    np.testing.assert_allclose(dz[others] / p[others], eta * abs(adv), rtol=1e-10)
    alt = np.where(others, p, -np.inf)
    if np.sum(alt == alt.max()) == 1:
        assert np.argmax(np.where(others, dz, -np.inf)) == np.argmax(alt)
    # Exact step: relative gains are ordered like the probabilities (higher rank gains more).
    gain = np.exp(log_softmax(z + dz))[others] / p[others]
    order = np.argsort(p[others], kind="stable")
    strictly = np.diff(p[others][order]) > 1e-12 * p[others][order][1:]
    assert np.all(np.diff(gain[order])[strictly] >= -1e-10)


@given(z=logit_vectors(2, 4), k=st.integers(1, 4))
def test_prop_3_closed_form_matches_enumeration(z, k):
    log_p = log_softmax(z)
    value = expected_distinct(log_p, k)
    assert abs(value - distinct_count_enumerated(np.exp(log_p), k)) <= 1e-12
    p_max = np.exp(log_p).max()
    assert 1 - 1e-12 <= value <= min(1 + k * (1 - p_max), k, z.size) + 1e-12


@given(z=logit_vectors(2, 30), k=st.integers(1, 64), data=st.data())
def test_prop_3_robin_hood_transfer_never_lowers_distinct_count(z, k, data):
    p = softmax(z)
    i, j = data.draw(st.lists(st.integers(0, z.size - 1), min_size=2, max_size=2, unique=True))
    if p[i] < p[j]:
        i, j = j, i
    q = p.copy()
    delta = data.draw(st.floats(0.0, 0.5)) * (p[i] - p[j])
    q[i] -= delta
    q[j] += delta
    before = expected_distinct(np.log(p), k)
    after = expected_distinct(np.log(q / q.sum()), k)
    assert after >= before - 1e-12 * k


def test_monte_carlo_reference_agrees():
    rng = np.random.default_rng(0)
    p = softmax(rng.normal(size=6))
    mean, se = distinct_count_monte_carlo(rng, p, 5, 20_000)
    assert abs(mean - expected_distinct(np.log(p), 5)) <= 6 * se


def test_checkers_hold_on_three_trials():
    rng = np.random.default_rng(0)
    for name in ("casp_lemma_2", "casp_prop_3"):
        res = CHECKERS[name].run(rng, 3)
        assert res.trials == 3 and res.violations == 0, (name, res)
