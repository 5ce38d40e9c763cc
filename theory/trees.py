"""Tree MDPs: trajectories, tabular policies and their trajectory distributions.

A tree MDP with `V` actions and depth `H` has `M = V**H` trajectories (leaves). A state is a prefix;
in a tree every distribution over leaves is realized by exactly one tabular policy on the prefixes
with positive probability (`π(a|s) = π(s·a) / π(s)`), so trajectory-level optima are policies.

Conventions used throughout the project:

- Trajectory `m` in `0..M-1` is the base-`V` number whose digits, most significant first, are the
  actions `a_1..a_H`; `enumerate_trajectories` lists them in that (lexicographic) order.
- Internal nodes (prefixes of length `d = 0..H-1`) are numbered depth-major: the prefix with base-`V`
  value `p` at depth `d` has index `node_offset(V, d) + p`. A tabular policy is a logits array of
  shape `(..., N_int, V)`, `N_int = (V**H - 1) / (V - 1)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
from scipy.special import log_softmax, logsumexp

from theory._validate import as_float_array, log_probs

ACTION_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _check_shape(num_actions: int, depth: int) -> None:
    if int(num_actions) != num_actions or num_actions < 2:
        raise ValueError(f"num_actions must be an integer >= 2, got {num_actions!r}")
    if int(depth) != depth or depth < 1:
        raise ValueError(f"depth must be an integer >= 1, got {depth!r}")
    if num_actions**depth > 2**24:
        raise ValueError(
            f"num_actions**depth = {num_actions}**{depth} exceeds 2**24 trajectories; use a smaller tree"
        )


def num_trajectories(num_actions: int, depth: int) -> int:
    """`M = V**H`, the number of trajectories (leaves)."""
    _check_shape(num_actions, depth)
    return num_actions**depth


def num_internal_nodes(num_actions: int, depth: int) -> int:
    """`N_int = 1 + V + ... + V**(H-1)`, the number of decision states (prefixes shorter than H)."""
    _check_shape(num_actions, depth)
    return (num_actions**depth - 1) // (num_actions - 1)


def node_offset(num_actions: int, depth_of_node: int) -> int:
    """Index of the first node at depth `d` in the depth-major node numbering."""
    return (num_actions**depth_of_node - 1) // (num_actions - 1)


@cache
def _indices(num_actions: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
    m = np.arange(num_actions**depth)
    nodes = np.empty((depth, m.size), dtype=np.int64)
    actions = np.empty((depth, m.size), dtype=np.int64)
    for d in range(depth):
        nodes[d] = node_offset(num_actions, d) + m // num_actions ** (depth - d)
        actions[d] = (m // num_actions ** (depth - 1 - d)) % num_actions
    nodes.setflags(write=False)
    actions.setflags(write=False)
    return nodes, actions


def enumerate_trajectories(num_actions: int, depth: int) -> np.ndarray:
    """All trajectories as action indices, shape `(M, H)`, in lexicographic order.

    Raises:
        ValueError: `num_actions < 2`, `depth < 1`, or more than 2**24 leaves.
    """
    _check_shape(num_actions, depth)
    return _indices(num_actions, depth)[1].T.copy()


def trajectory_nodes(num_actions: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """For each depth and trajectory, the node visited and the action taken: two `(H, M)` int arrays."""
    _check_shape(num_actions, depth)
    return _indices(num_actions, depth)


def trajectory_labels(num_actions: int, depth: int) -> list[str]:
    """Human-readable names of the `M` trajectories, e.g. `"ACD"` for actions `(0, 2, 3)`."""
    if num_actions > len(ACTION_LETTERS):
        raise ValueError(
            f"num_actions must be <= {len(ACTION_LETTERS)} for letter labels, got {num_actions}"
        )
    return [
        "".join(ACTION_LETTERS[a] for a in row)
        for row in enumerate_trajectories(num_actions, depth)
    ]


def trajectory_log_probs(logits: object, num_actions: int, depth: int) -> np.ndarray:
    """Trajectory log-probabilities of a tabular softmax policy.

    Args:
        logits: per-node action logits, shape `(..., N_int, V)`; any finite reals.

    Returns:
        `log π(τ) = Σ_t log softmax(logits[s_t])[a_t]`, shape `(..., M)`.

    Raises:
        ValueError: wrong trailing shape, NaN or infinite logits.
    """
    z = as_float_array(logits, "logits")
    n_int = num_internal_nodes(num_actions, depth)
    if z.ndim < 2 or z.shape[-2:] != (n_int, num_actions):
        raise ValueError(f"logits must have shape (..., {n_int}, {num_actions}), got {z.shape}")
    if not np.isfinite(z).all():
        raise ValueError("logits must be finite")
    node_logp = log_softmax(z, axis=-1)
    nodes, actions = _indices(num_actions, depth)
    return node_logp[..., nodes, actions].sum(axis=-2)


def prefix_log_probs(log_p: object, num_actions: int, depth: int) -> np.ndarray:
    """Log-probability of reaching each internal node, shape `(..., N_int)` (depth-major order).

    Args:
        log_p: trajectory log-probabilities, shape `(..., M)`, normalized.
    """
    lp = log_probs(log_p, "log_p")
    m = num_trajectories(num_actions, depth)
    if lp.shape[-1] != m:
        raise ValueError(f"log_p must have last axis {m} = {num_actions}**{depth}, got {lp.shape}")
    batch = lp.shape[:-1]
    parts = [
        logsumexp(lp.reshape(*batch, num_actions**d, num_actions ** (depth - d)), axis=-1)
        for d in range(depth)
    ]
    return np.concatenate(parts, axis=-1)


def logits_from_log_probs(log_p: object, num_actions: int, depth: int) -> np.ndarray:
    """The tabular policy realizing a distribution over trajectories, as logits `(..., N_int, V)`.

    The logits returned are the conditional log-probabilities `log π(a|s) = log π(s·a) − log π(s)`,
    so `trajectory_log_probs(logits_from_log_probs(lp)) == lp` for full-support `lp`. Nodes that
    `lp` never reaches get uniform logits (their policy does not change the distribution); a
    zero-probability action gets a logit of −1e30 so that its trajectories keep probability 0.

    Raises:
        ValueError: `log_p` not normalized over its last axis, or its size is not `V**H`.
    """
    lp = log_probs(log_p, "log_p")
    m = num_trajectories(num_actions, depth)
    if lp.shape[-1] != m:
        raise ValueError(f"log_p must have last axis {m} = {num_actions}**{depth}, got {lp.shape}")
    batch = lp.shape[:-1]
    out = []
    for d in range(depth):
        child = logsumexp(
            lp.reshape(*batch, num_actions**d, num_actions, num_actions ** (depth - d - 1)), axis=-1
        )
        parent = logsumexp(child, axis=-1, keepdims=True)
        reached = np.isfinite(parent)
        with np.errstate(invalid="ignore"):
            cond = np.where(reached, child - np.where(reached, parent, 0.0), 0.0)
        out.append(np.maximum(cond, -1e30))
    return np.concatenate(out, axis=-2)


@dataclass(frozen=True)
class TreeInstance:
    """A tree MDP with a base policy and a correct set.

    Attributes:
        num_actions: `V`; depth: `H`.
        log_pb: base-policy trajectory log-probabilities, shape `(M,)`.
        correct: boolean correct-set mask, shape `(M,)`.
    """

    num_actions: int
    depth: int
    log_pb: np.ndarray
    correct: np.ndarray

    @property
    def num_trajectories(self) -> int:
        return self.num_actions**self.depth


def random_base_logits(
    rng: np.random.Generator, num_actions: int, depth: int, skew: float = 1.0
) -> np.ndarray:
    """Random tabular base-policy logits, shape `(N_int, V)`: i.i.d. `Normal(0, skew²)`.

    `skew = 0` is the uniform policy; larger `skew` gives sharper (more peaked) base policies.

    Raises:
        ValueError: negative or non-finite `skew`.
    """
    if not np.isfinite(skew) or skew < 0:
        raise ValueError(f"skew must be a finite number >= 0, got {skew!r}")
    return skew * rng.standard_normal((num_internal_nodes(num_actions, depth), num_actions))


def random_base_policy(
    rng: np.random.Generator, num_actions: int, depth: int, skew: float = 1.0
) -> np.ndarray:
    """Trajectory log-probabilities `(M,)` of a random tabular base policy (see `random_base_logits`)."""
    return trajectory_log_probs(
        random_base_logits(rng, num_actions, depth, skew), num_actions, depth
    )


def random_correct_set(
    rng: np.random.Generator,
    num_trajectories: int,
    size: int | None = None,
    *,
    fraction: float = 0.25,
) -> np.ndarray:
    """A random correct set: boolean mask `(M,)` with `size` correct trajectories.

    If `size` is None, it is `round(fraction·M)` clipped to `[1, M−1]`, so both kinds exist.

    Raises:
        ValueError: `size` outside `[0, M]`, or `fraction` outside `[0, 1]`.
    """
    m = int(num_trajectories)
    if size is None:
        if not 0 <= fraction <= 1:
            raise ValueError(f"fraction must be in [0, 1], got {fraction!r}")
        size = int(min(max(round(fraction * m), 1), m - 1))
    if not 0 <= size <= m:
        raise ValueError(f"size must be in [0, {m}], got {size!r}")
    mask = np.zeros(m, dtype=bool)
    mask[rng.choice(m, size=size, replace=False)] = True
    return mask


def random_instance(
    rng: np.random.Generator,
    num_actions: int = 3,
    depth: int = 3,
    skew: float = 1.0,
    correct_size: int | None = None,
) -> TreeInstance:
    """A random tree with a random base policy and a random correct set holding both kinds."""
    log_pb = random_base_policy(rng, num_actions, depth, skew)
    correct = random_correct_set(rng, num_actions**depth, correct_size)
    return TreeInstance(num_actions, depth, log_pb, correct)


#: The CaSP toy (seed 004, Fig. 5): actions A..D, depth 3, six correct trajectories.
CASP_CORRECT = ("ACD", "ACB", "BDC", "BDA", "CAB", "DBA")


def casp_tree(log_pb: np.ndarray | None = None) -> TreeInstance:
    """The CaSP tree (seed 004, Fig. 5): `V = 4` (A..D), `H = 3`, correct `ACD ACB BDC BDA CAB DBA`.

    The base policy defaults to uniform (the paper does not publish one).
    """
    labels = trajectory_labels(4, 3)
    correct = np.array([lab in CASP_CORRECT for lab in labels])
    if log_pb is None:
        log_pb = np.full(64, -np.log(64.0))
    return TreeInstance(4, 3, log_probs(log_pb, "log_pb"), correct)
