"""Registry of named shaping methods (advantage + loss), shared by `toymdp/` and `llm/`.

A method is added here once and becomes available to both drivers:
``shaping.METHODS[name].loss(batch, **hyper) -> (scalar loss, metrics)`` and
``shaping.METHODS[name].advantages(batch, **hyper) -> (B, G)``. See ``shaping/CONTRACT.md`` for
the batch keys and hyper-parameter names, and FORMULAS.md §2 for the formulas.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from array_api_compat import array_namespace

from shaping import core
from shaping.backend import stop_gradient

Array = Any
Batch = Mapping[str, Array]

__all__ = ["METHODS", "Method", "get_method", "methods_table", "register"]

_BASE_KEYS = ("rewards", "mask", "logp", "logp_old")
_TOKEN_KEYS = ("mask", "logp", "logp_old", "logp_ref", "entropy", "sampled_rank", "is_weight")
_CAND_KEYS = ("cand_logp", "cand_logp_old")
_PROMPT_KEYS = ("prompt_logp", "prompt_mask")


@dataclass(frozen=True)
class Method:
    """A named shaping method.

    Attributes:
        name: registry key.
        needs: batch keys required with the default hyper-parameters, beyond
            rewards/mask/logp/logp_old (see `needs_for` for other settings).
        defaults: every hyper-parameter and its default (read-only).
        source: where the formula comes from (seed file and equation, or authors' code).
        advantages: ``advantages(batch, **hyper) -> (B, G)`` detached advantages.
        loss: ``loss(batch, **hyper) -> (scalar loss, dict of detached metrics)``.
        doc: the formula as implemented, one line (for the README table).
    """

    name: str
    needs: frozenset[str]
    defaults: Mapping[str, object]
    source: str
    advantages: Callable[..., Array]
    loss: Callable[..., tuple[Array, dict[str, Array]]]
    doc: str = ""
    needs_fn: Callable[[Mapping[str, object]], frozenset[str]] | None = field(
        default=None, repr=False, compare=False
    )

    def needs_for(self, **hyper: object) -> frozenset[str]:
        """Batch keys (beyond rewards/mask/logp/logp_old) needed with these hyper-parameters.

        Raises:
            ValueError: an unknown hyper-parameter name.
        """
        h = _fill(self.name, self.defaults, hyper)
        extra = self.needs_fn(h) if self.needs_fn is not None else self.needs
        if not (_concrete(h["kl_coef"]) and h["kl_coef"] == 0):
            extra = extra | {"logp_ref"}
        if not (_concrete(h["entropy_coef"]) and h["entropy_coef"] == 0):
            extra = extra | {"entropy"}
        return frozenset(extra)


_REGISTRY: dict[str, Method] = {}
METHODS: Mapping[str, Method] = MappingProxyType(_REGISTRY)
"""Read-only view ``name -> Method`` of every registered method."""


def register(method: Method) -> Method:
    """Add `method` to `METHODS`.

    Raises:
        ValueError: a method of that name is already registered.
    """
    if method.name in _REGISTRY:
        raise ValueError(f"method {method.name!r} is already registered")
    _REGISTRY[method.name] = method
    return method


def get_method(name: str) -> Method:
    """Return the registered method `name`.

    Raises:
        ValueError: unknown name (the message lists the known names).
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known: {sorted(_REGISTRY)}") from None


def methods_table() -> str:
    """Markdown table of the registry: ``name | source | needs | defaults`` (one row per method)."""
    rows = ["| name | source | needs | defaults |", "|---|---|---|---|"]
    for name in sorted(_REGISTRY):
        m = _REGISTRY[name]
        needs = ", ".join(f"`{k}`" for k in sorted(m.needs)) or "-"
        defaults = ", ".join(f"`{k}={v!r}`" for k, v in m.defaults.items())
        rows.append(f"| `{name}` | {m.source} | {needs} | {defaults} |")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------
# Hyper-parameter validation. Values that are not concrete Python numbers (e.g. JAX tracers when
# a driver vmaps over settings) are not checked: checking them would need their value.


def _concrete(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _nonneg(v: object) -> bool:
    return v >= 0


def _positive(v: object) -> bool:
    return v > 0


def _unit(v: object) -> bool:
    return 0 <= v <= 1


def _open_unit(v: object) -> bool:
    return 0 < v < 1


def _half_open_unit(v: object) -> bool:
    return 0 < v <= 1


_NUMERIC_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "eps_low": (_unit, "in [0, 1]"),
    "eps_high": (_nonneg, ">= 0"),
    "kl_coef": (_nonneg, ">= 0"),
    "entropy_coef": (_nonneg, ">= 0"),
    "eps": (_nonneg, ">= 0"),
    "gamma_p": (_nonneg, ">= 0"),
    "gamma_n": (_nonneg, ">= 0"),
    "eta": (_nonneg, ">= 0"),
    "eta_pos": (_nonneg, ">= 0"),
    "eta_neg": (_nonneg, ">= 0"),
    "lam": (_nonneg, ">= 0"),
    "sigma": (_nonneg, ">= 0"),
    "tau": (_positive, "> 0"),
    "lam_loc": (_nonneg, ">= 0"),
    "low_frac": (_half_open_unit, "in (0, 1]"),
    "quantile": (_open_unit, "in (0, 1)"),
    "lam_top1": (_positive, "> 0"),
    "beta_rank": (_nonneg, ">= 0"),
}
# `alpha` means different things in ProGRPO (any nonnegative weight) and CaSP (a mixture weight).
_ALPHA_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "progrpo": (_nonneg, ">= 0"),
    "casp": (_unit, "in [0, 1]"),
}
_CHOICES: dict[str, tuple[object, ...]] = {
    "loss_agg": core.AGG_MODES,
    "std_correction": (0, 1),
    "logp_reduction": ("sum", "mean"),
    "form": ("trajectory", "token"),
    "confidence_ref": ("prompt", "group_mean"),
}
_INTEGERS = ("top_n",)


def _fill(name: str, defaults: Mapping[str, object], hyper: Mapping[str, object]) -> dict:
    unknown = sorted(set(hyper) - set(defaults))
    if unknown:
        raise ValueError(f"{name}: unknown hyper-parameter(s) {unknown}; known: {sorted(defaults)}")
    return {**defaults, **hyper}


def _validate(name: str, h: Mapping[str, object]) -> None:
    for key, value in h.items():
        if key in _CHOICES:
            if isinstance(value, bool) or value not in _CHOICES[key]:
                raise ValueError(
                    f"{name}: {key} must be one of {list(_CHOICES[key])}, got {value!r}"
                )
            continue
        if key in _INTEGERS:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: {key} must be an int >= 1, got {value!r}")
            continue
        if key == "k":
            if _concrete(value) and (value < 1 or value != int(value)):
                raise ValueError(f"{name}: k must be an integer >= 1, got {value!r}")
            continue
        rule = _ALPHA_RULES.get(name) if key == "alpha" else _NUMERIC_RULES.get(key)
        if rule is not None and _concrete(value) and not rule[0](value):
            raise ValueError(f"{name}: {key} must be {rule[1]}, got {value!r}")


# ---------------------------------------------------------------------------------------------
# Batch access and shape checks (Python branching on shapes only, never on values).


def _check_batch(name: str, batch: Batch) -> None:
    if "rewards" not in batch:
        raise ValueError(f"{name}: batch is missing key 'rewards'")
    rewards = batch["rewards"]
    if rewards.ndim != 2:
        raise ValueError(f"{name}: batch['rewards'] must have shape (B, G), got {rewards.shape}")
    bg = tuple(rewards.shape)
    token_shape = None
    for key in _TOKEN_KEYS:
        if key not in batch:
            continue
        shape = tuple(batch[key].shape)
        if token_shape is None:
            token_shape = shape
        if len(shape) != 3 or shape[:2] != bg or shape != token_shape:
            raise ValueError(
                f"{name}: batch[{key!r}] has shape {shape}, expected (B, G, T) with "
                f"(B, G) = {bg}, the same T as every other per-token key ({token_shape})"
            )
    cand_shape = None
    for key in _CAND_KEYS:
        if key not in batch:
            continue
        shape = tuple(batch[key].shape)
        cand_shape = cand_shape or shape
        ok = len(shape) == 4 and shape[:2] == bg and shape == cand_shape
        if ok and token_shape is not None:
            ok = shape[:3] == token_shape
        if not ok:
            raise ValueError(
                f"{name}: batch[{key!r}] has shape {shape}, expected (B, G, T, N) with "
                f"(B, G) = {bg} and (B, G, T) of the per-token keys ({token_shape})"
            )
    if "diversity" in batch and tuple(batch["diversity"].shape) != bg:
        raise ValueError(
            f"{name}: batch['diversity'] has shape {tuple(batch['diversity'].shape)}, "
            f"expected (B, G) = {bg}"
        )
    prompt_shape = None
    for key in _PROMPT_KEYS:
        if key not in batch:
            continue
        shape = tuple(batch[key].shape)
        prompt_shape = prompt_shape or shape
        if len(shape) != 2 or shape[0] != bg[0] or shape != prompt_shape:
            raise ValueError(
                f"{name}: batch[{key!r}] has shape {shape}, expected (B, P) with B = {bg[0]}"
            )


def _get(name: str, batch: Batch, key: str) -> Array:
    if key not in batch:
        raise ValueError(f"{name}: batch is missing key {key!r} (needed with these settings)")
    return batch[key]


def _rewards(name: str, batch: Batch) -> Array:
    r = batch["rewards"]
    xp = array_namespace(r)
    if xp.isdtype(r.dtype, "real floating"):
        return r
    like = batch.get("logp", batch.get("logp_old"))
    if like is not None and xp.isdtype(like.dtype, "real floating"):
        return xp.astype(r, like.dtype)
    return xp.astype(r, xp.__array_namespace_info__().default_dtypes()["real floating"])


def _correct_f(r: Array) -> Array:
    xp = array_namespace(r)
    return xp.astype(core.is_correct(r), r.dtype)


def _grpo(r: Array, h: Mapping[str, Any]) -> Array:
    return core.grpo_advantages(r, std_correction=h["std_correction"], eps=h["eps"])


def _seq_logp_old(name: str, batch: Batch, reduction: str) -> Array:
    return core.sequence_logp(
        _get(name, batch, "logp_old"), _get(name, batch, "mask"), reduction=reduction
    )


# ---------------------------------------------------------------------------------------------
# Shared loss: clipped surrogate + optional k3 KL + optional per-token extra term, one aggregation.


def _policy_loss(
    name: str,
    batch: Batch,
    adv: Array,
    h: Mapping[str, Any],
    *,
    ratio: Array | None = None,
    ratio_fn: Callable[[Array, Array], Array] | None = None,
    token_extra: Array | None = None,
    scalar_extra: Array | None = None,
    metrics: dict[str, Array] | None = None,
) -> tuple[Array, dict[str, Array]]:
    logp, logp_old, mask = (_get(name, batch, k) for k in ("logp", "logp_old", "mask"))
    xp = array_namespace(logp, mask)
    keep = core._bool_mask(xp, mask)
    agg = h["loss_agg"]
    if ratio is None:
        ratio = core.importance_ratio(logp, logp_old, keep)
    if ratio_fn is not None:
        ratio = ratio_fn(ratio, adv)
    surrogate = core.clipped_surrogate(ratio, adv, eps_low=h["eps_low"], eps_high=h["eps_high"])
    clip_frac = core._clip_fraction(xp, stop_gradient(surrogate), stop_gradient(ratio), adv, keep)
    if "is_weight" in batch:
        # Rollout importance weight (sampler -> behaviour policy), on the surrogate only, before
        # the KL and extra terms, as TRL's vllm_importance_sampling_correction and verl's TIS do.
        surrogate = surrogate * stop_gradient(batch["is_weight"])
    per_token = surrogate
    out: dict[str, Array] = {}
    kl_coef = h["kl_coef"]
    if not (_concrete(kl_coef) and kl_coef == 0):
        kl = core.kl_k3(logp, _get(name, batch, "logp_ref"), keep)
        per_token = per_token + kl_coef * kl
        out["kl"] = core.agg_loss(stop_gradient(kl), keep, agg)
    entropy_coef = h["entropy_coef"]
    if not (_concrete(entropy_coef) and entropy_coef == 0):
        # verl's actor.entropy_coeff: loss -= c * agg(token entropy), the same aggregation.
        per_token = per_token - entropy_coef * _masked_entropy(name, batch)
    if token_extra is not None:
        per_token = per_token + token_extra
    loss = core.agg_loss(per_token, keep, agg)
    if scalar_extra is not None:
        loss = loss + scalar_extra
    # Metrics are computed on detached values so they add no autograd work.
    surrogate = stop_gradient(surrogate)
    out["pg_loss"] = (
        stop_gradient(loss) if per_token is surrogate else core.agg_loss(surrogate, keep, agg)
    )
    out["clip_frac"] = clip_frac
    out["adv_mean"] = xp.mean(adv)
    out.update(metrics or {})
    return loss, {k: stop_gradient(v) for k, v in out.items()}


def _masked_entropy(name: str, batch: Batch) -> Array:
    entropy, mask = _get(name, batch, "entropy"), _get(name, batch, "mask")
    xp = array_namespace(entropy, mask)
    keep = core._bool_mask(xp, mask)
    return xp.where(keep, entropy, xp.zeros_like(entropy))


# ---------------------------------------------------------------------------------------------
# Method definitions.

_COMMON: dict[str, object] = {
    "eps_low": 0.2,
    "eps_high": 0.2,
    "loss_agg": "token-mean",
    "kl_coef": 0.0,
    "entropy_coef": 0.0,
}
_NORM: dict[str, object] = {"std_correction": 1, "eps": 1e-6}


def _define(
    name: str,
    *,
    source: str,
    doc: str,
    defaults: Mapping[str, object],
    advantages: Callable[[Batch, Mapping[str, Any]], Array],
    loss: Callable[[Batch, Mapping[str, Any], Array], tuple[Array, dict[str, Array]]] | None = None,
    needs: Callable[[Mapping[str, object]], frozenset[str]] | None = None,
) -> Method:
    frozen = MappingProxyType(dict(defaults))

    def _prepare(batch: Batch, hyper: Mapping[str, object]) -> dict:
        h = _fill(name, frozen, hyper)
        _validate(name, h)
        _check_batch(name, batch)
        return h

    def adv_fn(batch: Batch, **hyper: object) -> Array:
        return stop_gradient(advantages(batch, _prepare(batch, hyper)))

    def loss_fn(batch: Batch, **hyper: object) -> tuple[Array, dict[str, Array]]:
        h = _prepare(batch, hyper)
        adv = stop_gradient(advantages(batch, h))
        if loss is None:
            return _policy_loss(name, batch, adv, h)
        return loss(batch, h, adv)

    adv_fn.__name__ = f"{name}_advantages"
    loss_fn.__name__ = f"{name}_loss"
    adv_fn.__doc__ = (
        f"{name} advantages (B, G), detached. {doc}\n\nSource: {source}.\n\n"
        "Raises ValueError on unknown or invalid hyper-parameters and mismatched shapes."
    )
    loss_fn.__doc__ = (
        f"{name} loss -> (scalar, metrics). {doc}\n\nSource: {source}.\n\n"
        "Raises ValueError on unknown or invalid hyper-parameters and mismatched shapes."
    )
    default_needs = needs(frozen) if needs is not None else frozenset()
    return register(
        Method(
            name=name,
            needs=default_needs,
            defaults=frozen,
            source=source,
            advantages=adv_fn,
            loss=loss_fn,
            doc=doc,
            needs_fn=needs,
        )
    )


# GRPO and Dr. GRPO ---------------------------------------------------------------------------

_define(
    "grpo",
    source="Shao et al. 2024 (DeepSeekMath); FORMULAS §2",
    doc="A = (r - mean r)/(std r + eps); loss = agg(-min(rho A, clip(rho) A)) + kl_coef k3",
    defaults={**_COMMON, **_NORM},
    advantages=lambda b, h: _grpo(_rewards("grpo", b), h),
)

_define(
    "dr_grpo",
    source="Liu et al. 2025 (Dr. GRPO); FORMULAS §2",
    doc="A = r - mean r; seq-mean-token-sum-norm aggregation",
    defaults={**_COMMON, "loss_agg": "seq-mean-token-sum-norm"},
    advantages=lambda b, h: core.dr_grpo_advantages(_rewards("dr_grpo", b)),
)


# DS-GRPO and its ablations -------------------------------------------------------------------


def _ds_advantages(name: str, fixed: Mapping[str, float]) -> Callable:
    def adv(batch: Batch, h: Mapping[str, Any]) -> Array:
        r = _rewards(name, batch)
        gamma_p = fixed.get("gamma_p", h.get("gamma_p"))
        gamma_n = fixed.get("gamma_n", h.get("gamma_n"))
        ell = _seq_logp_old(name, batch, h["logp_reduction"])
        c = _correct_f(r)
        return _grpo(r, h) - gamma_p * c * ell + gamma_n * (1.0 - c) * ell

    return adv


_define(
    "ds_grpo",
    source="seed 000 §4.2 (Eq. 4, differential smoothing)",
    doc="A~ = A - gamma_p l (correct), A + gamma_n l (incorrect); l = log pi_old(tau)",
    defaults={**_COMMON, **_NORM, "gamma_p": 0.02, "gamma_n": 0.005, "logp_reduction": "sum"},
    advantages=_ds_advantages("ds_grpo", {}),
)
_define(
    "ds_grpo_pos",
    source="seed 000 §4.2 (DS-Positive ablation)",
    doc="A~ = A - gamma_p l on correct responses only (gamma_n = 0)",
    defaults={**_COMMON, **_NORM, "gamma_p": 0.02, "logp_reduction": "sum"},
    advantages=_ds_advantages("ds_grpo_pos", {"gamma_n": 0.0}),
)
_define(
    "ds_grpo_neg",
    source="seed 000 §4.2 (DS-Negative ablation)",
    doc="A~ = A + gamma_n l on incorrect responses only (gamma_p = 0)",
    defaults={**_COMMON, **_NORM, "gamma_n": 0.005, "logp_reduction": "sum"},
    advantages=_ds_advantages("ds_grpo_neg", {"gamma_p": 0.0}),
)


# Global entropy bonus / penalty and differential entropy control -----------------------------


def _entropy_method(name: str, sign: float) -> None:
    # sign = +1 for the bonus (reward - eta log pi), -1 for the penalty (reward + eta log pi).
    def adv(batch: Batch, h: Mapping[str, Any]) -> Array:
        a = _grpo(_rewards(name, batch), h)
        if h["form"] == "token":
            return a
        return a - sign * h["eta"] * _seq_logp_old(name, batch, h["logp_reduction"])

    def loss(batch: Batch, h: Mapping[str, Any], a: Array) -> tuple[Array, dict[str, Array]]:
        if h["form"] == "trajectory":
            return _policy_loss(name, batch, a, h)
        entropy = _masked_entropy(name, batch)
        mean_entropy = core.agg_loss(entropy, batch["mask"], h["loss_agg"])
        return _policy_loss(
            name, batch, a, h, token_extra=-sign * h["eta"] * entropy,
            metrics={"entropy": mean_entropy},
        )  # fmt: skip

    kind = "bonus" if sign > 0 else "penalty"
    op = "-" if sign > 0 else "+"
    _define(
        name,
        source=f"seed 000 Lemma B.4 (global entropy {kind}); token form: verl entropy_coeff",
        doc=(
            f"trajectory: A~ = A {op} eta l for every response; "
            f"token: loss {'-' if sign > 0 else '+'}= eta agg(H_t)"
        ),
        defaults={**_COMMON, **_NORM, "eta": 0.01, "form": "trajectory", "logp_reduction": "sum"},
        advantages=adv,
        loss=loss,
        needs=lambda h: frozenset({"entropy"}) if h["form"] == "token" else frozenset(),
    )


_entropy_method("entropy_bonus", +1.0)
_entropy_method("entropy_penalty", -1.0)


def _diff_entropy_loss(
    batch: Batch, h: Mapping[str, Any], a: Array
) -> tuple[Array, dict[str, Array]]:
    entropy = _masked_entropy("diff_entropy", batch)
    xp = array_namespace(entropy)
    c = _correct_f(_rewards("diff_entropy", batch))
    coef = xp.expand_dims(h["eta_pos"] * c - h["eta_neg"] * (1.0 - c), axis=-1)
    mean_entropy = core.agg_loss(entropy, batch["mask"], h["loss_agg"])
    return _policy_loss(
        "diff_entropy", batch, a, h, token_extra=-coef * entropy, metrics={"entropy": mean_entropy}
    )


_define(
    "diff_entropy",
    source="seed 000 §4.8.2 (differential entropy control)",
    doc="GRPO A; loss += -eta_pos H_t on correct responses, +eta_neg H_t on incorrect ones",
    defaults={**_COMMON, **_NORM, "eta_pos": 0.01, "eta_neg": 0.01},
    advantages=lambda b, h: _grpo(_rewards("diff_entropy", b), h),
    loss=_diff_entropy_loss,
    needs=lambda h: frozenset({"entropy"}),
)


# DSDR ----------------------------------------------------------------------------------------


def _dsdr_advantages(batch: Batch, h: Mapping[str, Any]) -> Array:
    r = _rewards("dsdr", batch)
    xp = array_namespace(r)
    s = _get("dsdr", batch, "diversity")
    capped = xp.clip(s, max=h["sigma"])
    return _grpo(r + h["lam"] * _correct_f(r) * capped, h)


def _dsdr_weights(s: Array, correct: Array, tau: Any) -> Array:
    # Softmax over the correct set only; shifting by the max over that set keeps exp finite.
    xp = array_namespace(s, correct)
    z = s / tau
    floor = xp.min(z, axis=-1, keepdims=True)
    top = xp.max(xp.where(correct, z, floor), axis=-1, keepdims=True)
    e = xp.where(correct, xp.exp(xp.where(correct, z - top, xp.zeros_like(z))), xp.zeros_like(z))
    total = xp.sum(e, axis=-1, keepdims=True)
    return core._safe_divide(xp, e, total)


def _dsdr_loss(batch: Batch, h: Mapping[str, Any], a: Array) -> tuple[Array, dict[str, Array]]:
    r = _rewards("dsdr", batch)
    logp, logp_old, mask = batch["logp"], batch["logp_old"], batch["mask"]
    xp = array_namespace(logp, mask)
    w = stop_gradient(_dsdr_weights(batch["diversity"], core.is_correct(r), h["tau"]))
    keep = core._bool_mask(xp, mask)
    ratio = core.importance_ratio(logp, logp_old, keep)
    # ratio is 1 and the guarded log-prob 0 on padding, so the token sum needs no second mask.
    count = xp.sum(xp.astype(keep, logp.dtype), axis=-1)
    local = -xp.sum(ratio * xp.where(keep, logp, 0.0), axis=-1) / xp.maximum(count, 1.0)
    l_loc = xp.mean(xp.sum(w * local, axis=-1))
    return _policy_loss(
        "dsdr",
        batch,
        a,
        h,
        ratio=ratio,
        scalar_extra=-h["lam_loc"] * l_loc,
        metrics={"local_entropy": l_loc},
    )


_define(
    "dsdr",
    source="seed 001 Eqs. 10, 11, 15, 16 (DSDR)",
    doc=(
        "r~ = r + lam 1[correct] min(s, sigma), GRPO A(r~); "
        "loss -= lam_loc mean_B sum_{i in C} softmax_C(s/tau)_i mean_t[rho_t (-log pi_t)]"
    ),
    defaults={**_COMMON, **_NORM, "lam": 0.1, "sigma": 0.5, "tau": 1.0, "lam_loc": 0.01},
    advantages=_dsdr_advantages,
    loss=_dsdr_loss,
    needs=lambda h: frozenset({"diversity"}),
)


# ProGRPO -------------------------------------------------------------------------------------


def _progrpo_advantages(batch: Batch, h: Mapping[str, Any]) -> Array:
    r = _rewards("progrpo", batch)
    xp = array_namespace(r)
    a = _grpo(r, h)
    conf = core.low_prob_confidence(
        _get("progrpo", batch, "logp_old"), _get("progrpo", batch, "mask"), low_frac=h["low_frac"]
    )
    if h["confidence_ref"] == "prompt":
        ref = core.low_prob_confidence(
            _get("progrpo", batch, "prompt_logp"),
            _get("progrpo", batch, "prompt_mask"),
            low_frac=h["low_frac"],
        )
        ref = xp.expand_dims(ref, axis=-1)
    else:
        ref = xp.mean(conf, axis=-1, keepdims=True)
    mixed = xp.max(r, axis=-1, keepdims=True) > xp.min(r, axis=-1, keepdims=True)
    return a + xp.where(mixed, h["alpha"] * (ref - conf), xp.zeros_like(a))


_define(
    "progrpo",
    source="seed 003 Alg. 1, Eqs. 4-6 (Eq. 10 for confidence_ref='group_mean')",
    doc="A~ = A + alpha (c(q) - c(o_i|q)) in mixed groups; c = exp(mean of lowest-20% log p)",
    defaults={**_COMMON, **_NORM, "alpha": 0.3, "low_frac": 0.2, "confidence_ref": "prompt"},
    advantages=_progrpo_advantages,
    needs=lambda h: frozenset(_PROMPT_KEYS) if h["confidence_ref"] == "prompt" else frozenset(),
)


# CaSP ----------------------------------------------------------------------------------------


def _casp_loss(batch: Batch, h: Mapping[str, Any], a: Array) -> tuple[Array, dict[str, Array]]:
    name = "casp"
    entropy, cand, rank, mask = (
        _get(name, batch, k) for k in ("entropy", "cand_logp", "sampled_rank", "mask")
    )

    def ratio_fn(ratio: Array, adv: Array) -> Array:
        return core.casp_ratio(
            ratio, adv, entropy, cand, rank, mask,
            alpha=h["alpha"], top_n=h["top_n"], quantile=h["quantile"], lam_top1=h["lam_top1"],
        )  # fmt: skip

    return _policy_loss(name, batch, a, h, ratio_fn=ratio_fn)


_define(
    "casp",
    source="seed 004 Eqs. 4.1, 5; authors' code compute_policy_loss_simko",
    doc=(
        "GRPO A; on tokens with H_t > q-quantile: rho+ = (1-alpha) rho + (alpha/N) sum_n "
        "sg(rho/rho_n) rho_n (A > 0), rho- = lam_top1 rho if sampled = rank 1 (A < 0)"
    ),
    defaults={
        **_COMMON,
        **_NORM,
        "alpha": 0.01,
        "top_n": 3,
        "quantile": 0.8,
        "lam_top1": 1.1,
    },
    advantages=lambda b, h: _grpo(_rewards("casp", b), h),
    loss=_casp_loss,
    needs=lambda h: frozenset({"entropy", "sampled_rank", "cand_logp"}),
)


# Unlikeliness reward -------------------------------------------------------------------------


def _unlikeliness_advantages(batch: Batch, h: Mapping[str, Any]) -> Array:
    r = _rewards("unlikeliness", batch)
    rank = core.group_rank(_seq_logp_old("unlikeliness", batch, "mean"))
    return _grpo(r * (1.0 - h["beta_rank"] * rank / r.shape[-1]), h)


_define(
    "unlikeliness",
    source="He, Fried, Welleck 2025 (authors' code)",
    doc="r <- r (1 - beta_rank rank_i/G), rank of mean log pi_old ascending (least likely 0); GRPO",
    defaults={**_COMMON, **_NORM, "beta_rank": 0.25},
    advantages=_unlikeliness_advantages,
)


# Pass@k training -----------------------------------------------------------------------------

_define(
    "passk",
    source="Chen et al. 2025, Pass@k Training (authors' code)",
    doc="A_pos = (1-R)/sigma, A_neg = (1-R-C(N_neg-1,k-1)/C(N-1,k-1))/sigma, R = 1-C(N_neg,k)/C(N,k)",
    defaults={**_COMMON, "k": 4},
    advantages=lambda b, h: core.passk_advantages(_rewards("passk", b), k=h["k"]),
)


# W-REINFORCE, PSR, NSR -----------------------------------------------------------------------


def _signed(name: str, pos: str | float, neg: float) -> Callable:
    def adv(batch: Batch, h: Mapping[str, Any]) -> Array:
        c = _correct_f(_rewards(name, batch))
        p = h[pos] if isinstance(pos, str) else pos
        return p * c + neg * (1.0 - c)

    return adv


_define(
    "w_reinforce",
    source="Zhu et al. 2025, W-REINFORCE (authors' code)",
    doc="A = +lam (correct), -1 (incorrect); no group normalization",
    defaults={**_COMMON, "lam": 0.1},
    advantages=_signed("w_reinforce", "lam", -1.0),
)
_define(
    "psr",
    source="Zhu et al. 2025, PSR (authors' code)",
    doc="A = +1 (correct), 0 (incorrect)",
    defaults=dict(_COMMON),
    advantages=_signed("psr", 1.0, 0.0),
)
_define(
    "nsr",
    source="Zhu et al. 2025, NSR (authors' code)",
    doc="A = 0 (correct), -1 (incorrect)",
    defaults=dict(_COMMON),
    advantages=_signed("nsr", 0.0, -1.0),
)
