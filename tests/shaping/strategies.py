"""Test-side draws for the shaping tests: a seeded NumPy batch (`random_batch`, for the
non-Hypothesis cross-backend tests) and hyper-parameter overrides valid for a batch (`hypers`,
reading the reference implementation's defaults).

The batch strategies themselves are public: `shaping.strategies` (`batches`, `masks`,
`reward_groups`, `method_batches`).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st


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
