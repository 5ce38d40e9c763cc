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

from . import reference as ref
from .strategies import batches, reward_groups

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
        assert got == math.inf
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


@pytest.mark.parametrize("name", ["grpo", "casp", "dsdr", "diff_entropy", "entropy_bonus"])
@given(data=st.data())
def test_reference_gradients_match_finite_differences(name, data):
    pytest.importorskip("torch")
    batch = data.draw(batches(ref.NEEDS[name]))
    over = {"form": "token"} if name == "entropy_bonus" else {}
    if name == "casp":
        over = {"alpha": 0.5, "top_n": batch["cand_logp"].shape[-1]}
    _, grads = ref.loss(name, batch, **over)
    h = 1e-6
    for key, grad in grads.items():
        flat = batch[key].reshape(-1)
        for i in range(flat.size):
            up, down = dict(batch), dict(batch)
            up[key] = flat.copy()
            up[key][i] += h
            up[key] = up[key].reshape(batch[key].shape)
            down[key] = flat.copy()
            down[key][i] -= h
            down[key] = down[key].reshape(batch[key].shape)
            fd = (ref.loss(name, up, **over)[0] - ref.loss(name, down, **over)[0]) / (2 * h)
            # A kink of the clip or of the quantile mask inside the step would make the finite
            # difference meaningless; those are measure-zero, so a loose tolerance suffices.
            assert fd == pytest.approx(grad.reshape(-1)[i], abs=1e-4, rel=1e-4) or _at_kink(
                name, up, down, over
            )


def _at_kink(name, up, down, over):
    """True where a step crosses a non-differentiable point (clip edge, casp mask threshold)."""
    return not np.array_equal(_branches(name, up, over), _branches(name, down, over))


def _branches(name, batch, over):
    h = ref.hyper(name, **over)
    adv = ref.advantages(name, batch, **over)
    rho = np.exp(batch["logp"] - batch["logp_old"])
    side = np.sign(adv)[..., None]
    key = [(rho < 1 - h["eps_low"]) & (side < 0), (rho > 1 + h["eps_high"]) & (side > 0)]
    if name == "casp":
        tau = ref.masked_quantile(batch["entropy"], batch["mask"], h["quantile"])
        key.append(batch["entropy"] > tau[..., None])
        key.append(rho * h["lam_top1"] < 1 - h["eps_low"])
    return np.stack(key)
