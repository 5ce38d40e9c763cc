"""Hypothesis tests of DSDR's theory (seed 001: Props C.2, C.4, C.5, Lemma C.3, Theorem 3.1)."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.special import comb, logsumexp, softmax, xlogy

from theory.checks import CHECKERS
from theory.checks.dsdr import (
    allocation_objective,
    correctness_and_token_entropy,
    dsdr_reward,
    group_advantages,
    mixed_group_probability,
    score_function_gradient,
    support_uniform_logits,
    tilted_objective,
)
from theory.trees import num_internal_nodes, trajectory_log_probs

LOGIT = st.floats(-6.0, 6.0, allow_nan=False, allow_infinity=False)
UNIT = st.floats(0.0, 1.0, allow_nan=False, allow_infinity=False)


def logits(shape):
    return hnp.arrays(np.float64, shape, elements=LOGIT)


@given(
    correct=st.lists(st.booleans(), min_size=9, max_size=9),
    extra=logits((8, num_internal_nodes(3, 2), 3)),
    fraction=st.floats(0.0, 0.999),
    positive_only=st.booleans(),
)
def test_prop_c2_maximizers_are_correctness_optimal_below_the_bound(
    correct, extra, fraction, positive_only
):
    assume(any(correct) and not all(correct))
    mask = np.array(correct, dtype=np.float64)
    pol = np.concatenate([support_uniform_logits(3, 2), extra])
    p, r_all, r_pos = correctness_and_token_entropy(pol, 3, 2, mask)
    reg = r_pos if positive_only else r_all
    assert np.all(reg >= -1e-15) and np.all(reg <= np.log(3) + 1e-12)
    optimal = p >= p.max() - 1e-9
    gap = p.max() - p[~optimal].max()
    j = p + fraction * gap / np.log(3) * reg
    winners = j >= j.max() - 1e-12 * (1 - fraction) * gap
    assert np.all(optimal[winners])
    # Eq. 36, quantitatively.
    assert j[optimal].max() - j[~optimal].max() >= (1 - fraction) * gap - 1e-12


@given(p=UNIT, group_size=st.integers(1, 10))
def test_lemma_c3_matches_enumeration_and_binomial_sum(p, group_size):
    outcomes = (np.arange(2**group_size)[:, None] >> np.arange(group_size)) & 1
    k = outcomes.sum(axis=1)
    weights = p**k * (1 - p) ** (group_size - k)
    mixed = (k > 0) & (k < group_size)
    closed = mixed_group_probability(p, group_size)
    assert abs(closed - weights[mixed].sum()) <= 1e-12
    k_mid = np.arange(1, group_size)
    binomial = np.sum(comb(group_size, k_mid) * p**k_mid * (1 - p) ** (group_size - k_mid))
    assert abs(closed - binomial) <= 1e-12


@given(
    correct=st.lists(st.booleans(), min_size=2, max_size=12),
    scores=st.lists(st.floats(0.0, 2.0), min_size=12, max_size=12),
    bonus=st.floats(0.01, 1.0),
    clip=st.floats(0.05, 1.0),
    eps=st.floats(1e-6, 1e-2),
    ddof=st.integers(0, 1),
)
def test_prop_c4_nonconstant_reward_gives_nonzero_advantage(
    correct, scores, bonus, clip, eps, ddof
):
    c = np.array(correct)
    rt = dsdr_reward(c, np.array(scores[: c.size]), bonus=bonus, clip=clip)
    adv = group_advantages(rt, eps=eps, ddof=ddof)
    if np.all(rt == rt[0]):
        assert np.max(np.abs(adv)) <= 1e-8
    else:
        assert np.any(adv != 0)
        assert np.max(np.abs(adv)) >= rt.std() / (rt.std(ddof=ddof) + eps) * (1 - 1e-12)


@given(
    scores=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=8),
    bonus=st.floats(0.01, 1.0),
    clip=st.floats(0.05, 1.0),
)
def test_prop_c4_solve_all_group_with_distinct_clipped_scores(scores, bonus, clip):
    s = np.array(scores)
    assume(np.unique(np.minimum(s, clip)).size > 1)
    rt = dsdr_reward(np.ones(s.size, bool), s, bonus=bonus, clip=clip)
    assume(np.unique(rt).size > 1)  # λ·min(s, σ) can round away a difference below 1 ulp of 1
    assert np.any(group_advantages(rt, eps=1e-6) != 0)
    assert np.all(group_advantages(np.ones(s.size), eps=1e-6) == 0)


@given(
    scores=hnp.arrays(np.float64, st.integers(1, 8), elements=LOGIT),
    tau=st.floats(0.02, 5.0),
    other=st.data(),
)
def test_prop_c5_softmax_maximizes_entropy_regularized_allocation(scores, tau, other):
    w_logits = other.draw(logits(scores.shape))
    w = softmax(w_logits)
    w_star = softmax(scores / tau)
    f_star = allocation_objective(w_star, scores, tau)
    scale = 1 + np.max(np.abs(scores))
    assert abs(f_star - tau * logsumexp(scores / tau)) <= 1e-9 * scale
    f = allocation_objective(w, scores, tau)
    kl = np.sum(xlogy(w, w) - xlogy(w, w_star))
    assert f <= f_star + 1e-9 * scale
    assert abs(f_star - f - tau * kl) <= 1e-9 * scale


@given(
    theta=logits((num_internal_nodes(2, 2), 2)),
    correct=st.lists(st.booleans(), min_size=4, max_size=4),
    scores=st.lists(UNIT, min_size=4, max_size=4),
    tau=st.floats(0.05, 2.0),
)
def test_thm_3_1_score_function_form_equals_finite_differences(theta, correct, scores, tau):
    assume(any(correct))
    c, s = np.array(correct), np.array(scores)
    log_z = tilted_objective(theta, 2, 2, c, s, tau)
    adv = np.where(c, np.exp(s / tau - log_z), 0.0) - 1.0
    grad = score_function_gradient(theta, 2, 2, adv)
    h = 1e-5
    steps = np.eye(theta.size).reshape(-1, *theta.shape) * h
    fd = (
        tilted_objective(theta + steps, 2, 2, c, s, tau)
        - tilted_objective(theta - steps, 2, 2, c, s, tau)
    ) / (2 * h)
    assert np.max(np.abs(fd.reshape(theta.shape) - grad)) <= 1e-6 * (1 + np.max(np.abs(grad)))
    pi = np.exp(trajectory_log_probs(theta, 2, 2))
    assert abs(pi @ adv) <= 1e-12  # the constant baseline has zero mean (Eq. 51)


def test_score_function_gradient_matches_per_trajectory_loop():
    rng = np.random.default_rng(0)
    theta = rng.normal(size=(num_internal_nodes(3, 2), 3))
    weights = rng.normal(size=9)
    node_p = softmax(theta, axis=-1)
    pi = np.exp(trajectory_log_probs(theta, 3, 2))
    expected = np.zeros_like(theta)
    for m in range(9):
        a1, a2 = divmod(m, 3)
        for node, action in ((0, a1), (1 + a1, a2)):
            onehot = np.eye(3)[action]
            expected[node] += pi[m] * weights[m] * (onehot - node_p[node])
    np.testing.assert_allclose(score_function_gradient(theta, 3, 2, weights), expected, atol=1e-14)


def test_checkers_hold_on_three_trials():
    rng = np.random.default_rng(0)
    for name in ("dsdr_prop_c2", "dsdr_lemma_c3", "dsdr_prop_c4", "dsdr_prop_c5", "dsdr_thm_3_1"):
        res = CHECKERS[name].run(rng, 3)
        assert res.trials == 3 and res.violations == 0, (name, res)
