"""The pick rules of `experiment.study.select` (issue 56, item 3): each ranks a label's models by
its own score, and the shrinkage is DerSimonian & Laird's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from experiment import study as S


def _section(models):
    return {"models": [{"label": lb, "setting": s, "step": 1, "reference": False,
                        "status": "inside", "lift": v, "lift_se": se, "lift_p": 0.5, "x": 0.1,
                        "inside_fraction": 1.0} for lb, s, v, se in models]}  # fmt: skip


def test_each_rule_picks_by_its_score():
    # a noisy large estimate, a precise smaller one
    sec = _section([("m", "noisy", 0.05, 0.05), ("m", "precise", 0.03, 0.005)])
    assert S.select(sec, rule="estimate")["m"]["setting"] == "noisy"
    assert S.select(sec, rule="t")["m"]["setting"] == "precise"
    assert S.select(sec)["m"]["setting"] == S.select(sec, rule=S.PICK_RULE)["m"]["setting"]
    with pytest.raises(ValueError, match="rule"):
        S.select(sec, rule="largest")


@given(st.lists(st.tuples(st.floats(-0.2, 0.2), st.floats(0.001, 0.1)), min_size=1, max_size=8))
def test_shrinkage_stays_between_the_estimate_and_the_common_mean(cands):
    lift, se = (np.array(v) for v in zip(*cands, strict=True))
    post = S.shrunk_lifts(lift, se)
    lo, hi = np.minimum(lift, lift.min()), np.maximum(lift, lift.max())
    assert np.all(post >= lo - 1e-12) and np.all(post <= hi + 1e-12)
    if lift.size == 1:
        assert post[0] == pytest.approx(lift[0])


@given(st.lists(st.floats(-0.2, 0.2), min_size=2, max_size=8), st.floats(0.001, 0.1))
def test_with_equal_precision_shrinkage_keeps_the_order(lift, se):
    """Equal standard errors: one factor in [0, 1] pulls every estimate toward their mean, so the
    shrunk pick is the largest estimate's (the rules differ only by unequal precision)."""
    lift = np.array(lift)
    post = S.shrunk_lifts(lift, np.full(lift.size, se))
    d, e = post - post.mean(), lift - lift.mean()
    c = float(d @ e / (e @ e)) if e @ e > 0 else 0.0
    assert -1e-9 <= c <= 1 + 1e-9
    np.testing.assert_allclose(d, c * e, atol=1e-12)


def test_shrinkage_refuses_bad_standard_errors():
    with pytest.raises(ValueError, match="se"):
        S.shrunk_lifts([0.1, 0.2], [0.01, 0.0])
    with pytest.raises(ValueError, match="lift, se"):
        S.shrunk_lifts([0.1, 0.2], [0.01])
