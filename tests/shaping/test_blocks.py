"""Each fast building block equals its slow reference loop on random inputs (Hypothesis, NumPy).

The blocks are the pieces every method is assembled from: group advantages, the clipped
surrogate, the three loss aggregations, the k3 KL, token entropy from logits, sequence
log-prob sum/mean, the masked quantile, ProGRPO's low-probability confidence, the group rank and
the pass@k advantages. Rows may be fully masked; values include ties and very negative log-probs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import shaping
from shaping.strategies import masks, reward_groups

from . import reference as ref
from .helpers import assert_close

_SHAPE = st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 6))
_LOGP = st.one_of(
    st.floats(-40.0, 0.0, allow_nan=False, allow_infinity=False),
    st.sampled_from([-0.5, -1.0, -30.0]),
)
_SMALL = st.floats(-2.0, 2.0, allow_nan=False, allow_infinity=False)


@given(st.data(), st.sampled_from([0, 1]), st.sampled_from([1e-6, 1e-4, 0.0]))
def test_grpo_and_dr_grpo_advantages(data, std_correction, eps):
    n_b, n_g, _ = data.draw(_SHAPE)
    r = data.draw(reward_groups(n_b, n_g))
    if data.draw(st.booleans()):
        r = r * data.draw(hnp.arrays(np.float64, r.shape, elements=st.floats(0.0, 1.0)))
    got = shaping.grpo_advantages(r, std_correction=std_correction, eps=eps)
    assert_close(got, ref.group_advantages(r, std_correction, eps), what="grpo")
    assert_close(shaping.dr_grpo_advantages(r), ref.dr_grpo_advantages(r), what="dr_grpo")


@given(st.data(), st.sampled_from([0.2, 0.1]), st.sampled_from([0.2, 0.28]))
def test_clipped_surrogate(data, eps_low, eps_high):
    shape = data.draw(_SHAPE)
    log_ratio = data.draw(hnp.arrays(np.float64, shape, elements=st.floats(-0.7, 0.7)))
    adv = data.draw(hnp.arrays(np.float64, shape[:2], elements=_SMALL))
    got = shaping.clipped_surrogate(np.exp(log_ratio), adv, eps_low=eps_low, eps_high=eps_high)
    want = np.zeros(shape)
    for idx in np.ndindex(*shape):
        want[idx] = ref.clipped_surrogate(log_ratio[idx], 0.0, adv[idx[:2]], eps_low, eps_high)
    assert_close(got, want, what="surrogate")


@given(st.data(), st.sampled_from(ref.LOSS_AGGS))
def test_agg_loss(data, mode):
    shape = data.draw(_SHAPE)
    loss = data.draw(hnp.arrays(np.float64, shape, elements=_SMALL))
    mask = data.draw(masks(*shape))
    got = shaping.agg_loss(loss, mask, mode)
    assert_close(got, ref.aggregate(loss.tolist(), mask, mode), what=mode)
    # The mask may be bool, and padding may hold garbage: neither changes the value.
    garbage = np.where(mask > 0, loss, np.nan)
    assert_close(shaping.agg_loss(garbage, mask > 0, mode), got, what=f"{mode} (bool, NaN pad)")


@given(st.data())
def test_kl_k3(data):
    shape = data.draw(_SHAPE)
    p = data.draw(hnp.arrays(np.float64, shape, elements=_LOGP))
    q = p + data.draw(hnp.arrays(np.float64, shape, elements=_SMALL))
    got = shaping.kl_k3(p, q, np.ones(shape))
    assert_close(got, np.vectorize(ref.k3)(p, q), what="k3")
    assert np.all(got >= 0)


@given(
    hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 6)),
        elements=st.one_of(st.floats(-30.0, 30.0), st.sampled_from([0.0, 1.0])),
    )
)
def test_token_entropy(logits):
    got = shaping.token_entropy(logits)
    assert_close(got, ref.token_entropy(logits), atol=1e-9, what="entropy")
    assert np.all(got >= -1e-12) and np.all(got <= np.log(logits.shape[-1]) + 1e-9)


@given(st.data(), st.sampled_from(["sum", "mean"]))
def test_sequence_logp(data, reduction):
    shape = data.draw(_SHAPE)
    logp = data.draw(hnp.arrays(np.float64, shape, elements=_LOGP))
    mask = data.draw(masks(*shape))
    got = shaping.sequence_logp(logp, mask, reduction=reduction)
    assert_close(got, ref.seq_logp(logp, mask, reduction), what=reduction)


@given(
    st.data(),
    st.one_of(st.sampled_from([0.1, 0.2, 0.25, 0.5, 0.75, 0.8, 0.9]), st.floats(0.01, 0.99)),
)
def test_masked_quantile(data, q):
    n_b, n_g = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 4))
    n_t = data.draw(st.integers(1, 12))
    x = data.draw(
        hnp.arrays(
            np.float64, (n_b, n_g, n_t), elements=st.one_of(_SMALL, st.sampled_from([0.0, 1.0]))
        )
    )
    mask = data.draw(masks(n_b, n_g, n_t))
    assert_close(shaping.masked_quantile(x, mask, q), ref.masked_quantile(x, mask, q), what="q")


@given(
    st.data(),
    st.one_of(st.sampled_from([0.2, 0.25, 0.5, 1.0]), st.floats(0.05, 1.0)),
)
def test_low_prob_confidence(data, low_frac):
    # Rows up to 16 tokens so that ceil(low_frac * n) takes several values.
    n_b, n_g, n_t = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3)), 16
    logp = data.draw(
        hnp.arrays(
            np.float64, (n_b, n_g, n_t), elements=st.one_of(st.floats(-4.0, 0.0), st.just(-1.0))
        )
    )
    mask = data.draw(masks(n_b, n_g, n_t))
    got = shaping.low_prob_confidence(logp, mask, low_frac=low_frac)
    want = np.array(
        [
            [ref.low_prob_confidence_1d(logp[b, g], mask[b, g], low_frac) for g in range(n_g)]
            for b in range(n_b)
        ]
    )
    assert_close(got, want, what=f"confidence, low_frac={low_frac}")


def test_low_prob_confidence_rounds_low_frac_times_n_up():
    # T_low of 15 tokens at 20% has exactly 3 positions although 0.2 * 15 = 3.0000000000000004.
    logp = -np.arange(1.0, 16.0)[None, :]
    got = shaping.low_prob_confidence(logp, np.ones_like(logp), low_frac=0.2)
    assert_close(got, np.exp([-(15 + 14 + 13) / 3]), what="0.2 * 15")
    got = shaping.low_prob_confidence(logp[:, :7], np.ones((1, 7)), low_frac=0.2)
    assert_close(got, np.exp([-(7 + 6) / 2]), what="ceil(1.4) = 2")


@given(
    hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 3), st.integers(1, 6)),
        elements=st.sampled_from([-2.0, -1.0, -0.5, 0.0]) | _SMALL,
    )
)
def test_group_rank(x):
    want = np.array([ref.ascending_ranks(list(row)) for row in x], dtype=np.float64)
    assert_close(shaping.group_rank(x), want, what="rank")


@given(st.integers(1, 8), st.data())
def test_passk_advantages(n, data):
    k = data.draw(st.integers(1, n))
    r = data.draw(reward_groups(data.draw(st.integers(1, 3)), n))
    assert_close(shaping.passk_advantages(r, k=k), ref.passk_advantages(r, k), what=f"k={k}")


def test_token_entropy_ignores_banned_tokens():
    torch = pytest.importorskip("torch")
    logits = np.array([[0.3, -np.inf, 1.2, -np.inf], [2.0, 2.0, 2.0, 2.0]])
    want = [ref.token_entropy(np.array([0.3, 1.2]))[()], np.log(4.0)]
    assert_close(shaping.token_entropy(logits), want, what="entropy with -inf logits")
    z = torch.tensor(logits, requires_grad=True)
    shaping.token_entropy(z).sum().backward()
    assert torch.isfinite(z.grad).all() and (z.grad[0, [1, 3]] == 0).all()
