"""Tree MDPs (`theory.trees`): enumeration order, tabular policies, the CaSP toy and input errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.special import log_softmax, logsumexp

from theory import trees


def _reference_log_probs(logits: np.ndarray, v: int, h: int) -> np.ndarray:
    """Slow reference: walk each trajectory's prefixes, summing the conditional log-probabilities."""
    out = []
    for actions in itertools.product(range(v), repeat=h):
        total, prefix = 0.0, 0
        for d, a in enumerate(actions):
            node = trees.node_offset(v, d) + prefix
            total += log_softmax(logits[node])[a]
            prefix = prefix * v + a
        out.append(total)
    return np.array(out)


@pytest.mark.parametrize(("v", "h"), [(2, 1), (2, 3), (3, 2), (4, 3)])
def test_enumeration_is_lexicographic(v: int, h: int) -> None:
    traj = trees.enumerate_trajectories(v, h)
    assert traj.shape == (v**h, h)
    assert [tuple(row) for row in traj] == list(itertools.product(range(v), repeat=h))
    assert trees.num_trajectories(v, h) == v**h
    assert trees.num_internal_nodes(v, h) == sum(v**d for d in range(h))


def test_labels() -> None:
    assert trees.trajectory_labels(3, 2) == ["AA", "AB", "AC", "BA", "BB", "BC", "CA", "CB", "CC"]


@pytest.mark.parametrize(("v", "h"), [(2, 2), (3, 3), (4, 2)])
def test_trajectory_nodes_are_the_prefixes(v: int, h: int) -> None:
    nodes, actions = trees.trajectory_nodes(v, h)  # (H, M)
    traj = trees.enumerate_trajectories(v, h)
    for m, row in enumerate(traj):
        prefix = 0
        for d in range(h):
            assert nodes[d, m] == trees.node_offset(v, d) + prefix
            assert actions[d, m] == row[d]
            prefix = prefix * v + row[d]


@pytest.mark.parametrize(("v", "h"), [(2, 1), (2, 4), (3, 3), (4, 3)])
def test_log_probs_match_the_reference_and_normalize(v: int, h: int) -> None:
    rng = np.random.default_rng(v * 10 + h)
    logits = 2.0 * rng.standard_normal((trees.num_internal_nodes(v, h), v))
    lp = trees.trajectory_log_probs(logits, v, h)
    np.testing.assert_allclose(lp, _reference_log_probs(logits, v, h), rtol=0, atol=1e-12)
    assert abs(logsumexp(lp)) < 1e-12


def test_log_probs_batch() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((5, 2, trees.num_internal_nodes(3, 2), 3))
    lp = trees.trajectory_log_probs(logits, 3, 2)
    assert lp.shape == (5, 2, 9)
    np.testing.assert_allclose(lp[3, 1], trees.trajectory_log_probs(logits[3, 1], 3, 2))


@pytest.mark.parametrize(("v", "h"), [(2, 3), (3, 2), (4, 3)])
def test_logits_round_trip(v: int, h: int) -> None:
    rng = np.random.default_rng(h)
    lp = trees.random_base_policy(rng, v, h, skew=2.0)
    logits = trees.logits_from_log_probs(lp, v, h)
    assert logits.shape == (trees.num_internal_nodes(v, h), v)
    # The logits are the conditional log-probabilities: each node's row is normalized.
    np.testing.assert_allclose(logsumexp(logits, axis=-1), 0.0, atol=1e-12)
    np.testing.assert_allclose(trees.trajectory_log_probs(logits, v, h), lp, atol=1e-12)


def test_logits_round_trip_with_zero_probability_branches() -> None:
    v, h = 3, 3
    rng = np.random.default_rng(1)
    p = rng.random(v**h)
    p[:9] = 0.0  # the whole subtree under action A
    p[10] = 0.0  # one leaf
    p[18:21] = 0.0  # the subtree under C, A
    lp = np.log(p / p.sum(), where=p > 0, out=np.full(p.size, -np.inf))
    logits = trees.logits_from_log_probs(lp, v, h)
    assert np.isfinite(logits).all()  # zero branches get −1e30, unreached nodes uniform logits
    back = trees.trajectory_log_probs(logits, v, h)
    np.testing.assert_allclose(np.exp(back), np.exp(lp), rtol=1e-12, atol=1e-300)
    assert np.all(np.exp(back[p == 0]) == 0.0)
    np.testing.assert_allclose(back[p > 0], lp[p > 0], atol=1e-12)


def test_prefix_log_probs() -> None:
    v, h = 3, 3
    lp = trees.random_base_policy(np.random.default_rng(2), v, h)
    pre = trees.prefix_log_probs(lp, v, h)
    assert pre.shape == (trees.num_internal_nodes(v, h),)
    assert abs(pre[0]) < 1e-12  # the root is always reached
    # Node B at depth 1 is reached by the nine trajectories starting with action 1.
    np.testing.assert_allclose(pre[trees.node_offset(v, 1) + 1], logsumexp(lp[9:18]), atol=1e-12)
    # Node CA at depth 2 is reached by trajectories 18..20.
    np.testing.assert_allclose(pre[trees.node_offset(v, 2) + 6], logsumexp(lp[18:21]), atol=1e-12)


def test_skew_zero_is_uniform() -> None:
    lp = trees.random_base_policy(np.random.default_rng(0), 4, 2, skew=0.0)
    np.testing.assert_allclose(lp, -np.log(16.0), atol=1e-12)


def test_random_correct_set_holds_both_kinds() -> None:
    rng = np.random.default_rng(0)
    for m in (2, 3, 9, 64):
        for _ in range(20):
            mask = trees.random_correct_set(rng, m)
            assert mask.dtype == bool and mask.shape == (m,)
            assert mask.any() and not mask.all()
    assert trees.random_correct_set(rng, 10, 4).sum() == 4


def test_random_instance() -> None:
    inst = trees.random_instance(np.random.default_rng(0), 3, 2, skew=1.5, correct_size=3)
    assert inst.num_trajectories == 9
    assert inst.log_pb.shape == (9,) and inst.correct.sum() == 3
    assert abs(logsumexp(inst.log_pb)) < 1e-12


def test_casp_tree() -> None:
    inst = trees.casp_tree()
    labels = trees.trajectory_labels(4, 3)
    assert (inst.num_actions, inst.depth, inst.num_trajectories) == (4, 3, 64)
    assert inst.correct.sum() == 6
    assert sorted(lab for lab, c in zip(labels, inst.correct, strict=True) if c) == sorted(
        ["ACD", "ACB", "BDC", "BDA", "CAB", "DBA"]
    )
    # "ACD" is actions (0, 2, 3): index 0·16 + 2·4 + 3.
    assert inst.correct[11] and labels[11] == "ACD"
    np.testing.assert_allclose(inst.log_pb, -np.log(64.0))


def test_casp_tree_checks_its_base_policy() -> None:
    with pytest.raises(ValueError, match="log_pb"):
        trees.casp_tree(np.zeros(64))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: trees.enumerate_trajectories(1, 2), "num_actions"),
        (lambda: trees.enumerate_trajectories(2.5, 2), "num_actions"),
        (lambda: trees.enumerate_trajectories(2, 0), "depth"),
        (lambda: trees.num_trajectories(4, 13), "2\\*\\*24"),
        (lambda: trees.trajectory_labels(27, 1), "num_actions"),
        (lambda: trees.trajectory_log_probs(np.zeros((3, 2)), 2, 3), "logits"),
        (lambda: trees.trajectory_log_probs(np.full((3, 2), np.nan), 2, 2), "logits"),
        (lambda: trees.trajectory_log_probs(np.full((3, 2), np.inf), 2, 2), "logits"),
        (lambda: trees.logits_from_log_probs(np.zeros(4), 2, 2), "log_p"),
        (lambda: trees.logits_from_log_probs(np.full(8, -np.log(8)), 2, 2), "log_p"),
        (lambda: trees.prefix_log_probs(np.full(4, np.nan), 2, 2), "log_p"),
        (lambda: trees.random_base_logits(np.random.default_rng(0), 2, 2, -1.0), "skew"),
        (lambda: trees.random_base_logits(np.random.default_rng(0), 2, 2, np.nan), "skew"),
        (lambda: trees.random_correct_set(np.random.default_rng(0), 4, 5), "size"),
        (lambda: trees.random_correct_set(np.random.default_rng(0), 4, fraction=1.5), "fraction"),
    ],
)
def test_errors_name_the_argument(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()
