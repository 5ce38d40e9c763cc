"""Closed-form optima (`theory.optimum`, seed 000 App. B) against direct formulas and each other."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import logsumexp

from theory import optimum
from theory.checks.bias_and_optima import ds_coefficients, numerical_optimum
from theory.trees import random_instance


def _normalized(x: np.ndarray) -> np.ndarray:
    return x - logsumexp(x, axis=-1, keepdims=True)


@pytest.fixture
def inst():
    return random_instance(np.random.default_rng(7), 3, 2, skew=1.5, correct_size=3)


def test_kl_regularized_matches_the_formula(inst) -> None:
    beta = 0.4
    r = inst.correct.astype(float)
    pb = np.exp(inst.log_pb)
    direct = pb * np.exp(r / beta) / np.sum(pb * np.exp(r / beta))
    np.testing.assert_allclose(
        np.exp(optimum.kl_regularized(inst.log_pb, r, beta)), direct, rtol=1e-12
    )


def test_kl_regularized_batch_and_zero_base_probability() -> None:
    lpb = np.log(
        [0.5, 0.0, 0.25, 0.25], where=np.array([1, 0, 1, 1], bool), out=np.full(4, -np.inf)
    )
    rewards = np.array([[1.0, 1.0, 0.0, 0.0], [0.0, 5.0, 0.0, 1.0]])  # (2, M)
    out = optimum.kl_regularized(lpb, rewards, 1.0)
    assert out.shape == (2, 4)
    assert np.all(np.isneginf(out[:, 1]))  # π_b = 0 stays 0 whatever the reward
    np.testing.assert_allclose(out[1], optimum.kl_regularized(lpb, rewards[1], 1.0))


def test_entropy_regularized_matches_the_formulas(inst) -> None:
    beta, r = 0.7, np.random.default_rng(0).normal(size=inst.num_trajectories)
    pb = np.exp(inst.log_pb)
    for eta in (0.3, -0.5):
        pol = pb ** (beta / (beta + eta)) * np.exp(r / (beta + eta))
        base = pb ** (1 - eta / beta) * np.exp(r / beta)
        got_pol = np.exp(optimum.entropy_regularized(inst.log_pb, r, beta, eta, "policy"))
        got_base = np.exp(optimum.entropy_regularized(inst.log_pb, r, beta, eta, "base"))
        np.testing.assert_allclose(got_pol, pol / pol.sum(), rtol=1e-12)
        np.testing.assert_allclose(got_base, base / base.sum(), rtol=1e-12)
    # η = 0 is Lemma B.1; base-anchored η = β forgets π_b entirely.
    for anchor in ("policy", "base"):
        np.testing.assert_allclose(
            optimum.entropy_regularized(inst.log_pb, r, beta, 0.0, anchor),
            optimum.kl_regularized(inst.log_pb, r, beta),
            atol=1e-12,
        )
    np.testing.assert_allclose(
        optimum.entropy_regularized(inst.log_pb, r, beta, beta, "base"),
        _normalized(r / beta),
        atol=1e-12,
    )


def test_differential_smoothing_base_matches_the_formula(inst) -> None:
    beta, gp, gn = 0.5, 0.2, 0.3
    c = inst.correct
    pb = np.exp(inst.log_pb)
    un = np.where(c, np.exp(1 / beta) * pb ** (1 - gp / beta), pb ** (1 + gn / beta))
    got = np.exp(optimum.differential_smoothing(inst.log_pb, c, beta, gp, gn, "base"))
    np.testing.assert_allclose(got, un / un.sum(), rtol=1e-12)


def test_differential_smoothing_policy_satisfies_lemma_b5(inst) -> None:
    beta, gp, gn = 0.5, 0.2, 0.3
    lpb, c = inst.log_pb, inst.correct
    lam = optimum.ds_multiplier(lpb, c, beta, gp, gn)
    on_c = (1 + beta * lpb - gp - beta - lam) / (beta + gp)
    off_c = (beta * lpb + gn - beta - lam) / (beta - gn)
    formula = np.where(c, on_c, off_c)
    assert abs(logsumexp(formula)) < 1e-12  # λ normalizes the unnormalized formula by itself
    np.testing.assert_allclose(
        optimum.differential_smoothing(lpb, c, beta, gp, gn, "policy"), formula, atol=1e-12
    )


def test_differential_smoothing_special_cases(inst) -> None:
    lpb, c, beta = inst.log_pb, inst.correct, 0.3
    kl = optimum.kl_regularized(lpb, c.astype(float), beta)
    for anchor in ("policy", "base"):
        np.testing.assert_allclose(
            optimum.differential_smoothing(lpb, c, beta, 0.0, 0.0, anchor), kl, atol=1e-12
        )
        # γ_p = η, γ_n = −η is the global entropy bonus with r = 1[C].
        np.testing.assert_allclose(
            optimum.differential_smoothing(lpb, c, beta, 0.2, -0.2, anchor),
            optimum.entropy_regularized(lpb, c.astype(float), beta, 0.2, anchor),
            atol=1e-12,
        )


@pytest.mark.parametrize("mask", [[0] * 9, [1] * 9])
def test_ds_multiplier_with_one_kind_only(inst, mask) -> None:
    c = np.array(mask, dtype=bool)
    lp = optimum.differential_smoothing(inst.log_pb, c, 0.5, 0.3, 0.2, "policy")
    exponent = 0.5 / (0.5 + 0.3) if c.all() else 0.5 / (0.5 - 0.2)
    np.testing.assert_allclose(lp, _normalized(exponent * inst.log_pb), atol=1e-12)


def test_ds_multiplier_batch_equals_loop() -> None:
    rng = np.random.default_rng(3)
    lpb = _normalized(2 * rng.standard_normal((4, 9)))
    c = rng.random((4, 9)) < 0.4
    c[:, 0], c[:, 1] = True, False
    lam = optimum.ds_multiplier(lpb, c, 0.8, 0.5, 0.4)
    assert lam.shape == (4,)
    for i in range(4):
        assert lam[i] == pytest.approx(
            optimum.ds_multiplier(lpb[i], c[i], 0.8, 0.5, 0.4), abs=1e-13
        )
    out = optimum.differential_smoothing(lpb, c, 0.8, 0.5, 0.4)
    np.testing.assert_allclose(out[2], optimum.differential_smoothing(lpb[2], c[2], 0.8, 0.5, 0.4))


def test_ds_anchor_map_reproduces_the_optimum(inst) -> None:
    lpb, c = inst.log_pb, inst.correct
    beta, gp, gn = 1.0, 0.3, 0.1
    b2, gp2, gn2 = optimum.ds_anchor_map(lpb, c, beta, gp, gn)
    assert b2 > 0
    np.testing.assert_allclose(
        optimum.differential_smoothing(lpb, c, b2, gp2, gn2, "base"),
        optimum.differential_smoothing(lpb, c, beta, gp, gn, "policy"),
        atol=1e-12,
    )
    # The entropy bonus: (β, η) ↦ (β + η, η) whatever the instance.
    np.testing.assert_allclose(optimum.ds_anchor_map(lpb, c, 0.5, 0.2, -0.2), (0.7, 0.2, -0.2))


def test_ds_anchor_map_can_have_no_base_anchored_counterpart() -> None:
    # The worked example of the eq19 checker: β' < 0 in the paper's parameter range.
    lpb, c = np.log([0.4, 0.1, 0.3, 0.2]), np.array([1, 1, 0, 0], bool)
    b2, _, _ = optimum.ds_anchor_map(lpb, c, 1.0, 0.5, 0.5)
    assert b2 == pytest.approx(-5.5573, abs=1e-4)


def test_objective_matches_a_loop(inst) -> None:
    rng = np.random.default_rng(5)
    lpi = _normalized(rng.standard_normal(inst.num_trajectories))
    r = rng.normal(size=inst.num_trajectories)
    coef_c, coef_d = rng.normal(size=inst.num_trajectories), 0.3
    beta = 0.9
    total = 0.0
    for m in range(inst.num_trajectories):
        p, lp, lb = np.exp(lpi[m]), lpi[m], inst.log_pb[m]
        total += p * (r[m] - coef_c[m] * lp - coef_d * lb) - beta * p * (lp - lb)
    assert optimum.objective(lpi, inst.log_pb, r, beta, coef_c, coef_d) == pytest.approx(total)
    batch = optimum.objective(np.stack([lpi, inst.log_pb]), inst.log_pb, r, beta)
    assert batch.shape == (2,)
    assert batch[1] == pytest.approx(np.sum(np.exp(inst.log_pb) * r))  # π = π_b: no KL


def test_closed_forms_maximize_the_objective(inst) -> None:
    lpb, c = inst.log_pb, inst.correct
    r = c.astype(float)
    beta = 0.6
    cases = [
        (optimum.kl_regularized(lpb, r, beta), {}),
        (optimum.entropy_regularized(lpb, r, beta, -0.4, "policy"), {"coef_policy": -0.4}),
        (optimum.entropy_regularized(lpb, r, beta, 0.8, "base"), {"coef_base": 0.8}),
        (
            optimum.differential_smoothing(lpb, c, beta, 0.5, 0.3, "policy"),
            {"coef_policy": ds_coefficients(c, 0.5, 0.3)},
        ),
        (
            optimum.differential_smoothing(lpb, c, beta, 0.5, 0.3, "base"),
            {"coef_base": ds_coefficients(c, 0.5, 0.3)},
        ),
    ]
    for closed, coefs in cases:
        numeric = numerical_optimum(lpb, r, beta, **coefs)
        np.testing.assert_allclose(np.exp(closed), np.exp(numeric), atol=1e-10)


_LPB = np.log([0.5, 0.25, 0.25])
_C = np.array([True, False, False])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        # β ≤ 0, NaN or infinite.
        (lambda: optimum.kl_regularized(_LPB, _C, 0.0), "beta"),
        (lambda: optimum.kl_regularized(_LPB, _C, -1.0), "beta"),
        (lambda: optimum.kl_regularized(_LPB, _C, np.nan), "beta"),
        (lambda: optimum.kl_regularized(_LPB, _C, np.inf), "beta"),
        (lambda: optimum.entropy_regularized(_LPB, _C, 0.0, 0.1, "base"), "beta"),
        (lambda: optimum.differential_smoothing(_LPB, _C, -0.5, 0.1, 0.0, "base"), "beta"),
        (lambda: optimum.ds_multiplier(_LPB, _C, 0.0, 0.1), "beta"),
        (lambda: optimum.objective(_LPB, _LPB, _C, 0.0), "beta"),
        # Unnormalized or NaN log-probabilities.
        (lambda: optimum.kl_regularized(np.log([0.5, 0.5, 0.5]), _C, 1.0), "log_pb"),
        (lambda: optimum.kl_regularized([np.nan, 0.0, 0.0], _C, 1.0), "log_pb"),
        (lambda: optimum.kl_regularized([np.inf, 0.0, 0.0], _C, 1.0), "log_pb"),
        (lambda: optimum.entropy_regularized(np.zeros(3), _C, 1.0, 0.1), "log_pb"),
        (lambda: optimum.differential_smoothing(np.zeros(3), _C, 1.0, 0.1), "log_pb"),
        (lambda: optimum.objective(np.zeros(3), _LPB, _C, 1.0), "log_pi"),
        (lambda: optimum.objective(_LPB, [0.0, np.nan, 0.0], _C, 1.0), "log_pb"),
        # A softmax policy has full support: −inf is rejected where exponents of π_b appear.
        (
            lambda: optimum.entropy_regularized([0.0, -np.inf, -np.inf], _C, 1.0, 0.1),
            "log_pb",
        ),
        (lambda: optimum.differential_smoothing([0.0, -np.inf, -np.inf], _C, 1.0, 0.1), "log_pb"),
        # Rewards and masks.
        (lambda: optimum.kl_regularized(_LPB, [1.0, np.nan, 0.0], 1.0), "reward"),
        (lambda: optimum.kl_regularized(_LPB, [1.0, np.inf, 0.0], 1.0), "reward"),
        (lambda: optimum.kl_regularized(_LPB, [1.0, 0.0], 1.0), "reward"),
        (lambda: optimum.differential_smoothing(_LPB, [True, False], 1.0, 0.1), "correct"),
        (lambda: optimum.differential_smoothing(_LPB, [0.5, 0, 0], 1.0, 0.1), "correct"),
        (lambda: optimum.objective(_LPB, _LPB, _C, 1.0, coef_policy=np.nan), "coef_policy"),
        (lambda: optimum.objective(_LPB, _LPB, _C, 1.0, coef_base=[0, np.nan, 0]), "coef_base"),
        # Non-concave policy-anchored problems.
        (lambda: optimum.entropy_regularized(_LPB, _C, 1.0, -1.0, "policy"), "beta \\+ eta"),
        (lambda: optimum.entropy_regularized(_LPB, _C, 1.0, -3.0, "policy"), "beta \\+ eta"),
        (lambda: optimum.entropy_regularized(_LPB, _C, 1.0, np.nan, "base"), "eta"),
        (lambda: optimum.differential_smoothing(_LPB, _C, 1.0, 0.1, 1.0, "policy"), "gamma_n"),
        (lambda: optimum.differential_smoothing(_LPB, _C, 1.0, 0.1, 2.0, "policy"), "gamma_n"),
        (lambda: optimum.differential_smoothing(_LPB, _C, 1.0, -1.0, 0.0, "policy"), "gamma_p"),
        (lambda: optimum.differential_smoothing(_LPB, _C, 1.0, np.nan, 0.0, "base"), "gamma_p"),
        (lambda: optimum.ds_multiplier(_LPB, _C, 1.0, 0.1, 1.5), "gamma_n"),
        (lambda: optimum.ds_anchor_map(_LPB, _C, 1.0, 0.1, 1.0), "gamma_n"),
        (lambda: optimum.entropy_regularized(_LPB, _C, 1.0, 0.1, "both"), "anchor"),
        (lambda: optimum.differential_smoothing(_LPB, _C, 1.0, 0.1, 0.0, "pi"), "anchor"),
        # The anchor map needs both kinds: the offset between C and its complement pins β'.
        (lambda: optimum.ds_anchor_map(_LPB, [False] * 3, 1.0, 0.1, 0.1), "correct is empty"),
        (lambda: optimum.ds_anchor_map(_LPB, [True] * 3, 1.0, 0.1, 0.1), "correct is full"),
    ],
)
def test_errors_name_the_argument(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_base_anchor_accepts_what_the_policy_anchor_rejects() -> None:
    # The base-anchored objectives are concave for every η and γ_n: no error.
    assert np.isfinite(optimum.entropy_regularized(_LPB, _C, 1.0, -3.0, "base")).all()
    assert np.isfinite(optimum.differential_smoothing(_LPB, _C, 1.0, 0.1, 2.0, "base")).all()
