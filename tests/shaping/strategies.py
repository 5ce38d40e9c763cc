"""Random batches for the shaping tests: Hypothesis strategies and a seeded NumPy generator.

Sizes stay small (B <= 3, G <= 5, T <= 6, N <= 4, P <= 4) so a reference loss with autograd
over 0-d tensors takes milliseconds. Floats are bounded and finite; values are drawn so that the
degenerate cases the issue names come up often: all-correct and all-wrong groups, G = 1, fully
masked rows, ties in entropy and in length-normalized log-probs, and very negative log-probs.
Everything is float64 (mask float 0/1, ``sampled_rank`` int64).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

MAX_B, MAX_G, MAX_T, MAX_N, MAX_P = 3, 5, 6, 4, 4

# Log-probs: ordinary values, a few repeated ones (ties) and very negative ones.
_LOGP = st.one_of(
    st.floats(-8.0, 0.0, allow_nan=False, allow_infinity=False),
    st.sampled_from([-0.5, -1.0, -30.0]),
    st.floats(-40.0, -20.0, allow_nan=False, allow_infinity=False),
)
# Mild log-probs only: confidences exp(mean log p) stay far above float noise (ProGRPO).
_MILD_LOGP = st.one_of(
    st.floats(-3.0, 0.0, allow_nan=False, allow_infinity=False), st.sampled_from([-0.5, -1.0])
)
# Ratio log-deltas: both sides of the clip range [log 0.8, log 1.2], and exactly on-policy.
_DELTA = st.one_of(st.just(0.0), st.floats(-0.6, 0.6, allow_nan=False, allow_infinity=False))
_ENTROPY = st.one_of(
    st.floats(0.0, 3.0, allow_nan=False, allow_infinity=False), st.sampled_from([0.0, 1.0])
)
_UNIT = st.floats(0.0, 1.0, allow_nan=False, allow_infinity=False)


def _f64(draw, shape, elements):
    return draw(hnp.arrays(np.float64, shape, elements=elements))


@st.composite
def reward_groups(draw, n_b: int, n_g: int) -> np.ndarray:
    """Binary (B, G) rewards; each group is mixed (if G > 1), all correct, or all wrong."""
    rows = []
    for _ in range(n_b):
        kind = draw(st.sampled_from(["mixed", "all_correct", "all_wrong"]))
        if kind == "all_correct":
            rows.append([1.0] * n_g)
        elif kind == "all_wrong":
            rows.append([0.0] * n_g)
        else:
            bits = draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n_g, max_size=n_g))
            if n_g > 1 and len(set(bits)) == 1:
                # Keep "mixed" mixed: Hypothesis would otherwise shrink it to a uniform group.
                bits[draw(st.integers(0, n_g - 1))] = 1.0 - bits[0]
            rows.append(bits)
    return np.array(rows, dtype=np.float64)


@st.composite
def masks(draw, n_b: int, n_g: int, n_t: int) -> np.ndarray:
    """(B, G, T) float masks: prefixes of random length (0 = fully masked) or arbitrary bits."""
    if draw(st.booleans()):
        lengths = draw(hnp.arrays(np.int64, (n_b, n_g), elements=st.integers(0, n_t)))
        return (np.arange(n_t)[None, None, :] < lengths[..., None]).astype(np.float64)
    return draw(hnp.arrays(np.float64, (n_b, n_g, n_t), elements=st.sampled_from([0.0, 1.0])))


@st.composite
def batches(draw, needs: frozenset[str] = frozenset(), min_g: int = 1) -> dict[str, np.ndarray]:
    """A full batch dict (CONTRACT.md keys); always has rewards/mask/logp/logp_old/logp_ref."""
    n_b = draw(st.integers(1, MAX_B))
    n_g = draw(st.integers(min_g, MAX_G))
    n_t = draw(st.integers(1, MAX_T))
    logp_old = _f64(draw, (n_b, n_g, n_t), draw(st.sampled_from([_LOGP, _MILD_LOGP])))
    mask = draw(masks(n_b, n_g, n_t))
    tie = n_g > 1 and draw(st.booleans())
    if tie:
        # An exact copy of response 0 ties it with the last one in every per-response score.
        logp_old[:, -1], mask[:, -1] = logp_old[:, 0], mask[:, 0]
    batch = {
        "rewards": draw(reward_groups(n_b, n_g)),
        "mask": mask,
        "logp_old": logp_old,
        "logp": logp_old + _f64(draw, (n_b, n_g, n_t), _DELTA),
        "logp_ref": logp_old + _f64(draw, (n_b, n_g, n_t), _DELTA),
    }
    if draw(st.booleans()):
        # Optional rollout importance weight: truncated ratios in [0, 2].
        batch["is_weight"] = _f64(draw, (n_b, n_g, n_t), st.floats(0.0, 2.0))
    if "entropy" in needs:
        batch["entropy"] = _f64(draw, (n_b, n_g, n_t), _ENTROPY)
        if tie:
            batch["entropy"][:, -1] = batch["entropy"][:, 0]
    if "cand_logp" in needs or "cand_logp_old" in needs or "sampled_rank" in needs:
        n_c = draw(st.integers(1, MAX_N))
        cand_old = _f64(draw, (n_b, n_g, n_t, n_c), _LOGP)
        batch["cand_logp_old"] = cand_old
        batch["cand_logp"] = cand_old + _f64(draw, (n_b, n_g, n_t, n_c), _DELTA)
        batch["sampled_rank"] = draw(
            hnp.arrays(np.int64, (n_b, n_g, n_t), elements=st.integers(0, n_c))
        )
    if "diversity" in needs:
        batch["diversity"] = _f64(draw, (n_b, n_g), st.one_of(_UNIT, st.just(0.5)))
    if "prompt_logp" in needs or "prompt_mask" in needs:
        n_p = draw(st.integers(1, MAX_P))
        batch["prompt_logp"] = _f64(draw, (n_b, n_p), _LOGP)
        batch["prompt_mask"] = draw(
            hnp.arrays(np.float64, (n_b, n_p), elements=st.sampled_from([0.0, 1.0]))
        )
    return batch


def random_batch(
    seed: int,
    n_b: int = 3,
    n_g: int = 5,
    n_t: int = 6,
    n_c: int = 3,
    n_p: int = 4,
) -> dict[str, np.ndarray]:
    """A seeded batch with every CONTRACT.md key, for the (non-Hypothesis) cross-backend tests.

    Group 0 is mixed, group 1 all correct, group 2 random; one response is fully masked; the ratios
    straddle the clip range, so every branch of every loss is exercised.
    """
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 2, size=(n_b, n_g)).astype(np.float64)
    # Group 0 has one correct response, so pass@k advantages are nonzero for every k < G.
    rewards[0] = 0.0
    rewards[0, 0] = 1.0
    if n_b > 1:
        rewards[1] = 1.0
    lengths = rng.integers(1, n_t + 1, size=(n_b, n_g))
    lengths[-1, 1 % n_g] = 0
    mask = (np.arange(n_t)[None, None, :] < lengths[..., None]).astype(np.float64)
    logp_old = -rng.exponential(1.5, size=(n_b, n_g, n_t))
    cand_old = -rng.exponential(1.5, size=(n_b, n_g, n_t, n_c))
    return {
        "rewards": rewards,
        "mask": mask,
        "logp_old": logp_old,
        "logp": logp_old + rng.uniform(-0.5, 0.5, size=logp_old.shape),
        "logp_ref": logp_old + rng.uniform(-0.5, 0.5, size=logp_old.shape),
        "entropy": rng.uniform(0.0, 3.0, size=logp_old.shape),
        "cand_logp_old": cand_old,
        "cand_logp": cand_old + rng.uniform(-0.5, 0.5, size=cand_old.shape),
        "sampled_rank": rng.integers(0, n_c + 1, size=(n_b, n_g, n_t)),
        "diversity": rng.uniform(0.0, 1.0, size=(n_b, n_g)),
        "prompt_logp": -rng.exponential(1.5, size=(n_b, n_p)),
        "prompt_mask": (rng.uniform(size=(n_b, n_p)) < 0.8).astype(np.float64),
    }


_COEF = st.floats(0.0, 0.2, allow_nan=False, allow_infinity=False)


@st.composite
def hypers(draw, name: str, batch: dict[str, np.ndarray]) -> dict[str, object]:
    """Hyper-parameter overrides for `name`, valid for `batch` (e.g. ``k <= G``, ``top_n <= N``).

    Each key is drawn or left at its default; ``kl_coef > 0`` is drawn only when it can be
    combined with every method (the batch always carries ``logp_ref``).
    """
    n_g = batch["rewards"].shape[1]
    choices: dict[str, st.SearchStrategy] = {
        "loss_agg": st.sampled_from(
            ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
        ),
        "kl_coef": st.sampled_from([0.0, 0.3]),
        "entropy_coef": st.sampled_from([0.0, 0.05]),
        "eps_low": st.sampled_from([0.2, 0.1]),
        "eps_high": st.sampled_from([0.2, 0.28]),
        "std_correction": st.sampled_from([0, 1]),
        "eps": st.sampled_from([1e-6, 1e-4, 0.0]),
        "gamma_p": _COEF,
        "gamma_n": _COEF,
        "logp_reduction": st.sampled_from(["sum", "mean"]),
        "eta": _COEF,
        "form": st.sampled_from(["trajectory", "token"]),
        "eta_pos": _COEF,
        "eta_neg": _COEF,
        "lam": st.floats(0.0, 1.0),
        "sigma": st.floats(0.0, 1.0),
        "tau": st.floats(0.1, 2.0),
        "lam_loc": _COEF,
        "low_frac": st.floats(0.05, 1.0),
        "confidence_ref": st.sampled_from(["prompt", "group_mean"]),
        "beta_rank": st.floats(0.0, 1.0),
        "k": st.integers(1, n_g),
        "quantile": st.floats(0.05, 0.95),
        "lam_top1": st.floats(0.5, 2.0),
        "skip_uniform_groups": st.booleans(),
        "subset_normalization": st.booleans(),
        "kl_estimator": st.sampled_from(["k1", "k2", "k3", "k3+"]),
        "top_entropy_quantile": st.sampled_from([1.0, 0.5, 0.2]),
        "clip_ratio_c": st.sampled_from([1.05, 1.5, 3.0]),
        "kappa": st.floats(1.0, 4.0),
        "clip_cov_ratio": st.sampled_from([2e-4, 0.1, 0.5, 1.0]),
        "clip_cov_lb": st.sampled_from([0.0, 0.3, 1.0]),
        "clip_cov_ub": st.sampled_from([2.0, 5.0, 100.0]),
        "kl_cov_ratio": st.sampled_from([2e-4, 0.1, 0.5, 1.0]),
        "ppo_kl_coef": st.floats(0.0, 2.0),
        # Dr. GRPO's constant divisor: any int at least the padded length T.
        "max_response_length": st.integers(max(batch["mask"].shape[-1], 1), 12),
    }
    if name == "casp":
        choices["alpha"] = st.floats(0.0, 1.0)
        choices["top_n"] = st.integers(1, batch["cand_logp"].shape[-1])
    elif name in ("progrpo", "entropy_adv"):
        choices["alpha"] = st.floats(0.0, 1.0)
    if name == "gspo":
        # Widths a GSPO ratio can cross here (its defaults, 3e-4 / 4e-4, clip almost all).
        choices["eps_low"] = st.sampled_from([3e-4, 0.1, 0.2])
        choices["eps_high"] = st.sampled_from([4e-4, 0.1, 0.28])
    if name == "cispo":
        choices["eps_low"] = st.sampled_from([1.0, 0.2])
    from .reference import DEFAULTS

    out: dict[str, object] = {}
    for key in DEFAULTS[name]:
        if key in choices and draw(st.booleans()):
            out[key] = draw(choices[key])
    if name == "casp" and "top_n" not in out:
        # The default top_n = 3 is only valid with at least 3 candidates.
        out["top_n"] = min(3, batch["cand_logp"].shape[-1])
    if "k" in DEFAULTS[name] and "k" not in out:
        # pass@k methods (passk, pkpo): the default k = 4 needs G >= 4.
        out["k"] = min(4, n_g)
    return out
