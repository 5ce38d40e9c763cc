"""Checks of the slow references themselves, against independent NumPy/SciPy forms.

A wrong reference would make every equality test meaningless, so each building block is first
compared with a one-line library computation, and the reference gradients with finite differences.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy import special

from shaping.strategies import reward_groups

from . import reference as ref
from .strategies import random_batch

FLOATS = st.floats(-5.0, 5.0, allow_nan=False, allow_infinity=False)


@given(st.data())
def test_group_advantages_match_numpy_std(data):
    n_b, n_g = data.draw(st.integers(1, 3)), data.draw(st.integers(2, 5))
    r = data.draw(reward_groups(n_b, n_g))
    for ddof in (0, 1):
        want = (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=ddof, keepdims=True) + 1e-6)
        np.testing.assert_allclose(ref.group_advantages(r, ddof, 1e-6), want, atol=1e-12)


def test_group_advantages_single_response_is_zero_not_nan():
    out = ref.group_advantages(np.array([[1.0], [0.0]]), std_correction=1, eps=1e-6)
    assert np.array_equal(out, np.zeros((2, 1)))


@given(hnp.arrays(np.float64, (2, 5), elements=FLOATS))
def test_token_entropy_matches_scipy(logits):
    p = special.softmax(logits, axis=-1)
    np.testing.assert_allclose(ref.token_entropy(logits), special.entr(p).sum(-1), atol=1e-12)


@given(
    hnp.arrays(np.float64, 6, elements=FLOATS),
    hnp.arrays(np.float64, 6, elements=st.sampled_from([0.0, 1.0])),
    st.floats(0.01, 0.99),
)
def test_masked_quantile_matches_numpy(values, mask, q):
    got = ref.masked_quantile_1d(values, mask, q)
    if mask.sum() == 0:
        assert got == 0.0
    else:
        assert got == pytest.approx(np.quantile(values[mask > 0], q), abs=1e-12)


@given(st.integers(1, 8), st.data())
def test_passk_advantages_match_closed_form_and_have_zero_group_mean(n, data):
    k = data.draw(st.integers(1, n))
    r = data.draw(reward_groups(1, n))
    adv = ref.passk_advantages(r, k)
    np.testing.assert_allclose(adv.sum(), 0.0, atol=1e-9)
    # k = 1 is GRPO with the population std and no epsilon.
    if k == 1 and 0 < r.sum() < n:
        np.testing.assert_allclose(adv, (r - r.mean()) / r.std(), atol=1e-12)


def test_unbiased_pass_at_k_stable_form():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                stable = (
                    1.0
                    if n - c < k
                    else 1.0 - np.prod([1.0 - k / i for i in range(n - c + 1, n + 1)])
                )
                assert ref.unbiased_pass_at_k(n, c, k) == pytest.approx(stable, abs=1e-12)


def test_clipped_surrogate_branches():
    # Positive advantage: the ratio is capped at 1 + eps_high; negative: floored at 1 - eps_low.
    assert ref.clipped_surrogate(math.log(2.0), 0.0, 1.0) == pytest.approx(-1.2)
    assert ref.clipped_surrogate(math.log(0.5), 0.0, 1.0) == pytest.approx(-0.5)
    assert ref.clipped_surrogate(math.log(0.5), 0.0, -1.0) == pytest.approx(0.8)
    assert ref.clipped_surrogate(math.log(2.0), 0.0, -1.0) == pytest.approx(2.0)


def test_k3_is_nonnegative_and_zero_on_policy():
    assert ref.k3(-1.3, -1.3) == 0.0
    assert ref.k3(-1.0, -2.0) == pytest.approx(math.exp(-1.0) + 1.0 - 1.0)


FD_CASES = {
    "grpo": {"kl_coef": 0.3, "loss_agg": "seq-mean-token-mean"},
    # alpha = 0: the smoothed ratio's value is rho whatever the candidates, so its stop-gradient
    # gradient is not a derivative of the value; the rank-1 penalty branch still is.
    "casp": {"alpha": 0.0, "lam_top1": 1.5, "quantile": 0.5, "top_n": 2},
    "dsdr": {"lam_loc": 0.5},
    "diff_entropy": {"eta_pos": 0.3, "eta_neg": 0.2, "loss_agg": "seq-mean-token-sum-norm"},
    "entropy_bonus": {"form": "token", "eta": 0.2},
}


@pytest.mark.parametrize("name", sorted(FD_CASES))
def test_reference_gradients_match_finite_differences(name):
    pytest.importorskip("torch")
    full = random_batch(seed=2, n_b=2, n_g=3, n_t=4, n_c=2)
    keep = {"rewards", "mask", "logp", "logp_old", "logp_ref", "cand_logp_old", *ref.NEEDS[name]}
    batch = {k: v for k, v in full.items() if k in keep}
    over = FD_CASES[name]
    _, grads = ref.loss(name, batch, **over)
    step = 1e-6
    for key, grad in grads.items():
        fd = np.zeros(batch[key].size)
        for i in range(fd.size):
            shifted = []
            for sign in (1.0, -1.0):
                moved = batch[key].copy().reshape(-1)
                moved[i] += sign * step
                shifted.append(ref.loss(name, {**batch, key: moved.reshape(grad.shape)}, **over)[0])
            fd[i] = (shifted[0] - shifted[1]) / (2 * step)
        np.testing.assert_allclose(grad.reshape(-1), fd, atol=1e-6, err_msg=f"{name} {key}")
    assert np.any(grads["logp"] != 0)


# PKPO (Walder & Karkhanis 2025): the enumerations against the paper's sorted closed forms --------

_REWARDS = st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(-2.0, 2.0))


@given(st.data())
def test_pkpo_enumerations_match_the_sorted_closed_forms(data):
    n = data.draw(st.integers(2, 6))
    k = data.draw(st.integers(2, n))
    row = data.draw(st.lists(_REWARDS, min_size=n, max_size=n))
    # Ascending order, ties by position: y[i] is the reward of rank i + 1 (1-based in the paper).
    order = sorted(range(n), key=lambda i: (row[i], i))
    y = [row[i] for i in order]
    c = math.comb
    # Eq. 12: rho = sum_i C(i-1, k-1)/C(n, k) g_(i).
    rho = sum(c(i - 1, k - 1) * y[i - 1] for i in range(1, n + 1)) / c(n, k)
    assert ref.max_at_k(row, k) == pytest.approx(rho, abs=1e-12)
    # Eq. 19: s_(i) = [C(i-1, k-1) g_(i) + sum_{j>i} C(j-2, k-2) g_(j)] / C(n, k).
    s_sorted = [
        (c(i - 1, k - 1) * y[i - 1] + sum(c(j - 2, k - 2) * y[j - 1] for j in range(i + 1, n + 1)))
        / c(n, k)
        for i in range(1, n + 1)
    ]
    # Eq. 33 with the (k-1) leave-one-out baseline: the reference's weights, rank by rank.
    weights = ref.pkpo_weights(row, k)
    for rank, i in enumerate(order):
        others = row[:i] + row[i + 1 :]
        want = s_sorted[rank] - k / n * ref.max_at_k(others, k - 1)
        assert weights[i] == pytest.approx(want, abs=1e-12)


@given(st.integers(2, 7), st.data())
def test_pkpo_binary_weights_are_the_papers_eq_8_baselined(n, data):
    # Binary rewards: s_i = k/n (correct) or (k/n) rho(n-1, c, k-1) (incorrect) (Eq. 8); the
    # (k-1) baseline (k/n) rho(n-1, c_others, k-1) leaves k/n C(n-c, k-1)/C(n-1, k-1) and 0.
    k = data.draw(st.integers(2, n))
    r = data.draw(reward_groups(1, n))[0]
    c = int(r.sum())
    weights = ref.pkpo_weights([float(x) for x in r], k)
    for g in range(n):
        want = k / n * math.comb(n - c, k - 1) / math.comb(n - 1, k - 1) if r[g] == 1 else 0.0
        assert weights[g] == pytest.approx(want, abs=1e-12)
