"""Backend-agnostic building blocks: advantages, ratios, surrogates, aggregation, KL and entropy.

Every function takes arrays of one backend (NumPy, JAX, torch) and returns arrays of the same
backend (``xp = array_namespace(...)``). Named axes: ``B`` prompts, ``G`` responses per prompt
(a group), ``T`` token positions, ``N`` top-N candidates, ``V`` vocabulary, ``P`` prompt tokens.

Rules that make these functions safe under ``jax.jit``, ``jax.grad`` and torch autograd:
no Python branching on array values, no item assignment, no ``asarray`` on inputs, and masked
positions are replaced by a harmless constant *before* any nonlinearity (the "double-where"
pattern), so garbage (NaN, +-inf) at padding reaches neither the value nor the gradient.
Hyper-parameters that only enter arithmetic may be Python numbers or traced JAX scalars.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from array_api_compat import array_namespace, device

import numerics
from shaping.backend import sqrt, stop_gradient, top_k

Array = Any

__all__ = [
    "AGG_MODES",
    "KL_ESTIMATORS",
    "LOG_RATIO_MAX",
    "agg_loss",
    "batch_high_entropy_mask",
    "batch_random_count",
    "batch_top_count",
    "casp_ratio",
    "clip_fraction",
    "clipped_surrogate",
    "dr_grpo_advantages",
    "group_rank",
    "grpo_advantages",
    "high_entropy_mask",
    "importance_ratio",
    "is_correct",
    "kl_k3",
    "kl_penalty",
    "low_prob_confidence",
    "masked_mean",
    "masked_quantile",
    "masked_sum",
    "passk_advantages",
    "sequence_logp",
    "token_covariance",
    "token_entropy",
    "topn_smoothed_ratio",
]

AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""Loss aggregation modes of `agg_loss` (verl names)."""

LOG_RATIO_MAX: float = 20.0
"""Upper clamp on log-ratios before ``exp`` (verl clamps at +-20): it only guards overflow."""

_CORRECT_THRESHOLD = 0.5


def _bool_mask(xp: Any, mask: Array) -> Array:
    if mask.dtype == xp.bool:
        return mask
    return mask > 0


def _float_dtype(xp: Any, x: Array) -> Any:
    if xp.isdtype(x.dtype, "real floating"):
        return x.dtype
    return xp.__array_namespace_info__().default_dtypes()["real floating"]


def _as_float(xp: Any, x: Array, dtype: Any = None) -> Array:
    dtype = _float_dtype(xp, x) if dtype is None else dtype
    return x if x.dtype == dtype else xp.astype(x, dtype)


def _safe_divide(xp: Any, num: Array, den: Array) -> Array:
    # 0 where the denominator is 0; the inner where keeps the gradient of the unused branch finite.
    nonzero = den != 0
    return xp.where(nonzero, num / xp.where(nonzero, den, 1.0), 0.0)


def _snap_to_int(xp: Any, h: Array) -> Array:
    # q * (n - 1) is often an integer in exact arithmetic; float32 rounding must not move it
    # across an integer boundary (floor/ceil would then pick a neighbouring token).
    r = xp.round(h)
    return xp.where(xp.abs(h - r) <= 1e-5 * xp.maximum(xp.abs(h), 1.0), r, h)


def is_correct(rewards: Array) -> Array:
    """Correct-set indicator of each response.

    Args:
        rewards: (B, G) verifier rewards (binary 0/1; a float reward counts as correct above 0.5).

    Returns:
        (B, G) bool array, ``rewards > 0.5``.

    Source: docs/formulas.md §0.2 (correct set, threshold 0.5).
    """
    return rewards > _CORRECT_THRESHOLD


def masked_sum(x: Array, mask: Array, *, axis: int = -1, keepdims: bool = False) -> Array:
    """Sum of `x` over `axis`, counting only entries where `mask` is set.

    Args:
        x: array, e.g. (B, G, T); masked-out entries may hold anything (NaN, +-inf).
        mask: same shape as `x`, bool or float (nonzero = kept).
        axis: axis to reduce (default -1, tokens).
        keepdims: keep the reduced axis with length 1.

    Returns:
        `x`'s shape without `axis` (or with length 1 there); 0 where nothing is kept.
    """
    xp = array_namespace(x, mask)
    keep = _bool_mask(xp, mask)
    return xp.sum(xp.where(keep, x, 0.0), axis=axis, keepdims=keepdims)


def masked_mean(x: Array, mask: Array, *, axis: int = -1, keepdims: bool = False) -> Array:
    """Mean of `x` over the kept entries along `axis`; 0 (never NaN) where nothing is kept.

    Args:
        x: array, e.g. (B, G, T).
        mask: same shape, bool or float.
        axis: axis to reduce (default -1).
        keepdims: keep the reduced axis with length 1.

    Returns:
        `x`'s shape without `axis` (or with length 1 there).
    """
    xp = array_namespace(x, mask)
    keep = _bool_mask(xp, mask)
    count = xp.sum(xp.astype(keep, _float_dtype(xp, x)), axis=axis, keepdims=keepdims)
    total = masked_sum(x, keep, axis=axis, keepdims=keepdims)
    return total / xp.maximum(count, 1.0)


def grpo_advantages(rewards: Array, *, std_correction: int = 1, eps: float = 1e-6) -> Array:
    """GRPO group-normalized advantages ``A_i = (r_i - mean_j r_j) / (std_j r_j + eps)``.

    Args:
        rewards: (B, G) rewards; integer rewards are cast to the default float dtype.
        std_correction: 1 for the unbiased std (ddof=1), as TRL and verl use (verl's
            ``compute_grpo_outcome_advantage`` calls ``torch.std``, which is unbiased by
            default); 0 for the population std (ddof=0). With G = 1 the std is defined as 0.
        eps: added to the std (default 1e-6, verl; TRL uses 1e-4). May be a traced scalar.

    Returns:
        (B, G) advantages; exactly 0 on a group whose rewards are all equal (the centring of
        `dr_grpo_advantages`), and 0 wherever ``std + eps == 0``.

    Raises:
        ValueError: `std_correction` not 0 or 1, or `rewards` not 2-D.

    Source: docs/formulas.md §2.1 (GRPO; Shao et al. 2024).
    """
    xp = array_namespace(rewards)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must have shape (B, G), got {tuple(rewards.shape)}")
    if std_correction not in (0, 1):
        raise ValueError(f"std_correction must be 0 or 1, got {std_correction!r}")
    r = _as_float(xp, rewards)
    group = r.shape[-1]
    centred = dr_grpo_advantages(r)
    var = xp.sum(centred * centred, axis=-1, keepdims=True) / max(group - std_correction, 1)
    return _safe_divide(xp, centred, sqrt(var) + eps)


def dr_grpo_advantages(rewards: Array) -> Array:
    """Dr. GRPO advantages ``A_i = r_i - mean_j r_j`` (no std normalization).

    Args:
        rewards: (B, G) rewards.

    Returns:
        (B, G) advantages (float). A group whose rewards are all equal gets exactly 0 (from
        `numerics` version 3, `numerics.EXACT_CENTRING`): in float32, ``r - mean(r)`` of a
        constant group need not be 0 (0.1 × 8 in torch, or ``sum · (1/G)`` fused into one
        multiply-add by XLA), and GRPO's division by ``std + eps`` (1e-6) turned that residual
        into advantages up to 0.06 (docs/numerics.md). Every other group keeps its bytes in
        NumPy, torch and XLA's default compile; under the toy engine's compile options XLA fuses
        the program otherwise, and they move by up to 2.4e-7.

    Source: docs/formulas.md §2.2 (Dr. GRPO; Liu et al. 2025).
    """
    xp = array_namespace(rewards)
    r = _as_float(xp, rewards)
    centred = r - xp.mean(r, axis=-1, keepdims=True)
    if r.shape[-1] < 2 or numerics.version() < numerics.EXACT_CENTRING:
        return centred
    equal = xp.max(r, axis=-1, keepdims=True) == xp.min(r, axis=-1, keepdims=True)
    return xp.where(equal, xp.zeros_like(centred), centred)


def sequence_logp(logp: Array, mask: Array, *, reduction: str = "sum") -> Array:
    """Sequence log-probability ``l_i`` reduced over each response's tokens.

    Args:
        logp: (B, G, T) per-token log-probs (padding may hold anything).
        mask: (B, G, T) response-token mask, bool or float.
        reduction: "sum" (``log pi(tau)``, the theory's quantity; default) or "mean"
            (length-normalized: sum / max(n_tokens, 1)).

    Returns:
        (B, G); 0 for a fully masked response.

    Raises:
        ValueError: unknown `reduction`.

    Source: docs/formulas.md §2.8 (seed 000 §4.2).
    """
    if reduction == "sum":
        return masked_sum(logp, mask, axis=-1)
    if reduction == "mean":
        return masked_mean(logp, mask, axis=-1)
    raise ValueError(f"logp_reduction must be 'sum' or 'mean', got {reduction!r}")


def importance_ratio(logp: Array, logp_old: Array, mask: Array) -> Array:
    """Per-token importance ratio ``rho_t = exp(logp - logp_old)``.

    The log-ratio is clamped from above at `LOG_RATIO_MAX` (20, as verl) so the ratio cannot
    overflow; for A > 0 the clipped surrogate's value is unchanged by the clamp. Padding gets 1.

    Args:
        logp: (B, G, T) current-policy log-probs (differentiable).
        logp_old: (B, G, T) behaviour-policy log-probs.
        mask: (B, G, T) response-token mask.

    Returns:
        (B, G, T) ratios.

    Source: docs/formulas.md §2.3 (PPO; clamp at 20 as verl).
    """
    xp = array_namespace(logp, logp_old, mask)
    keep = _bool_mask(xp, mask)
    log_ratio = xp.where(keep, logp, 0.0) - xp.where(keep, logp_old, 0.0)
    return xp.exp(xp.clip(log_ratio, max=LOG_RATIO_MAX))


def _expand_advantages(xp: Any, advantages: Array, like: Array) -> Array:
    if advantages.ndim == like.ndim - 1:
        return xp.expand_dims(advantages, axis=-1)
    return advantages


def clipped_surrogate(
    ratio: Array, advantages: Array, *, eps_low: float = 0.2, eps_high: float = 0.2
) -> Array:
    """Per-token PPO clipped surrogate loss ``-min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A)``.

    Args:
        ratio: (B, G, T) importance ratios (see `importance_ratio`).
        advantages: (B, G) per-response or (B, G, T) per-token advantages.
        eps_low: lower clip width (default 0.2). May be a traced scalar.
        eps_high: upper clip width (default 0.2; DAPO's clip-higher uses 0.28).

    Returns:
        (B, G, T) per-token loss (not masked; aggregate with `agg_loss`).

    Source: docs/formulas.md §2.4 (DAPO for eps_low/eps_high).
    """
    xp = array_namespace(ratio, advantages)
    adv = _expand_advantages(xp, advantages, ratio)
    clipped = xp.clip(ratio, min=1.0 - eps_low, max=1.0 + eps_high)
    return -xp.minimum(ratio * adv, clipped * adv)


def clip_fraction(
    ratio: Array, advantages: Array, mask: Array, *, eps_low: float = 0.2, eps_high: float = 0.2
) -> Array:
    """Fraction of response tokens whose surrogate is on the clipped (zero-gradient) branch.

    A token counts when ``clip(rho)*A < rho*A`` strictly, i.e. the ``min`` picks the clipped term.

    Args:
        ratio: (B, G, T); advantages: (B, G) or (B, G, T); mask: (B, G, T).
        eps_low, eps_high: clip widths (defaults 0.2).

    Returns:
        scalar in [0, 1] (0 if nothing is masked in); carries no gradient.

    Source: standard PPO diagnostic (verl ``pg_clipfrac``).
    """
    xp = array_namespace(ratio, advantages, mask)
    ratio = stop_gradient(ratio)
    surrogate = clipped_surrogate(ratio, advantages, eps_low=eps_low, eps_high=eps_high)
    return _clip_fraction(xp, surrogate, ratio, advantages, _bool_mask(xp, mask))


def _clip_fraction(
    xp: Any, surrogate: Array, ratio: Array, advantages: Array, keep: Array
) -> Array:
    clipped = -surrogate < ratio * _expand_advantages(xp, advantages, ratio)
    return agg_loss(xp.astype(clipped, ratio.dtype), keep, "token-mean")


def agg_loss(
    loss: Array, mask: Array, mode: str = "token-mean", *, norm_length: int | None = None
) -> Array:
    """Aggregate a per-token loss into a scalar.

    Modes (padding is ignored even if it holds NaN or +-inf):

    - ``"token-mean"`` (DAPO): ``sum(l*m) / max(sum(m), 1)`` over the whole batch;
    - ``"seq-mean-token-mean"`` (GRPO): mean over all ``B*G`` sequences of
      ``sum_t(l*m) / max(sum_t m, 1)`` (a fully masked sequence contributes 0 and still counts);
    - ``"seq-mean-token-sum-norm"`` (Dr. GRPO): mean over all sequences of ``sum_t(l*m) / L``
      with the constant ``L = norm_length`` (TRL's ``max_completion_length``), or the padded
      length ``T`` when `norm_length` is None.

    A batch with no sequence (``B*G = 0``) gives 0 in every mode (never NaN), and so does
    ``T = 0`` (every sum is empty; ``L`` is read as at least 1).

    Args:
        loss: (B, G, T) per-token loss (any leading shape; tokens on the last axis).
        mask: same shape, bool or float.
        mode: one of `AGG_MODES` (default "token-mean").
        norm_length: ``L`` of ``"seq-mean-token-sum-norm"``, an int with ``L >= T``
            (ignored by the other modes).

    Returns:
        scalar.

    Raises:
        ValueError: unknown `mode`, `loss` and `mask` shapes differ, or `norm_length` not an
            int >= max(T, 1).

    Source: docs/formulas.md §2.5 (and §2.2 for the Dr. GRPO constant); verl
    ``core_algos.agg_loss``; TRL ``GRPOTrainer`` ``loss_type="dr_grpo"``.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"loss_agg must be one of {list(AGG_MODES)}, got {mode!r}")
    if tuple(loss.shape) != tuple(mask.shape):
        raise ValueError(f"loss shape {tuple(loss.shape)} != mask shape {tuple(mask.shape)}")
    xp = array_namespace(loss, mask)
    keep = _bool_mask(xp, mask)
    kept = xp.where(keep, loss, 0.0)
    if mode == "token-mean":
        return xp.sum(kept) / xp.maximum(xp.sum(xp.astype(keep, loss.dtype)), 1.0)
    # A static count: an empty batch divides 0 by 1 instead of taking the mean of nothing.
    n_seq = max(math.prod(loss.shape[:-1]), 1)
    seq_sum = xp.sum(kept, axis=-1)
    if mode == "seq-mean-token-mean":
        count = xp.sum(xp.astype(keep, loss.dtype), axis=-1)
        return xp.sum(seq_sum / xp.maximum(count, 1.0)) / n_seq
    t = loss.shape[-1]
    if norm_length is None:
        length = max(t, 1)
    elif isinstance(norm_length, bool) or not isinstance(norm_length, int) or norm_length < 1:
        raise ValueError(f"norm_length must be an int >= 1, got {norm_length!r}")
    elif norm_length < t:
        raise ValueError(f"norm_length = {norm_length} is below the padded length T = {t}")
    else:
        length = norm_length
    return xp.sum(seq_sum) / (n_seq * length)


def kl_k3(logp: Array, logp_ref: Array, mask: Array) -> Array:
    """Per-token k3 estimator of ``KL(pi_theta || pi_ref)``: ``exp(q - p) - (q - p) - 1``.

    ``p = logp``, ``q = logp_ref``. ``q - p`` is clamped from above at `LOG_RATIO_MAX` (overflow
    guard; no lower clamp, so the linear tail keeps its gradient). Padding gets 0.

    Args:
        logp: (B, G, T) current-policy log-probs (differentiable).
        logp_ref: (B, G, T) reference-policy log-probs.
        mask: (B, G, T).

    Returns:
        (B, G, T) nonnegative per-token KL estimates.

    Source: docs/formulas.md §2.6 (Schulman's k3; verl ``low_var_kl`` without its +-10 clamp).
    """
    xp = array_namespace(logp, logp_ref, mask)
    keep = _bool_mask(xp, mask)
    diff = xp.clip(xp.where(keep, logp_ref, 0.0) - xp.where(keep, logp, 0.0), max=LOG_RATIO_MAX)
    return xp.exp(diff) - diff - 1.0


KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3", "k3+")
"""Per-token estimators of ``KL(pi_theta || pi_ref)`` that `kl_penalty` computes (verl names)."""


def kl_penalty(logp: Array, logp_ref: Array, mask: Array, estimator: str = "k3") -> Array:
    """Per-token estimate of ``KL(pi_theta || pi_ref)`` by one of Schulman's estimators.

    With ``d = logp - logp_ref`` (0 on padding): ``k1 = d``; ``k2 = d**2 / 2``; ``k3`` is
    `kl_k3` (``exp(-d) + d - 1``, the default and the only one before 2026-11-27); ``k3+``
    takes k3's value and k2's gradient (straight-through: ``k2 - sg(k2) + sg(k3)``), whose
    expected gradient is the KL's (verl ``kl_penalty`` with a trailing ``+``). k1 and k3 are
    unbiased for the value, k2's gradient is the unbiased one.

    Args:
        logp: (B, G, T) current-policy log-probs (differentiable).
        logp_ref: (B, G, T) reference-policy log-probs.
        mask: (B, G, T).
        estimator: one of `KL_ESTIMATORS`.

    Returns:
        (B, G, T) per-token estimates (0 on padding).

    Raises:
        ValueError: an unknown `estimator`.

    Source: docs/formulas.md §2.6 (Schulman, "Approximating KL divergence", 2020; verl
    ``core_algos.kl_penalty`` / ``kl_penalty_forward``).
    """
    if estimator == "k3":
        return kl_k3(logp, logp_ref, mask)
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {list(KL_ESTIMATORS)}, got {estimator!r}")
    xp = array_namespace(logp, logp_ref, mask)
    keep = _bool_mask(xp, mask)
    d = xp.where(keep, logp, 0.0) - xp.where(keep, logp_ref, 0.0)
    if estimator == "k1":
        return d
    k2 = 0.5 * d * d
    if estimator == "k2":
        return k2
    return k2 - stop_gradient(k2) + stop_gradient(kl_k3(logp, logp_ref, mask))


def batch_high_entropy_mask(entropy: Array, mask: Array, *, top: float = 0.2) -> Array:
    """The "80/20" forking-token mask: tokens whose entropy is in the batch's top `top` fraction.

    ``w_t = 1[H_t >= quantile_{1-top}(H over every response token of the batch)]`` (numpy's
    linear quantile; ``>=`` as TRL's ``get_high_entropy_mask``). Unlike `high_entropy_mask`
    (CaSP: a threshold per response, strict ``>``), one threshold for the whole batch.
    ``top = 1`` keeps every token. The entropy is stop-gradiented.

    Args:
        entropy: (B, G, T) token entropies (nats).
        mask: (B, G, T) response-token mask.
        top: the kept fraction in (0, 1] (TRL's ``top_entropy_quantile``; 0.2 in the paper).

    Returns:
        (B, G, T) bool; False on padding.

    Source: Wang et al. 2025, "Beyond the 80/20 rule", arXiv 2506.01939; TRL ``GRPOTrainer``
    ``top_entropy_quantile``; docs/formulas.md §2.23.
    """
    xp = array_namespace(entropy, mask)
    keep = _bool_mask(xp, mask)
    h = stop_gradient(entropy)
    flat_h = xp.reshape(h, (1, -1))
    flat_keep = xp.reshape(keep, (1, -1))
    threshold = masked_quantile(flat_h, flat_keep, 1.0 - top)[0]
    return (h >= threshold) & keep


def token_covariance(advantages: Array, logp: Array, mask: Array) -> Array:
    """Per-token centred cross-product ``(A_t - mean A) (log pi_t - mean log pi)``, detached.

    The means are over every response token of the batch (token-weighted), as Cui et al. select
    the tokens that drive the entropy change (its covariance is the batch mean of this).

    Args:
        advantages: (B, G) per-response advantages (broadcast to the tokens).
        logp: (B, G, T) log-probs of the sampled tokens under the current policy.
        mask: (B, G, T).

    Returns:
        (B, G, T); ``-inf`` on padding and on tokens of log-prob ``-inf`` (left out of the means
        too: never selected, and they do not poison the others' covariance).

    Source: Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617
    (Eq. of Clip-Cov / KL-Cov); verl ``compute_policy_loss_clip_cov`` / ``_kl_cov``;
    docs/formulas.md §2.25.
    """
    xp = array_namespace(logp, mask)
    keep = _bool_mask(xp, mask)
    keep = keep & (stop_gradient(logp) > -math.inf)
    a = stop_gradient(_expand_advantages(xp, advantages, logp)) * xp.ones_like(logp)
    lp = stop_gradient(xp.where(keep, logp, 0.0))
    n = xp.maximum(xp.sum(xp.astype(keep, lp.dtype)), 1.0)
    a_mean = xp.sum(xp.where(keep, a, 0.0)) / n
    lp_mean = xp.sum(lp) / n
    return xp.where(keep, (a - a_mean) * (lp - lp_mean), -math.inf)


def batch_top_count(score: Array, keep: Array, count: Array) -> Array:
    """The `count` largest entries of `score` among the kept ones, over the whole batch.

    Ties are broken by position (row-major: earlier first), so the result is a function of
    the inputs alone. Fewer than `count` kept entries: all of them.

    Args:
        score: (B, G, T) (detached).
        keep: (B, G, T) bool.
        count: number to select; int or 0-d array (may be traced).

    Returns:
        (B, G, T) bool.

    Source: verl ``compute_policy_loss_kl_cov`` (``torch.topk`` over the valid tokens).
    """
    xp = array_namespace(score, keep)
    flat = xp.reshape(xp.where(keep, score, -math.inf), (-1,))
    order = xp.argsort(flat, descending=True, stable=True)
    rank = xp.argsort(order, stable=True)
    return xp.reshape(rank < count, score.shape) & keep


_M32 = 0xFFFFFFFF


def _mix32(x: Array) -> Array:
    # lowbias32 (C. Wellons' hash prospector): a bijection of 32-bit integers whose output bits
    # each flip with probability ~1/2 for a flipped input bit. int64 arithmetic: a product wraps
    # modulo 2^64, and its low 32 bits (all that is kept) are exact.
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def batch_random_count(keep: Array, count: Array, salt: Array, *, seed: int = 0) -> Array:
    """A uniformly drawn `count` of the kept entries, over the whole batch; a function of the
    inputs alone (no generator state), the same draw on every backend and device.

    Each entry gets a 24-bit key, a hash of its flat position, `seed` and its `salt`; the
    `count` kept entries of largest key are drawn (`batch_top_count`). Independent, uniform
    keys make every subset of ``min(count, kept)`` kept entries equally likely, as
    ``torch.randperm`` over them does. The salt (integers, e.g. quantized log-probs) makes the
    draws of different batches differ under one seed.

    Args:
        keep: (B, G, T) bool.
        count: number to draw; int or 0-d array.
        salt: (B, G, T) int64, nonnegative; read only where `keep`.
        seed: int >= 0.

    Returns:
        (B, G, T) bool.

    Raises:
        ValueError: `seed` not an integer in [0, 2^32); a backend without 64-bit integers.

    Source: verl ``compute_policy_loss_clip_cov`` (``torch.randperm`` over the in-band tokens);
    docs/formulas.md §2.25.
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed <= _M32:
        raise ValueError(f"seed: expected an integer in [0, 2^32), got {seed!r}")
    xp = array_namespace(keep, salt)
    if xp.zeros((), dtype=xp.int64).dtype != xp.int64:  # JAX without jax_enable_x64
        raise ValueError("a random draw needs 64-bit integers (NumPy, torch, or JAX with "
                         "jax_enable_x64)")  # fmt: skip
    n = math.prod(keep.shape)
    flat = xp.reshape(xp.arange(n, dtype=xp.int64, device=device(keep)), keep.shape)
    salt = xp.where(keep, salt, xp.zeros_like(salt)) & _M32
    key = _mix32(_mix32((flat + int(seed) * 0x9E3779B9) & _M32) ^ salt)
    # 24 bits: exact in float32. Two of n keys tie with probability about n^2 / 2^25; a tie goes
    # by position.
    return batch_top_count(xp.astype(key >> 8, xp.float32), keep, count)


def token_entropy(logits: Array) -> Array:
    """Entropy of the softmax of `logits` over the last axis, computed in log space.

    ``H = -sum_v p_v log p_v`` with ``log p = z - max(z) - log sum exp(z - max(z))``.
    Entries at ``-inf`` (banned tokens) contribute 0 to value and gradient.

    Args:
        logits: (B, G, T, V) (any leading shape).

    Returns:
        (B, G, T) entropies in nats.

    Source: docs/formulas.md §2.7 (token entropy; verl ``entropy_from_logits``).
    """
    xp = array_namespace(logits)
    shift = stop_gradient(xp.max(logits, axis=-1, keepdims=True))
    shift = xp.where(xp.isfinite(shift), shift, 0.0)
    z = logits - shift
    finite = xp.isfinite(z)
    z = xp.where(finite, z, 0.0)
    e = xp.where(finite, xp.exp(z), 0.0)
    total = xp.sum(e, axis=-1, keepdims=True)
    # total >= 1 unless every logit is -inf; keep log() finite for that row.
    total = xp.where(total > 0, total, 1.0)
    log_p = z - xp.log(total)
    return -xp.sum(xp.where(finite, (e / total) * log_p, 0.0), axis=-1)


def _static(v: object) -> float | None:
    # A concrete, finite Python/NumPy real (a static bound can be derived from it), else None
    # (JAX tracers, 0-d arrays, NaN): those take the full-sort path.
    if isinstance(v, numbers.Real) and math.isfinite(v):
        return float(v)
    return None


def _quantile_top_count(q: float, t: int) -> int:
    """How many of a row's largest values `masked_quantile` reads: ``min(T, ceil((1-q)(T-1)) + 2)``.

    A row with ``n <= T`` kept entries sorted ascending as ``s`` (descending as ``d``, so
    ``s[i] = d[n-1-i]``) reads ``s[lo]`` and ``s[hi]`` with ``lo = floor(h) <= hi``, ``h`` the
    snapped float value of ``q*(n-1)``. In exact arithmetic ``n-1-lo = ceil((1-q)(n-1)) <= c``,
    ``c = ceil((1-q)(T-1))``, so ``c + 1`` values would do; the extra one absorbs float rounding.
    Bound with rounding: snapping never lowers ``floor(h)`` (it moves a value just below an
    integer up to it, one just above down to the same floor), and the float32/float64 error of
    ``q*(n-1)`` is below ``delta = q*(n-1)*2**-22 < 1`` for ``T < 2**22``; so ``lo > q*(n-1) -
    1 - delta`` and ``n-1-lo < (1-q)*(n-1) + 1 + delta <= c + 1 + delta``. An integer below
    ``c + 1 + delta`` (``delta < 1``) is at most ``c + 1``: descending positions ``0..c+1``, the
    ``c + 2`` largest values, suffice. ``hi >= lo`` reads a position no larger.
    """
    return min(t, math.ceil((1.0 - q) * (t - 1)) + 2)


def masked_quantile(x: Array, mask: Array, q: float) -> Array:
    """Quantile of each row's masked entries, numpy's default "linear" method.

    With ``n`` kept entries sorted ascending as ``s``: ``h = q*(n-1)``,
    ``value = s[floor(h)] + (h - floor(h)) * (s[floor(h)+1] - s[floor(h)])``.
    Implemented with one (partial) sort and one-hot selection: no Python loops. For a concrete
    `q` only the ``K = min(T, ceil((1-q)(T-1)) + 2)`` largest entries of each row are needed
    (padding sent to -inf; see `_quantile_top_count`) and `shaping.backend.top_k` gets them:
    ascending position ``i`` of a row with ``n`` kept entries is descending position ``n-1-i``.
    A traced `q` (or ``K = T``) sorts the whole row (padding sent to +inf). Both read the same
    values, so the result is identical.

    Args:
        x: (..., T), e.g. (B, G, T) token entropies.
        mask: same shape, bool or float.
        q: quantile level in [0, 1]; may be a traced scalar.

    Returns:
        (...,) one value per row; 0 for a row with no kept entry (and for every row when T = 0).

    Raises:
        ValueError: concrete `q` outside [0, 1].

    Source: CaSP authors' code (``row_quantile_masked`` with ``torch.quantile``), seed 004 §4.
    """
    if isinstance(q, int | float) and not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q!r}")
    xp = array_namespace(x, mask)
    if x.shape[-1] == 0:
        # Every row is empty (T = 0): nothing to sort or index.
        return xp.zeros(x.shape[:-1], dtype=_float_dtype(xp, x), device=device(x))
    keep = _bool_mask(xp, mask)
    dtype = _float_dtype(xp, x)
    n = xp.sum(xp.astype(keep, dtype), axis=-1, keepdims=True)
    last = xp.maximum(n - 1.0, 0.0)
    h = _snap_to_int(xp, q * last)
    lo = xp.floor(h)
    hi = xp.minimum(lo + 1.0, last)
    weight = h - lo
    t = x.shape[-1]
    q_static = _static(q)
    k = t if q_static is None else _quantile_top_count(q_static, t)
    if k < t:
        s = top_k(xp.where(keep, x, -math.inf), k, largest=True)
        # Descending positions; an empty row (n = 0) would give -1: clamp, it is replaced below.
        lo, hi = xp.maximum(n - 1.0 - lo, 0.0), xp.maximum(n - 1.0 - hi, 0.0)
    else:
        s = xp.sort(xp.where(keep, x, math.inf), axis=-1)
    index = xp.__array_namespace_info__().default_dtypes()["indexing"]
    # An empty row would read the +-inf padding: replace it before the interpolation.
    s_lo = xp.where(n > 0, xp.take_along_axis(s, xp.astype(lo, index), axis=-1), 0.0)
    s_hi = xp.where(n > 0, xp.take_along_axis(s, xp.astype(hi, index), axis=-1), 0.0)
    return (s_lo + weight * (s_hi - s_lo))[..., 0]


def group_rank(x: Array) -> Array:
    """Ascending 0-based rank of each entry within its group (last axis).

    ``rank_i = #{j : x_j < x_i} + #{j < i : x_j == x_i}``: ties are broken by index (the lower
    index gets the lower rank), i.e. ``argsort(argsort(x, stable), stable)``. Pairwise over G.

    Args:
        x: (B, G) scores, e.g. length-normalized ``log pi_old``.

    Returns:
        (B, G) ranks as floats in ``{0, ..., G-1}`` (a permutation per row).

    Source: unlikeliness reward (He, Fried, Welleck 2025, authors' code), docs/formulas.md §2.12.
    """
    xp = array_namespace(x)
    xi = xp.expand_dims(x, axis=-1)
    xj = xp.expand_dims(x, axis=-2)
    idx = xp.arange(x.shape[-1], device=device(x))
    before = xp.expand_dims(idx, axis=0) < xp.expand_dims(idx, axis=1)
    below = (xj < xi) | ((xj == xi) & before)
    return xp.sum(xp.astype(below, _float_dtype(xp, x)), axis=-1)


def passk_advantages(rewards: Array, *, k: int = 4) -> Array:
    """Pass@k-training advantages (analytical form over all k-subsets of the group).

    With ``N = G`` samples and ``N_neg`` incorrect ones:
    ``R = 1 - C(N_neg, k)/C(N, k)``, ``sigma = sqrt(R(1-R))``, ``A_pos = (1 - R)/sigma``,
    ``A_neg = (1 - R - C(N_neg-1, k-1)/C(N-1, k-1))/sigma``. Binomial ratios are evaluated as
    products ``prod_{i<k} (N_neg - i)/(N - i)``. Where ``sigma = 0`` (every k-subset has the same
    reward: all correct, all wrong, or fewer than k wrong) the group's advantages are 0.

    Args:
        rewards: (B, G) binary rewards (correct = ``r > 0.5``).
        k: subset size, ``1 <= k <= G`` (default 4). May be a traced integer.

    Returns:
        (B, G) advantages.

    Raises:
        ValueError: concrete `k` outside ``[1, G]``.

    Source: Chen et al. 2025, "Pass@k Training" (authors' code), docs/formulas.md §2.14.
    """
    xp = array_namespace(rewards)
    group = rewards.shape[-1]
    if isinstance(k, int | float) and not 1 <= k <= group:
        raise ValueError(f"k must satisfy 1 <= k <= G = {group}, got k={k!r}")
    dtype = _float_dtype(xp, rewards)
    correct = is_correct(rewards)
    n_neg = xp.sum(xp.astype(~correct, dtype), axis=-1, keepdims=True)
    i = xp.arange(group, dtype=dtype, device=device(rewards))
    all_neg = xp.prod(xp.where(i < k, (n_neg - i) / (group - i), 1.0), axis=-1, keepdims=True)
    den = xp.where(i < k - 1, group - 1.0 - i, 1.0)
    with_neg = xp.prod(xp.where(i < k - 1, (n_neg - 1.0 - i) / den, 1.0), axis=-1, keepdims=True)
    r_bar = 1.0 - all_neg
    sigma = sqrt(xp.maximum(r_bar * (1.0 - r_bar), 0.0))
    a_pos = _safe_divide(xp, 1.0 - r_bar, sigma)
    a_neg = _safe_divide(xp, 1.0 - r_bar - with_neg, sigma)
    return xp.where(correct, a_pos, a_neg)


def low_prob_confidence(logp: Array, mask: Array, *, low_frac: float = 0.2) -> Array:
    """ProGRPO confidence ``c = exp(mean of log p over T_low)``.

    ``T_low`` holds the ``k = clip(ceil(low_frac * n), 1, n)`` masked positions with the lowest
    log-probability (``n`` = number of masked positions; ``ceil`` is taken after snapping
    ``low_frac * n`` to an integer within float rounding, so 0.2 * 15 gives 3). For a concrete
    `low_frac` only the ``min(T, ceil(low_frac*T) + 1)`` smallest values of each row are sorted
    (`shaping.backend.top_k`, padding sent to +inf); a traced one sorts the whole row. The two
    paths sum the same values (up to float summation order).

    Args:
        logp: (B, G, T) response log-probs under pi_old, or (B, P) prompt log-probs.
        mask: same shape, bool or float.
        low_frac: fraction of positions kept (default 0.2, "about 20%"); may be a traced scalar.

    Returns:
        (B, G) or (B,) confidences in (0, 1]; 1 for a row with no masked position.

    Source: seed 003, Eqs. 5-6 and Alg. 1 (Low-Probability Token Length Normalization).
    """
    xp = array_namespace(logp, mask)
    keep = _bool_mask(xp, mask)
    dtype = _float_dtype(xp, logp)
    n = xp.sum(xp.astype(keep, dtype), axis=-1, keepdims=True)
    k = xp.clip(xp.ceil(_snap_to_int(xp, low_frac * n)), min=1.0)
    k = xp.minimum(k, xp.maximum(n, 1.0))
    t = logp.shape[-1]
    frac = _static(low_frac)
    # Static bound on k for a concrete low_frac (n <= T): in exact arithmetic
    # k <= max(ceil(low_frac*T), 1); one more absorbs float rounding (snapping never raises the
    # ceil, it only moves a value just above an integer down to it, and the float error of
    # low_frac*n is below 1, as in `_quantile_top_count`). A traced low_frac sorts the whole row.
    top = t if frac is None else min(t, max(math.ceil(frac * t) + 1, 1))
    if top < t:
        s = top_k(xp.where(keep, logp, math.inf), top, largest=False)
    else:
        s = xp.sort(xp.where(keep, logp, math.inf), axis=-1)
    pos = xp.arange(top, dtype=dtype, device=device(logp))
    chosen = (pos < k) & (n > 0)
    total = xp.sum(xp.where(chosen, s, 0.0), axis=-1)
    return xp.exp(total / k[..., 0])


def high_entropy_mask(entropy: Array, mask: Array, *, quantile: float = 0.8) -> Array:
    """CaSP forking-token mask ``w_t = 1[H_t > quantile_q(H over the response's tokens)]``.

    The entropy is stop-gradiented (the authors detach it). Strict ``>``: with ``q = 0.8`` about
    20% of each response's tokens are selected.

    Args:
        entropy: (B, G, T) token entropies.
        mask: (B, G, T) response-token mask.
        quantile: q in (0, 1) (default 0.8); may be a traced scalar.

    Returns:
        (B, G, T) bool; False on padding.

    Source: seed 004 §4 and App. E.1; authors' code ``compute_policy_loss_simko``.
    """
    xp = array_namespace(entropy, mask)
    keep = _bool_mask(xp, mask)
    h = stop_gradient(entropy)
    threshold = masked_quantile(h, keep, quantile)
    return (h > xp.expand_dims(threshold, axis=-1)) & keep


def topn_smoothed_ratio(ratio: Array, cand_logp: Array, mask: Array, weight: Array) -> Array:
    """CaSP's top-N smoothed positive ratio (seed 004, Eq. 4.1).

    ``rho+ = (1 - weight)*rho + (weight/N) * sum_n sg(rho/rho_n)*rho_n`` with
    ``rho_n = pi_theta(v_n)/pi_old(v_n)``. Each auxiliary term has value ``sg(rho)`` and gradient
    ``sg(rho) * grad log pi_theta(v_n)``: ``pi_old(v_n)`` cancels from both, so the sum is computed
    as ``sg(rho) * (1 + m - sg(m))`` with ``m = mean_n log pi_theta(v_n)``. That is exact (value
    ``rho``, same gradient), needs no ``exp`` and cannot overflow; the behaviour-policy candidate
    log-probs are therefore not an input. The logit-gradient of ``rho+`` is
    ``sg(rho) * [(1-weight) g_y + (weight/N) sum_n g_{v_n}]``, the top-N smoothed target.

    Args:
        ratio: (B, G, T) sampled-token ratios (differentiable).
        cand_logp: (B, G, T, N) current-policy log-probs of the top-N candidates.
        mask: (B, G, T).
        weight: (B, G, T) smoothing weight ``alpha * w_t`` (0 leaves ``rho`` unchanged).

    Returns:
        (B, G, T) smoothed ratios.

    Source: seed 004, Eq. 4.1 and App. A; authors' code ``compute_policy_loss_simko``.
    """
    xp = array_namespace(ratio, cand_logp, mask, weight)
    n = cand_logp.shape[-1]
    # Reduce over N first so the padding guard runs on (B, G, T), not (B, G, T, N). The mean over
    # the short last axis is a matrix-vector product with ones: torch CPU reduces a length-3 last
    # axis several times slower (forward + backward at (64, 1024, 3): 0.30 ms against 0.54 ms).
    ones = xp.ones((n,), dtype=cand_logp.dtype, device=device(cand_logp))
    m = xp.where(_bool_mask(xp, mask), xp.matmul(cand_logp, ones) / n, 0.0)
    aux = stop_gradient(ratio) * (1.0 + (m - stop_gradient(m)))
    return ratio + weight * (aux - ratio)


def casp_ratio(
    ratio: Array,
    advantages: Array,
    entropy: Array,
    cand_logp: Array,
    sampled_rank: Array,
    mask: Array,
    *,
    alpha: float = 0.01,
    top_n: int = 3,
    quantile: float = 0.8,
    lam_top1: float = 1.1,
) -> Array:
    """CaSP ratio: top-N smoothing where ``A > 0``, rank-1 penalty where ``A < 0``.

    ``w = high_entropy_mask(entropy, mask, quantile)``;
    ``A > 0``: ``rho+ = (1 - alpha*w)*rho + (alpha*w/top_n)*sum_{n<top_n} sg(rho/rho_n)*rho_n``;
    ``A < 0``: ``rho- = lam_top1*rho`` where ``sampled_rank == 0`` and ``w``, else ``rho``.
    The ratio is scaled before clipping (seed 004 Eq. 5 and Fig. 10); the authors' repository
    scales the advantage instead, which agrees at ``rho = 1`` (on-policy).

    Args:
        ratio: (B, G, T) sampled-token ratios.
        advantages: (B, G) advantages (their sign picks the branch).
        entropy: (B, G, T) token entropies of pi_theta (detached inside).
        cand_logp: (B, G, T, N) current-policy candidate log-probs, rank 1 first (ranked by
            pi_old); the first `top_n` are used. (``pi_old`` of the candidates cancels: see
            `topn_smoothed_ratio`.)
        sampled_rank: (B, G, T) int, 0-based rank of the sampled token among the candidates.
        mask: (B, G, T).
        alpha: smoothing strength in [0, 1] (default 0.01). May be traced.
        top_n: number of candidates, ``1 <= top_n <= N`` (default 3). Python int.
        quantile: entropy quantile q in (0, 1) (default 0.8). May be traced.
        lam_top1: rank-1 penalty factor > 0 (default 1.1). May be traced.

    Returns:
        (B, G, T) ratios to feed `clipped_surrogate`.

    Raises:
        ValueError: `top_n` larger than N or smaller than 1.

    Source: seed 004 §4.1-4.2, Eqs. 4.1 and 5; authors' code ``compute_policy_loss_simko``.
    """
    if not 1 <= top_n <= cand_logp.shape[-1]:
        raise ValueError(
            f"top_n must satisfy 1 <= top_n <= N = {cand_logp.shape[-1]} candidates, got {top_n!r}"
        )
    xp = array_namespace(ratio, advantages, entropy, cand_logp, mask)
    mask = _bool_mask(xp, mask)  # once, not in each block below
    w = high_entropy_mask(entropy, mask, quantile=quantile)
    adv = _expand_advantages(xp, advantages, ratio)
    # alpha * 1[w and A > 0] (bool and-ed before the one cast: same value as alpha * w * 1[A > 0]).
    weight = alpha * xp.astype(w & (adv > 0), ratio.dtype)
    if top_n < cand_logp.shape[-1]:
        cand_logp = cand_logp[..., :top_n]
    smoothed = topn_smoothed_ratio(ratio, cand_logp, mask, weight)
    penalize = w & (sampled_rank == 0) & (adv < 0)
    # A gradient-free factor (lam_top1 or 1) times the ratio: the same value as
    # where(penalize, lam_top1 * smoothed, smoothed), without where's two-branch backward.
    scale = xp.where(penalize, lam_top1, xp.ones_like(smoothed))
    return smoothed * scale
