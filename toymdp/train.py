"""`make_train(config) -> train(settings, key)`: RL on a tree MDP, PureJaxRL style.

Static sizes (tree, prompts, group size, number of updates and epochs, method, objective) live in
a `TrainConfig` and are closed over; swept coefficients (learning rate, the method's float
hyper-parameters such as `kl_coef`, `gamma_p`, `alpha`, `eta`, or the exact mode's `beta`, `eta`,
`gamma_p`, `gamma_n`) are a flat dict of scalar arrays, the `settings` pytree, so one compiled
`jax.jit(jax.vmap(jax.vmap(train, (None, 0)), (0, None)))` runs settings × seeds (`vmap_train`).

Two modes:

- ``"sampled"`` (RLVR): each update samples `G` trajectories per training prompt from the
  behaviour policy (the policy at the start of the update), rewards the correct ones with 1,
  builds exactly the batch keys the shaping method needs (`shaping.METHODS[method].needs_for`),
  and takes `num_epochs` (μ) optimizer steps on `method.loss(batch, **hyper)` (clipped surrogate,
  optional k3 KL to the base policy through `kl_coef` and `logp_ref`).
- ``"exact"``: gradient ascent on the population objective, enumerating all trajectories,
  `J(π) = mean_p Σ_τ π(τ)·[r(τ) − c(τ)·log ρ(τ)] − β·KL(π‖π_b)`, with `ρ = π` (policy anchor) or
  `π_b` (base anchor) and `c = 0` (`"kl"`, the GRPO-equivalent KL-regularized objective, seed 000
  Eq. 1), `c = η` (`"entropy"`, Lemma B.4) or `c = γ_p` on `C`, `−γ_n` off `C` (`"ds"`, Eq. 4 /
  Lemma B.5). Its fixed point is `theory.optimum`'s closed form (`closed_form`).

`train` returns `{"exact": ..., "train": ..., "params": ...}`: exact metrics (`toymdp.metrics`)
of the policy after `0..U` updates (leading axis `U + 1`, so index 0 is the base policy), per-update
training metrics (leading axis `U`: loss, batch reward, the method's metrics; the exact mode's
objective), and the final parameters.

Random draws: the only randomness is sampling; `sampling_uniforms(config, key)` gives the
`(U, B, G)` uniforms that `train` inverts into trajectories (`toymdp.policy.sample_trajectories`),
so the NumPy reference, fed the same array, draws the same trajectories.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import shaping
from theory import optimum
from toymdp import policy
from toymdp.env import TreeEnv
from toymdp.metrics import exact_metrics

MODES = ("sampled", "exact")
OBJECTIVES = ("kl", "entropy", "ds")
ANCHORS = ("policy", "base")
OPTIMIZERS = ("adam", "sgd")

#: Toy-specific defaults that differ from a method's registry defaults. A tree-MDP prompt has no
#: tokens, so ProGRPO's prompt confidence is replaced by the group mean (seed 003, Eq. 10); with
#: ``confidence_ref="prompt"`` the toy supplies a one-token prompt of probability 1 (`c(q) = 1`).
#: Unlikeliness keeps every group (the loss is then a mean over all `B·G·T` tokens, which the NumPy
#: reference `toymdp.reference` reproduces); the authors' group skipping is an LLM-scale option.
TOY_HYPER: Mapping[str, Mapping[str, object]] = {
    "progrpo": {"confidence_ref": "group_mean"},
    "unlikeliness": {"skip_uniform_groups": False},
}

#: Settings of the exact mode, by objective (besides the learning rate `lr`).
EXACT_SETTINGS: Mapping[str, tuple[str, ...]] = {
    "kl": ("beta",),
    "entropy": ("beta", "eta"),
    "ds": ("beta", "gamma_p", "gamma_n"),
}

Settings = dict[str, jax.Array]


@dataclass(frozen=True, eq=False)
class TrainConfig:
    """Static configuration: everything that fixes shapes or code paths (validated on construction).

    Attributes:
        env: the tree MDP (`toymdp.env.TreeEnv`).
        mode: ``"sampled"`` (RLVR with a shaping method) or ``"exact"`` (population gradient).
        method: a `shaping.METHODS` name (sampled mode).
        method_hyper: hyper-parameter overrides for the method. Float-valued ones (by the type of
            the method's default) become the defaults of the swept settings; the others
            (`loss_agg`, `form`, `top_n`, `k`, `std_correction`, ...) are static.
        objective, anchor: the exact mode's objective (`OBJECTIVES`) and anchor (`ANCHORS`).
        group_size: `G`, responses per prompt and update (sampled mode).
        num_updates: `U`, updates (sampled: one batch each; exact: one gradient step each).
        num_epochs: `μ`, optimizer steps on each sampled batch.
        optimizer: ``"adam"`` or ``"sgd"`` (optax; the learning rate is a setting).
        adam_eps: Adam's `eps` (default 1e-4; optax and torch use 1e-8). Adam turns a gradient
            `g` into a step of about `lr·g/(|g| + eps)`, so float32 rounding noise (`|g| ~ 1e-9`
            where the exact gradient is 0, e.g. on actions no response took, since `Σ_i A_i = 0`
            in a GRPO group) becomes a step of `~lr/10` with `eps = 1e-8`: the float32 simulator
            then leaves the float64 NumPy reference within two updates. `1e-4` damps such steps
            to `~1e-5·lr` and leaves real gradients (`|g| ≳ 1e-2`) alone.
        learning_rate, beta, eta, gamma_p, gamma_n: defaults of the swept settings (`beta`, `eta`,
            `gamma_p`, `gamma_n` belong to the exact mode).
        num_candidates: `N`, top-N candidates per token (`cand_logp`, `topn_*` metrics); default
            the method's `top_n` if it has one, else `min(3, V)`.
        distinct_k, pass_k: budgets of the `distinct_correct` and `pass_at_k` metrics.
        record_policy: also record trajectory log-probs `(U + 1, P, M)` (heat maps).

    Raises:
        ValueError: naming the field: unknown mode/method/objective/anchor/optimizer, a
            non-positive size, an unknown or invalid hyper-parameter.
    """

    env: TreeEnv
    mode: str = "sampled"
    method: str = "grpo"
    method_hyper: Mapping[str, object] = field(default_factory=dict)
    objective: str = "kl"
    anchor: str = "policy"
    group_size: int = 8
    num_updates: int = 100
    num_epochs: int = 1
    optimizer: str = "adam"
    adam_eps: float = 1e-4
    learning_rate: float = 0.1
    beta: float = 0.1
    eta: float = 0.05
    gamma_p: float = 0.05
    gamma_n: float = 0.02
    num_candidates: int | None = None
    distinct_k: tuple[int, ...] = (1000,)
    pass_k: tuple[int, ...] = (1, 4, 16, 64, 256)
    record_policy: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.env, TreeEnv):
            raise ValueError(f"env must be a toymdp.env.TreeEnv, got {type(self.env).__name__}")
        for name, choices in (
            ("mode", MODES),
            ("objective", OBJECTIVES),
            ("anchor", ANCHORS),
            ("optimizer", OPTIMIZERS),
        ):
            if getattr(self, name) not in choices:
                raise ValueError(
                    f"{name} must be one of {list(choices)}, got {getattr(self, name)!r}"
                )
        if self.method not in shaping.METHODS:
            raise ValueError(
                f"method: unknown method {self.method!r}; known: {sorted(shaping.METHODS)}"
            )
        for name in ("group_size", "num_updates", "num_epochs"):
            _positive_int(name, getattr(self, name))
        for name in ("distinct_k", "pass_k"):
            values = getattr(self, name)
            if not values:
                raise ValueError(f"{name} must hold at least one budget")
            for v in values:
                _positive_int(name, v)
        v = self.env.num_actions
        if self.num_candidates is None:
            top_n = self.hyper().get("top_n", min(3, v))
            object.__setattr__(self, "num_candidates", min(int(top_n), v))
        _positive_int("num_candidates", self.num_candidates)
        if self.num_candidates > v:
            raise ValueError(f"num_candidates must be <= V = {v}, got {self.num_candidates}")
        object.__setattr__(self, "method_hyper", dict(self.method_hyper))
        if self.mode == "sampled":
            _dry_run(self)

    def hyper(self) -> dict[str, object]:
        """The method's hyper-parameters: registry defaults < `TOY_HYPER` < `method_hyper`.

        Raises:
            ValueError: naming `method_hyper`, for a name the method does not have.
        """
        method = shaping.METHODS[self.method]
        unknown = sorted(set(self.method_hyper) - set(method.defaults))
        if unknown:
            raise ValueError(
                f"method_hyper: unknown hyper-parameter(s) {unknown} for method {self.method!r}; "
                f"known: {sorted(method.defaults)}"
            )
        toy = dict(TOY_HYPER.get(self.method, {}))
        if "max_response_length" in method.defaults:
            # Every trajectory has exactly `depth` tokens: Dr. GRPO's constant is the depth.
            toy["max_response_length"] = self.env.depth
        return {**method.defaults, **toy, **self.method_hyper}

    def swept_names(self) -> tuple[str, ...]:
        """Names of the settings (the swept scalars), `lr` first."""
        if self.mode == "exact":
            return ("lr", *EXACT_SETTINGS[self.objective])
        defaults = shaping.METHODS[self.method].defaults
        # `entropy_coef` (the LLM trainer's verl-style bonus) and `top_entropy_quantile` (the
        # 80/20 mask) stay static: swept as data they would always build their entropy terms;
        # the toy's entropy methods are entropy_bonus & co.
        return (
            "lr",
            *(k for k, v in defaults.items() if isinstance(v, float) and k not in _STATIC),
        )


_STATIC = ("entropy_coef", "top_entropy_quantile")


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _static_hyper(config: TrainConfig) -> dict[str, object]:
    swept = set(config.swept_names())
    return {k: v for k, v in config.hyper().items() if k not in swept}


def _needs(config: TrainConfig) -> frozenset[str]:
    # `kl_coef` is data (swept), so the KL term is always built and needs `logp_ref`.
    return shaping.METHODS[config.method].needs_for(**_static_hyper(config)) | {"logp_ref"}


def _dry_run(config: TrainConfig) -> None:
    """Validate the hyper-parameters against the method on a NumPy batch of the real shapes."""
    env = config.env
    g, t, n = config.group_size, env.depth, config.num_candidates
    batch = shaping.example_batch(_needs(config), 1, g, t, n, np, dtype=np.float64)
    try:
        shaping.METHODS[config.method].loss(batch, **config.hyper())
    except ValueError as err:
        raise ValueError(f"method_hyper: {err}") from None


def default_settings(config: TrainConfig, **values: float) -> Settings:
    """The settings pytree of one run: `{name: float32 scalar}` for `config.swept_names()`.

    Defaults: `lr = config.learning_rate`; sampled mode: the method's float hyper-parameters
    (`config.hyper()`); exact mode: `config.beta`, `eta`, `gamma_p`, `gamma_n` as the objective
    uses them. `values` override them.

    Raises:
        ValueError: naming an override that is not a setting of this config.
    """
    names = config.swept_names()
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ValueError(f"settings: unknown name(s) {unknown}; this config sweeps {list(names)}")
    base: dict[str, object] = {"lr": config.learning_rate}
    if config.mode == "exact":
        base.update({k: getattr(config, k) for k in names[1:]})
    else:
        hyper = config.hyper()
        base.update({k: hyper[k] for k in names[1:]})
    base.update(values)
    return {k: jnp.asarray(base[k], dtype=jnp.float32) for k in names}


def stack_settings(settings: Sequence[Settings]) -> Settings:
    """Stack per-run settings along a new leading axis `S` (for `vmap_train`)."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *settings)


def settings_grid(config: TrainConfig, **axes: Sequence[float]) -> Settings:
    """Cartesian product of swept values, `S = Π len(axes[k])` runs in row-major order.

    Example: ``settings_grid(cfg, lr=[0.1, 0.3], kl_coef=[0.0, 0.05])`` gives `S = 4`.
    """
    names = list(axes)
    mesh = np.meshgrid(*(np.asarray(axes[k], dtype=np.float64) for k in names), indexing="ij")
    rows = np.stack([m.ravel() for m in mesh], axis=-1)  # (S, len(names))
    runs = [
        default_settings(config, **dict(zip(names, map(float, row), strict=True))) for row in rows
    ]
    return stack_settings(runs)


def sampling_uniforms(config: TrainConfig, key: jax.Array) -> jax.Array:
    """The `(U, B, G)` uniforms `train(settings, key)` turns into sampled trajectories."""
    shape = (config.num_updates, config.env.train_index.size, config.group_size)
    return jax.random.uniform(key, shape)


def make_optimizer(
    name: str, learning_rate: jax.Array, adam_eps: float
) -> optax.GradientTransformation:
    """optax Adam (betas 0.9, 0.999; `eps = adam_eps`) or plain SGD at a (traced) learning rate."""
    if name == "adam":
        return optax.adam(learning_rate, eps=adam_eps)
    return optax.sgd(learning_rate)


def init_params(env: TreeEnv) -> dict[str, jax.Array]:
    """Zero parameters for `env.sharing` (the initial policy is the base policy).

    Returns:
        ``{"shared": (N_int, V)}`` and/or ``{"prompt": (P, N_int, V)}``.
    """
    n_int, v, p = env.num_internal_nodes, env.num_actions, env.num_prompts
    params = {}
    if env.sharing in ("shared", "factored"):
        params["shared"] = jnp.zeros((n_int, v), jnp.float32)
    if env.sharing in ("per_prompt", "factored"):
        params["prompt"] = jnp.zeros((p, n_int, v), jnp.float32)
    return params


def policy_logits(params: Mapping[str, jax.Array], base_logits: jax.Array) -> jax.Array:
    """`logits[p] = base_logits[p] + θ_shared + θ_prompt[p]`, `(P, N_int, V)` (see `toymdp.env`)."""
    logits = base_logits
    if "shared" in params:
        logits = logits + params["shared"]
    if "prompt" in params:
        logits = logits + params["prompt"]
    return logits


def population_objective(
    node_logp: jax.Array,
    base_lp: jax.Array,
    reward: jax.Array,
    correct: jax.Array,
    nodes: np.ndarray,
    actions: np.ndarray,
    settings: Mapping[str, jax.Array],
    objective: str,
    anchor: str,
) -> jax.Array:
    """`J(π)`, the exact mode's objective, averaged over the given prompts (see the module doc).

    Args:
        node_logp: `(B, N_int, V)`. base_lp, reward: `(B, M)`. correct: `(B, M)` bool.

    Returns:
        scalar `mean_b Σ_τ π(τ)·[r − c·log ρ − β·(log π − log π_b)]` (seed 000 Eq. 1, Lemmas B.1,
        B.4, B.5; the same functional as `theory.optimum.objective`).
    """
    lp = policy.trajectory_log_probs(node_logp, nodes, actions)  # (B, M)
    if objective == "kl":
        coef = jnp.zeros_like(lp)
    elif objective == "entropy":
        coef = jnp.broadcast_to(settings["eta"], lp.shape)
    else:
        coef = jnp.where(correct, settings["gamma_p"], -settings["gamma_n"])
    anchor_lp = lp if anchor == "policy" else base_lp
    per = jnp.exp(lp) * (reward - coef * anchor_lp - settings["beta"] * (lp - base_lp))
    return jnp.mean(jnp.sum(per, axis=-1))


def closed_form(config: TrainConfig, settings: Mapping[str, object]) -> np.ndarray:
    """`theory.optimum`'s closed-form optimum of the exact mode's objective, per training prompt.

    With `sharing="per_prompt"` (or a single prompt) this is the fixed point of exact training.

    Args:
        settings: one run's settings (scalars).

    Returns:
        `(B, M)` float64 log-probabilities.
    """
    env = config.env
    idx = env.train_index
    log_pb = env.base_log_probs()[idx]
    correct = env.correct[idx]
    s = {k: float(v) for k, v in settings.items()}
    if config.objective == "kl":
        return optimum.kl_regularized(log_pb, correct.astype(float), s["beta"])
    if config.objective == "entropy":
        return optimum.entropy_regularized(
            log_pb, correct.astype(float), s["beta"], s["eta"], config.anchor
        )
    return np.stack([
        optimum.differential_smoothing(
            log_pb[i], correct[i], s["beta"], s["gamma_p"], s["gamma_n"], config.anchor
        )
        for i in range(idx.size)
    ])  # fmt: skip


def make_train(config: TrainConfig) -> Callable[[Settings, jax.Array], dict[str, Any]]:
    """Build `train(settings, key) -> outputs` for `config` (pure; jit/vmap it, see `vmap_train`).

    Args:
        config: static sizes and choices.

    Returns:
        `train(settings, key)`: `settings` from `default_settings` (or one slice of a stacked
        grid), `key` a JAX PRNG key (ignored by the exact mode, which is deterministic). Output
        shapes (`U = num_updates`): ``exact[name]`` `(U + 1, P, ...)` (`toymdp.metrics`),
        ``train[name]`` `(U,)`, ``params`` the final parameters.
    """
    env = config.env
    nodes, actions = policy.tree_index(env.num_actions, env.depth)
    base_logits = jnp.asarray(env.base_logits, jnp.float32)  # (P, N_int, V)
    base_node_logp = policy.node_log_probs(base_logits)
    base_lp = policy.trajectory_log_probs(base_node_logp, nodes, actions)  # (P, M)
    correct = jnp.asarray(env.correct)  # (P, M)
    idx = env.train_index  # (B,) static
    correct_b, base_node_logp_b, base_lp_b = correct[idx], base_node_logp[idx], base_lp[idx]
    reward_b = correct_b.astype(jnp.float32)
    n_cand = config.num_candidates

    def metrics_of(params: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        node_logp = policy.node_log_probs(policy_logits(params, base_logits))
        return exact_metrics(
            node_logp, base_lp, correct, nodes, actions,
            distinct_k=config.distinct_k, pass_k=config.pass_k,
            num_candidates=n_cand, record_policy=config.record_policy,
        )  # fmt: skip

    if config.mode == "sampled":
        step = _sampled_step(config, nodes, actions, base_logits, base_node_logp_b, reward_b)
    else:
        step = _exact_step(config, nodes, actions, base_logits, base_lp_b, reward_b, correct_b)

    def train(settings: Settings, key: jax.Array) -> dict[str, Any]:
        optimizer = make_optimizer(config.optimizer, settings["lr"], config.adam_eps)
        params = init_params(env)
        opt_state = optimizer.init(params)
        num = config.num_updates
        if config.mode == "sampled":
            xs = sampling_uniforms(config, key)
            xs = jnp.concatenate([xs, jnp.zeros_like(xs[:1])])
        else:
            xs = jnp.zeros((num + 1,))

        # U + 1 iterations, each measuring the policy before its update, and the last update
        # discarded: the metrics are compiled once (not once more for the initial policy).
        def update(carry: tuple, x: tuple) -> tuple:
            i, u = x
            exact = metrics_of(carry[0])
            new, train_metrics = step(carry, settings, optimizer, u)
            carry = jax.tree.map(lambda a, b: jnp.where(i < num, a, b), new, carry)
            return carry, (train_metrics, exact)

        (params, _), (train_metrics, exact) = jax.lax.scan(
            update, (params, opt_state), (jnp.arange(num + 1), xs)
        )
        train_metrics = jax.tree.map(lambda a: a[:num], train_metrics)
        return {"exact": exact, "train": train_metrics, "params": params}

    return train


def _exact_step(
    config: TrainConfig,
    nodes: np.ndarray,
    actions: np.ndarray,
    base_logits: jax.Array,
    base_lp_b: jax.Array,
    reward_b: jax.Array,
    correct_b: jax.Array,
) -> Callable:
    """One exact update: an optimizer step on `−J(π)` (`population_objective`), no sampling."""
    idx = config.env.train_index

    def step(carry: tuple, settings: Settings, optimizer: Any, _: jax.Array) -> tuple:
        params, opt_state = carry

        def loss_fn(p: Mapping[str, jax.Array]) -> jax.Array:
            node_logp = policy.node_log_probs(policy_logits(p, base_logits)[idx])
            return -population_objective(
                node_logp, base_lp_b, reward_b, correct_b, nodes, actions,
                settings, config.objective, config.anchor,
            )  # fmt: skip

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), {"objective": -loss}

    return step


def _sampled_step(
    config: TrainConfig,
    nodes: np.ndarray,
    actions: np.ndarray,
    base_logits: jax.Array,
    base_node_logp_b: jax.Array,
    reward_b: jax.Array,
) -> Callable:
    """One RLVR update: sample `(B, G)`, build the method's batch, `μ` optimizer steps."""
    method = shaping.METHODS[config.method]
    static_hyper = _static_hyper(config)
    float_names = config.swept_names()[1:]
    needs = _needs(config)
    idx = config.env.train_index
    n_cand = config.num_candidates

    def step(carry: tuple, settings: Settings, optimizer: Any, u: jax.Array) -> tuple:
        params, opt_state = carry
        hyper = {**static_hyper, **{k: settings[k] for k in float_names}}
        logits_old = jax.lax.stop_gradient(policy_logits(params, base_logits)[idx])
        node_logp_old = policy.node_log_probs(logits_old)  # (B, N_int, V)
        traj = policy.sample_trajectories(
            policy.trajectory_log_probs(node_logp_old, nodes, actions), u
        )  # (B, G)
        rewards = jnp.take_along_axis(reward_b, traj, axis=-1)  # (B, G)
        tok_nodes, tok_actions = policy.token_path(traj, nodes, actions)  # (B, G, T)
        fixed = {
            "rewards": rewards,
            "mask": jnp.ones(tok_nodes.shape, jnp.float32),
            "logp_old": policy.token_log_probs(node_logp_old, tok_nodes, tok_actions),
        }
        if "logp_ref" in needs:
            fixed["logp_ref"] = policy.token_log_probs(base_node_logp_b, tok_nodes, tok_actions)
        order, rank = policy.candidate_ranking(node_logp_old)
        if "cand_logp_old" in needs:
            fixed["cand_logp_old"] = policy.candidate_log_probs(
                node_logp_old, order, tok_nodes, n_cand
            )
        if "sampled_rank" in needs:
            fixed["sampled_rank"] = policy.sampled_rank(rank, tok_nodes, tok_actions)
        if "diversity" in needs:
            fixed["diversity"] = policy.hamming_diversity(tok_actions)
        if "prompt_logp" in needs:
            # A tree-MDP prompt is given, not generated: one token of probability 1.
            fixed["prompt_logp"] = jnp.zeros((idx.size, 1), jnp.float32)
            fixed["prompt_mask"] = jnp.ones((idx.size, 1), jnp.float32)

        def loss_fn(p: Mapping[str, jax.Array]) -> tuple[jax.Array, dict]:
            logits = policy_logits(p, base_logits)[idx]
            node_logp = policy.node_log_probs(logits)
            batch = {**fixed, "logp": policy.token_log_probs(node_logp, tok_nodes, tok_actions)}
            if "entropy" in needs:
                batch["entropy"] = policy.token_entropies(logits, tok_nodes)
            if "cand_logp" in needs:
                batch["cand_logp"] = policy.candidate_log_probs(node_logp, order, tok_nodes, n_cand)
            return method.loss(batch, **hyper)

        def epoch(carry: tuple, _: None) -> tuple:
            params, opt_state = carry
            (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), {"loss": loss, **aux}

        carry, per_epoch = jax.lax.scan(epoch, (params, opt_state), None, config.num_epochs)
        # Per-epoch diagnostics are averaged; the first epoch is on-policy (ratio 1).
        out = {k: jnp.mean(v, axis=0) for k, v in per_epoch.items()}
        out["reward"] = jnp.mean(rewards)
        # Distinct trajectories per group: those with no equal earlier response.
        same = traj[:, :, None] == traj[:, None, :]  # (B, G, G)
        earlier = jnp.tril(jnp.ones(same.shape[1:], bool), -1)
        out["distinct_in_group"] = jnp.mean(jnp.sum(~jnp.any(same & earlier, axis=-1), axis=-1))
        return carry, out

    return step


#: XLA options that cut CPU compile time by about 2-3x for slower steady-state code: for tests
#: and short runs, where compiling dominates.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def jit_train(train: Callable, *, fast_compile: bool = False) -> Callable:
    """`jax.jit(train)` for one run (`fast_compile`: see `FAST_COMPILE`)."""
    return jax.jit(train, compiler_options=FAST_COMPILE if fast_compile else None)


def vmap_train(train: Callable, *, fast_compile: bool = False) -> Callable:
    """`jax.jit(jax.vmap(jax.vmap(train, (None, 0)), (0, None)))`: settings `(S,)` × keys `(R,)`.

    Outputs get leading axes `(S, R)`. Compile once and call many times.
    """
    return jit_train(jax.vmap(jax.vmap(train, (None, 0)), (0, None)), fast_compile=fast_compile)


def run_grid(
    config: TrainConfig, settings: Settings, keys: jax.Array, *, fast_compile: bool = False
) -> dict[str, Any]:
    """Run `S` stacked settings × `R` keys of `config` (outputs with leading axes `(S, R)`)."""
    return vmap_train(make_train(config), fast_compile=fast_compile)(settings, keys)


def seed_keys(seed: int, num_seeds: int) -> jax.Array:
    """`(R,)` independent PRNG keys from one integer seed."""
    return jax.random.split(jax.random.key(seed), num_seeds)
