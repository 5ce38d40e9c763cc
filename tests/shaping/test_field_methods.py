"""What the policy losses the field uses promise (issue 39), on the fast implementation.

Each test compares a method with GRPO's clipped surrogate at a setting where theory says they
agree, or checks the one thing the method changes (which tokens lose their gradient, which
advantages are nonzero). The slow references (test_methods.py) check every value and gradient.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import shaping
from shaping import core
from shaping.strategies import batches, reward_groups

from . import reference as ref
from .helpers import assert_close, evaluate
from .strategies import random_batch

torch = pytest.importorskip("torch")


def _grad(name, batch, **hyper):
    return evaluate(shaping.get_method(name), batch, "torch.grad", hyper)


@given(batch=batches(), data=st.data())
def test_gspo_is_grpo_when_every_token_of_a_response_has_the_same_ratio(batch, data):
    # One log-ratio per response: s_i = rho_t, and grad s_it = s_i grad log pi_t = grad rho_t.
    n_b, n_g, _ = batch["mask"].shape
    delta = data.draw(st.lists(st.floats(-0.5, 0.5), min_size=n_b * n_g, max_size=n_b * n_g))
    batch = {**batch, "logp": batch["logp_old"] + np.reshape(delta, (n_b, n_g, 1))}
    over = {"eps_low": 0.2, "eps_high": 0.2, "loss_agg": "token-mean"}
    got, want = _grad("gspo", batch, **over), _grad("grpo", batch)
    assert_close(got[0], want[0], what="loss")
    assert_close(got[1]["logp"], want[1]["logp"], what="d loss / d logp")


def test_gspo_clips_whole_responses():
    batch = random_batch(seed=3)
    _, grads = _grad("gspo", batch)  # widths 3e-4 / 4e-4: a response's one ratio decides
    for b, g in np.ndindex(batch["rewards"].shape):
        tokens = grads["logp"][b, g][batch["mask"][b, g] > 0]
        assert np.all(tokens == 0) or np.all(tokens != 0), (b, g)


@pytest.mark.parametrize("name", sorted(shaping.OFF_POLICY_ONLY))
@given(batch=batches())
def test_off_policy_only_methods_have_grpo_gradient_on_policy(name, batch):
    batch = {**batch, "logp": batch["logp_old"].copy()}  # rho = 1: no clip acts
    agg = shaping.METHODS[name].defaults["loss_agg"]
    got, want = _grad(name, batch), _grad("grpo", batch, loss_agg=agg)
    assert_close(got[1]["logp"], want[1]["logp"], what=f"{name}: d loss / d logp")


def test_on_policy_methods_differ_from_grpo_on_policy():
    # The others change the on-policy gradient (their settings here act on the seeded batch).
    batch = random_batch(seed=5)
    batch = {**batch, "logp": batch["logp_old"].copy()}
    over = {
        "clip_cov": {"clip_cov_ratio": 0.5, "clip_cov_lb": 0.0},
        "entropy_adv": {},
        "lite_ppo": {},
        "grpo_passk": {},
        "pkpo": {},
    }
    assert set(over) | shaping.OFF_POLICY_ONLY >= {
        "dual_clip", "gspo", "cispo", "clip_cov", "kl_cov", "entropy_adv", "lite_ppo", "grpo_passk",
        "pkpo",
    }  # fmt: skip
    want = _grad("grpo", batch)[1]["logp"]
    for name, hyper in over.items():
        assert not np.allclose(_grad(name, batch, **hyper)[1]["logp"], want), name


def test_cispo_keeps_the_gradient_of_tokens_grpo_clips():
    batch = random_batch(seed=7)
    rho = np.exp(batch["logp"] - batch["logp_old"])
    adv = shaping.get_method("grpo").advantages(batch)[..., None] * np.ones_like(rho)
    clipped = (batch["mask"] > 0) & (((adv > 0) & (rho > 1.2)) | ((adv < 0) & (rho < 0.8)))
    assert clipped.any()
    g_cispo, g_grpo = _grad("cispo", batch)[1]["logp"], _grad("grpo", batch)[1]["logp"]
    assert np.all(g_grpo[clipped] == 0) and np.all(g_cispo[clipped] != 0)
    # The weight is capped at 1 + eps_high: |grad| <= 1.28 |A| / n_tokens.
    n = batch["mask"].sum()
    assert np.all(np.abs(g_cispo) <= 1.28 * np.abs(adv) / n + 1e-12)


@given(batch=batches(), c=st.sampled_from([1.05, 1.5, 3.0]))
def test_dual_clip_stops_only_negative_tokens_past_c(batch, c):
    got, want = _grad("dual_clip", batch, clip_ratio_c=c), _grad("grpo", batch)
    rho = np.exp(batch["logp"] - batch["logp_old"])
    adv = shaping.get_method("grpo").advantages(batch)[..., None] * np.ones_like(rho)
    capped = (adv < 0) & (rho > c) & (batch["mask"] > 0)
    assert np.all(got[1]["logp"][capped] == 0)
    assert_close(got[1]["logp"][~capped], want[1]["logp"][~capped], what="elsewhere GRPO's")


def _chosen(batch, **hyper):
    """Clip-Cov's detached tokens: those whose gradient differs from GRPO's (zeroed)."""
    g_cov, g_grpo = _grad("clip_cov", batch, **hyper)[1]["logp"], _grad("grpo", batch)[1]["logp"]
    assert np.all((g_cov == g_grpo) | (g_cov == 0))
    return g_cov != g_grpo


@pytest.mark.parametrize("ratio", [2e-4, 0.05, 0.2, 1.0])
def test_clip_cov_detaches_exactly_the_selected_tokens(ratio):
    batch = random_batch(seed=5, n_b=3, n_g=5, n_t=6)
    hyper = {"clip_cov_ratio": ratio, "clip_cov_lb": 0.0, "clip_cov_ub": 50.0}
    adv = shaping.get_method("grpo").advantages(batch)
    keep = batch["mask"] > 0
    cov = core.token_covariance(adv, batch["logp"], keep)
    rho = np.exp(batch["logp"] - batch["logp_old"])
    a = adv[..., None] * np.ones_like(rho)
    by_clip = np.clip(rho, 0.8, 1.2) * a < rho * a
    band = keep & ~by_clip & (cov > 0.0) & (cov < 50.0)
    k = max(math.floor(ratio * keep.sum()), 1)
    want = np.zeros_like(band)
    flat = np.argsort(-np.where(band, cov, -np.inf), axis=None, kind="stable")[: min(k, band.sum())]
    want.reshape(-1)[flat] = True
    got = core.batch_top_count(cov, band, k)
    assert np.array_equal(got, want) and got.sum() == min(k, band.sum())
    # Every selected token with a nonzero GRPO gradient loses it; nothing else changes.
    g_grpo = _grad("grpo", batch)[1]["logp"]
    assert np.array_equal(_chosen(batch, **hyper), want & (g_grpo != 0))
    # The covariance is the centred cross-product over the valid tokens.
    lp = batch["logp"][keep]
    a_valid = a[keep]
    np.testing.assert_allclose(cov[keep], (a_valid - a_valid.mean()) * (lp - lp.mean()))


def test_kl_cov_penalises_the_top_covariance_tokens_and_never_clips():
    batch = random_batch(seed=5)
    keep = batch["mask"] > 0
    adv = shaping.get_method("grpo").advantages(batch)
    cov = core.token_covariance(adv, batch["logp"], keep)
    k = 6
    ratio = k / keep.sum() + 1e-9
    top = core.batch_top_count(cov, keep, k)
    assert top.sum() == k and cov[top].min() >= cov[keep & ~top].max()
    # Without the penalty it is the unclipped REINFORCE-with-ratio loss: -rho A everywhere.
    rho = np.exp(batch["logp"] - batch["logp_old"])
    a = adv[..., None] * np.ones_like(rho)
    value, grads = _grad("kl_cov", batch, kl_cov_ratio=ratio, ppo_kl_coef=0.0)
    assert_close(value, (-rho * a)[keep].mean(), what="unclipped loss")
    assert_close(grads["logp"], np.where(keep, -rho * a, 0.0) / keep.sum(), what="gradient")
    # The penalty adds coef * sign(log rho) / n_tokens to the gradient of the chosen tokens.
    _, pen = _grad("kl_cov", batch, kl_cov_ratio=ratio, ppo_kl_coef=0.5)
    step = 0.5 * np.sign(batch["logp"] - batch["logp_old"]) / keep.sum()
    assert_close(pen["logp"] - grads["logp"], np.where(top, step, 0.0), what="penalty gradient")


@given(batch=batches(frozenset({"entropy"})), alpha=st.floats(0.0, 2.0), kappa=st.floats(1, 4))
def test_entropy_advantage_never_flips_a_sign_and_is_grpo_at_alpha_zero(batch, alpha, kappa):
    zero = _grad("entropy_adv", batch, alpha=0.0)
    want = _grad("grpo", batch)
    assert_close(zero[0], want[0], what="alpha = 0 loss")
    assert_close(zero[1]["logp"], want[1]["logp"], what="alpha = 0 gradient")
    adv = shaping.get_method("grpo").advantages(batch)[..., None]
    shaped = adv + np.minimum(alpha * batch["entropy"], np.abs(adv) / kappa)
    sign = np.broadcast_to(np.sign(adv), shaped.shape)
    assert np.all(shaped[sign > 0] > 0) and np.all(shaped[sign < 0] <= 0)
    assert np.all(shaped[sign == 0] == 0)


@given(batch=batches(frozenset({"entropy"})))
def test_kl_estimators(batch):
    over = {"kl_coef": 0.3}
    k3 = _grad("grpo", batch, **over)
    k3p = _grad("grpo", batch, kl_estimator="k3+", **over)
    k2 = _grad("grpo", batch, kl_estimator="k2", **over)
    assert_close(k3p[0], k3[0], what="k3+ takes k3's value")
    assert_close(k3p[1]["logp"], k2[1]["logp"], what="k3+ takes k2's gradient")
    d = batch["logp"] - batch["logp_ref"]
    m = batch["mask"]
    k1 = core.kl_penalty(batch["logp"], batch["logp_ref"], m, "k1")
    assert_close(np.where(m > 0, k1, 0), np.where(m > 0, d, 0), what="k1")
    with pytest.raises(ValueError, match="kl_estimator"):
        shaping.get_method("grpo").loss(batch, kl_coef=0.1, kl_estimator="k4")


@given(batch=batches(frozenset({"entropy"})), top=st.sampled_from([0.1, 0.2, 0.5]))
def test_top_entropy_mask_keeps_the_gradient_of_the_high_entropy_tokens_only(batch, top):
    got = _grad("grpo", batch, top_entropy_quantile=top)[1]["logp"]
    full = _grad("grpo", batch)[1]["logp"]
    keep = batch["mask"] > 0
    high = core.batch_high_entropy_mask(batch["entropy"], keep, top=top)
    assert np.all(got[~high] == 0)
    assert_close(got[high], full[high], what="high-entropy tokens keep GRPO's gradient")
    if keep.any():
        h = batch["entropy"][keep]
        assert np.all(batch["entropy"][high] >= np.quantile(h, 1 - top) - 1e-12)
    assert shaping.get_method("grpo").needs_for(top_entropy_quantile=top) == {"entropy"}


@given(r=reward_groups(3, 4), scale=st.floats(0.1, 10.0))
def test_lite_ppo_is_scale_free_and_centred_per_group(r, scale):
    lite = shaping.get_method("lite_ppo")
    a = lite.advantages({"rewards": r}, eps=0.0)
    assert_close(a.sum(-1), np.zeros(3), atol=1e-9, what="group sums")
    assert_close(lite.advantages({"rewards": r * scale}, eps=0.0), a, what="scale")
    flat = r.reshape(-1)
    if flat.std(ddof=1) > 0:
        want = (r - r.mean(-1, keepdims=True)) / flat.std(ddof=1)
        assert_close(a, want, what="group mean, batch std")


@given(r=reward_groups(3, 5))
def test_grpo_passk_credits_only_a_unique_best(r):
    a = shaping.get_method("grpo_passk").advantages({"rewards": r})
    for row, adv in zip(r, a, strict=True):
        if (row == 1).sum() == 1:
            assert (adv != 0).sum() == 1 and adv[row == 1][0] > 0
            assert adv[row == 1][0] == pytest.approx(1 / (row.std(ddof=1) + 1e-6))
        else:
            assert np.all(adv == 0)


# PKPO (Walder & Karkhanis 2025, arXiv 2505.15201) -----------------------------------------------

pkpo = shaping.get_method("pkpo")
#: Rewards with frequent ties: a few repeated values and any value in [-2, 2].
_REWARD = st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(-2.0, 2.0))


@st.composite
def _continuous(draw, max_g: int = 6) -> tuple[np.ndarray, int]:
    n_b, n_g = draw(st.integers(1, 3)), draw(st.integers(1, max_g))
    return draw(hnp.arrays(np.float64, (n_b, n_g), elements=_REWARD)), draw(st.integers(1, n_g))


@given(case=_continuous())
def test_pkpo_equals_the_subset_enumeration_on_continuous_rewards(case):
    r, k = case
    want = ref.pkpo_advantages(r, k)
    assert_close(pkpo.advantages({"rewards": r}, k=k), want, what=f"k={k} (numpy)")
    t = torch.from_numpy(r)
    assert_close(pkpo.advantages({"rewards": t}, k=k), want, what=f"k={k} (torch)")


@given(value=_REWARD, n_b=st.integers(1, 3), n_g=st.integers(1, 6), data=st.data())
def test_pkpo_gives_zero_to_a_group_of_equal_rewards(value, n_b, n_g, data):
    k = data.draw(st.integers(1, n_g))
    a = pkpo.advantages({"rewards": np.full((n_b, n_g), value)}, k=k)
    assert np.array_equal(a, np.zeros((n_b, n_g)))


@given(case=_continuous())
def test_pkpo_with_k_one_is_the_leave_one_out_mean_baseline(case):
    r, _ = case
    n = r.shape[1]
    a = pkpo.advantages({"rewards": r}, k=1)
    want = n / (n - 1) * (r - r.mean(1, keepdims=True)) if n > 1 else np.zeros_like(r)
    assert_close(a, want, atol=1e-12, what="k = 1: RLOO")


@given(case=_continuous())
def test_pkpo_is_nonnegative_and_at_k_equals_g_credits_only_a_unique_best(case):
    r, k = case
    assert np.all(pkpo.advantages({"rewards": r}, k=k) >= 0) or k == 1
    n = r.shape[1]
    a = pkpo.advantages({"rewards": r}, k=n)
    for row, adv in zip(r, a, strict=True):
        top = np.sort(row)[::-1]
        if n > 1 and top[0] > top[1]:
            # Tang et al.'s k = n baseline (max of the others): G (r_max - r_second) on the best.
            assert adv[np.argmax(row)] == pytest.approx(n * (top[0] - top[1]), abs=1e-12)
            assert (adv != 0).sum() == 1
        else:
            assert np.all(adv == 0)


@given(st.integers(2, 8), st.data())
def test_pkpo_binary_closed_form(n, data):
    k = data.draw(st.integers(2, n))
    r = data.draw(reward_groups(3, n))
    a = pkpo.advantages({"rewards": r}, k=k)
    for row, adv in zip(r, a, strict=True):
        c = int(row.sum())
        pos = k * math.comb(n - c, k - 1) / math.comb(n - 1, k - 1)
        assert_close(adv, np.where(row == 1, pos, 0.0), atol=1e-12, what=f"c={c}, k={k}")


def _outcomes(levels: int, n: int) -> np.ndarray:
    # (levels^n, n): every joint outcome of a group of n responses (category indices).
    return np.array(list(itertools.product(range(levels), repeat=n)), dtype=np.int64)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6])
def test_pkpo_is_unbiased_for_bernoulli_pass_at_k_and_its_gradient(n):
    # x ~ Bernoulli(p), p = sigmoid(theta): d log p(x) / d theta = x - p. Exact expectations
    # over all 2^n groups: E[rho] = pass@k and E[(1/n) sum_i A_i (x_i - p)] = d pass@k / d theta.
    x = _outcomes(2, n).astype(np.float64)
    for p in (0.1, 0.35, 0.8):
        prob = np.prod(np.where(x == 1, p, 1 - p), axis=1)
        for k in range(1, n + 1):
            rho = np.array([ref.max_at_k(list(row), k) for row in x])
            assert prob @ rho == pytest.approx(1 - (1 - p) ** k, abs=1e-12)
            if n == 1:
                continue  # no leave-one-out baseline exists: the advantage is 0 by choice
            a = pkpo.advantages({"rewards": x}, k=k)
            grad = prob @ (a * (x - p)).mean(axis=1)
            want = k * (1 - p) ** (k - 1) * p * (1 - p)
            assert grad == pytest.approx(want, abs=1e-12), (p, k)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_pkpo_is_unbiased_for_the_gradient_of_max_at_k_with_continuous_rewards(n):
    # Three reward levels, softmax(theta) probabilities: d log p(x) / d theta = e_x - p.
    # max@k = sum_a v_a (F_a^k - F_{a-1}^k), F the CDF over ascending levels.
    v = np.array([-0.5, 0.2, 1.0])
    p = np.exp([0.3, -0.4, -1.1])
    p /= p.sum()
    cats = _outcomes(3, n)
    prob = np.prod(p[cats], axis=1)
    g = v[cats]
    eye = np.eye(3)
    cdf = np.cumsum(p)
    # dF_a / d theta_c = p_c [c <= a] - F_a p_c; F_0 = 0 below the lowest level.
    d_cdf = np.tril(np.ones((3, 3))) * p[None, :] - cdf[:, None] * p[None, :]
    prev, d_prev = np.concatenate([[0.0], cdf[:-1]]), np.vstack([np.zeros(3), d_cdf[:-1]])
    for k in range(1, n + 1):
        rho = np.array([ref.max_at_k(list(row), k) for row in g])
        assert prob @ rho == pytest.approx(v @ (cdf**k - prev**k), abs=1e-12)
        # k = 1 (0^0 = 1): d E[r] / d theta, which the leave-one-out baseline keeps unbiased.
        d_max = k * (cdf[:, None] ** (k - 1) * d_cdf - prev[:, None] ** (k - 1) * d_prev)
        want = v @ d_max
        a = pkpo.advantages({"rewards": g}, k=k)  # (outcomes, n)
        score = eye[cats] - p  # (outcomes, n, 3)
        grad = prob @ (a[..., None] * score).mean(axis=1)
        assert_close(grad, want, atol=1e-12, what=f"k={k}")


def test_pkpo_k_outside_one_to_g_raises_naming_k_and_g():
    r = np.zeros((2, 3))
    for k in (0, 4):
        with pytest.raises(ValueError, match=r"\bk\b.*(G = 3|>= 1)"):
            pkpo.advantages({"rewards": r}, k=k)
