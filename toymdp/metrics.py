"""Exact metrics of a tabular policy by enumerating every trajectory (no sampling noise), in JAX.

Each is the JAX twin of a `theory.measures` function (tests check them equal) or of a formula of
docs/formulas.md (§1.9, §2.21, §4.9, §5.2); all are per prompt. Named axes as in `toymdp.policy`; `K` distinct-count budgets,
`k` pass@k budgets.

| key | shape | definition | source |
|---|---|---|---|
| `correctness` | (P,) | `P(π) = Σ_{τ∈C} π(τ)` | seed 000 Def. 3.3; `measures.correctness` |
| `normalized_variance` | (P,) | `|C|·Σ_{τ∈C} q(τ)² − 1`, `q = π/P` on `C` | seed 000 Def. 3.3; `measures.normalized_variance` |
| `entropy` | (P,) | `−Σ_τ π log π` (nats, trajectory level) | `measures.entropy` |
| `kl_to_base` | (P,) | `KL(π‖π_b)` | `measures.divergence` |
| `distinct_correct` | (P, K) | `Σ_{τ∈C} 1 − (1 − π(τ))^K` | seed 004 Prop. 3; `measures.expected_distinct` |
| `pass_at_k` | (P, k) | `1 − (1 − P(π))^k` (population pass@k of the prompt) | Chen et al. 2021 |
| `topn_logp` | (P, N) | `Λ^(n) = E_τ[(1/T) Σ_t log π(a^(n)_{s_t}|s_t)]`, `a^(n)` the rank-n action of `π` | seed 004 Eq. 2 |
| `topn_prob` | (P, N) | same with `π(a^(n)|s_t)` in place of its log | seed 004 Fig. 3 |

pass@k across prompts is the mean of `pass_at_k` over the prompts of interest (`prompt_means`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from toymdp.env import TreeEnv
from toymdp.policy import trajectory_log_probs

Array = jax.Array


def reach_probs(traj_p: Array, num_actions: int, depth: int) -> Array:
    """Probability of visiting each internal node, `(P, M) -> (P, N_int)` (depth-major order).

    A node at depth `d` is a block of `V**(H-d)` consecutive trajectories (lexicographic order),
    so its visit probability is the sum of that block. Each depth sums to 1.
    """
    lead = traj_p.shape[:-1]
    parts = [
        jnp.sum(traj_p.reshape(*lead, num_actions**d, num_actions ** (depth - d)), axis=-1)
        for d in range(depth)
    ]
    return jnp.concatenate(parts, axis=-1)


def exact_metrics(
    node_logp: Array,
    base_traj_logp: Array,
    correct: Array,
    nodes: np.ndarray,
    actions: np.ndarray,
    *,
    distinct_k: Sequence[int] = (1000,),
    pass_k: Sequence[int] = (1, 4, 16, 64),
    num_candidates: int = 3,
    record_policy: bool = False,
) -> dict[str, Array]:
    """Every exact metric of the table above.

    Args:
        node_logp: `(P, N_int, V)` policy log-probs. base_traj_logp: `(P, M)` base policy.
        correct: `(P, M)` bool. nodes, actions: `(H, M)` from `toymdp.policy.tree_index`.
        distinct_k, pass_k: budgets (static). num_candidates: `N <= V` (static).
        record_policy: also return `traj_logp` `(P, M)` (for heat maps over training).

    Returns:
        dict of arrays (shapes in the module table).
    """
    depth, _ = nodes.shape
    num_actions = node_logp.shape[-1]
    lp = trajectory_log_probs(node_logp, nodes, actions)  # (P, M)
    p = jnp.exp(lp)
    neg_inf = jnp.full_like(lp, -jnp.inf)
    log_pc = logsumexp(jnp.where(correct, lp, neg_inf), axis=-1)  # (P,)
    log_sq = logsumexp(jnp.where(correct, 2.0 * lp, neg_inf), axis=-1)
    size = jnp.sum(correct, axis=-1)
    # Log space as in theory.measures: q² sums of far-from-uniform policies stay accurate.
    nvar = jnp.maximum(jnp.expm1(jnp.log(size) + log_sq - 2.0 * log_pc), 0.0)
    corr = jnp.exp(log_pc)
    kk = jnp.asarray(distinct_k, dtype=lp.dtype)
    # 1 − (1 − p)^K = −expm1(K·log1p(−p)) stays accurate for tiny p.
    miss = -jnp.expm1(kk * jnp.log1p(-jnp.minimum(p, 1.0))[..., None])  # (P, M, K)
    distinct = jnp.sum(jnp.where(correct[..., None], miss, 0.0), axis=-2)
    ks = jnp.asarray(pass_k, dtype=lp.dtype)
    passk = -jnp.expm1(ks * jnp.log1p(-jnp.minimum(corr, 1.0))[..., None])  # (P, k)
    reach = reach_probs(p, num_actions, depth)  # (P, N_int)
    top_logp = jax.lax.top_k(node_logp, num_candidates)[0]  # (P, N_int, N), rank 1 first
    out = {
        "correctness": corr,
        "normalized_variance": nvar,
        "entropy": -jnp.sum(p * lp, axis=-1),
        "kl_to_base": jnp.sum(p * (lp - base_traj_logp), axis=-1),
        "distinct_correct": distinct,
        "pass_at_k": passk,
        "topn_logp": jnp.einsum("pn,pnk->pk", reach, top_logp) / depth,
        "topn_prob": jnp.einsum("pn,pnk->pk", reach, jnp.exp(top_logp)) / depth,
    }
    if record_policy:
        out["traj_logp"] = lp
    return out


def prompt_means(metrics: Mapping[str, object], env: TreeEnv) -> dict[str, np.ndarray]:
    """Means over training and held-out prompts of per-prompt metrics (NumPy, after training).

    Args:
        metrics: arrays whose prompt axis is the first one after any leading (settings, seeds,
            steps) axes, i.e. shape `(..., P)` or `(..., P, K)`; arrays are matched by rank to
            the shapes of `exact_metrics` (prompt axis at -1 for the `(P,)` metrics, -2 otherwise).
        env: the environment (gives `train_prompts`).

    Returns:
        `{"train/<key>": ..., "heldout/<key>": ...}` (held-out entries only if there are any).
    """
    per_prompt_last = {"correctness", "normalized_variance", "entropy", "kl_to_base"}
    out = {}
    train = env.train_prompts
    for key, value in metrics.items():
        if key == "traj_logp":
            continue
        arr = np.asarray(value)
        axis = -1 if key in per_prompt_last else -2
        for name, sel in (("train", train), ("heldout", ~train)):
            if sel.any():
                out[f"{name}/{key}"] = np.compress(sel, arr, axis=axis).mean(axis=axis)
    return out
