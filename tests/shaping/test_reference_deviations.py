"""Issue 54, items 7 and 8: two losses against their references, computed here independently
(vectorized NumPy written from the references' documented behaviour) on shared random batches
with padding, a uniform group and ratios far from 1.

- The entropy bonus under the 80/20 mask is TRL ``GRPOTrainer``'s: on the kept (high-entropy)
  tokens only, averaged over them (``loss_type = "bnpo"``, our ``token-mean``).
- Clip-Cov's ``clip_cov_select = "random"`` draws verl's ``compute_policy_loss_clip_cov``
  distribution (``torch.randperm`` over the in-band tokens): every draw is a subset of the band
  of verl's size with verl's loss, each band token drawn at verl's rate, and the mean loss is
  verl's expectation. The default ``"top"`` (the committed studies') sits at the low end.
"""

from __future__ import annotations

import numpy as np
import pytest

import shaping

from .helpers import assert_close, evaluate

EPS = 0.2  # clip widths, the methods' defaults


def _batch(seed: int, *, uniform_group: bool) -> dict[str, np.ndarray]:
    """B = 4 prompts x G = 8 responses x T = 24 tokens; padding after random lengths (garbage
    there), ratios exp(N(0, 0.7)) far from 1, entropies in (0, 3) nats; group 0 all correct
    when `uniform_group`."""
    rng = np.random.default_rng(seed)
    b, g, t = 4, 8, 24
    lengths = rng.integers(3, t + 1, size=(b, g))
    mask = (np.arange(t) < lengths[..., None]).astype(np.float64)
    logp_old = -rng.exponential(1.5, size=(b, g, t))
    logp = np.minimum(logp_old + rng.normal(0.0, 0.7, size=(b, g, t)), 0.0)
    entropy = rng.uniform(0.01, 3.0, size=(b, g, t))
    rewards = rng.integers(0, 2, size=(b, g)).astype(np.float64)
    rewards[:, :2] = [1.0, 0.0]  # every group mixed ...
    if uniform_group:
        rewards[0] = 1.0  # ... but the first
    for x in (logp_old, logp, entropy):
        x[mask == 0] = np.nan  # padding holds garbage
    return {"rewards": rewards, "mask": mask, "logp": logp, "logp_old": logp_old,
            "entropy": entropy}  # fmt: skip


def _grpo_advantages(rewards: np.ndarray) -> np.ndarray:
    # Group mean and unbiased std, eps 1e-6 (TRL's scale_rewards="group" with the package's eps).
    std = rewards.std(axis=1, ddof=1, keepdims=True)
    return (rewards - rewards.mean(axis=1, keepdims=True)) / (std + 1e-6)


def _policy_terms(batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """verl's / TRL's ``pg_losses1 = -A ratio`` and ``pg_losses2 = -A clip(ratio)`` (0 at
    padding) and the response-token mask as bool."""
    m = batch["mask"] > 0.5
    a = np.broadcast_to(_grpo_advantages(batch["rewards"])[..., None], m.shape)
    ratio = np.exp(np.where(m, batch["logp"] - batch["logp_old"], 0.0))
    return -a * ratio, -a * np.clip(ratio, 1 - EPS, 1 + EPS), m


# ---------------------------------------------------------------------------------------------
# Item 7: the entropy bonus under the 80/20 mask, as TRL


def _trl_loss(batch: dict[str, np.ndarray], coef: float, rho: float) -> float:
    """TRL ``GRPOTrainer._compute_loss`` with ``loss_type = "bnpo"``, ``beta = 0``,
    ``top_entropy_quantile = rho`` and ``entropy_coef = coef``: the policy term times the
    entropy mask, summed over every completion token and divided by their count; minus
    ``coef`` times the mean entropy of the kept tokens."""
    pg1, pg2, m = _policy_terms(batch)
    h = np.where(m, batch["entropy"], 0.0)
    threshold = np.quantile(h[m], 1.0 - rho)  # torch.quantile's linear interpolation
    kept = (h >= threshold) & m
    per_token = np.maximum(pg1, pg2) * kept
    policy = per_token[m].sum() / m.sum()
    return float(policy - coef * h[kept].sum() / kept.sum())


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("coef", "rho"), [(0.01, 0.2), (0.05, 0.5), (0.3, 0.8)])
def test_entropy_bonus_under_the_top_entropy_mask_is_trls(seed, coef, rho):
    batch = _batch(seed, uniform_group=True)
    hyper = {"entropy_coef": coef, "top_entropy_quantile": rho}
    loss, grads = evaluate(shaping.get_method("grpo"), batch, "torch.grad", hyper)
    assert_close(loss, _trl_loss(batch, coef, rho), rtol=1e-12, atol=1e-14, what="loss")
    # The entropy reaches the loss through the bonus alone (the mask is detached):
    # d loss / d H_t = -coef / |kept| on the kept tokens, 0 elsewhere (padding included).
    m = batch["mask"] > 0.5
    h = np.where(m, batch["entropy"], 0.0)
    kept = (h >= np.quantile(h[m], 1.0 - rho)) & m
    assert_close(grads["entropy"], np.where(kept, -coef / kept.sum(), 0.0), what="d/dH")
    # The former loss (the bonus on every token, over every token) is not TRL's.
    pg1, pg2, _ = _policy_terms(batch)
    former = (np.maximum(pg1, pg2) * kept)[m].sum() / m.sum() - coef * h[m].mean()
    assert abs(float(loss) - former) > 1e-4


def test_entropy_bonus_without_the_mask_is_unchanged():
    # top_entropy_quantile = 1: verl's entropy_coeff, -coef * agg(H) over every token.
    batch = _batch(0, uniform_group=True)
    loss, _ = evaluate(shaping.get_method("grpo"), batch, "numpy", {"entropy_coef": 0.01})
    pg1, pg2, m = _policy_terms(batch)
    want = np.maximum(pg1, pg2)[m].mean() - 0.01 * batch["entropy"][m].mean()
    assert_close(loss, want, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------------------------------------
# Item 8: Clip-Cov's random selection, as verl


def _verl_band(batch: dict[str, np.ndarray], lb: float, ub: float) -> tuple[np.ndarray, int]:
    """verl's eligible tokens (``top_k_idx`` before the draw) and ``clip_num``: response tokens
    not clipped by the surrogate (``pg_losses2 > pg_losses1``) whose covariance
    ``(A - mean A)(log pi - mean log pi)`` (token means over the batch) lies in ``(lb, ub)``."""
    pg1, pg2, m = _policy_terms(batch)
    a = np.broadcast_to(_grpo_advantages(batch["rewards"])[..., None], m.shape)
    lp = np.where(m, batch["logp"], 0.0)
    cov = (a - a[m].mean()) * (lp - lp[m].mean())
    band = m & ~(pg2 > pg1) & (cov > lb) & (cov < ub)
    return band, cov


def _verl_loss(batch: dict[str, np.ndarray], chosen: np.ndarray) -> float:
    """verl's ``pg_losses = max(pg_losses1, pg_losses2) * corr`` (``corr`` 0 on the drawn
    tokens), token-mean over the response tokens."""
    pg1, pg2, m = _policy_terms(batch)
    return float((np.maximum(pg1, pg2) * ~chosen)[m].sum() / m.sum())


RATIO, LB, UB = 0.02, 1.0, 5.0


def _hyper(select: str, seed: int = 0) -> dict[str, object]:
    return {"clip_cov_ratio": RATIO, "clip_cov_lb": LB, "clip_cov_ub": UB,
            "clip_cov_select": select, "clip_cov_seed": seed}  # fmt: skip


def _drawn(batch: dict[str, np.ndarray], grad: np.ndarray, band: np.ndarray) -> np.ndarray:
    # A drawn token's loss is detached: its gradient is exactly 0; an undrawn in-band token's is
    # -A ratio / N, nonzero (no uniform group here, and the band's A is nonzero).
    return band & (grad == 0.0)


def test_clip_cov_random_draw_is_verls_distribution():
    batch = _batch(3, uniform_group=False)
    band, cov = _verl_band(batch, LB, UB)
    m = batch["mask"] > 0.5
    k = max(int(RATIO * m.sum()), 1)
    n_band = int(band.sum())
    drawn_size = min(k, n_band)
    assert n_band > 2 * k  # a real draw: many subsets are possible
    pg1, pg2, _ = _policy_terms(batch)
    loss_tok = np.maximum(pg1, pg2)
    # verl's expectation: each band token is drawn with probability drawn_size / n_band.
    expected = float((loss_tok[m].sum() - drawn_size / n_band * loss_tok[band].sum()) / m.sum())

    method = shaping.get_method("clip_cov")
    draws = 300
    counts = np.zeros(band.shape)
    losses = []
    for seed in range(draws):
        loss, grads = evaluate(method, batch, "torch.grad", _hyper("random", seed))
        chosen = _drawn(batch, grads["logp"], band)
        assert int(chosen.sum()) == drawn_size
        assert_close(loss, _verl_loss(batch, chosen), rtol=1e-12, atol=1e-14, what=f"seed {seed}")
        counts += chosen
        losses.append(float(loss))
    rate = drawn_size / n_band
    se = np.sqrt(rate * (1 - rate) / draws)
    assert np.all(np.abs(counts[band] / draws - rate) < 5 * se)  # uniform over the band
    assert not counts[~band].any()
    assert abs(np.mean(losses) - expected) < 4 * np.std(losses) / np.sqrt(draws)

    # verl's own procedure (a uniform permutation of the band, its first clip_num), 300 draws.
    rng = np.random.default_rng(0)
    idx = np.argwhere(band)
    verl = []
    for _ in range(draws):
        pick = idx[rng.permutation(len(idx))[:drawn_size]]
        chosen = np.zeros(band.shape, dtype=bool)
        chosen[tuple(pick.T)] = True
        verl.append(_verl_loss(batch, chosen))
    assert abs(np.mean(verl) - expected) < 4 * np.std(verl) / np.sqrt(draws)

    # "top" (the default): the drawn_size in-band tokens of largest covariance.
    top = np.zeros(band.shape, dtype=bool)
    order = np.argsort(-np.where(band, cov, -np.inf), axis=None, kind="stable")[:drawn_size]
    top.flat[order] = True
    loss_top, _ = evaluate(method, batch, "numpy", _hyper("top"))
    assert_close(loss_top, _verl_loss(batch, top), rtol=1e-12, atol=1e-14)


def test_clip_cov_random_draw_is_a_function_of_the_inputs():
    batch = _batch(4, uniform_group=True)
    method = shaping.get_method("clip_cov")
    a = evaluate(method, batch, "numpy", _hyper("random", 7))[0]
    assert evaluate(method, batch, "numpy", _hyper("random", 7))[0] == a  # no hidden state
    assert_close(evaluate(method, batch, "torch", _hyper("random", 7))[0], a, rtol=1e-14)
    other = evaluate(method, batch, "numpy", _hyper("random", 8))[0]
    assert other != a  # another seed, another draw
    # One seed, another batch (the behaviour log-probs salt the draw): another subset.
    shifted = {**batch, "logp_old": batch["logp_old"] - 1e-3, "logp": batch["logp"] - 1e-3}
    band, _ = _verl_band(batch, LB, UB)
    g1 = evaluate(method, batch, "torch.grad", _hyper("random", 7))[1]["logp"]
    g2 = evaluate(method, shifted, "torch.grad", _hyper("random", 7))[1]["logp"]
    assert (_drawn(batch, g1, band) != _drawn(shifted, g2, band)).any()


@pytest.mark.parametrize(
    ("hyper", "match"),
    [({"clip_cov_select": "randperm"}, r"clip_cov_select must be one of \['top', 'random'\]"),
     ({"clip_cov_seed": -1}, r"clip_cov_seed must be an integer in \[0, 2\^32\), got -1"),
     ({"clip_cov_seed": 1.5}, r"clip_cov_seed must be an integer in \[0, 2\^32\), got 1\.5")],
)  # fmt: skip
def test_clip_cov_selection_hyper_parameters_are_checked(hyper, match):
    with pytest.raises(ValueError, match=match):
        shaping.get_method("clip_cov").loss(_batch(0, uniform_group=True), **hyper)
