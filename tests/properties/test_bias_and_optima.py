"""Hypothesis tests of seed 000, App. B: Lemmas B.1, B.4, B.5, Props. B.2, B.3 and Eq. 19.

Instances are `theory.strategies.tree_instances`: tabular base-policy logits in [−5, 5] on trees
with `V ∈ 2..4`, `H ∈ 1..4` (up to 256 leaves), and a correct set holding both kinds. The checkers
behind `python -m theory check` are also run here, and fed wrong closed forms to show they catch
them.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import logsumexp

import theory.checks.bias_and_optima as bo
from theory.checks import CHECKERS
from theory.optimum import (
    differential_smoothing,
    ds_anchor_map,
    ds_multiplier,
    entropy_regularized,
    kl_regularized,
    objective,
)
from theory.strategies import kl_coefs, rewards, tree_instances
from theory.trees import TreeInstance

MY_CHECKERS = (
    "lemma_b1",
    "prop_b2_selection_bias",
    "prop_b3_reinforcement_bias",
    "lemma_b4",
    "lemma_b5",
    "eq19_anchor_equivalence",
)

SMALL_SHAPES = [(2, 1), (3, 1), (4, 1), (2, 2)]  # M <= 4: every N-sample can be enumerated
BETA = kl_coefs()


def _assert_is_the_maximizer(lp, lpb, reward, beta, coef_policy=0.0, coef_base=0.0) -> None:
    """Numerical maximization agrees; the closed form is not beaten; `∂J/∂π` is constant (= λ)."""
    numeric = bo.numerical_optimum(lpb, reward, beta, coef_policy, coef_base)
    np.testing.assert_allclose(np.exp(lp), np.exp(numeric), rtol=0, atol=1e-8)
    j_closed = objective(lp, lpb, reward, beta, coef_policy, coef_base)
    j_numeric = objective(numeric, lpb, reward, beta, coef_policy, coef_base)
    assert j_numeric <= j_closed + 1e-10 * (1 + abs(j_closed))
    grad = bo.lagrangian_gradient(lp, lpb, reward, beta, coef_policy, coef_base)
    scale = 1 + np.max(np.abs(reward)) + np.max(np.abs(np.multiply(beta + np.abs(coef_base), lpb)))
    scale += np.max(np.abs((np.asarray(coef_policy) + beta) * (lp + 1)))
    assert np.ptp(grad) <= 1e-9 * scale


# ------------------------------------------------------------------------------------- Lemma B.1


@given(data=st.data(), inst=tree_instances(), beta=BETA)
def test_lemma_b1_closed_form_is_the_maximizer(data, inst: TreeInstance, beta: float) -> None:
    reward = data.draw(rewards(inst))
    lp = kl_regularized(inst.log_pb, reward, beta)
    # Stationarity in the paper's form: log π − log π_b − r̂/β is the same for every trajectory.
    assert np.ptp(lp - inst.log_pb - reward / beta) <= 1e-12 * (
        1 + np.max(np.abs(inst.log_pb)) + 3 / beta
    )
    _assert_is_the_maximizer(lp, inst.log_pb, reward, beta)


# -------------------------------------------------------------------------------------- Prop. B.2


@given(inst=tree_instances(SMALL_SHAPES), beta=BETA, n=st.integers(1, 4))
def test_prop_b2_probability_by_enumerating_every_sample(
    inst: TreeInstance, beta: float, n: int
) -> None:
    """`P(π*(τ) > π_b(τ)) = 1 − (1 − π_b(τ))^N` exactly, summing over all `M^N` ordered samples."""
    lpb, c, m = inst.log_pb, inst.correct, inst.num_trajectories
    samples = np.array(list(itertools.product(range(m), repeat=n)))  # (M^N, N)
    weight = np.exp(lpb[samples].sum(axis=1))  # (M^N,)
    sampled = np.zeros((len(samples), m), dtype=bool)
    sampled[np.arange(len(samples))[:, None], samples] = True
    lp_star = kl_regularized(lpb, (sampled & c).astype(float), beta)  # (M^N, M)
    event = (lp_star - lpb) > bo.EVENT_MARGIN
    probability = weight @ event  # (M,)
    claimed = 1.0 - (1.0 - np.exp(lpb)) ** n
    np.testing.assert_allclose(probability[c], claimed[c], rtol=0, atol=1e-12)
    # Increasing in π_b(τ) over the correct set.
    order = np.argsort(lpb[c], kind="stable")
    assert np.all(np.diff(probability[c][order]) >= -1e-12)


@given(data=st.data(), inst=tree_instances(), beta=BETA)
def test_prop_b2_a_rewarded_trajectory_gains_and_no_other_does(
    data, inst: TreeInstance, beta: float
) -> None:
    """The mechanism of Prop. B.2, for any sampled set: `π*(τ) > π_b(τ)` iff `r̂(τ) = 1`, as long as
    some trajectory is unrewarded (here the forced incorrect one): `log π*/π_b = r̂/β − log Z` with
    `Z = 1 + (e^{1/β} − 1)·P_b(rewarded) < e^{1/β}`."""
    m = inst.num_trajectories
    sampled = np.array(data.draw(st.lists(st.booleans(), min_size=m, max_size=m)))
    rewarded = sampled & inst.correct
    lpb = inst.log_pb
    lp_star = kl_regularized(lpb, rewarded.astype(float), beta)
    rewarded_mass = np.exp(logsumexp(lpb[rewarded])) if rewarded.any() else 0.0
    log_z = np.log1p(np.expm1(1.0 / beta) * rewarded_mass)
    stated = np.where(rewarded, 1.0 / beta - log_z, -log_z)
    np.testing.assert_allclose(
        lp_star - lpb, stated, rtol=0, atol=1e-12 * (1 + 1 / beta + np.max(-lpb))
    )
    # 1/β − log Z = −log(1 − (1 − e^{−1/β})·P_b(unrewarded)): > 0, in a form exact for tiny masses.
    gain = -np.log1p(np.expm1(-1.0 / beta) * np.exp(logsumexp(lpb[~rewarded])))
    assert gain > 0
    assert log_z >= 0  # Z >= 1: an unrewarded trajectory never gains
    resolvable = np.abs(stated) > 1e-10
    assert np.all(((lp_star - lpb) > 0)[resolvable] == rewarded[resolvable])


# -------------------------------------------------------------------------------------- Prop. B.3


@given(inst=tree_instances(), beta=BETA)
def test_prop_b3_gain_is_proportional_to_the_base_probability(
    inst: TreeInstance, beta: float
) -> None:
    lpb, c = inst.log_pb, inst.correct
    lp_star = kl_regularized(lpb, c.astype(float), beta)
    p_b = np.exp(logsumexp(lpb[c]))
    z = p_b * np.exp(1.0 / beta) + (1.0 - p_b)
    pb = np.exp(lpb)
    gain = np.exp(lp_star) - pb
    stated = np.where(c, pb * (np.exp(1.0 / beta) / z - 1.0), pb * (1.0 / z - 1.0))
    np.testing.assert_allclose(gain, stated, rtol=1e-9, atol=1e-15)
    # Gains relative to π_b are one constant on C and another off C: proportional to π_b.
    log_ratio = lp_star - lpb
    tol = 1e-12 * (1 + 1 / beta + np.max(-lpb))
    assert np.ptp(log_ratio[c]) <= tol and np.ptp(log_ratio[~c]) <= tol
    # Correct trajectories gain and incorrect ones lose (exactly, in log1p form).
    incorrect_mass = np.exp(logsumexp(lpb[~c]))
    factor_c = -np.log1p(np.expm1(-1.0 / beta) * incorrect_mass)  # 1/β − log Z
    factor_n = factor_c - 1.0 / beta  # −log Z
    assert factor_c > 0 > factor_n
    np.testing.assert_allclose(log_ratio, np.where(c, factor_c, factor_n), rtol=0, atol=tol)
    # The likelier a correct trajectory, the larger its gain.
    order = np.argsort(pb[c], kind="stable")
    assert np.all(np.diff(gain[c][order]) >= -1e-15)


# ------------------------------------------------------------------------------------- Lemma B.4


@given(
    data=st.data(),
    inst=tree_instances(),
    beta=BETA,
    anchor=st.sampled_from(["policy", "base"]),
    eta_ratio=st.floats(-0.9, 2.0, allow_nan=False),
)
def test_lemma_b4_closed_form_is_the_maximizer(
    data, inst: TreeInstance, beta: float, anchor: str, eta_ratio: float
) -> None:
    reward = data.draw(rewards(inst))
    eta = eta_ratio * beta  # the policy anchor needs β + η > 0: η >= −0.9β by construction
    lp = entropy_regularized(inst.log_pb, reward, beta, eta, anchor)
    coefs = {"coef_policy": eta} if anchor == "policy" else {"coef_base": eta}
    _assert_is_the_maximizer(lp, inst.log_pb, reward, beta, **coefs)


# ------------------------------------------------------------------------------------- Lemma B.5


@given(
    inst=tree_instances(),
    beta=BETA,
    anchor=st.sampled_from(["policy", "base"]),
    gp_ratio=st.one_of(st.just(0.0), st.floats(0.0, 2.0, allow_nan=False)),
    gn_ratio=st.one_of(st.just(0.0), st.floats(0.0, 0.9, allow_nan=False)),
)
def test_lemma_b5_closed_form_is_the_maximizer(
    inst: TreeInstance, beta: float, anchor: str, gp_ratio: float, gn_ratio: float
) -> None:
    lpb, c = inst.log_pb, inst.correct
    gamma_p, gamma_n = gp_ratio * beta, gn_ratio * beta  # γ_n < β by construction
    reward = c.astype(float)
    lp = differential_smoothing(lpb, c, beta, gamma_p, gamma_n, anchor)
    coef = bo.ds_coefficients(c, gamma_p, gamma_n)
    coefs = {"coef_policy": coef} if anchor == "policy" else {"coef_base": coef}
    _assert_is_the_maximizer(lp, lpb, reward, beta, **coefs)
    if anchor == "policy":
        # λ from ds_multiplier is the Lagrange multiplier: ∂J/∂π(τ) = λ for every τ.
        lam = ds_multiplier(lpb, c, beta, gamma_p, gamma_n)
        grad = bo.lagrangian_gradient(lp, lpb, reward, beta, coef)
        np.testing.assert_allclose(
            grad, lam, rtol=0, atol=1e-9 * (1 + abs(lam) + np.max(-beta * lpb))
        )


# -------------------------------------------------------------------------------------- Eq. 19


@given(
    data=st.data(),
    inst=tree_instances(),
    beta=BETA,
    eta_ratio=st.floats(-0.9, 2.0, allow_nan=False),
)
def test_eq19_entropy_bonus_policy_equals_base_with_beta_plus_eta(
    data, inst: TreeInstance, beta: float, eta_ratio: float
) -> None:
    reward = data.draw(rewards(inst))
    eta = eta_ratio * beta
    np.testing.assert_allclose(
        entropy_regularized(inst.log_pb, reward, beta, eta, "policy"),
        entropy_regularized(inst.log_pb, reward, beta + eta, eta, "base"),
        rtol=0,
        atol=1e-12 * (1 + np.max(-inst.log_pb) + 3 / (beta + eta)),
    )
    np.testing.assert_allclose(
        ds_anchor_map(inst.log_pb, inst.correct, beta, eta, -eta),
        (beta + eta, eta, -eta),
        rtol=1e-9,
        atol=1e-12,
    )


@given(
    inst=tree_instances(),
    beta=BETA,
    gp_ratio=st.floats(0.0, 2.0, allow_nan=False),
    gn_ratio=st.floats(0.0, 0.95, allow_nan=False),
)
def test_eq19_ds_map_matches_the_optimum_shape(
    inst: TreeInstance, beta: float, gp_ratio: float, gn_ratio: float
) -> None:
    """The policy-anchored optimum is `π_b^{β/s_C}·e^{o_C}` on C and `π_b^{β/s_N}·e^{o_N}` off C with
    `o_C − o_N = 1/β'` from `ds_anchor_map`, whatever its sign; where `β' > 0` the base-anchored
    problem with the mapped parameters has that optimum and maps back."""
    lpb, c = inst.log_pb, inst.correct
    gamma_p, gamma_n = gp_ratio * beta, gn_ratio * beta
    lp = differential_smoothing(lpb, c, beta, gamma_p, gamma_n, "policy")
    beta_b, gp_b, gn_b = ds_anchor_map(lpb, c, beta, gamma_p, gamma_n)
    offset = lp - np.where(c, beta / (beta + gamma_p), beta / (beta - gamma_n)) * lpb
    tol = 1e-12 * (1 + np.max(-lpb) / (1 - gn_ratio) + 1 / beta)
    assert np.ptp(offset[c]) <= tol and np.ptp(offset[~c]) <= tol
    inv = offset[c][0] - offset[~c][0]
    assert inv == pytest.approx(1.0 / beta_b, rel=1e-9, abs=tol)
    if 1.0 / beta_b > 1e-6:
        np.testing.assert_allclose(
            differential_smoothing(lpb, c, beta_b, gp_b, gn_b, "base"), lp, rtol=0, atol=1e-9
        )
        back = bo.ds_base_to_policy(lpb, c, beta_b, gp_b, gn_b)
        assert back is not None
        np.testing.assert_allclose(back, (beta, gamma_p, gamma_n), rtol=1e-7, atol=1e-9)


@given(
    inst=tree_instances(),
    beta_b=BETA,
    gp_ratio=st.floats(0.0, 0.95, allow_nan=False),
    gn_ratio=st.floats(0.0, 1.0, allow_nan=False),
)
def test_eq19_reverse_map(
    inst: TreeInstance, beta_b: float, gp_ratio: float, gn_ratio: float
) -> None:
    lpb, c = inst.log_pb, inst.correct
    gp_b, gn_b = gp_ratio * beta_b, gn_ratio * beta_b
    pre = bo.ds_base_to_policy(lpb, c, beta_b, gp_b, gn_b)
    if pre is None:
        return  # no concave policy-anchored problem has this optimum (counted by the checker)
    beta, gamma_p, gamma_n = pre
    assert beta > 0 and gamma_n < beta and beta + gamma_p > 0
    np.testing.assert_allclose(
        differential_smoothing(lpb, c, beta, gamma_p, gamma_n, "policy"),
        differential_smoothing(lpb, c, beta_b, gp_b, gn_b, "base"),
        rtol=0,
        atol=1e-9,
    )


# ------------------------------------------------------------------------------------- checkers


@pytest.mark.parametrize("name", MY_CHECKERS)
def test_checker_finds_no_violation(name: str) -> None:
    res = CHECKERS[name].run(np.random.default_rng(0), 3)
    assert res.trials == 3
    assert res.violations == 0, res.details
    assert np.isfinite(res.max_residual)
    json.dumps(res.details)  # JSON-serializable for `python -m theory check --json`


def test_eq19_checker_reports_the_counterexample() -> None:
    res = CHECKERS["eq19_anchor_equivalence"].run(np.random.default_rng(0), 30)
    assert res.counterexamples > 0 and res.status == "counterexample"
    assert res.violations == 0
    example = res.details["worked_example"]
    assert example["mapped_base_params"][0] < 0
    assert example["fitted_offset_equals_1_over_beta_prime"] == pytest.approx(
        1.0 / example["mapped_base_params"][0], rel=1e-9
    )


def _wrong_kl(log_pb, reward, beta):
    return kl_regularized(log_pb, reward, 2.0 * beta)


def _no_update(log_pb, reward, beta):
    return kl_regularized(log_pb, np.zeros_like(np.asarray(reward, dtype=float)), beta)


def _wrong_entropy(log_pb, reward, beta, eta, anchor="policy"):
    return entropy_regularized(log_pb, reward, beta, eta, "base")


def _wrong_ds(log_pb, correct, beta, gamma_p, gamma_n=0.0, anchor="policy"):
    return differential_smoothing(log_pb, correct, beta, gamma_n, gamma_p, "base")


def _wrong_map(log_pb, correct, beta, gamma_p, gamma_n=0.0):
    return beta, gamma_p, gamma_n


@pytest.mark.parametrize(
    ("name", "target", "wrong"),
    [
        ("lemma_b1", "kl_regularized", _wrong_kl),
        ("prop_b2_selection_bias", "kl_regularized", _no_update),
        ("prop_b3_reinforcement_bias", "kl_regularized", _wrong_kl),
        ("lemma_b4", "entropy_regularized", _wrong_entropy),
        ("lemma_b5", "differential_smoothing", _wrong_ds),
        ("eq19_anchor_equivalence", "ds_anchor_map", _wrong_map),
    ],
)
def test_checker_catches_a_wrong_closed_form(monkeypatch, name: str, target: str, wrong) -> None:
    monkeypatch.setattr(bo, target, wrong)
    assert CHECKERS[name].run(np.random.default_rng(0), 5).violations > 0
