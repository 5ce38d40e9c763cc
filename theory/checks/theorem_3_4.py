"""Checkers for Theorem 3.4 / B.10 of seed 000, one per divergence (`thm_3_4_kl`, ...).

On random trees each checker computes the entropy-bonus optimum `π_ent` (policy anchor) and
searches the DS family for a witness (`theory.theorem_3_4.search_witness`), separately in the
general family (`γ_p, γ_n ≥ 0`) and the positive-only family (`γ_n = 0`). The paper's claim fails
on a large share of instances; the project documents the exact sufficient condition
(`construction_margin > 0`: the proof's construction reaches `P(π_ent)`; docs/theorem_3_4.md).
Violations (exit 1) are failures of what the project claims:

- the margin is positive but no witness is found, or the proof's construction fails (unequal `V`,
  smaller `P` or larger `D`);
- a witness is found although the proven lower bound exceeds `ε`, or the lower bound exceeds the
  searched minimum (the search and the certificate disagree);
- a positive-only witness exists but no general one (the former family is a subset).

Counterexamples (status "counterexample", no exit 1) are instances without a general witness.
"""

from __future__ import annotations

import numpy as np

from theory.checks._registry import CheckResult, register
from theory.measures import correctness, normalized_variance
from theory.optimum import differential_smoothing, entropy_regularized
from theory.theorem_3_4 import (
    ATOL,
    RTOL,
    TheoremDivergence,
    construction_margin,
    divergence_lower_bound,
    paper_construction,
    search_witness,
    theorem_divergence,
)
from theory.trees import random_instance

_SOURCE = "seed 000, Thm 3.4 / B.10"
_CLAIM = (
    "for beta>0, eta>=0, eps=D(pi_ent||pi_b): some DS (beta', gamma_p, gamma_n>=0) has "
    "D<=eps, P>=P(pi_ent), V<=V(pi_ent)"
)
_TRIALS = 40


def _excess(x: float, bound: float) -> float:
    """How far `x` exceeds `bound` beyond the tolerance (0 if within)."""
    return max(0.0, x - bound - RTOL * abs(bound) - ATOL)


def _draw(rng: np.random.Generator) -> tuple:
    """A random instance: `V ∈ 2..4`, `H ∈ 1..3`, skew in `[0, 3]`, `|C|` uniform in `1..M−1`,
    `β` log-uniform in `[0.05, 5]`, `η` uniform in `[0, 5]`."""
    num_actions, depth = int(rng.integers(2, 5)), int(rng.integers(1, 4))
    m = num_actions**depth
    inst = random_instance(
        rng, num_actions, depth, skew=float(rng.uniform(0, 3)), correct_size=int(rng.integers(1, m))
    )
    beta = float(np.exp(rng.uniform(np.log(0.05), np.log(5.0))))
    eta = float(rng.uniform(0.0, 5.0))
    return inst, beta, eta


def _check_construction(log_pb, correct, beta, eta, kind, eps) -> float:
    """Largest failure of the proof's construction (equal `V`, `P ≥ P_ent`, `D ≤ ε`); 0 if it holds."""
    params = paper_construction(log_pb, correct, beta, eta)
    log_ent = entropy_regularized(log_pb, correct.astype(float), beta, eta, anchor="policy")
    log_ds = differential_smoothing(log_pb, correct, *params, anchor="policy")
    v_ent, v_ds = normalized_variance(log_ent, correct), normalized_variance(log_ds, correct)
    p_ent, p_ds = correctness(log_ent, correct), correctness(log_ds, correct)
    return max(
        max(0.0, abs(v_ds - v_ent) - 1e-7 * max(1.0, v_ent)),
        max(0.0, abs(p_ds - p_ent) - 1e-9),
        _excess(theorem_divergence(log_ds, log_pb, kind), eps),
    )


def _run(kind: TheoremDivergence, rng: np.random.Generator, trials: int) -> CheckResult:
    res = CheckResult(trials=trials)
    counts = {
        "construction_reachable": 0,
        "witness_general": 0,
        "witness_positive_only": 0,
        "certified_no_witness": 0,
    }
    minimal: dict | None = None
    worst_cex_gap = 0.0
    for _ in range(trials):
        inst, beta, eta = _draw(rng)
        lpb, c = inst.log_pb, inst.correct
        margin = construction_margin(lpb, c, beta, eta)
        gen = search_witness(lpb, c, beta, eta, kind)
        pos = search_witness(lpb, c, beta, eta, kind, positive_only=True)
        bound = divergence_lower_bound(lpb, c, beta, eta, kind)
        eps = gen.epsilon
        counts["witness_general"] += gen.found
        counts["witness_positive_only"] += pos.found
        counts["certified_no_witness"] += _excess(bound, eps) > 0
        bad = [
            _excess(bound, gen.min_divergence),
            _excess(bound, eps) if gen.found else 0.0,
            float(pos.found and not gen.found),
        ]
        if margin > 0:
            counts["construction_reachable"] += 1
            bad += [float(not gen.found), float(not pos.found)]
            bad.append(_check_construction(lpb, c, beta, eta, kind, eps))
        res.max_residual = max(res.max_residual, gen.residual, pos.residual, *bad)
        res.violations += any(b > 0 for b in bad)
        if gen.found:
            continue
        res.counterexamples += 1
        gap = (gen.min_divergence - eps) / max(eps, 1e-300)
        worst_cex_gap = max(worst_cex_gap, gap)
        key = (inst.num_trajectories, int(c.sum()), -gap)
        if minimal is None or key < minimal["_key"]:
            minimal = {
                "_key": key,
                "num_actions": inst.num_actions,
                "depth": inst.depth,
                "log_pb": [float(x) for x in lpb],
                "correct": [bool(x) for x in c],
                "beta": beta,
                "eta": eta,
                "epsilon": eps,
                "p_ent": gen.p_ent,
                "v_ent": gen.v_ent,
                "construction_margin": margin,
                "min_ds_divergence": gen.min_divergence,
                "proven_lower_bound": bound,
                "best_ds": {
                    "kappa_c": gen.kappa_c,
                    "kappa_n": gen.kappa_n,
                    "beta_gamma_p_gamma_n": list(gen.params) if gen.params else None,
                    "P": gen.p_ds,
                    "V": gen.v_ds,
                    "D": gen.d_ds,
                },
            }
    if minimal is not None:
        minimal.pop("_key")
    res.details = {
        **counts,
        "counterexamples_positive_only": trials - counts["witness_positive_only"],
        "largest_relative_gap": worst_cex_gap,
        "minimal_counterexample": minimal,
    }
    return res


@register("thm_3_4_kl", source=_SOURCE + ", KL(pi||pi_b)", claim=_CLAIM, trials=_TRIALS)
def thm_3_4_kl(rng: np.random.Generator, trials: int) -> CheckResult:
    """Theorem 3.4 / B.10 with `D = KL(π‖π_b)` (seed 000, Lemma B.7)."""
    return _run("kl", rng, trials)


@register("thm_3_4_kl_reverse", source=_SOURCE + ", KL(pi_b||pi)", claim=_CLAIM, trials=_TRIALS)
def thm_3_4_kl_reverse(rng: np.random.Generator, trials: int) -> CheckResult:
    """Theorem 3.4 / B.10 with `D = KL(π_b‖π)` (seed 000, Lemma B.6)."""
    return _run("kl_reverse", rng, trials)


@register("thm_3_4_chi2", source=_SOURCE + ", chi2(pi||pi_b)", claim=_CLAIM, trials=_TRIALS)
def thm_3_4_chi2(rng: np.random.Generator, trials: int) -> CheckResult:
    """Theorem 3.4 / B.10 with `D = χ²(π‖π_b)` (seed 000, Lemma B.9)."""
    return _run("chi2", rng, trials)


@register("thm_3_4_chi2_reverse", source=_SOURCE + ", chi2(pi_b||pi)", claim=_CLAIM, trials=_TRIALS)
def thm_3_4_chi2_reverse(rng: np.random.Generator, trials: int) -> CheckResult:
    """Theorem 3.4 / B.10 with `D = χ²(π_b‖π)` (seed 000, Lemma B.8)."""
    return _run("chi2_reverse", rng, trials)
