"""Tabular softmax policy on a tree MDP, in JAX: trajectory and per-token quantities.

Named axes: `P` prompts, `B` prompts in a batch (the training prompts), `G` responses per prompt,
`T = H` tokens per response (every response has exactly `H` tokens: the mask is all ones), `N_int`
internal nodes, `V` actions, `M = V**H` trajectories, `N` top-N candidates.

A policy is a logits array `(..., N_int, V)`; `π(a|s) = softmax(logits[s])[a]` and
`log π(τ) = Σ_t log π(a_t|s_t)`. The node visited and the action taken by every trajectory at every
depth come from `theory.trees.trajectory_nodes(V, H)` (two `(H, M)` int arrays), so the numbering
is the one `theory/` uses.

CaSP's candidates at a node are its actions ranked by the behaviour policy's probability
(descending; ties broken by action index, lower first, from a stable sort), as the LLM trainer
ranks vocabulary entries (seed 004 §4).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import shaping
from theory import trees

Array = jax.Array


def tree_index(num_actions: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """`(nodes, actions)`, each `(H, M)` int: the node visited and action taken at each depth."""
    nodes, actions = trees.trajectory_nodes(num_actions, depth)
    return np.asarray(nodes, dtype=np.int32), np.asarray(actions, dtype=np.int32)


def node_log_probs(logits: Array) -> Array:
    """`log π(a|s)`, shape `(..., N_int, V)`, from logits of the same shape."""
    return jax.nn.log_softmax(logits, axis=-1)


def trajectory_log_probs(node_logp: Array, nodes: np.ndarray, actions: np.ndarray) -> Array:
    """`log π(τ) = Σ_t log π(a_t|s_t)` for all `M` trajectories: `(..., N_int, V) -> (..., M)`.

    Same value as `theory.trees.trajectory_log_probs` (which takes logits; this takes their
    log-softmax so that callers compute it once).
    """
    return jnp.sum(node_logp[..., nodes, actions], axis=-2)


def sample_trajectories(traj_logp: Array, uniforms: Array) -> Array:
    """Sample trajectories by inverting the CDF of `π(τ)` over the lexicographic order.

    One uniform per response makes the draw easy to reproduce in the NumPy reference (which gets
    the same uniforms); it has the same law as sampling token by token.

    Args:
        traj_logp: `(B, M)` trajectory log-probabilities.
        uniforms: `(B, G)` numbers in `[0, 1)`.

    Returns:
        `(B, G)` int32 trajectory indices: the first `m` with `u·Σπ < cumsum(π)[m]`.
    """
    cdf = jnp.cumsum(jnp.exp(traj_logp), axis=-1)  # (B, M)
    # Scaling u by the total (not 1) keeps float32 rounding of the cumsum from leaving a gap.
    target = uniforms * cdf[:, -1:]
    idx = jnp.sum(cdf[:, None, :] <= target[..., None], axis=-1)
    return jnp.minimum(idx, traj_logp.shape[-1] - 1).astype(jnp.int32)


def token_path(traj: Array, nodes: np.ndarray, actions: np.ndarray) -> tuple[Array, Array]:
    """Nodes visited and actions taken by sampled trajectories: `(B, G) -> ((B, G, T), (B, G, T))`."""
    return jnp.asarray(nodes.T)[traj], jnp.asarray(actions.T)[traj]


def _rows(x: Array, tok_nodes: Array) -> Array:
    """`x[b, tok_nodes[b, g, t]]`: per-node values `(B, N_int, ...)` -> `(B, G, T, ...)`."""
    b = jnp.arange(x.shape[0])[:, None, None]
    return x[b, tok_nodes]


def token_log_probs(node_logp: Array, tok_nodes: Array, tok_actions: Array) -> Array:
    """`log π(a_t|s_t)` of the sampled tokens: `(B, N_int, V)` -> `(B, G, T)` (differentiable)."""
    b = jnp.arange(node_logp.shape[0])[:, None, None]
    return node_logp[b, tok_nodes, tok_actions]


def token_entropies(logits: Array, tok_nodes: Array) -> Array:
    """Entropy of `π(·|s_t)` at each sampled position, `(B, G, T)` (differentiable).

    Computed once per node with `shaping.token_entropy` (the LLM trainer's function) and gathered.
    """
    return _rows(shaping.token_entropy(logits), tok_nodes)


def candidate_ranking(node_logp_old: Array) -> tuple[Array, Array]:
    """Actions at every node ranked by the behaviour policy (descending, ties by index).

    Args:
        node_logp_old: `(B, N_int, V)` behaviour-policy log-probs.

    Returns:
        `(order, rank)`, both `(B, N_int, V)` int: `order[..., n]` is the rank-`n` action (0-based),
        `rank[..., a]` the 0-based rank of action `a` (`order` and `rank` are inverse permutations).
    """
    order = jnp.argsort(-node_logp_old, axis=-1, stable=True)
    rank = jnp.argsort(order, axis=-1, stable=True)
    return order, rank


def candidate_log_probs(node_logp: Array, order: Array, tok_nodes: Array, num: int) -> Array:
    """Log-probs of the top-`num` candidates (ranked by `order`) at each sampled position.

    Args:
        node_logp: `(B, N_int, V)` log-probs of the policy to evaluate (current or behaviour).
        order: `(B, N_int, V)` from `candidate_ranking` (behaviour policy).
        tok_nodes: `(B, G, T)` visited nodes. num: `N <= V` (static).

    Returns:
        `(B, G, T, N)`, rank 1 first (the `cand_logp` / `cand_logp_old` batch keys).
    """
    cand = jnp.take_along_axis(node_logp, order[..., :num], axis=-1)  # (B, N_int, N)
    return _rows(cand, tok_nodes)


def sampled_rank(rank: Array, tok_nodes: Array, tok_actions: Array) -> Array:
    """0-based rank of each sampled action among the behaviour policy's candidates, `(B, G, T)` int."""
    b = jnp.arange(rank.shape[0])[:, None, None]
    return rank[b, tok_nodes, tok_actions]


def hamming_diversity(traj_actions: Array) -> Array:
    """DSDR's per-response diversity score `s_i` in `[0, 1]` for the tree (the toy's analogue).

    `s_i = (s_sem_i + u_i)/2` (seed 001's combination) with the "semantic" distance replaced by the
    normalized Hamming distance between action sequences, `s_sem_i = mean_{j≠i} d_H(τ_i, τ_j)/T`,
    and formula uniqueness by trajectory uniqueness, `u_i = 1[τ_i differs from every other
    response of the group]` (a trajectory is its own single "formula").

    Args:
        traj_actions: `(B, G, T)` int actions of the sampled responses.

    Returns:
        `(B, G)` float32 scores (0 when `G = 1`).
    """
    diff = traj_actions[:, :, None, :] != traj_actions[:, None, :, :]  # (B, G, G, T)
    dist = jnp.mean(diff.astype(jnp.float32), axis=-1)  # (B, G, G); 0 on the diagonal
    group = traj_actions.shape[1]
    s_sem = jnp.sum(dist, axis=-1) / max(group - 1, 1)
    same = jnp.sum((dist == 0.0).astype(jnp.float32), axis=-1)  # counts itself once
    unique = (same == 1.0).astype(jnp.float32) * (group > 1)
    return 0.5 * (s_sem + unique)
