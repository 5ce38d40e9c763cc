"""Hypothesis properties of Theorem 3.4 / B.10 (seed 000) under the conditions the project states.

Instances are `theory.strategies.tree_instances`: tabular tree policies drawn as logits in [−3, 3]
(`V ≤ 6`, `H ≤ 3`: up to 216 leaves) with a correct set holding both kinds.
"""

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st
from scipy.special import expit, logit

from theory.measures import correctness, normalized_variance
from theory.optimum import differential_smoothing, entropy_regularized
from theory.strategies import entropy_coefs, kl_coefs, tree_instances
from theory.theorem_3_4 import (
    DIVERGENCES,
    construction_margin,
    divergence_lower_bound,
    ds_family_params,
    paper_construction,
    reachable_correctness_bound,
    search_witness,
    theorem_divergence,
)

finite = {"allow_nan": False, "allow_infinity": False}


def trees(max_actions: int = 6):
    """Tree instances with `V <= max_actions`, `H <= 3` (up to 216 leaves), logits in [-3, 3]."""
    return tree_instances(max_actions=max_actions, max_depth=3, logit_bound=3.0)


def _tol(bound):
    return bound + 1e-9 * abs(bound) + 1e-12


@given(
    trees(max_actions=4), kl_coefs(), entropy_coefs(), st.sampled_from(DIVERGENCES), st.booleans()
)
def test_witness_exists_when_construction_reachable(inst, beta, eta, kind, positive_only):
    log_pb, correct = inst.log_pb, inst.correct
    assume(construction_margin(log_pb, correct, beta, eta) > 0)
    res = search_witness(
        log_pb, correct, beta, eta, kind, positive_only=positive_only, grid=9, zooms=2
    )
    assert res.found
    assert res.d_ds <= _tol(res.epsilon)
    assert -res.p_ds <= _tol(-res.p_ent)
    assert res.v_ds <= _tol(res.v_ent)
    if positive_only:
        assert res.params[2] == 0.0


@given(trees(), kl_coefs(), entropy_coefs())
def test_paper_construction_keeps_v_and_lowers_divergence(inst, beta, eta):
    log_pb, correct = inst.log_pb, inst.correct
    params = paper_construction(log_pb, correct, beta, eta)
    assume(params is not None)
    log_ent = entropy_regularized(log_pb, correct.astype(float), beta, eta)
    log_ds = differential_smoothing(log_pb, correct, *params)
    v_ent = normalized_variance(log_ent, correct)
    assert abs(normalized_variance(log_ds, correct) - v_ent) <= 1e-7 * max(1.0, v_ent)
    assert abs(correctness(log_ds, correct) - correctness(log_ent, correct)) <= 1e-9
    for kind in DIVERGENCES:
        eps = theorem_divergence(log_ent, log_pb, kind)
        assert theorem_divergence(log_ds, log_pb, kind) <= _tol(eps)


@given(
    trees(max_actions=5),
    kl_coefs(),
    entropy_coefs(),
    st.floats(0.02, 1.0, **finite),
    st.floats(0.02, 1.0, **finite),
    st.floats(0.01, 5.0, **finite),
)
def test_lower_bound_holds_for_every_constrained_ds_optimum(inst, beta, eta, frac_c, inv_n, lift):
    """Any DS optimum with `κ_C ≤ κ` and `P ≥ P(π_ent)` is at least `divergence_lower_bound` away."""
    log_pb, correct = inst.log_pb, inst.correct
    assume(np.ptp(log_pb[correct]) > 1e-9)  # else κ_C is free and the bound uses κ_max = 1
    kc, kn = frac_c * beta / (beta + eta), 1.0 / inv_n
    p_star = reachable_correctness_bound(log_pb, correct, kc, kn)
    assume(p_star < 1 - 1e-9)
    p = float(expit(logit(p_star) + lift))
    assume(p < 1 - 1e-9)
    log_ds = differential_smoothing(log_pb, correct, *ds_family_params(log_pb, correct, kc, kn, p))
    log_ent = entropy_regularized(log_pb, correct.astype(float), beta, eta)
    assume(correctness(log_ds, correct) >= correctness(log_ent, correct))
    for kind in DIVERGENCES:
        bound = divergence_lower_bound(log_pb, correct, beta, eta, kind)
        with np.errstate(over="ignore"):
            d = theorem_divergence(log_ds, log_pb, kind)
        assert d >= bound * (1 - 1e-7) - 1e-10
