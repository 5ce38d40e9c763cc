"""Slow, obviously-correct NumPy reference of the sampled mode: one run, Python loop over updates.

Same algorithm as `toymdp.train` with `mode="sampled"`, written independently in NumPy float64:

- sampling: the `(U, B, G)` uniforms are an *input* (`toymdp.train.sampling_uniforms(config, key)`
  gives the ones the JAX run uses), inverted through the CDF of `π_old(τ)` in lexicographic order,
  so both implementations draw the same trajectories from the same numbers;
- advantages: the shaping method's own `advantages(batch, **hyper)` on NumPy arrays;
- loss gradient: the tabular policy gradient of the clipped surrogate plus `kl_coef`·k3, written
  by hand (no autodiff; see `surrogate_logit_grad`);
- optimizers: Adam and SGD written out (the update rules of `optax.adam` / `optax.sgd`);
- metrics: `theory.measures` on the trajectory distribution, and `Λ^(n)` by an explicit loop over
  nodes.

It covers the methods whose loss is the clipped surrogate of an advantage (`REFERENCE_METHODS`):
the others add ratio reshaping (CaSP), token-entropy terms or a local term (DSDR) to the loss.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from scipy.special import log_softmax

import shaping
from theory import measures, trees
from toymdp.train import TrainConfig

#: Methods whose loss is `agg(clipped surrogate(A) + kl_coef·k3)` with shaping's advantages `A`.
REFERENCE_METHODS = (
    "grpo",
    "dr_grpo",
    "ds_grpo",
    "ds_grpo_pos",
    "ds_grpo_neg",
    "entropy_bonus",
    "entropy_penalty",
    "unlikeliness",
    "passk",
    "w_reinforce",
    "psr",
    "nsr",
    "progrpo",
)


def surrogate_logit_grad(
    node_probs: np.ndarray,
    tok_nodes: np.ndarray,
    tok_actions: np.ndarray,
    logp_old: np.ndarray,
    logp_ref: np.ndarray,
    adv: np.ndarray,
    *,
    eps_low: float,
    eps_high: float,
    kl_coef: float,
) -> tuple[float, np.ndarray]:
    """Loss and its gradient w.r.t. the logits of the training prompts, by hand.

    Per token `ℓ_t = −min(ρ_t A, clip(ρ_t, 1−ε_low, 1+ε_high) A) + kl_coef·k3_t`, with
    `ρ_t = exp(min(log π − log π_old, 20))`, `k3 = e^{q−p} − (q−p) − 1` (`q = log π_ref`,
    `q − p` clamped at 20 as in shaping); the loss is the mean over all `B·G·T` tokens (every mask
    entry is 1, so token-mean, seq-mean-token-mean and seq-mean-token-sum-norm coincide).

    `∂ℓ_t/∂log π_t = −A·ρ_t` unless the clipped branch is active (`A > 0, ρ > 1+ε_high` or
    `A < 0, ρ < 1−ε_low`: then 0), plus `kl_coef·(1 − e^{q−p})`; and for the tabular softmax
    `∂log π(a|s)/∂z[s, v] = 1[v = a] − π(v|s)` (seed 004 Lemma 2 is the same identity).

    Args:
        node_probs: `(B, N_int, V)` current policy. tok_nodes, tok_actions: `(B, G, T)`.
        logp_old, logp_ref: `(B, G, T)`. adv: `(B, G)`.

    Returns:
        `(loss, grad)` with `grad` of shape `(B, N_int, V)`.
    """
    b_idx = np.arange(node_probs.shape[0])[:, None, None]
    logp = np.log(node_probs[b_idx, tok_nodes, tok_actions])
    log_ratio = logp - logp_old
    ratio = np.exp(np.minimum(log_ratio, 20.0))
    a = adv[..., None]
    clipped = np.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    surrogate = -np.minimum(ratio * a, clipped * a)
    diff = logp_ref - logp
    kl = np.exp(np.minimum(diff, 20.0)) - diff - 1.0
    n = logp.size
    loss = float(np.mean(surrogate + kl_coef * kl))
    on_clip = ((a > 0) & (ratio > 1.0 + eps_high)) | ((a < 0) & (ratio < 1.0 - eps_low))
    d_ratio = np.where(log_ratio < 20.0, ratio, 0.0)
    d_kl = 1.0 - np.where(diff < 20.0, np.exp(np.minimum(diff, 20.0)), 0.0)
    g = (np.where(on_clip, 0.0, -a * d_ratio) + kl_coef * d_kl) / n  # (B, G, T) dL/dlogp
    grad = np.zeros_like(node_probs)
    v = node_probs.shape[-1]
    onehot = np.eye(v)[tok_actions]  # (B, G, T, V)
    contrib = g[..., None] * (onehot - node_probs[b_idx, tok_nodes])
    np.add.at(grad, (np.broadcast_to(b_idx, tok_nodes.shape), tok_nodes), contrib)
    return loss, grad


def _topn(node_logp: np.ndarray, log_p: np.ndarray, v: int, h: int, num: int) -> np.ndarray:
    """`Λ^(n)` and the matching probabilities for one prompt by a loop over nodes: `(2, N)`."""
    reach = np.exp(trees.prefix_log_probs(log_p, v, h))
    out = np.zeros((2, num))
    for s in range(node_logp.shape[0]):
        ranked = sorted(range(v), key=lambda a, s=s: (-node_logp[s, a], a))[:num]
        for n, a in enumerate(ranked):
            out[0, n] += reach[s] * node_logp[s, a] / h
            out[1, n] += reach[s] * np.exp(node_logp[s, a]) / h
    return out


def reference_metrics(node_logp: np.ndarray, config: TrainConfig) -> dict[str, np.ndarray]:
    """The exact metrics of `toymdp.metrics.exact_metrics` via `theory.measures`, per prompt."""
    env = config.env
    v, h = env.num_actions, env.depth
    log_pb = env.base_log_probs()
    rows: dict[str, list] = {}
    for p in range(env.num_prompts):
        lp = trees.trajectory_log_probs(node_logp[p], v, h)
        lp = lp - np.logaddexp.reduce(lp)
        c = env.correct[p]
        corr = measures.correctness(lp, c)
        topn = _topn(node_logp[p], lp, v, h, config.num_candidates)
        values = {
            "correctness": corr,
            "normalized_variance": measures.normalized_variance(lp, c),
            "entropy": measures.entropy(lp),
            "kl_to_base": measures.divergence(lp, log_pb[p], "kl"),
            "distinct_correct": [measures.expected_distinct(lp, k, c) for k in config.distinct_k],
            "pass_at_k": [1.0 - (1.0 - corr) ** k for k in config.pass_k],
            "topn_logp": topn[0],
            "topn_prob": topn[1],
        }
        for key, value in values.items():
            rows.setdefault(key, []).append(value)
    return {k: np.asarray(v, dtype=np.float64) for k, v in rows.items()}


def reference_train(
    config: TrainConfig,
    settings: Mapping[str, object],
    uniforms: np.ndarray,
    *,
    every_step: bool = True,
) -> dict[str, dict[str, np.ndarray]]:
    """Run the sampled mode for one setting with the given uniforms (NumPy float64).

    Args:
        config: a sampled-mode config with a method in `REFERENCE_METHODS` (token-entropy forms
            excluded).
        settings: one run's settings (`toymdp.train.default_settings`; scalars).
        uniforms: `(U, B, G)` in `[0, 1)`, e.g. `np.asarray(sampling_uniforms(config, key))`.
        every_step: measure the exact metrics after every update (as the JAX simulator does);
            False measures only the initial and final policies (benchmarks of training alone).

    Returns:
        ``{"exact": {name: (U + 1, P, ...)}, "train": {"loss", "reward": (U,)}}``, the same
        layout as `toymdp.train.make_train`'s outputs (`(2, P, ...)` without `every_step`).

    Raises:
        ValueError: naming `method`, `form` or `uniforms` when the reference does not cover it.
    """
    if config.mode != "sampled" or config.method not in REFERENCE_METHODS:
        raise ValueError(
            f"method: the NumPy reference covers the sampled mode with {list(REFERENCE_METHODS)}, "
            f"got mode={config.mode!r}, method={config.method!r}"
        )
    env = config.env
    hyper = {**config.hyper(), **{k: float(v) for k, v in settings.items() if k != "lr"}}
    if hyper.get("form", "trajectory") != "trajectory":
        raise ValueError("form: the NumPy reference covers form='trajectory' only")
    idx = env.train_index
    u_all = np.asarray(uniforms, dtype=np.float64)
    if u_all.shape != (config.num_updates, idx.size, config.group_size):
        raise ValueError(
            f"uniforms must have shape (U, B, G) = "
            f"{(config.num_updates, idx.size, config.group_size)}, got {u_all.shape}"
        )
    method = shaping.METHODS[config.method]
    nodes, actions = trees.trajectory_nodes(env.num_actions, env.depth)  # (H, M)
    base_logits = env.base_logits.astype(np.float64)
    base_node_logp = log_softmax(base_logits, axis=-1)
    lr = float(settings["lr"])
    shape = base_logits.shape
    params = {}
    if env.sharing in ("shared", "factored"):
        params["shared"] = np.zeros(shape[1:])
    if env.sharing in ("per_prompt", "factored"):
        params["prompt"] = np.zeros(shape)
    adam = {k: (np.zeros_like(p), np.zeros_like(p)) for k, p in params.items()}
    count = 0

    def logits_of(params: dict) -> np.ndarray:
        return base_logits + params.get("shared", 0.0) + params.get("prompt", 0.0)

    exact = [reference_metrics(log_softmax(logits_of(params), axis=-1), config)]
    losses, rewards_mean = [], []
    b_idx = np.arange(idx.size)[:, None]
    for u in u_all:
        node_logp_old = log_softmax(logits_of(params)[idx], axis=-1)  # (B, N_int, V)
        traj_logp = node_logp_old[:, nodes, actions].sum(axis=1)  # (B, M)
        cdf = np.cumsum(np.exp(traj_logp), axis=-1)
        traj = np.minimum(
            np.sum(cdf[:, None, :] <= (u * cdf[:, -1:])[..., None], axis=-1), cdf.shape[-1] - 1
        )  # (B, G)
        rewards = env.correct[idx][b_idx, traj].astype(np.float64)
        tok_nodes, tok_actions = nodes.T[traj], actions.T[traj]  # (B, G, T)
        b3 = b_idx[..., None]
        logp_old = node_logp_old[b3, tok_nodes, tok_actions]
        logp_ref = base_node_logp[idx][b3, tok_nodes, tok_actions]
        batch = {
            "rewards": rewards,
            "mask": np.ones(tok_nodes.shape),
            "logp": logp_old,
            "logp_old": logp_old,
        }
        adv = np.asarray(method.advantages(batch, **hyper), dtype=np.float64)  # (B, G)
        epoch_losses = []
        for _ in range(config.num_epochs):
            probs = np.exp(log_softmax(logits_of(params)[idx], axis=-1))
            loss, g_b = surrogate_logit_grad(
                probs, tok_nodes, tok_actions, logp_old, logp_ref, adv,
                eps_low=hyper["eps_low"], eps_high=hyper["eps_high"], kl_coef=hyper["kl_coef"],
            )  # fmt: skip
            epoch_losses.append(loss)
            g_logits = np.zeros(shape)
            g_logits[idx] = g_b
            grads = {"shared": g_logits.sum(axis=0), "prompt": g_logits}
            count += 1
            for k in params:
                if config.optimizer == "sgd":
                    params[k] = params[k] - lr * grads[k]
                    continue
                m, v = adam[k]
                m = 0.9 * m + 0.1 * grads[k]
                v = 0.999 * v + 0.001 * grads[k] ** 2
                adam[k] = (m, v)
                m_hat, v_hat = m / (1.0 - 0.9**count), v / (1.0 - 0.999**count)
                params[k] = params[k] - lr * m_hat / (np.sqrt(v_hat) + config.adam_eps)
        losses.append(np.mean(epoch_losses))
        rewards_mean.append(rewards.mean())
        if every_step:
            exact.append(reference_metrics(log_softmax(logits_of(params), axis=-1), config))
    if not every_step:
        exact.append(reference_metrics(log_softmax(logits_of(params), axis=-1), config))
    stacked = {k: np.stack([e[k] for e in exact]) for k in exact[0]}
    return {
        "exact": stacked,
        "train": {"loss": np.asarray(losses), "reward": np.asarray(rewards_mean)},
    }
