"""The public tree-MDP strategies (`theory.strategies`) draw what their docstrings promise."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import find, given
from hypothesis import strategies as st
from scipy.special import logsumexp

from theory.strategies import (
    base_logits,
    correct_sets,
    entropy_coefs,
    kl_coefs,
    reward_vectors,
    rewards,
    tree_instances,
    tree_shapes,
)
from theory.trees import TreeInstance, num_internal_nodes


@given(inst=tree_instances(max_actions=3, max_depth=3, max_leaves=20, logit_bound=2.0))
def test_tree_instances_honour_their_bounds(inst: TreeInstance):
    v, h, m = inst.num_actions, inst.depth, inst.num_trajectories
    assert 2 <= v <= 3 and 1 <= h <= 3 and m == v**h <= 20
    assert inst.log_pb.shape == inst.correct.shape == (m,)
    assert inst.correct.dtype == bool and inst.correct.any() and not inst.correct.all()
    assert abs(logsumexp(inst.log_pb)) < 1e-12
    # Each action has probability at least e^(-2 bound) / V, so a leaf at least that to the H.
    assert np.all(inst.log_pb >= h * (-2 * 2.0 - np.log(v)) - 1e-12)


@given(inst=tree_instances([(5, 1), (2, 3)]))
def test_tree_instances_draw_only_the_shapes_asked_for(inst: TreeInstance):
    assert (inst.num_actions, inst.depth) in {(5, 1), (2, 3)}


@given(shape=tree_shapes(max_actions=6, max_depth=5, max_leaves=30))
def test_tree_shapes_stay_within_the_leaf_bound(shape):
    v, h = shape
    assert 2 <= v <= 6 and 1 <= h <= 5 and v**h <= 30


@given(logits=base_logits(3, 2, bound=0.5))
def test_base_logits_have_one_row_per_internal_node(logits):
    assert logits.shape == (num_internal_nodes(3, 2), 3) == (4, 3)
    assert logits.dtype == np.float64 and np.all(np.abs(logits) <= 0.5)


@pytest.mark.parametrize("m", [2, 3, 7])
def test_correct_sets_reach_every_split_holding_both_kinds(m):
    for size in range(1, m):
        found = find(correct_sets(m), lambda c, size=size: int(c.sum()) == size)
        assert found.shape == (m,) and found.dtype == bool


@given(data=st.data(), inst=tree_instances(max_depth=2))
def test_rewards_are_the_indicator_or_bounded_reals(data, inst: TreeInstance):
    r = data.draw(rewards(inst, bound=0.25))
    assert r.shape == (inst.num_trajectories,) and r.dtype == np.float64
    assert np.array_equal(r, inst.correct) or np.all(np.abs(r) <= 0.25)


@given(r=reward_vectors(5, bound=1.5), beta=kl_coefs(0.1, 0.2), eta=entropy_coefs(-0.05, 0.0))
def test_reward_vectors_and_coefficients_stay_in_range(r, beta, eta):
    assert r.shape == (5,) and np.all(np.abs(r) <= 1.5)
    assert 0.1 <= beta <= 0.2 and -0.05 <= eta <= 0.0


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: tree_shapes(max_actions=1), "max_actions must be an int >= 2, got 1"),
        (lambda: tree_shapes(max_depth=2.0), "max_depth must be an int >= 1, got 2.0"),
        (lambda: base_logits(2, 2, bound=-1.0), "bound must be a finite number >= 0, got -1.0"),
        (lambda: reward_vectors(0), "num_trajectories must be an int >= 1, got 0"),
        (lambda: kl_coefs(0.0, 1.0), "kl_coefs needs 0 < low <= high"),
        (lambda: entropy_coefs(1.0, 0.5), "entropy_coefs needs low <= high"),
    ],
)
def test_bad_bounds_are_refused_with_their_name(make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        make()


@pytest.mark.parametrize(
    ("strategy", "message"),
    [
        (correct_sets(1), "num_trajectories must be an int >= 2, got 1"),
        (tree_instances(shapes=[]), r"shapes must name at least one \(V, H\), got \[\]"),
    ],
)
def test_bad_sizes_are_refused_when_drawn(strategy, message):
    with pytest.raises(ValueError, match=message):
        find(strategy, lambda _: True)
