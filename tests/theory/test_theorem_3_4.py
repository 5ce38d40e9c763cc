"""Theorem 3.4 / B.10 (seed 000): the DS reparametrization, the certificate, and a pinned counterexample."""

import numpy as np
import pytest
from scipy.special import expit, logit

from theory.checks import CHECKERS
from theory.measures import correctness, normalized_variance
from theory.optimum import differential_smoothing, entropy_regularized
from theory.theorem_3_4 import (
    DIVERGENCES,
    construction_margin,
    divergence_lower_bound,
    ds_family_params,
    family_min_correctness,
    reachable_correctness_bound,
    search_witness,
    theorem_divergence,
)
from theory.trees import random_instance

# The smallest counterexample found: a one-step tree with three actions (V = 3, H = 1).
PIN_LOG_PB = np.log([0.4, 0.4, 0.2])
PIN_CORRECT = np.array([True, False, True])
PIN_BETA, PIN_ETA = 0.1, 4.0


def _instances(n, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        v, h = int(rng.integers(2, 5)), int(rng.integers(1, 4))
        m = v**h
        inst = random_instance(
            rng, v, h, skew=rng.uniform(0, 3), correct_size=int(rng.integers(1, m))
        )
        yield rng, inst


def test_family_parametrization_matches_lemma_b5():
    for rng, inst in _instances(40):
        kc, kn = rng.uniform(0.05, 1.0), 1.0 / rng.uniform(0.05, 1.0)
        p_star = reachable_correctness_bound(inst.log_pb, inst.correct, kc, kn)
        p = float(expit(logit(p_star) + rng.uniform(0.05, 2.0)))
        params = ds_family_params(inst.log_pb, inst.correct, kc, kn, p)
        log_ds = differential_smoothing(inst.log_pb, inst.correct, *params)
        assert correctness(log_ds, inst.correct) == pytest.approx(p, abs=1e-9)
        c = inst.correct
        # π ∝ π_b^{κ_C} on C and π_b^{κ_N} off C: log-ratios are exponents times base log-ratios.
        np.testing.assert_allclose(np.diff(log_ds[c]), kc * np.diff(inst.log_pb[c]), atol=1e-8)
        np.testing.assert_allclose(np.diff(log_ds[~c]), kn * np.diff(inst.log_pb[~c]), atol=1e-8)
        with pytest.raises(ValueError, match="not reachable"):
            ds_family_params(inst.log_pb, inst.correct, kc, kn, float(expit(logit(p_star) - 0.1)))


def test_large_beta_limit_is_p_star_not_base_correctness():
    _, inst = next(_instances(1, seed=3))
    kc, kn = 0.3, 2.0
    big = 1e6
    log_ds = differential_smoothing(
        inst.log_pb, inst.correct, big, big * (1 / kc - 1), big * (1 - 1 / kn)
    )
    p_star = reachable_correctness_bound(inst.log_pb, inst.correct, kc, kn)
    assert correctness(log_ds, inst.correct) == pytest.approx(p_star, abs=1e-5)
    assert abs(p_star - correctness(inst.log_pb, inst.correct)) > 1e-2


def test_variance_increases_with_kappa_c():
    for _, inst in _instances(20, seed=1):
        if np.ptp(inst.log_pb[inst.correct]) < 1e-9:
            continue
        ks = np.linspace(0.02, 1.0, 50)
        v = [
            normalized_variance(
                np.where(inst.correct, k * inst.log_pb, -np.inf)
                - np.logaddexp.reduce(k * inst.log_pb[inst.correct]),
                inst.correct,
            )
            for k in ks
        ]
        assert np.all(np.diff(v) > 0)


def test_family_min_correctness_bounds_every_sampled_optimum():
    for rng, inst in _instances(15, seed=2):
        kappa = rng.uniform(0.05, 1.0)
        p_min = family_min_correctness(inst.log_pb, inst.correct, kappa)
        for _ in range(40):
            beta = np.exp(rng.uniform(-4, 4))
            gp = beta * (1 / (kappa * rng.uniform(0.01, 1.0)) - 1)
            gn = beta * rng.uniform(0, 1) * (rng.random() < 0.7)
            log_ds = differential_smoothing(inst.log_pb, inst.correct, beta, gp, gn)
            assert correctness(log_ds, inst.correct) >= p_min - 1e-9


def test_lower_bound_never_exceeds_searched_minimum():
    for rng, inst in _instances(10, seed=4):
        beta, eta = float(np.exp(rng.uniform(-3, 1.6))), float(rng.uniform(0, 5))
        for kind in DIVERGENCES:
            res = search_witness(inst.log_pb, inst.correct, beta, eta, kind, grid=13, zooms=3)
            bound = divergence_lower_bound(inst.log_pb, inst.correct, beta, eta, kind)
            assert bound <= res.min_divergence * (1 + 1e-9) + 1e-12


def test_no_entropy_bonus_is_its_own_witness():
    _, inst = next(_instances(1, seed=5))
    res = search_witness(inst.log_pb, inst.correct, 0.7, 0.0, "kl")
    assert res.found and res.d_ds <= res.epsilon * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize("kind", DIVERGENCES)
def test_pinned_counterexample_has_no_witness(kind):
    assert construction_margin(PIN_LOG_PB, PIN_CORRECT, PIN_BETA, PIN_ETA) < 0
    for positive_only in (False, True):
        res = search_witness(
            PIN_LOG_PB, PIN_CORRECT, PIN_BETA, PIN_ETA, kind, positive_only=positive_only
        )
        assert not res.found
    # Certificate: every DS optimum with V <= V(pi_ent) and P >= P(pi_ent) is farther than eps.
    bound = divergence_lower_bound(PIN_LOG_PB, PIN_CORRECT, PIN_BETA, PIN_ETA, kind)
    assert bound > 1.05 * res.epsilon
    # Independent of the reparametrization: sample DS parameters and call Lemma B.5 directly.
    log_ent = entropy_regularized(PIN_LOG_PB, PIN_CORRECT.astype(float), PIN_BETA, PIN_ETA)
    p_ent = correctness(log_ent, PIN_CORRECT)
    v_ent = normalized_variance(log_ent, PIN_CORRECT)
    rng = np.random.default_rng(0)
    for _ in range(600):
        beta = float(np.exp(rng.uniform(-7, 7)))
        gp = beta * float(np.exp(rng.uniform(-7, 9)))
        gn = beta * float(rng.uniform(0, 1)) * (rng.random() < 0.5)
        log_ds = differential_smoothing(PIN_LOG_PB, PIN_CORRECT, beta, gp, gn)
        with np.errstate(over="ignore"):
            d_ds = theorem_divergence(log_ds, PIN_LOG_PB, kind)
        ok_pv = (
            correctness(log_ds, PIN_CORRECT) >= p_ent
            and normalized_variance(log_ds, PIN_CORRECT) <= v_ent
        )
        assert not (ok_pv and d_ds <= res.epsilon)
        if ok_pv:
            assert d_ds >= bound * (1 - 1e-9)


def test_checkers_run_without_violations():
    rng = np.random.default_rng(7)
    for name in ("thm_3_4_kl", "thm_3_4_chi2_reverse"):
        res = CHECKERS[name].run(rng, 6)
        assert res.violations == 0
        assert set(res.details) >= {"witness_general", "witness_positive_only"}
