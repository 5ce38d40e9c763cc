"""Checkers for DSDR's theory (seed 001, App. C and Theorem 3.1).

The seed lost its math symbols; each checker's docstring states the reconstruction it checks. The notation
follows docs/formulas.md §2.16-§2.17 (DSDR): verifier reward `r ∈ {0,1}`, clipped diversity score
`min(s, σ)`, augmented reward `r̃ = r + λ·1[r=1]·min(s, σ)`, group advantages
`A_i = (r̃_i − mean r̃)/(std r̃ + ε)`, coupling `w = softmax_{j∈C}(s_j/τ)`, local regularizer weight `λ_loc`.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize
from scipy.special import comb, log_softmax, logsumexp, softmax, xlogy

from theory.checks._registry import CheckResult, register
from theory.trees import num_internal_nodes, trajectory_log_probs, trajectory_nodes

#: A logit this low gives probability exactly 0.0 in float64 (exp underflows), yet stays finite, which
#: `trajectory_log_probs` requires.
_MASKED_LOGIT = -1e4


def group_advantages(rewards: np.ndarray, *, eps: float, ddof: int = 0) -> np.ndarray:
    """GRPO group-normalized advantages `A_i = (r_i − mean_j r_j)/(std_j r_j + ε)` (docs/formulas.md §2.1).

    Args:
        rewards: `(..., G)` per-response rewards of each group.
        eps: the stabilizer `ε > 0` added to the standard deviation.
        ddof: 0 (population std) or 1 (unbiased std, as TRL and verl's `torch.std`).

    Returns:
        `(..., G)` advantages.
    """
    r = np.asarray(rewards, dtype=np.float64)
    centred = r - r.mean(axis=-1, keepdims=True)
    return centred / (r.std(axis=-1, ddof=ddof, keepdims=True) + eps)


def dsdr_reward(
    correct: np.ndarray, scores: np.ndarray, *, bonus: float, clip: float
) -> np.ndarray:
    """DSDR augmented reward `r̃_i = r_i + λ·1[r_i=1]·min(s_i, σ)` (seed 001, Eq. 10 / Eq. 22).

    Args:
        correct: `(..., G)` boolean verifier outcomes; scores: `(..., G)` diversity scores `s_i ≥ 0`.
        bonus: `λ`; clip: `σ`.
    """
    c = np.asarray(correct, dtype=bool)
    return c + bonus * c * np.minimum(scores, clip)


# --------------------------------------------------------------------------------------------
# Proposition C.2
# --------------------------------------------------------------------------------------------


def _subset_masks(num_actions: int) -> np.ndarray:
    """All non-empty subsets of the actions as boolean rows, shape `(2**V − 1, V)`."""
    bits = (np.arange(1, 2**num_actions)[:, None] >> np.arange(num_actions)) & 1
    return bits.astype(bool)


def support_uniform_logits(num_actions: int, depth: int) -> np.ndarray:
    """Every tabular policy that is uniform over a non-empty action subset at each node.

    Returns:
        logits `(n_pol, N_int, V)` with `n_pol = (2**V − 1)**N_int`; masked actions get a logit whose
        probability underflows to exactly 0. The class holds the deterministic policies (singletons)
        and the uniform policy, and its correctness values form a finite set, so it has the strict
        correctness gap that Proposition C.2 assumes (seed 001, Eq. 25).
    """
    subsets = _subset_masks(num_actions)
    n_int = num_internal_nodes(num_actions, depth)
    choice = np.indices((len(subsets),) * n_int).reshape(n_int, -1).T  # (n_pol, N_int)
    return np.where(subsets[choice], 0.0, _MASKED_LOGIT)


def correctness_and_token_entropy(
    logits: np.ndarray, num_actions: int, depth: int, correct: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Correctness and the length-invariant token entropy of tabular tree policies (seed 001, Eq. 28).

    Args:
        logits: `(n_pol, N_int, V)`; correct: `(M,)` mask.

    Returns:
        `(P, R, R_pos)`, each `(n_pol,)`: `P = Σ_{τ∈C} π(τ)`;
        `R = E_{τ~π}[(1/H)·Σ_t H(π(·|s_t))]`; `R_pos = E_{τ~π}[r(τ)·(1/H)·Σ_t H(π(·|s_t))]`
        (the positive-only variant). Both lie in `[0, log V]` (Eq. 29).
    """
    node_logp = log_softmax(logits, axis=-1)
    node_entropy = -np.sum(np.exp(node_logp) * node_logp, axis=-1)  # (n_pol, N_int)
    pi = np.exp(trajectory_log_probs(logits, num_actions, depth))  # (n_pol, M)
    nodes, _ = trajectory_nodes(num_actions, depth)
    per_traj = node_entropy[:, nodes].mean(axis=-2)  # (n_pol, M): (1/H) Σ_t H(π(·|s_t))
    return pi @ correct, np.sum(pi * per_traj, axis=-1), np.sum(pi * correct * per_traj, axis=-1)


@register(
    "dsdr_prop_c2",
    source="seed 001, Prop. C.2",
    claim="λ_loc < (J*−J_sub)/log|V| ⇒ every maximizer of J + λ_loc·R is correctness-optimal",
    trials=20,
)
def check_prop_c2(rng: np.random.Generator, trials: int) -> CheckResult:
    """Correctness preservation under a bounded local regularizer (seed 001, Prop. C.2, Eqs. 25-36).

    Reconstruction: `J(π) = E_π[r]` (population correctness, Eq. 30), `J* = sup_π J(π)`,
    `J_sub = sup{J(π) : J(π) < J*}` (Eq. 31) with a strict gap `J* > J_sub` (Eq. 25). For any regularizer
    `0 ≤ R(π) ≤ log|V|` (e.g. the length-invariant token entropy, Eq. 28), the objective
    `J_λ(π) = J(π) + λ_loc·R(π)` (Eq. 32) has only correctness-optimal maximizers when
    `λ_loc < (J* − J_sub)/log|V|`; quantitatively (Eq. 36) `max_{J=J*} J_λ − max_{J<J*} J_λ ≥
    (J* − J_sub) − λ_loc·log|V|`.

    Instances: random trees (`V, H` in {(2,2), (2,3), (3,2)}), a random correct set, and a finite policy
    class: all node-wise uniform-over-a-subset policies (which include the deterministic and the
    uniform policy) plus random softmax policies. The class is finite, so the gap exists; the
    maximization is exhaustive. Both the plain (Eq. 28) and the positive-only regularizer are checked at
    `λ_loc = f·bound` for `f < 1`. Above the bound (`f > 1`) a suboptimal maximizer *may* appear; how
    often is recorded in details, never counted as a violation. In the sub-class {deterministic
    policies, uniform policy} the bound is sharp: at `1.001·bound` the uniform policy (correctness
    `|C|/M`, `R = log|V|`) beats the deterministic correct one (`R = 0`) on every instance (details).
    """
    below = (0.25, 0.5, 0.9, 0.99, 0.999)
    above = (1.001, 1.1, 2.0, 5.0, 20.0)
    shapes = ((2, 2), (2, 3), (3, 2))
    # Enumerated correctness values are rationals computed to ~1e-15. The random softmax policies
    # have logits of scale ≤ 3, so their correctness stays far (≫ 1e-12) from 1 unless exactly 1.
    tol_p = 1e-12
    violations, residual = 0, 0.0
    above_counts = {f: 0 for f in above}
    min_margin_ratio = np.inf
    tight = 0
    for _ in range(trials):
        v, h = shapes[rng.integers(len(shapes))]
        m = v**h
        correct = np.zeros(m)
        correct[rng.choice(m, size=rng.integers(1, m), replace=False)] = 1.0
        n_int = num_internal_nodes(v, h)
        extra = rng.normal(size=(64, n_int, v)) * rng.uniform(0.0, 3.0, size=(64, 1, 1))
        enumerated = support_uniform_logits(v, h)
        logits = np.concatenate([enumerated, extra])
        p, r_all, r_pos = correctness_and_token_entropy(logits, v, h, correct)
        # Tightness: in the sub-class {deterministic policies, uniform policy} the optimum has R = 0 and
        # the uniform policy has R = log|V| exactly, so just above the bound the uniform one must win.
        width = np.sum(enumerated == 0.0, axis=-1)  # (n_pol, N_int) support sizes
        sub = np.concatenate(
            [np.all(width == 1, axis=1) | np.all(width == v, axis=1), np.zeros(64, bool)]
        )
        sub_opt = p[sub] >= p[sub].max() - tol_p
        sub_bound = (p[sub].max() - p[sub][~sub_opt].max()) / np.log(v)
        j_sub = p[sub] + 1.001 * sub_bound * r_all[sub]
        tight += int(j_sub[~sub_opt].max() > j_sub[sub_opt].max())
        # The bound R ≤ log|V| is what the proof uses (Eq. 29); a bad regularizer would break it.
        for r in (r_all, r_pos):
            excess = max(float(np.max(r - np.log(v))), float(-np.min(r)), 0.0)
            residual = max(residual, excess)
            violations += int(excess > 1e-12)
        j_star = p.max()
        optimal = p >= j_star - tol_p
        gap = j_star - p[~optimal].max()
        bound = gap / np.log(v)
        for r in (r_all, r_pos):
            for f in below + above:
                j = p + f * bound * r
                margin = j[optimal].max() - j[~optimal].max()
                if f < 1:
                    # Eq. 36: the optimal side wins by at least gap − λ·log|V| = (1 − f)·gap.
                    shortfall = (1 - f) * gap - margin
                    residual = max(residual, shortfall)
                    violations += int(shortfall > 1e-12)
                    min_margin_ratio = min(min_margin_ratio, margin / ((1 - f) * gap))
                elif margin < 0:
                    above_counts[f] += 1
    # The strict-gap assumption is essential: over all softmax policies (no gap, J_sub = J*), the
    # maximizer of J + λ·H for one correct token of V is softmax(r/λ), with correctness < 1 for any λ.
    lam, v = 0.1, 4
    unrestricted_p = float(np.exp(1 / lam) / (np.exp(1 / lam) + v - 1))
    return CheckResult(
        trials=trials,
        violations=violations,
        max_residual=residual,
        details={
            "min_margin_over_lower_bound": float(min_margin_ratio),
            "suboptimal_maximizer_above_bound": {
                str(f): c for f, c in above_counts.items()
            },  # out of 2·trials (two regularizers)
            "deterministic_or_uniform_class_suboptimal_maximizer_at_1.001_bound": tight,
            "unrestricted_class_lambda_0.1_V_4_correctness": unrestricted_p,
        },
    )


# --------------------------------------------------------------------------------------------
# Lemma C.3
# --------------------------------------------------------------------------------------------


def mixed_group_probability(p: float, group_size: int) -> float:
    """`P(mixed group) = 1 − p^G − (1−p)^G` for `G` i.i.d. Bernoulli(p) rewards (seed 001, Lemma C.3)."""
    return 1.0 - p**group_size - (1.0 - p) ** group_size


@register(
    "dsdr_lemma_c3",
    source="seed 001, Lemma C.3",
    claim="P(mixed group of G Bernoulli(p)) = 1 − p^G − (1−p)^G",
    trials=50,
)
def check_lemma_c3(rng: np.random.Generator, trials: int) -> CheckResult:
    """Probability that a group holds both a success and a failure (seed 001, Lemma C.3, Eqs. 37-38).

    Reconstruction: `r_1..r_G ~ i.i.d. Bernoulli(p)`, `p = P_{o~π}(r(o) = 1)` (Eq. 37); the mixed event
    `M = {∃i,j: r_i ≠ r_j}` has `P(M) = 1 − p^G − (1−p)^G` (Eq. 38).

    Compared with exact enumeration of all `2^G` outcomes, with the binomial sum
    `Σ_{k=1}^{G−1} C(G,k) p^k (1−p)^{G−k}`, and with a Monte Carlo frequency (20,000 groups; a violation
    needs a 6σ binomial deviation, false alarm ≈ 2e-9 per trial).
    """
    n_mc = 20_000
    violations, residual, worst_z = 0, 0.0, 0.0
    for t in range(trials):
        g = int(rng.integers(1, 13))
        # Include the edges p ∈ {0, 1} and a tiny p, where cancellation would show.
        p = (0.0, 1.0, 1e-6)[t] if t < 3 else float(rng.uniform())
        closed = mixed_group_probability(p, g)
        outcomes = (np.arange(2**g)[:, None] >> np.arange(g)) & 1  # (2^G, G)
        k = outcomes.sum(axis=1)
        weights = p**k * (1.0 - p) ** (g - k)
        enumerated = float(np.sum(weights[(k > 0) & (k < g)]))
        k_mid = np.arange(1, g)
        # Not scipy.stats.binom.pmf: it raises OverflowError for subnormal p (seen at p = 2.2e-308).
        binomial = float(np.sum(comb(g, k_mid) * p**k_mid * (1.0 - p) ** (g - k_mid)))
        exact_err = max(abs(closed - enumerated), abs(closed - binomial))
        draws = rng.random((n_mc, g)) < p
        freq = float(np.mean(draws.any(axis=1) & ~draws.all(axis=1)))
        sd = np.sqrt(max(closed * (1 - closed), 1e-12) / n_mc)
        z = abs(freq - closed) / sd
        worst_z = max(worst_z, z)
        residual = max(residual, exact_err)
        # 1e-12: sums of at most 4096 terms of size ≤ 1 in float64.
        violations += int(exact_err > 1e-12 or z > 6.0)
    return CheckResult(
        trials=trials,
        violations=violations,
        max_residual=residual,
        details={"max_monte_carlo_z": float(worst_z), "monte_carlo_groups": n_mc},
    )


# --------------------------------------------------------------------------------------------
# Proposition C.4
# --------------------------------------------------------------------------------------------


@register(
    "dsdr_prop_c4",
    source="seed 001, Prop. C.4",
    claim="non-constant r̃ in a group ⇒ some GRPO advantage ≠ 0 (constant ⇒ all 0)",
    trials=200,
)
def check_prop_c4(rng: np.random.Generator, trials: int) -> CheckResult:
    """Non-vanishing GRPO signal under the correct-only diversity bonus (seed 001, Prop. C.4, Eqs. 39-41).

    Reconstruction (the statement's formulas are lost; the proof survives): with
    `A_i = (r̃_i − mean r̃)/(std r̃ + ε)`, `ε > 0` (Eqs. 23-24), (i) if the `r̃_i` are not all equal then
    some `A_i ≠ 0`; (ii) in particular (Eq. 40) in a solve-all group (`r_i = 1` for all `i`),
    `r̃_i = 1 + λ·min(s_i, σ)` and the advantages are not all zero whenever the *clipped* scores differ.
    The converse (constant `r̃` ⇒ all `A_i = 0`) is the degenerate case the bonus is meant to avoid.

    Checked quantitatively: `max_i |A_i| ≥ std_pop(r̃)/(std(r̃) + ε)` (because `max_i |r̃_i − mean| ≥
    std_pop`), which is `> 0` iff `r̃` is non-constant; constant groups must give `|A_i| ≤ 1e-8` (the
    mean of `G` equal floats can differ from them by an ulp; `ulp/ε ≤ 1e-9` for `ε ≥ 1e-6`).
    Groups mix all-correct, all-wrong and mixed groups, scores above and below the clip `σ`, both std
    conventions and `ε ∈ [1e-6, 1e-2]`.
    """
    violations, residual = 0, 0.0
    rescued = solve_all_nonconstant = clipped_flat = 0
    for _ in range(trials):
        g = int(rng.integers(2, 17))
        kind = rng.integers(3)
        correct = (
            np.ones(g, bool)
            if kind == 0
            else np.zeros(g, bool)
            if kind == 1
            else rng.random(g) < 0.5
        )
        clip = float(rng.uniform(0.05, 1.0))
        # Some groups have every score above the clip, so the clipped scores tie exactly.
        scores = clip + rng.uniform(0, 1, g) if rng.random() < 0.15 else rng.uniform(0, 1, g)
        bonus = float(rng.uniform(0.01, 1.0))
        eps = float(10 ** rng.uniform(-6, -2))
        ddof = int(rng.integers(2))
        rt = dsdr_reward(correct, scores, bonus=bonus, clip=clip)
        adv = group_advantages(rt, eps=eps, ddof=ddof)
        if np.all(rt == rt[0]):
            err = float(np.max(np.abs(adv)))
            residual = max(residual, err)
            violations += int(err > 1e-8)
            clipped_flat += int(correct.all())
        else:
            lower = rt.std() / (rt.std(ddof=ddof) + eps)
            shortfall = lower - float(np.max(np.abs(adv)))
            residual = max(residual, shortfall / lower)
            violations += int(not np.any(adv != 0) or shortfall > 1e-12 * lower)
            if correct.all():
                solve_all_nonconstant += 1
                # Verifier-only rewards would give A ≡ 0 here; the bonus restores a signal.
                rescued += int(np.all(group_advantages(correct, eps=eps, ddof=ddof) == 0))
    return CheckResult(
        trials=trials,
        violations=violations,
        max_residual=residual,
        details={
            "solve_all_groups_rescued_by_bonus": rescued,
            "solve_all_groups_with_distinct_clipped_scores": solve_all_nonconstant,
            "solve_all_groups_flat_after_clipping": clipped_flat,
        },
    )


# --------------------------------------------------------------------------------------------
# Proposition C.5
# --------------------------------------------------------------------------------------------


def allocation_objective(w: np.ndarray, scores: np.ndarray, temperature: float) -> np.ndarray:
    """`F(w) = Σ_i w_i s_i + τ·H(w)` over the last axis (seed 001, Eq. 44); `0·log 0 = 0`."""
    return w @ scores - temperature * np.sum(xlogy(w, w), axis=-1)


@register(
    "dsdr_prop_c5",
    source="seed 001, Prop. C.5",
    claim="softmax(s/τ) uniquely maximizes Σ w_i s_i + τ·H(w) on the simplex; max = τ·logsumexp(s/τ)",
    trials=30,
)
def check_prop_c5(rng: np.random.Generator, trials: int) -> CheckResult:
    """Softmax allocation optimality (seed 001, Prop. C.5, Eqs. 42-46).

    Reconstruction: over the simplex `Δ = {w ≥ 0, Σ_{i∈C} w_i = 1}` on the correct rollouts (Eq. 42),
    for `τ > 0` the weights `w*_i = exp(s_i/τ)/Σ_j exp(s_j/τ)` (Eq. 43) are the unique maximizer of
    `F(w) = Σ_i w_i s_i + τ·H(w)` (Eq. 44). Its value is `τ·logsumexp(s/τ)`, and the exact identity
    `F(w*) − F(w) = τ·KL(w ‖ w*)` gives uniqueness.

    Checked per instance (`|C| ∈ [1, 8]`, scores `N(0, 1)` or `U[0, 1]`, `τ ∈ [0.02, 5]`): the value;
    the KL identity at 200 random simplex points (Dirichlet with concentrations 0.1-10, vertices and
    faces); that none exceeds `F(w*)`; and that SciPy's SLSQP maximization over the simplex finds no
    larger value. Tolerances are 1e-9 relative to `1 + |s|_∞` (double-precision sums of ≤ 8 terms).
    """
    violations, residual, worst_solver_gap = 0, 0.0, 0.0
    for _ in range(trials):
        n = int(rng.integers(1, 9))
        scores = rng.normal(size=n) if rng.random() < 0.5 else rng.uniform(size=n)
        tau = float(10 ** rng.uniform(np.log10(0.02), np.log10(5.0)))
        scale = 1.0 + float(np.max(np.abs(scores)))
        w_star = softmax(scores / tau)
        f_star = float(allocation_objective(w_star, scores, tau))
        value_err = abs(f_star - tau * logsumexp(scores / tau)) / scale
        points = [rng.dirichlet(np.full(n, a), size=50) for a in (0.1, 1.0, 10.0)]
        face = rng.dirichlet(np.ones(n), size=50) * (rng.random((50, n)) < 0.5)
        face = face[face.sum(axis=1) > 0]
        points += [np.eye(n), face / face.sum(axis=1, keepdims=True)]
        w = np.concatenate(points)
        f = allocation_objective(w, scores, tau)
        kl = np.sum(xlogy(w, w) - xlogy(w, w_star), axis=-1)
        identity_err = float(np.max(np.abs(f_star - f - tau * kl))) / scale
        exceed = max(float(np.max(f - f_star)) / scale, 0.0)
        res = minimize(
            lambda x, s, t: -allocation_objective(x, s, t),
            rng.dirichlet(np.ones(n)),
            args=(scores, tau),
            jac=lambda x, s, t: -(s - t * (np.log(np.maximum(x, 1e-300)) + 1)),
            method="SLSQP",
            bounds=[(0.0, 1.0)] * n,
            constraints=[{"type": "eq", "fun": lambda x, *_: np.sum(x) - 1.0}],
            options={"ftol": 1e-14, "maxiter": 500},
        )
        x = np.clip(res.x, 0.0, None)
        x /= x.sum()  # evaluate F on the simplex, not on SLSQP's slightly infeasible iterate
        solver_val = float(allocation_objective(x, scores, tau))
        solver_exceed = max((solver_val - f_star) / scale, 0.0)
        worst_solver_gap = max(worst_solver_gap, (f_star - solver_val) / scale)
        err = max(value_err, identity_err, exceed, solver_exceed)
        residual = max(residual, err)
        violations += int(err > 1e-9)
    return CheckResult(
        trials=trials,
        violations=violations,
        max_residual=residual,
        details={"max_slsqp_shortfall_below_softmax_value": worst_solver_gap},
    )


# --------------------------------------------------------------------------------------------
# Theorem 3.1
# --------------------------------------------------------------------------------------------


def tilted_objective(
    logits: np.ndarray,
    num_actions: int,
    depth: int,
    correct: np.ndarray,
    scores: np.ndarray,
    temperature: float,
) -> np.ndarray:
    """`J_τ(θ) = log E_{τ~π_θ}[r(τ)·exp(s(τ)/τ)]` (seed 001, Eq. 17 as reconstructed).

    Args:
        logits: `(..., N_int, V)`; correct: `(M,)` bool; scores: `(M,)` fixed per trajectory.

    Returns:
        `(...)`.
    """
    lp = trajectory_log_probs(logits, num_actions, depth)
    return logsumexp(np.where(correct, lp + scores / temperature, -np.inf), axis=-1)


def score_function_gradient(
    logits: np.ndarray, num_actions: int, depth: int, weights: np.ndarray
) -> np.ndarray:
    """`Σ_τ π(τ)·weights(τ)·∇_θ log π_θ(τ)` for a tabular tree policy, shape `(N_int, V)`.

    `∇ log π(τ)` with respect to `logits[s, a]` is `Σ_t 1[s_t = s]·(1[a_t = a] − π(a|s))`.
    """
    node_p = softmax(logits, axis=-1)
    pi = np.exp(trajectory_log_probs(logits, num_actions, depth))
    nodes, actions = trajectory_nodes(num_actions, depth)
    w = pi * weights  # (M,)
    grad = np.zeros_like(node_p)
    for t in range(depth):
        np.add.at(grad, (nodes[t], actions[t]), w)
        np.add.at(grad, nodes[t], -w[:, None] * node_p[nodes[t]])
    return grad


@register(
    "dsdr_thm_3_1",
    source="seed 001, Thm 3.1 (App. C.6)",
    claim="∇ log E_π[r·e^{s/τ}] = E_π[A_τ ∇log π], A_τ = r·e^{s/τ}/Z − 1; SNIS weights = softmax_C(s/τ)",
    trials=30,
)
def check_thm_3_1(rng: np.random.Generator, trials: int) -> CheckResult:
    """Diversity-tilted policy gradient (seed 001, Theorem 3.1, Eqs. 17-20, proof Eqs. 47-51).

    Reconstruction: for a bounded score `s(o)` and `τ > 0`, the correct-only diversity-tilted objective
    is `J_τ(θ) = log Z(θ)`, `Z(θ) = E_{o~π_θ}[r(o)·exp(s(o)/τ)]` (Eq. 17; the proof differentiates a
    log, Eq. 47, and uses `E[r e^{s/τ}/Z] = 1`, Eq. 51). Assuming `Z > 0` (some correct response has
    positive probability), `∇J_τ = E_{π_θ}[A_τ(o)·∇ log π_θ(o)]` (Eq. 18) with
    `A_τ(o) = r(o)·exp(s(o)/τ)/Z − 1` (Eq. 19), and `E_π[A_τ] = 0`. Given i.i.d. rollouts, the
    self-normalized weights `ŵ_i = r_i e^{s_i/τ} / Σ_j r_j e^{s_j/τ}` (Eq. 20) are 0 off the correct set
    and `softmax_{j∈C}(s_j/τ)` on it (DSDR's coupling, Eq. 11). (A `τ·log Z` reading scales both sides
    by `τ` and changes nothing checked here.)

    Instances: tabular softmax policies on random trees (`V ∈ {2,3}`, `H ∈ {1,2,3}`), a random correct
    set, fixed scores `s ∈ [0, σ]`, `τ ∈ [0.05, 2]`. The exact score-function gradient is compared with
    central finite differences (`h = 1e-5`: truncation ~1e-10, rounding ~1e-10; tolerance 1e-6
    relative to `1 + |∇J|_∞`).
    """
    h = 1e-5
    violations, residual, skipped = 0, 0.0, 0
    for _ in range(trials):
        v, depth = int(rng.integers(2, 4)), int(rng.integers(1, 4))
        m = v**depth
        n_int = num_internal_nodes(v, depth)
        logits = rng.normal(size=(n_int, v)) * rng.uniform(0.2, 2.0)
        correct = np.zeros(m, bool)
        correct[rng.choice(m, size=rng.integers(1, m + 1), replace=False)] = True
        scores = rng.uniform(0, rng.uniform(0.1, 1.0), size=m)
        tau = float(rng.uniform(0.05, 2.0))
        log_z = float(tilted_objective(logits, v, depth, correct, scores, tau))
        advantage = np.where(correct, np.exp(scores / tau - log_z), 0.0) - 1.0  # A_τ, (M,)
        grad = score_function_gradient(logits, v, depth, advantage)
        steps = np.eye(n_int * v).reshape(-1, n_int, v) * h
        j_plus = tilted_objective(logits + steps, v, depth, correct, scores, tau)
        j_minus = tilted_objective(logits - steps, v, depth, correct, scores, tau)
        fd = ((j_plus - j_minus) / (2 * h)).reshape(n_int, v)
        grad_err = float(np.max(np.abs(fd - grad))) / (1.0 + float(np.max(np.abs(grad))))
        pi = np.exp(trajectory_log_probs(logits, v, depth))
        baseline_err = abs(float(pi @ advantage))
        # Self-normalized weights of a sampled group against DSDR's softmax coupling over its correct rollouts.
        group = rng.choice(m, size=int(rng.integers(2, 17)), p=pi / pi.sum())
        coupling_err = 0.0
        if correct[group].any():
            log_u = np.where(correct[group], scores[group] / tau, -np.inf)
            snis = np.exp(log_u - logsumexp(log_u))
            coupling = np.zeros(group.size)
            coupling[correct[group]] = softmax(scores[group][correct[group]] / tau)
            coupling_err = float(np.max(np.abs(snis - coupling)))
        else:
            skipped += 1
        err = max(grad_err, baseline_err, coupling_err)
        residual = max(residual, err)
        violations += int(err > 1e-6)
    return CheckResult(
        trials=trials,
        violations=violations,
        max_residual=residual,
        details={"groups_without_correct_rollout": skipped},
    )


__all__ = [
    "allocation_objective",
    "correctness_and_token_entropy",
    "dsdr_reward",
    "group_advantages",
    "mixed_group_probability",
    "score_function_gradient",
    "support_uniform_logits",
    "tilted_objective",
]
