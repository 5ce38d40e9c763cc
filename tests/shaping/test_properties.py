"""Properties the papers state or imply, checked on the fast implementation.

These do not use the slow references: each compares two fast quantities that theory says are
equal (a method at a limiting setting and the method it reduces to), or a fast gradient with a
closed form written out here (CaSP's smoothed target, seed 004 Eq. 12).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import shaping
from shaping.strategies import batches, reward_groups

from .helpers import assert_close, check_every, evaluate
from .strategies import random_batch

grpo = shaping.get_method("grpo")


def _loss_and_grads(name, batch, **hyper):
    pytest.importorskip("torch")
    return evaluate(shaping.get_method(name), batch, "torch.grad", hyper)


def _assert_same_loss(a, b, what):
    assert_close(a[0], b[0], what=f"{what}: loss")
    for key in b[1]:
        assert_close(a[1][key], b[1][key], what=f"{what}: d loss / d {key}")


# ProGRPO (seed 003, Alg. 1) --------------------------------------------------------------------


@pytest.mark.parametrize("confidence_ref", ["prompt", "group_mean"])
@given(batch=batches(frozenset({"prompt_logp", "prompt_mask"})))
def test_progrpo_leaves_uniform_groups_unchanged(confidence_ref, batch):
    adv = shaping.get_method("progrpo").advantages(batch, alpha=1.0, confidence_ref=confidence_ref)
    base = grpo.advantages(batch)
    r = batch["rewards"]
    uniform = (r.min(1) == r.max(1))[:, None]
    assert_close(np.where(uniform, adv, 0.0), np.where(uniform, base, 0.0), what="uniform groups")
    if confidence_ref == "group_mean":
        # Eq. 10: the correction c_bar - c_i sums to zero over each group.
        assert_close(adv.sum(1), base.sum(1), atol=1e-9, what="group sums")


def test_progrpo_reweights_mixed_groups_towards_low_confidence():
    batch = random_batch(seed=1)
    adv = shaping.get_method("progrpo").advantages(batch, confidence_ref="group_mean", alpha=1.0)
    base = grpo.advantages(batch)
    conf = np.array(
        [[_confidence(batch["logp_old"][b, g], batch["mask"][b, g]) for g in range(5)] for b in [0]]
    )
    # Group 0 is mixed: a less confident response gets a larger advantage increment.
    delta = adv[0] - base[0]
    order = np.argsort(conf[0])
    assert np.all(np.diff(delta[order]) <= 1e-12)
    assert np.ptp(delta) > 1e-3


def _confidence(logp, mask):
    xs = np.sort(logp[mask > 0])
    k = max(1, math.ceil(0.2 * len(xs))) if len(xs) else 1
    return math.exp(xs[:k].sum() / k) if len(xs) else 1.0


# DS-GRPO, entropy bonus/penalty, W-REINFORCE reductions ---------------------------------------


@given(batch=batches(frozenset({"entropy"})), agg=st.sampled_from(shaping.AGG_MODES))
def test_ds_grpo_with_zero_gammas_is_grpo(batch, agg):
    want = _loss_and_grads("grpo", batch, loss_agg=agg)
    for name in ("ds_grpo", "ds_grpo_pos", "ds_grpo_neg"):
        zero = {k: 0.0 for k in ("gamma_p", "gamma_n") if k in shaping.METHODS[name].defaults}
        got = _loss_and_grads(name, batch, loss_agg=agg, **zero)
        _assert_same_loss(got, want, name)


@given(batch=batches())
def test_ds_ablations_are_ds_grpo_with_one_gamma_zero(batch):
    ds = shaping.get_method("ds_grpo")
    assert_close(
        shaping.get_method("ds_grpo_pos").advantages(batch, gamma_p=0.05),
        ds.advantages(batch, gamma_p=0.05, gamma_n=0.0),
        what="DS-Positive",
    )
    assert_close(
        shaping.get_method("ds_grpo_neg").advantages(batch, gamma_n=0.05),
        ds.advantages(batch, gamma_p=0.0, gamma_n=0.05),
        what="DS-Negative",
    )


@given(batch=batches(), gamma_p=st.floats(0.001, 0.1))
def test_ds_grpo_positive_term_favours_unlikely_correct_responses(batch, gamma_p):
    # seed 000 Eq. 4: on C the shaped reward is r - gamma_p log pi, larger for unlikely tau.
    adv = shaping.get_method("ds_grpo_pos").advantages(batch, gamma_p=gamma_p)
    ell = shaping.sequence_logp(batch["logp_old"], batch["mask"])
    correct = batch["rewards"] > 0.5
    assert_close(
        np.where(correct, adv - grpo.advantages(batch), 0.0),
        np.where(correct, -gamma_p * ell, 0.0),
        what="DS-Positive shift",
    )


@pytest.mark.parametrize("form", ["trajectory", "token"])
@given(batch=batches(frozenset({"entropy"})))
def test_entropy_bonus_and_penalty_are_symmetric_around_grpo(form, batch):
    bonus = _loss_and_grads("entropy_bonus", batch, form=form, eta=0.05)
    penalty = _loss_and_grads("entropy_penalty", batch, form=form, eta=0.05)
    plain = _loss_and_grads("grpo", batch)
    if form == "token":
        # The token term is linear in eta: bonus + penalty = 2 GRPO exactly.
        assert_close(bonus[0] + penalty[0], 2 * plain[0], what="loss")
        for key in plain[1]:
            assert_close(bonus[1][key] + penalty[1][key], 2 * plain[1][key], what=key)
    eta0 = _loss_and_grads("entropy_bonus", batch, form=form, eta=0.0)
    _assert_same_loss(eta0, plain, "eta = 0")


@given(batch=batches())
def test_w_reinforce_with_lam_one_is_psr_plus_nsr(batch):
    w = shaping.get_method("w_reinforce").advantages(batch, lam=1.0)
    psr = shaping.get_method("psr").advantages(batch)
    nsr = shaping.get_method("nsr").advantages(batch)
    assert_close(w, psr + nsr, what="W-REINFORCE(1)")
    assert set(np.unique(psr)) <= {0.0, 1.0} and set(np.unique(nsr)) <= {0.0, -1.0}


@given(batch=batches())
def test_unlikeliness_with_zero_beta_is_grpo_and_favours_unlikely_correct(batch):
    method = shaping.get_method("unlikeliness")
    assert_close(method.advantages(batch, beta_rank=0.0), grpo.advantages(batch), what="beta=0")
    adv = method.advantages(batch, beta_rank=0.5)
    norm = shaping.sequence_logp(batch["logp_old"], batch["mask"], reduction="mean")
    for b in range(adv.shape[0]):
        correct = np.flatnonzero(batch["rewards"][b] > 0.5)
        for i in correct:
            for j in correct:
                if norm[b, i] < norm[b, j]:
                    # A strictly less likely correct response never gets a smaller advantage.
                    assert adv[b, i] >= adv[b, j] - 1e-12


# CaSP (seed 004) -------------------------------------------------------------------------------


@given(batch=batches(frozenset({"entropy", "cand_logp"})), agg=st.sampled_from(shaping.AGG_MODES))
def test_casp_with_alpha_zero_and_unit_penalty_is_the_clipped_surrogate(batch, agg):
    n_cand = batch["cand_logp"].shape[-1]
    got = _loss_and_grads("casp", batch, alpha=0.0, lam_top1=1.0, top_n=n_cand, loss_agg=agg)
    want = _loss_and_grads("grpo", batch, loss_agg=agg)
    _assert_same_loss(got, want, "casp(alpha=0, lam=1)")
    assert_close(got[1]["cand_logp"], np.zeros_like(batch["cand_logp"]), what="no candidate grad")
    assert_close(got[1]["entropy"], np.zeros_like(batch["entropy"]), what="entropy is detached")


def _casp_logit_setup(seed: int, n_vocab: int = 7, n_cand: int = 3):
    """On-policy batch built from logits: returns (logits leaf, batch of torch tensors, y, cand)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    n_b, n_g, n_t = 2, 4, 6
    logits = torch.tensor(rng.normal(size=(n_b, n_g, n_t, n_vocab)) * 2.0, requires_grad=True)
    logp_all = torch.log_softmax(logits, dim=-1)
    # Candidates ranked by pi_old = pi_theta; the sampled token is any vocabulary entry.
    cand = torch.argsort(logits.detach(), dim=-1, descending=True)[..., :n_cand]
    y = torch.tensor(rng.integers(0, n_vocab, size=(n_b, n_g, n_t)))
    # Make some sampled tokens the rank-1 candidate, so the negative branch is exercised too.
    y = torch.where(torch.tensor(rng.uniform(size=y.shape) < 0.4), cand[..., 0], y)
    match = cand == y[..., None]
    rank = torch.where(match.any(-1), match.float().argmax(-1), torch.tensor(n_cand))
    logp = logp_all.gather(-1, y[..., None])[..., 0]
    cand_logp = logp_all.gather(-1, cand)
    mask = torch.ones(n_b, n_g, n_t, dtype=torch.float64)
    mask[0, 1, 4:] = 0.0
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    batch = {
        "rewards": rewards,
        "mask": mask,
        "logp": logp,
        "logp_old": logp.detach(),
        "entropy": shaping.token_entropy(logits),
        "cand_logp": cand_logp,
        "cand_logp_old": cand_logp.detach(),
        "sampled_rank": rank,
    }
    return logits, batch, y, cand


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("alpha", [0.01, 0.4, 1.0])
def test_casp_logit_gradient_is_the_topn_smoothed_target(seed, alpha):
    torch = pytest.importorskip("torch")
    lam_top1, quantile = 1.1, 0.5
    logits, batch, y, cand = _casp_logit_setup(seed)
    loss, _ = shaping.get_method("casp").loss(
        batch, alpha=alpha, top_n=cand.shape[-1], quantile=quantile, lam_top1=lam_top1
    )
    (grad,) = torch.autograd.grad(loss, logits)

    mask = batch["mask"]
    adv = grpo.advantages(batch)[..., None]
    high = shaping.high_entropy_mask(batch["entropy"].detach(), mask, quantile=quantile)
    pi = torch.softmax(logits.detach(), dim=-1)
    n_vocab = pi.shape[-1]
    e_y = torch.nn.functional.one_hot(y, n_vocab).double()
    e_cand = torch.nn.functional.one_hot(cand, n_vocab).double().mean(-2)
    w = high.double()[..., None]
    # Positive branch (A > 0): smoothed target (1 - alpha w) e_y + (alpha w / N) sum_n e_v(n).
    target_pos = (1.0 - alpha * w) * e_y + alpha * w * e_cand - pi
    # Negative branch (A < 0): lam_top1 times the plain direction on high-entropy rank-1 tokens.
    top1 = (high & (batch["sampled_rank"] == 0)).double()[..., None]
    target_neg = (1.0 + (lam_top1 - 1.0) * top1) * (e_y - pi)
    direction = torch.where(adv[..., None] > 0, target_pos, target_neg)
    # Ratios are 1 (inside the clip range); token-mean weights every token by 1 / sum(mask).
    want = -adv[..., None] * direction * mask[..., None] / mask.sum()
    assert_close(grad, want, atol=1e-12, what="d loss / d logits")

    positive_high = (adv > 0) & high
    assert positive_high.any(), "the batch must contain smoothed tokens"
    plain = -adv[..., None] * (e_y - pi) * mask[..., None] / mask.sum()
    assert (grad - plain).abs()[positive_high].max() > 1e-4 * alpha


# pass@k (Chen et al. 2025) ---------------------------------------------------------------------


@given(st.integers(1, 8), st.data())
def test_passk_advantages_closed_form(n, data):
    k = data.draw(st.integers(1, n))
    rewards = data.draw(reward_groups(data.draw(st.integers(1, 3)), n))
    adv = shaping.get_method("passk").advantages({"rewards": rewards}, k=k)
    for b in range(rewards.shape[0]):
        n_neg = int((rewards[b] < 0.5).sum())
        r_bar = 1 - math.comb(n_neg, k) / math.comb(n, k)
        sigma = math.sqrt(r_bar * (1 - r_bar))
        neg_frac = math.comb(n_neg - 1, k - 1) / math.comb(n - 1, k - 1) if n_neg >= 1 else 0.0
        for g in range(n):
            if sigma == 0:
                want = 0.0
            elif rewards[b, g] > 0.5:
                want = (1 - r_bar) / sigma
            else:
                want = (1 - r_bar - neg_frac) / sigma
            assert adv[b, g] == pytest.approx(want, abs=1e-9)
        # Identity: N_neg C(N_neg-1, k-1)/C(N-1, k-1) = N (1 - R), so the group mean is zero.
        assert adv[b].mean() == pytest.approx(0.0, abs=1e-9)


@given(st.integers(2, 8), st.data())
def test_passk_with_k_one_is_grpo_with_population_std(n, data):
    rewards = data.draw(reward_groups(3, n))
    got = shaping.get_method("passk").advantages({"rewards": rewards}, k=1)
    want = grpo.advantages({"rewards": rewards}, std_correction=0, eps=0.0)
    assert_close(got, want, atol=1e-12, what="pass@1 advantages")


# DSDR (seed 001) -------------------------------------------------------------------------------


@given(batch=batches(frozenset({"diversity"})), lam=st.floats(0.01, 1.0))
def test_dsdr_nonconstant_reward_gives_nonzero_advantage(batch, lam):
    """Prop. C.4: if the shaped reward r~ is not constant in a group, some A_i != 0."""
    adv = shaping.get_method("dsdr").advantages(batch, lam=lam)
    r = batch["rewards"]
    shaped = r + lam * (r > 0.5) * np.minimum(batch["diversity"], 0.5)
    for b in range(r.shape[0]):
        if np.ptp(shaped[b]) > 1e-9:
            assert np.abs(adv[b]).max() > 0
        else:
            assert np.abs(adv[b]).max() < 1e-6


def test_dsdr_gives_signal_to_an_all_correct_group():
    # The point of the correct-only diversity bonus: GRPO gives an all-correct group nothing.
    batch = random_batch(seed=4)
    assert np.all(grpo.advantages(batch)[1] == 0)
    adv = shaping.get_method("dsdr").advantages(batch)
    assert np.abs(adv[1]).max() > 0.1


# Errors ---------------------------------------------------------------------------------------


def test_unknown_method_lists_known_names():
    with pytest.raises(ValueError, match="no_such_method") as info:
        shaping.get_method("no_such_method")
    for name in shaping.METHODS:
        assert name in str(info.value)


def test_registering_a_duplicate_raises():
    with pytest.raises(ValueError, match="grpo"):
        shaping.register(shaping.METHODS["grpo"])
    assert shaping.get_method("grpo") is grpo


def test_unknown_hyper_parameter_is_named():
    batch = random_batch(seed=0)

    def check(name: str) -> None:
        method = shaping.get_method(name)
        for fn in (method.loss, method.advantages):
            with pytest.raises(ValueError, match="gamma_q"):
                fn(batch, gamma_q=0.1)

    check_every(((name,) for name in sorted(shaping.METHODS)), check)


_NONNEGATIVE = (
    "gamma_p",
    "gamma_n",
    "eta",
    "eta_pos",
    "eta_neg",
    "lam",
    "sigma",
    "lam_loc",
    "beta_rank",
    "kl_coef",
    "entropy_coef",
    "eps",
    "eps_high",
    "eps_low",
)
_BAD_VALUES = [
    (name, key, -0.1)
    for name in sorted(shaping.METHODS)
    for key in shaping.METHODS[name].defaults
    if key in _NONNEGATIVE
] + [
    ("progrpo", "alpha", -0.1),
    ("casp", "alpha", -0.1),
    ("casp", "alpha", 1.5),
    ("dsdr", "tau", 0.0),
    ("casp", "lam_top1", 0.0),
    ("casp", "quantile", 0.0),
    ("casp", "quantile", 1.0),
    ("casp", "quantile", -0.2),
    ("casp", "quantile", 1.3),
    ("casp", "top_n", 0),
    ("casp", "top_n", 4),
    ("progrpo", "low_frac", 0.0),
    ("progrpo", "low_frac", 1.5),
    ("passk", "k", 0),
    ("passk", "k", 6),
    ("pkpo", "k", 0),
    ("pkpo", "k", 6),
    ("pkpo", "k", 2.5),
    ("grpo", "std_correction", 2),
    ("grpo", "loss_agg", "seq-sum"),
    ("entropy_bonus", "form", "both"),
    ("ds_grpo", "logp_reduction", "max"),
    ("progrpo", "confidence_ref", "base"),
]


def test_invalid_hyper_parameter_raises_naming_it():
    batch = random_batch(seed=0)  # G = 5, N = 3 candidates

    def check(name: str, key: str, value: object) -> None:
        with pytest.raises(ValueError, match=rf"\b{key}\b"):
            shaping.get_method(name).loss(batch, **{key: value})

    check_every(_BAD_VALUES, check)


_BAD_SHAPES = [
    ("logp", lambda b: b["logp"][..., :-1]),
    ("logp_old", lambda b: b["logp_old"][:, :-1]),
    ("mask", lambda b: b["mask"][:-1]),
    ("logp_ref", lambda b: b["logp_ref"][..., :-1]),
    ("entropy", lambda b: b["entropy"][..., None]),
    ("cand_logp", lambda b: b["cand_logp"][..., 0]),
    ("sampled_rank", lambda b: b["sampled_rank"][..., :-1]),
    ("diversity", lambda b: b["diversity"][:, :-1]),
    ("prompt_logp", lambda b: b["prompt_logp"][:-1]),
    ("prompt_mask", lambda b: b["prompt_mask"][:, :-1]),
]


@pytest.mark.parametrize(("key", "cut"), _BAD_SHAPES, ids=[k for k, _ in _BAD_SHAPES])
def test_mismatched_shapes_raise_naming_the_key(key, cut):
    batch = random_batch(seed=0)
    batch[key] = cut(batch)
    users = []
    for name, method in sorted(shaping.METHODS.items()):
        hyper = {"kl_coef": 0.1, **_token_form(name)}
        if key in ("logp", "logp_old", "mask") or key in method.needs_for(**hyper):
            users.append((name, hyper))
    assert users
    for name, hyper in users:
        with pytest.raises(ValueError, match=key):
            shaping.get_method(name).loss(batch, **hyper)


def _token_form(name):
    return {"form": "token"} if "form" in shaping.METHODS[name].defaults else {}


def test_missing_key_is_named():
    batch = random_batch(seed=0)
    del batch["cand_logp"]
    with pytest.raises(ValueError, match="cand_logp"):
        shaping.get_method("casp").loss(batch)
    del batch["logp_ref"]
    with pytest.raises(ValueError, match="logp_ref"):
        grpo.loss(batch, kl_coef=0.1)


def test_block_arguments_are_validated():
    r = np.zeros((2, 3))
    with pytest.raises(ValueError, match="k"):
        shaping.passk_advantages(r, k=4)
    with pytest.raises(ValueError, match="quantile"):
        shaping.masked_quantile(np.zeros((2, 3)), np.ones((2, 3)), 1.5)
    with pytest.raises(ValueError, match="loss_agg"):
        shaping.agg_loss(np.zeros((2, 3)), np.ones((2, 3)), "sum")
    with pytest.raises(ValueError, match="shape"):
        shaping.agg_loss(np.zeros((2, 3)), np.ones((2, 4)))
    with pytest.raises(ValueError, match="std_correction"):
        shaping.grpo_advantages(r, std_correction=3)
    with pytest.raises(ValueError, match="logp_reduction"):
        shaping.sequence_logp(np.zeros((1, 2, 3)), np.ones((1, 2, 3)), reduction="max")
