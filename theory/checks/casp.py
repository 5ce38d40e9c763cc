"""Checkers for CaSP's candidate-level analysis (seed 004, §3, App. B).

Seed 004 kept its LaTeX, so the statements below are read, not reconstructed; where the checker goes
beyond the text (a consequence the paper draws in words), the docstring says so.
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy.special import log_softmax, softmax

from theory.checks._registry import CheckResult, register
from theory.measures import expected_distinct


def softmax_jacobian(logits: np.ndarray) -> np.ndarray:
    """`∂p_u/∂z_v = p_u(1[u=v] − p_v)` for `p = softmax(z)`; `(V,)` logits → `(V, V)` (row u, column v)."""
    p = softmax(logits)
    return np.diag(p) - np.outer(p, p)


@register(
    "casp_lemma_2",
    source="seed 004, Lemma 2 (App. B.1)",
    claim="∂p_y/∂z_v = −p_y p_v (v≠y); a negative update raises z_v ∝ p_v, most for the rank-1 alternative",
    trials=50,
)
def check_lemma_2(rng: np.random.Generator, trials: int) -> CheckResult:
    """The squeeze effect of negative updates (seed 004, Lemma 2, Eqs. 16-20).

    Statement: for `p = softmax(z)` over the vocabulary and the sampled token `y`,
    `∂p_y/∂z_y = p_y(1 − p_y)` (Eq. 18) and `∂p_y/∂z_v = −p_y p_v` for `v ≠ y` (Eq. 19). For the
    unclipped GRPO term `A·γ`, `γ = p_y/p_y^old`, with `A < 0`, a gradient-ascent step raises every
    alternative logit by `Δz_v = η|A|·p_y p_v / p_y^old ∝ p_v` (Eq. 20); so if `y` is not the rank-1
    candidate, the rank-1 candidate gets the largest increase.

    Checked: the analytic Jacobian (whole matrix, so the positive-update reading `∂p_v/∂z_y = −p_v p_y`,
    "raising the sampled logit lowers every other probability in proportion to it", is covered too)
    against central finite differences; the gradient of `A·p_y/p_y^old` against finite differences; the
    ratio `Δz_v/p_v` constant over `v ≠ y`; and the arg-max alternative being the most probable one.
    Beyond the text (the squeeze itself, Ren & Sutherland 2025): after an exact step of any size,
    `p'_v/p_v` is non-decreasing in `p_v` over the alternatives (higher-ranked alternatives gain
    relatively more), and alternatives with `p_v < Σ_u p_u² − p_y` lose mass to first order although
    their logits rise; how many is recorded in details.

    Tolerances: finite differences with `h = 1e-5` (truncation ≲ 1e-10, rounding ≲ 1e-11), so 1e-7.
    """
    h = 1e-5
    violations, residual = 0, 0.0
    squeezed = alternatives = 0
    for _ in range(trials):
        vocab = int(rng.integers(2, 41))
        z = rng.normal(size=vocab) * rng.uniform(0.1, 4.0)
        p = softmax(z)
        y = int(rng.integers(vocab))
        jac = softmax_jacobian(z)
        steps = np.eye(vocab) * h
        fd = (softmax(z + steps, axis=-1) - softmax(z - steps, axis=-1)).T / (2 * h)  # (u, v)
        jac_err = float(np.max(np.abs(fd - jac)))
        others = np.arange(vocab) != y
        row_err = max(
            abs(jac[y, y] - p[y] * (1 - p[y])),
            float(np.max(np.abs(jac[y, others] + p[y] * p[others]))),
        )
        # Negative update of the unclipped surrogate A·p_y/p_old, A < 0, at the behaviour policy.
        adv = -float(rng.uniform(0.1, 3.0))
        p_old = p[y]
        grad = adv * jac[y] / p_old  # ∇_z (A·p_y/p_old)
        surrogate = (
            adv * softmax(z + steps, axis=-1)[:, y] - adv * softmax(z - steps, axis=-1)[:, y]
        )
        grad_err = float(np.max(np.abs(surrogate / (2 * h * p_old) - grad)))
        eta = float(10 ** rng.uniform(-3, 0))
        dz = eta * grad
        ratio = dz[others] / p[others]  # should all equal η|A|·p_y/p_old
        ratio_err = float(np.max(np.abs(ratio - eta * abs(adv)))) / (eta * abs(adv))
        ranked_wrong = False
        alt_p = np.where(others, p, -np.inf)
        if np.sum(alt_p == alt_p.max()) == 1:  # skip exact ties of the top alternative
            ranked_wrong = int(np.argmax(np.where(others, dz, -np.inf))) != int(np.argmax(alt_p))
        # The exact step: p'_v/p_v = exp(Δz_v)·Z/Z' is increasing in Δz_v ∝ p_v.
        p_new = np.exp(log_softmax(z + dz))
        gain = p_new[others] / p[others]
        order = np.argsort(p[others], kind="stable")
        sorted_p, sorted_gain = p[others][order], gain[order]
        distinct = (
            np.diff(sorted_p) > 1e-12 * sorted_p[1:]
        )  # compare strictly ordered neighbours only
        monotone_err = max(
            float(np.max((sorted_gain[:-1] - sorted_gain[1:])[distinct], initial=0.0)), 0.0
        )
        squeezed += int(np.sum(p[others] < np.sum(p**2) - p[y]))
        alternatives += vocab - 1
        # (error, tolerance): finite differences 1e-7; the ratio and the exact-step gains are
        # quotients of floats with relative precision ~1e-16, so 1e-10 is generous.
        checks = [
            (jac_err, 1e-7),
            (grad_err / (1 + float(np.max(np.abs(grad)))), 1e-7),
            (row_err, 1e-14),
            (ratio_err, 1e-10),
            (monotone_err, 1e-10),
        ]
        residual = max(residual, *(e for e, _ in checks))
        violations += int(ranked_wrong or any(e > tol for e, tol in checks))
    return CheckResult(
        trials=trials,
        violations=violations,
        max_residual=residual,
        details={
            "alternatives_losing_mass_first_order": squeezed,
            "alternatives_total": alternatives,
        },
    )


def distinct_count_enumerated(p: np.ndarray, k: int) -> float:
    """`E[#distinct of k i.i.d. draws]` by summing over all `V**k` ordered draws (the slow reference)."""
    total = 0.0
    for draw in itertools.product(range(p.size), repeat=k):
        total += float(np.prod(p[list(draw)])) * len(set(draw))
    return total


def distinct_count_monte_carlo(
    rng: np.random.Generator, p: np.ndarray, k: int, n: int
) -> tuple[float, float]:
    """Monte Carlo mean and standard error of the number of distinct tokens in `k` draws from `p`."""
    cdf = np.cumsum(p)
    draws = np.minimum(np.searchsorted(cdf, rng.random((n, k)) * cdf[-1], side="right"), p.size - 1)
    draws.sort(axis=1)
    counts = 1 + np.sum(np.diff(draws, axis=1) != 0, axis=1)
    return float(counts.mean()), float(counts.std(ddof=1) / np.sqrt(n))


@register(
    "casp_prop_3",
    source="seed 004, Prop. 3 (App. B.2)",
    claim="E[#distinct of K draws] = Σ_v 1 − (1 − p_v)^K ≤ 1 + K(1 − p_max); Schur-concave in p",
    trials=50,
)
def check_prop_3(rng: np.random.Generator, trials: int) -> CheckResult:
    """Local concentration limits rollout diversity (seed 004, Prop. 3, Eqs. 21-25).

    Statement: with `K` i.i.d. next tokens from `p`, `E|{ỹ_1..ỹ_K}| = Σ_v (1 − (1 − p_v)^K)`; and since
    `Σ_{v≠v(1)} (1 − (1 − p_v)^K) ≤ K(1 − p_{v(1)})` (Eq. 25), the expectation is at most
    `1 + K(1 − p_max)` and tends to 1 as `p_max → 1` for fixed `K`.

    Checked with `theory.measures.expected_distinct` against: exact enumeration of all `V^K` ordered
    draws (`V ≤ 4`, `K ≤ 5`; tolerance 1e-12); Monte Carlo (2,000 repetitions; a violation needs a 6σ
    deviation, using the sample standard error, floored at 1e-3 for near-deterministic `p`); the bound
    `1 ≤ E ≤ min(1 + K(1 − p_max), K, V)`; monotonicity in `K`. Beyond the text: the claim's converse
    direction, "flatter p ⇒ more distinct tokens", holds as Schur-concavity: a transfer `δ` from a
    larger to a smaller entry that keeps their order never lowers `E` (each term is concave in `p_v`),
    and raises it strictly for `K ≥ 2`; tolerance 1e-12·K (each of the `K`-th powers loses ~1 ulp).
    """
    n_mc = 2000
    violations, residual, worst_z = 0, 0.0, 0.0
    for t in range(trials):
        tiny = t % 2 == 0
        vocab = int(rng.integers(2, 5)) if tiny else int(rng.integers(2, 31))
        k = int(rng.integers(1, 6)) if tiny else int(rng.integers(1, 33))
        log_p = log_softmax(rng.normal(size=vocab) * rng.uniform(0.0, 6.0))
        p = np.exp(log_p)
        value = float(expected_distinct(log_p, k))
        errs = []  # each must be <= 1e-12 (sums of <= 1024 float64 terms of size <= 1)
        if tiny:
            errs.append(abs(value - distinct_count_enumerated(p, k)))
        mean, se = distinct_count_monte_carlo(rng, p, k, n_mc)
        z = abs(mean - value) / max(se, 1e-3)
        worst_z = max(worst_z, z)
        upper = min(1 + k * (1 - p.max()), k, vocab)
        errs.append(max(value - upper, 1 - value, 0.0))
        errs.append(max(value - float(expected_distinct(log_p, k + 1)), 0.0))
        # Robin Hood transfer between two entries, keeping their order.
        i, j = rng.choice(vocab, size=2, replace=False)
        if p[i] < p[j]:
            i, j = j, i
        q = p.copy()
        delta = rng.uniform(0, 0.5) * (p[i] - p[j])
        q[i] -= delta
        q[j] += delta
        flatter = float(expected_distinct(np.log(q / q.sum()), k))
        errs.append(max(value - flatter, 0.0) / k)
        err = max(errs)
        residual = max(residual, err)
        violations += int(err > 1e-12 or z > 6.0)
    return CheckResult(
        trials=trials,
        violations=violations,
        max_residual=residual,
        details={"max_monte_carlo_z": float(worst_z), "monte_carlo_repetitions": n_mc},
    )


__all__ = [
    "distinct_count_enumerated",
    "distinct_count_monte_carlo",
    "softmax_jacobian",
]
