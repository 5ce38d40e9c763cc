"""What the policy losses the field uses promise (issue 39), on the fast implementation.

Each test compares a method with GRPO's clipped surrogate at a setting where theory says they
agree, or checks the one thing the method changes (which tokens lose their gradient, which
advantages are nonzero). The slow references (test_methods.py) check every value and gradient.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import shaping
from shaping import core

from .helpers import assert_close, evaluate
from .strategies import batches, random_batch, reward_groups

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
    }
    assert set(over) | shaping.OFF_POLICY_ONLY >= {
        "dual_clip", "gspo", "cispo", "clip_cov", "kl_cov", "entropy_adv", "lite_ppo", "grpo_passk"
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
