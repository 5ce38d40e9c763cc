"""Checkers for ProGRPO's advantage re-weighting (seed 003, App. A: Lemma A.1, Theorem A.2).

Seed 003 kept its LaTeX. Its ARM rule appears in two forms that disagree on all-correct groups:
Eq. 4 applies `α·(c(q) − c(o_i|q))` to every group except all-wrong ones, Algorithm 1 (line 14) skips
all-wrong *and* all-correct groups. Theorem A.2 uses Eq. 10, the group-mean variant of Eq. 4 with no
exception. Both rules are implemented (`rule="eq4"` / `rule="alg1"`); see `check_thm_a2` for what each does.

Population model: one prompt, `n` responses with a softmax policy `π = softmax(θ)`, a correct set `C`,
groups of `G` i.i.d. responses from `π`, binary rewards. A response is treated as `T` tokens of equal
probability, so its ARM confidence (Eq. 6, geometric mean of token probabilities) is `c(o) = π(o)^{1/T}`,
a strictly increasing function of `π(o)` ("a monotonic proxy", App. A.5). The expected on-policy update is
`g(θ) = E_group[(1/G)·Σ_i Ã_i·∇_θ log π(o_i)]` with the advantages held fixed (stop-gradient).
"""

from __future__ import annotations

import math
from functools import cache
from typing import Literal

import numpy as np
from scipy.integrate import solve_ivp

from theory.checks._registry import CheckResult, register

ArmRule = Literal["eq4", "alg1"]

#: Added to the group standard deviation, as in Algorithm 1 (`σ + δ`).
STD_DELTA = 1e-6


def softmax(theta: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax over `axis`; `-inf` logits get probability 0. (SciPy's is ~10x slower on tiny arrays,
    and the dynamics call this hundreds of thousands of times.)"""
    e = np.exp(theta - np.max(theta, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


@cache
def _binomial_coefficients(n: int) -> np.ndarray:
    return np.array([math.comb(n, k) for k in range(n + 1)], dtype=np.float64)


def group_advantage(reward: np.ndarray, num_correct: np.ndarray, group_size: int) -> np.ndarray:
    """GRPO advantage of a response with `reward ∈ {0,1}` in a group of `G` holding `K` correct ones.

    `A = (r − μ)/(σ + δ)`, `μ = K/G`, `σ = sqrt(μ(1 − μ))` (population std, seed 003 Eq. 8; `δ` as in
    Algorithm 1). Broadcasts over its arguments.
    """
    mu = num_correct / group_size
    return (reward - mu) / (np.sqrt(mu * (1.0 - mu)) + STD_DELTA)


def expected_arm_update(
    theta: np.ndarray,
    correct: np.ndarray,
    *,
    group_size: int,
    alpha: np.ndarray | float,
    length: np.ndarray | float = 1.0,
    rule: ArmRule = "eq4",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact expected GRPO/ARM update for softmax policies over responses (seed 003, Eq. 4 / Eq. 10).

    The advantage is `Ã_i = A_i + α·1[apply]·(c̄_G − c(o_i))`, `c̄_G` the group-mean confidence
    (Eq. 10), `apply` = the group has a correct response (`rule="eq4"`) or is mixed (`rule="alg1"`);
    `α = 0` is plain GRPO. By exchangeability the update is `g_o = π_o·(b_o − Σ_u π_u b_u)` with
    `b_o = E[Ã_1 | o_1 = o]`, which conditions on the number `K'` of correct responses among the other
    `G − 1` (`K' ~ Binomial(G−1, P)`, `P = π(C)`): given `K'`, each other response is correct with
    probability `K'/(G−1)` and then has expected confidence `m_C = E_π[c | C]` (`m_W` off `C`).

    Args:
        theta: logits `(B, n)`; `-inf` marks an absent response.
        correct: `(B, n)` boolean correct sets.
        group_size: `G ≥ 2`.
        alpha: `α`, scalar or `(B, 1)`; length: `T`, scalar or `(B, 1)`.

    Returns:
        `(π, b, g)`, each `(B, n)`.
    """
    g = group_size
    pi = softmax(theta, axis=-1)
    conf = pi ** (1.0 / np.asarray(length, dtype=np.float64))
    p_c = np.sum(pi * correct, axis=-1, keepdims=True)  # (B, 1)
    m_c = np.sum(pi * conf * correct, axis=-1, keepdims=True) / np.maximum(p_c, 1e-300)
    m_w = np.sum(pi * conf * ~correct, axis=-1, keepdims=True) / np.maximum(1.0 - p_c, 1e-300)
    k = np.arange(g)  # K', correct among the other G − 1
    weight = _binomial_coefficients(g - 1) * p_c**k * (1.0 - p_c) ** (g - 1 - k)  # (B, G)
    r = correct[..., None].astype(np.float64)  # (B, n, 1)
    total = k + r  # K, (B, n, G)
    apply = total >= 1 if rule == "eq4" else (total >= 1) & (total <= g - 1)
    c_bar = (conf[..., None] + k * m_c[..., None] + (g - 1 - k) * m_w[..., None]) / g
    adv = group_advantage(r, total, g) + np.asarray(alpha)[..., None] * apply * (
        c_bar - conf[..., None]
    )
    b = np.sum(adv * weight[:, None, :], axis=-1)
    grad = pi * (b - np.sum(pi * b, axis=-1, keepdims=True))
    return pi, b, grad


def expected_flow(
    theta: np.ndarray,
    correct: np.ndarray,
    *,
    t_end: float,
    group_size: int,
    alpha: np.ndarray | float,
    length: np.ndarray | float = 1.0,
    rule: ArmRule = "eq4",
) -> np.ndarray:
    """Integrate the expected-update gradient flow `dθ/dt = g(θ)` from `theta` to time `t_end`.

    One unit of time is one expected update with step size 1. The flow is integrated with LSODA
    (adaptive, switches to a stiff method), because late in training the update shrinks like
    `1 − π(C) ∝ 1/t` and a collapsed correct response recovers only on time scales of 1e4-1e5.

    Args:
        theta: `(B, n)` logits, `-inf` for absent responses (kept); others as `expected_arm_update`.

    Returns:
        `(B, n)` logits at `t_end`.

    Raises:
        RuntimeError: the integrator failed.
    """
    present = np.isfinite(theta)
    shape = theta.shape

    def rhs(_t: float, x: np.ndarray) -> np.ndarray:
        th = np.where(present, x.reshape(shape), -np.inf)
        _, _, grad = expected_arm_update(
            th, correct, group_size=group_size, alpha=alpha, length=length, rule=rule
        )
        return grad.ravel()

    sol = solve_ivp(
        rhs,
        (0.0, t_end),
        np.where(present, theta, 0.0).ravel(),
        method="LSODA",
        rtol=1e-8,
        atol=1e-10,
    )
    if sol.status != 0:
        raise RuntimeError(f"expected_flow: integration failed: {sol.message}")
    return np.where(present, sol.y[:, -1].reshape(shape), -np.inf)


def confidence_spread(
    pi: np.ndarray, correct: np.ndarray, length: np.ndarray | float
) -> np.ndarray:
    """`(max_C c − min_C c)/max_C c` with `c = π^{1/T}`: 0 iff confidence is equal on `C`; `(B,)`."""
    conf = np.where(correct, pi ** (1.0 / np.asarray(length, dtype=np.float64)), np.nan)
    top = np.nanmax(conf, axis=-1)
    return (top - np.nanmin(conf, axis=-1)) / top


def conditional_entropy(pi: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """Entropy of `π` restricted to and renormalized on `C` (seed 003, Eq. 17); `(B,)`."""
    q = np.where(correct, pi, 0.0)
    q = q / q.sum(axis=-1, keepdims=True)
    return -np.sum(np.where(q > 0, q * np.log(np.where(q > 0, q, 1.0)), 0.0), axis=-1)


def _random_instances(
    rng: np.random.Generator, count: int, max_responses: int = 6, scale: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """`count` softmax policies over 3..max_responses responses with 2..n−1 correct, padded with −inf."""
    theta = np.full((count, max_responses), -np.inf)
    correct = np.zeros((count, max_responses), bool)
    for b in range(count):
        n = int(rng.integers(3, max_responses + 1))
        theta[b, :n] = rng.normal(size=n) * scale
        correct[b, rng.choice(n, size=int(rng.integers(2, n)), replace=False)] = True
    return theta, correct


@register(
    "progrpo_lemma_a1",
    source="seed 003, Lemma A.1",
    claim="GRPO gives all correct responses one advantage (1−μ)/σ; expected updates then sharpen π on C",
    trials=50,
)
def check_lemma_a1(rng: np.random.Generator, trials: int) -> CheckResult:
    """Homogeneity of the GRPO advantage and its positive feedback (seed 003, Lemma A.1, Eqs. 8-9).

    Statement: in a group of `G` with `K` correct responses, `μ = K/G`, `σ = sqrt(μ(1−μ) + ε)` (Eq. 8),
    every correct response gets `A = (1 − μ)/σ =: A_pos > 0` (Eq. 9). The proof adds that the update then
    "treats all correct trajectories indiscriminately": a more likely correct response gains more, a
    positive feedback loop towards entropy collapse on `C`.

    Checked: (i) in random groups, under Eq. 8's `σ`, Algorithm 1's `std + δ` and the unbiased std,
    all correct advantages are bit-identical and equal `(1 − μ)/σ` (1e-12 relative); `A_pos > 0` for
    `0 < K < G` (for `K = G`, `A_pos = 0`: the lemma's `> 0` needs a mixed group; counted in details).
    (ii) Under the exact expected GRPO update (`expected_arm_update` with `α = 0`) the log-ratio
    `log π(o_i)/π(o_j)` of two correct responses never shrinks (the step is `η·b_+·(π_i − π_j)` with
    `b_+ ≥ 0`), and the entropy of `π` renormalized on `C` never rises (the new conditional is
    `∝ q·exp(η b_+ q)`, which majorizes `q`); tolerance 1e-12 per step for float rounding.
    The paper's "exponentially increasing" is not what the exact dynamics show: near `π(C) = 1`,
    `b_+ ∝ 1 − π(C) ∝ 1/t`, so the log-ratios grow only logarithmically; details record them.
    """
    violations, residual, full_groups = 0, 0.0, 0
    for _ in range(trials):
        g = int(rng.integers(2, 17))
        k = int(rng.integers(1, g + 1))
        rewards = rng.permutation(np.r_[np.ones(k), np.zeros(g - k)])
        mu = k / g
        eps = float(10 ** rng.uniform(-8, -4))
        sigma = np.sqrt(mu * (1 - mu) + eps)
        forms = [
            ((rewards - rewards.mean()) / np.sqrt(rewards.var() + eps), (1 - mu) / sigma),
            (group_advantage(rewards, k, g), (1 - mu) / (np.sqrt(mu * (1 - mu)) + STD_DELTA)),
            (
                (rewards - rewards.mean()) / (rewards.std(ddof=1) + STD_DELTA),
                (1 - mu) / (np.sqrt(mu * (1 - mu) * g / (g - 1)) + STD_DELTA),
            ),
        ]
        for adv, closed in forms:
            pos = adv[rewards == 1]
            spread = float(pos.max() - pos.min())
            err = abs(float(pos[0]) - closed) / max(abs(closed), 1.0)
            residual = max(residual, spread, err)
            violations += int(spread != 0.0 or err > 1e-12 or (k < g and not pos[0] > 0))
        full_groups += int(k == g)
    # (ii) exact expected GRPO dynamics.
    theta, correct = _random_instances(rng, trials, scale=1.0)
    group_size = rng.integers(2, 9)
    entropy0 = conditional_entropy(softmax(theta, axis=-1), correct)
    h_prev = entropy0
    eta, steps = 0.5, 400
    for _ in range(steps):
        pi, _, grad = expected_arm_update(theta, correct, group_size=int(group_size), alpha=0.0)
        new = theta + eta * grad
        gap_old = np.where(correct, theta, np.nan)
        gap_new = np.where(correct, new, np.nan)
        old_d = gap_old[:, :, None] - gap_old[:, None, :]
        new_d = gap_new[:, :, None] - gap_new[:, None, :]
        shrink = np.nanmax(np.where(old_d > 0, old_d - new_d, np.nan), initial=0.0)
        theta = new
        h_new = conditional_entropy(softmax(theta, axis=-1), correct)
        rise = float(np.max(h_new - h_prev))
        h_prev = h_new
        residual = max(residual, shrink, rise)
        violations += int(shrink > 1e-12 or rise > 1e-12)
    pi = softmax(theta, axis=-1)
    sizes = correct.sum(axis=-1)
    return CheckResult(
        trials=trials,
        violations=violations,
        max_residual=residual,
        details={
            "all_correct_groups_with_zero_advantage": full_groups,
            "grpo_steps": steps,
            "mean_correct_set_entropy_over_log_C_start": float(np.mean(entropy0 / np.log(sizes))),
            "mean_correct_set_entropy_over_log_C_end": float(np.mean(h_prev / np.log(sizes))),
            "mean_incorrect_mass_end": float(np.mean(1 - np.sum(pi * correct, axis=-1))),
        },
    )


@register(
    "progrpo_thm_a2",
    source="seed 003, Thm A.2 (App. A.2, A.5)",
    claim="ARM's stationary point has equal confidence on C; its exact expected dynamics equalize it",
    trials=12,
)
def check_thm_a2(rng: np.random.Generator, trials: int) -> CheckResult:
    """Convergence to confidence equilibrium (seed 003, Theorem A.2 (i)-(ii), Eqs. 10-11, 18-19).

    Statement (Part 1 and App. A.5 step 3): with `Ã(o_i) = A_pos + α(c̄_G − c(o_i|q))` (Eq. 10), a
    more confident correct response gets a smaller advantage, and "equilibrium is reached only when"
    `c(o_1|q) = c(o_2|q)` for all correct responses, i.e. a uniform (maximum-entropy) policy on `C`.
    Part 2 (Eq. 11): `c̄_G − c(o_i)` is unchanged by a prompt-level shift `c → c + f(q)`.

    Reconstruction as a population claim, checked on exact expected updates (`expected_arm_update`):
    (a) for `o ∈ C`, `b_o + κ·c(o)` is the same for every `o` with
        `κ = α·(1 − 1/G)·P(ARM applies | o correct) > 0`, so at a stationary point (`g = 0`, hence
        `b_o = Σ_u π_u b_u` for all `o`) confidence is equal on `C` (tolerance 1e-12);
    (b) Eq. 11's shift invariance (1e-12 relative to `1 + |f|`);
    (c) the gradient flow of the exact expected Eq. 4/10 update (`expected_flow`, to `t = 1e10`, when
        `1 − π(C) ≈ 1e-10`; `α ∈ [0.3, 1]`, `G ∈ [4, 8]`, `T ∈ [1, 4]`, 3-6 responses, 2..n−1 correct,
        logits `N(0, 1)`) ends with the confidence spread on `C` below 1e-3 (observed: ≤ 1e-11).
        The run can be long: early on, GRPO's amplification (`∝ 1 − π(C)`) can collapse a correct
        response to `π(o) ≪ 1 − π(C)`; ARM's pull on it is `∝ π(o)`, so it recovers only once
        `1 − π(C) ∝ 1/t` has fallen below it, at `t ~ 1e4-1e5` (Euler runs of a few thousand steps
        report spurious failures).

    Finding (counted as counterexamples, not violations): under Algorithm 1's rule (ARM skipped on
    all-correct groups) at the paper's `α = 0.3`, the ARM term only acts in mixed groups, so it fades
    like `1 − π(C)`, as GRPO's amplification does, and GRPO's is larger (`A_pos ≈ 1/sqrt(G−1)` per
    mixed group against `α·(1−1/G)·Δc`). The flow then sharpens `π` on `C` as plain GRPO does (every
    point of the face `π(C) = 1` is stationary for it). A counterexample is an instance where
    Algorithm 1's flow ends with a larger spread than it started with while the Eq. 4/10 flow equalized.
    """
    violations, residual = 0, 0.0
    theta0, correct = _random_instances(rng, trials, scale=1.0)
    group_size = int(rng.integers(4, 9))
    alpha = rng.uniform(0.3, 1.0, size=(trials, 1))
    length = rng.integers(1, 5, size=(trials, 1)).astype(np.float64)
    # (a) the affine law on C, at the initial policies and at random ones.
    for theta in (
        theta0,
        np.where(np.isfinite(theta0), rng.normal(size=theta0.shape) * 2, -np.inf),
    ):
        for rule in ("eq4", "alg1"):
            pi, b, _ = expected_arm_update(
                theta, correct, group_size=group_size, alpha=alpha, length=length, rule=rule
            )
            p_c = np.sum(pi * correct, axis=-1, keepdims=True)
            # Given o correct, ARM applies always (Eq. 4) or unless the other G − 1 are all correct.
            applies = np.ones_like(p_c) if rule == "eq4" else 1.0 - p_c ** (group_size - 1)
            kappa = alpha * (1 - 1 / group_size) * applies
            level = np.where(correct, b + kappa * pi ** (1 / length), np.nan)
            spread = float(np.nanmax(np.nanmax(level, -1) - np.nanmin(level, -1)))
            residual = max(residual, spread)
            violations += int(spread > 1e-12 or np.any(kappa <= 0))
    # (b) Eq. 11: the ARM term ignores a prompt-level confidence shift.
    conf = rng.uniform(size=(trials, group_size))
    shift = rng.normal(size=(trials, 1)) * 10
    shifted = (conf + shift).mean(-1, keepdims=True) - (conf + shift)
    shift_err = float(np.max(np.abs(shifted - (conf.mean(-1, keepdims=True) - conf))))
    shift_err /= 1 + float(np.max(np.abs(shift)))
    residual = max(residual, shift_err)
    violations += int(shift_err > 1e-12)
    # (c) the gradient flow of the exact expected update, run to t = 1e10 (π(C) within ~1e-10 of 1).
    spread0 = confidence_spread(softmax(theta0), correct, length)
    common = {"t_end": 1e10, "group_size": group_size, "length": length}
    final = confidence_spread(
        softmax(expected_flow(theta0, correct, alpha=alpha, rule="eq4", **common)), correct, length
    )
    residual = max(residual, float(final.max()))
    violations += int(np.sum(final > 1e-3))
    # The paper's Algorithm 1 rule at its default α, and plain GRPO, from the same start.
    ends = {
        name: confidence_spread(
            softmax(expected_flow(theta0, correct, alpha=a, rule="alg1", **common)), correct, length
        )
        for name, a in (("alg1_alpha_0.3", 0.3), ("grpo", 0.0))
    }
    counterexamples = int(np.sum((ends["alg1_alpha_0.3"] > spread0) & (final <= 1e-3)))
    return CheckResult(
        trials=trials,
        violations=violations,
        max_residual=residual,
        counterexamples=counterexamples,
        details={
            "group_size": group_size,
            "median_spread_start": float(np.median(spread0)),
            "median_spread_eq4_end": float(np.median(final)),
            "median_spread_alg1_alpha_0.3_end": float(np.median(ends["alg1_alpha_0.3"])),
            "median_spread_grpo_end": float(np.median(ends["grpo"])),
            "grpo_instances_equalized": int(np.sum(ends["grpo"] <= 1e-3)),
        },
    )


__all__ = [
    "STD_DELTA",
    "ArmRule",
    "conditional_entropy",
    "confidence_spread",
    "expected_arm_update",
    "expected_flow",
    "group_advantage",
    "softmax",
]
