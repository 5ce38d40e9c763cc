"""Hypothesis strategies for tree MDPs: the public inputs of a property test of a closed form.

Use them to test a conjecture of your own against the package's closed forms (see
``docs/property_testing.md``)::

    from hypothesis import given
    from theory.strategies import kl_coefs, tree_instances

    @given(inst=tree_instances(), beta=kl_coefs())
    def test_mine(inst, beta): ...

Every strategy draws bounded, finite float64 values (logits rather than probabilities, as numpy
and scipy do), so a failing example shrinks to a readable one. Conventions are those of
`theory.trees`: `V` actions, depth `H`, `M = V**H` trajectories (leaves), `N_int` internal nodes.

Requires Hypothesis (the ``strategies`` extra: ``pip install -e '.[strategies]'`` in the checkout,
or ``pip install 'hypothesis>=6.100'``); importing `theory` does not.
"""

from __future__ import annotations

import numpy as np

try:
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
except ImportError as exc:  # an optional dependency: the package itself never needs it
    raise ImportError(
        "theory.strategies needs Hypothesis (the strategies extra): pip install 'hypothesis>=6.100'"
    ) from exc

from theory.trees import TreeInstance, num_internal_nodes, trajectory_log_probs

__all__ = [
    "base_logits",
    "correct_sets",
    "entropy_coefs",
    "kl_coefs",
    "reward_vectors",
    "rewards",
    "tree_instances",
    "tree_shapes",
]

#: Default bounds: at most 4 actions, depth 4 and 256 leaves; logits in [-5, 5] (base-policy
#: action probabilities down to about e^-10 / V); rewards in [-3, 3]; KL coefficient
#: beta in [0.05, 5]; entropy coefficient eta in [0, 5].
MAX_ACTIONS, MAX_DEPTH, MAX_LEAVES = 4, 4, 256
LOGIT_BOUND, REWARD_BOUND = 5.0, 3.0
KL_RANGE, ENTROPY_RANGE = (0.05, 5.0), (0.0, 5.0)


def _floats(low: float, high: float) -> st.SearchStrategy[float]:
    return st.floats(low, high, allow_nan=False, allow_infinity=False)


def _shapes(max_actions: int, max_depth: int, max_leaves: int) -> list[tuple[int, int]]:
    for name, value, low in (
        ("max_actions", max_actions, 2),
        ("max_depth", max_depth, 1),
        ("max_leaves", max_leaves, 2),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return [
        (v, h)
        for v in range(2, max_actions + 1)
        for h in range(1, max_depth + 1)
        if v**h <= max_leaves
    ]


def tree_shapes(
    max_actions: int = MAX_ACTIONS, max_depth: int = MAX_DEPTH, max_leaves: int = MAX_LEAVES
) -> st.SearchStrategy[tuple[int, int]]:
    """Tree sizes `(V, H)` with `2 <= V <= max_actions`, `1 <= H <= max_depth`, `V**H <= max_leaves`.

    Raises:
        ValueError: a bound that is not an int, or `max_actions < 2`, `max_depth < 1`,
            `max_leaves < 2` (named).
    """
    return st.sampled_from(_shapes(max_actions, max_depth, max_leaves))


def base_logits(
    num_actions: int, depth: int, bound: float = LOGIT_BOUND
) -> st.SearchStrategy[np.ndarray]:
    """Tabular base-policy logits, float64 of shape `(N_int, V)`, each in `[-bound, bound]`.

    Turn them into trajectory log-probabilities `(M,)` with `theory.trees.trajectory_log_probs`.

    Raises:
        ValueError: a tree size `theory.trees` refuses, or a negative or non-finite `bound`.
    """
    if not np.isfinite(bound) or bound < 0:
        raise ValueError(f"bound must be a finite number >= 0, got {bound!r}")
    shape = (num_internal_nodes(num_actions, depth), num_actions)
    return hnp.arrays(np.float64, shape, elements=_floats(-bound, bound))


@st.composite
def correct_sets(draw: st.DrawFn, num_trajectories: int) -> np.ndarray:
    """A correct set: boolean mask of shape `(M,)` with at least one correct and one wrong leaf.

    Any other leaf is drawn freely; the forced pair is drawn too, so every split can come up.

    Raises:
        ValueError: `num_trajectories < 2` (both kinds cannot exist).
    """
    m = num_trajectories
    if isinstance(m, bool) or not isinstance(m, int) or m < 2:
        raise ValueError(f"num_trajectories must be an int >= 2, got {m!r}")
    correct = np.array(draw(st.lists(st.booleans(), min_size=m, max_size=m)))
    i = draw(st.integers(0, m - 1))
    j = (i + 1 + draw(st.integers(0, m - 2))) % m
    correct[i], correct[j] = True, False
    return correct


@st.composite
def tree_instances(
    draw: st.DrawFn,
    shapes: list[tuple[int, int]] | None = None,
    *,
    max_actions: int = MAX_ACTIONS,
    max_depth: int = MAX_DEPTH,
    max_leaves: int = MAX_LEAVES,
    logit_bound: float = LOGIT_BOUND,
) -> TreeInstance:
    """A `theory.trees.TreeInstance`: a tree, a base policy drawn as logits, a correct set.

    `log_pb` has shape `(M,)` (from `base_logits` in `[-logit_bound, logit_bound]`); `correct`
    has shape `(M,)` and holds both kinds (`correct_sets`).

    Args:
        shapes: the `(V, H)` sizes to draw from; default every size `tree_shapes` allows.
        max_actions, max_depth, max_leaves: bounds of the sizes when `shapes` is None.
        logit_bound: bound of each logit.

    Raises:
        ValueError: an empty `shapes`, or a bound `tree_shapes` or `base_logits` refuses.
    """
    choices = _shapes(max_actions, max_depth, max_leaves) if shapes is None else list(shapes)
    if not choices:
        raise ValueError(f"shapes must name at least one (V, H), got {shapes!r}")
    v, h = draw(st.sampled_from(choices))
    logits = draw(base_logits(v, h, logit_bound))
    correct = draw(correct_sets(v**h))
    return TreeInstance(v, h, trajectory_log_probs(logits, v, h), correct)


def reward_vectors(
    num_trajectories: int, bound: float = REWARD_BOUND
) -> st.SearchStrategy[np.ndarray]:
    """Arbitrary real rewards `r̂`, float64 of shape `(M,)`, each in `[-bound, bound]`.

    Raises:
        ValueError: `num_trajectories < 1`, or a negative or non-finite `bound`.
    """
    if isinstance(num_trajectories, bool) or not isinstance(num_trajectories, int):
        raise ValueError(f"num_trajectories must be an int >= 1, got {num_trajectories!r}")
    if num_trajectories < 1:
        raise ValueError(f"num_trajectories must be an int >= 1, got {num_trajectories!r}")
    if not np.isfinite(bound) or bound < 0:
        raise ValueError(f"bound must be a finite number >= 0, got {bound!r}")
    m = num_trajectories
    elements = st.lists(_floats(-bound, bound), min_size=m, max_size=m)
    return elements.map(lambda xs: np.array(xs, dtype=np.float64))


@st.composite
def rewards(draw: st.DrawFn, inst: TreeInstance, bound: float = REWARD_BOUND) -> np.ndarray:
    """Rewards `(M,)` for `inst`: the verifier's `1[C]` (float 0/1) or a `reward_vectors` draw.

    Raises:
        ValueError: a `bound` `reward_vectors` refuses.
    """
    if draw(st.booleans()):
        return inst.correct.astype(np.float64)
    return draw(reward_vectors(inst.num_trajectories, bound))


def kl_coefs(low: float = KL_RANGE[0], high: float = KL_RANGE[1]) -> st.SearchStrategy[float]:
    """KL coefficients `β` in `[low, high]` (default `[0.05, 5]`; `β > 0`, seed 000, Lemma B.1).

    Raises:
        ValueError: `low <= 0`, `high < low`, or a non-finite bound.
    """
    if not (np.isfinite(low) and np.isfinite(high)) or low <= 0 or high < low:
        raise ValueError(f"kl_coefs needs 0 < low <= high, finite; got low={low!r}, high={high!r}")
    return _floats(low, high)


def entropy_coefs(
    low: float = ENTROPY_RANGE[0], high: float = ENTROPY_RANGE[1]
) -> st.SearchStrategy[float]:
    """Entropy coefficients `η` in `[low, high]` (default `[0, 5]`: a bonus; seed 000, Lemma B.4).

    Negative values (a penalty) are drawn when `low < 0`; `theory.optimum.entropy_regularized`
    needs `β + η > 0`.

    Raises:
        ValueError: `high < low`, or a non-finite bound.
    """
    if not (np.isfinite(low) and np.isfinite(high)) or high < low:
        raise ValueError(f"entropy_coefs needs low <= high, finite; got low={low!r}, high={high!r}")
    return _floats(low, high)
