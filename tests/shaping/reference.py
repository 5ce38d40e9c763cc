"""Slow, obviously-correct references for the shaping core (issue 3).

Every quantity here is computed by plain Python loops over groups ``(B, G)`` and tokens ``T``,
written from the formulas of ``docs/formulas.md`` §2 and ``shaping/CONTRACT.md`` without reading the fast code.
Detached quantities (advantages, masks, quantiles, confidences) use Python floats and ``math``.
Losses are built token by token from 0-d ``torch.float64`` tensors sliced out of leaf tensors, so
``torch.autograd`` gives reference gradients with respect to the differentiable batch keys
(``logp``, ``entropy``, ``cand_logp``); no vectorized torch op is used, only scalar arithmetic.

Where the contract leaves a choice open, the choice made here is the one documented in the fast
implementation's docstrings, and is named in a comment ("documented choice").

Shapes: ``B`` prompts, ``G`` responses per prompt, ``T`` padded tokens, ``N`` candidates,
``P`` prompt tokens. Inputs are NumPy arrays (any float dtype; converted to float64 here).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

import shaping

LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")

# The hyper-parameter names and defaults are read from the registry: the function signatures are
# their single source. What the registry cannot vouch for itself is checked elsewhere: every
# default is documented in its method's docstring (test_methods.py), and every method runs on
# exactly the keys it declares (`needs`) and names a missing one (test_methods.py). The formulas
# below are written independently of shaping/methods.py.
DEFAULTS: dict[str, dict[str, object]] = {
    name: dict(method.defaults) for name, method in shaping.METHODS.items()
}

#: Batch keys each method needs beyond rewards/mask/logp/logp_old with its defaults and with
#: ``form="token"`` for the entropy methods (``logp_ref`` only when ``kl_coef > 0``: not listed).
NEEDS: dict[str, frozenset[str]] = {
    name: method.needs_for(**({"form": "token"} if "form" in method.defaults else {}))
    for name, method in shaping.METHODS.items()
}

METHOD_NAMES: tuple[str, ...] = tuple(DEFAULTS)

# --------------------------------------------------------------------------------------------
# Building blocks (detached: Python floats)
# --------------------------------------------------------------------------------------------


def _rows(a: Any) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def group_advantages(rewards: Any, std_correction: int = 1, eps: float = 1e-6) -> np.ndarray:
    """GRPO advantages ``(r_i - mean_j r_j) / (std_j r_j + eps)`` per group; (B, G) -> (B, G).

    ``std`` uses ``ddof = std_correction``; with fewer than ``ddof + 1`` samples it is 0 (CONTRACT).
    """
    r = _rows(rewards)
    n_b, n_g = r.shape
    out = np.zeros((n_b, n_g))
    for b in range(n_b):
        mean = sum(r[b, g] for g in range(n_g)) / n_g
        dof = n_g - std_correction
        var = sum((r[b, g] - mean) ** 2 for g in range(n_g)) / dof if dof > 0 else 0.0
        std = math.sqrt(var)
        for g in range(n_g):
            # A constant group with eps = 0 gets 0 (documented choice), not a ZeroDivisionError.
            out[b, g] = (r[b, g] - mean) / (std + eps) if std + eps > 0 else 0.0
    return out


def dr_grpo_advantages(rewards: Any) -> np.ndarray:
    """Dr. GRPO advantages ``r_i - mean_j r_j``; (B, G) -> (B, G)."""
    r = _rows(rewards)
    n_b, n_g = r.shape
    out = np.zeros((n_b, n_g))
    for b in range(n_b):
        mean = sum(r[b, g] for g in range(n_g)) / n_g
        for g in range(n_g):
            out[b, g] = r[b, g] - mean
    return out


def _count(mask_row: np.ndarray) -> int:
    return sum(1 for m in mask_row if m > 0.5)


def seq_logp(logp: Any, mask: Any, reduction: str = "sum") -> np.ndarray:
    """Sequence log-probability ``sum_t mask * logp`` (or its mean over unmasked tokens).

    (B, G, T) -> (B, G). ``mean`` of an empty response is 0 (documented choice: no NaN).
    """
    lp, m = _rows(logp), _rows(mask)
    n_b, n_g, n_t = lp.shape
    out = np.zeros((n_b, n_g))
    for b in range(n_b):
        for g in range(n_g):
            total = sum(lp[b, g, t] for t in range(n_t) if m[b, g, t] > 0.5)
            if reduction == "sum":
                out[b, g] = total
            elif reduction == "mean":
                n = _count(m[b, g])
                out[b, g] = total / n if n > 0 else 0.0
            else:
                raise ValueError(f"logp_reduction must be 'sum' or 'mean', got {reduction!r}")
    return out


def token_entropy(logits: Any) -> np.ndarray:
    """Entropy ``-sum_v p_v log p_v`` of ``softmax(logits)`` over the last axis; (..., V) -> (...)."""
    z = _rows(logits)
    flat = z.reshape(-1, z.shape[-1])
    out = np.zeros(flat.shape[0])
    for i, row in enumerate(flat):
        top = max(row)
        log_z = top + math.log(sum(math.exp(v - top) for v in row))
        out[i] = -sum(math.exp(v - log_z) * (v - log_z) for v in row)
    return out.reshape(z.shape[:-1])


def _snap(h: float) -> float:
    """``h`` itself, or the nearest integer when within float rounding of it.

    Documented choice of the fast code (``q * (n - 1)`` and ``low_frac * n`` are often integers
    in exact arithmetic; e.g. ``0.2 * 15 = 3.0000000000000004`` must give 3, not 4).
    """
    r = round(h)
    return float(r) if abs(h - r) <= 1e-5 * max(abs(h), 1.0) else h


def masked_quantile_1d(values: Any, mask: Any, q: float) -> float:
    """Linear-interpolation quantile (NumPy's default) of ``values`` where ``mask`` is set.

    The ``q``-quantile of sorted ``x_0 <= ... <= x_{n-1}`` sits at position ``h = q (n - 1)``:
    ``x_floor(h) + (h - floor(h)) (x_ceil(h) - x_floor(h))``. An empty selection gives 0
    (documented choice; no token of an empty response is selected by CaSP anyway).
    """
    xs = sorted(float(v) for v, m in zip(values, mask, strict=True) if m > 0.5)
    if not xs:
        return 0.0
    h = _snap(q * (len(xs) - 1))
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def masked_quantile(values: Any, mask: Any, q: float) -> np.ndarray:
    """Row-wise :func:`masked_quantile_1d` over the last axis; (..., T) -> (...)."""
    v, m = _rows(values), _rows(mask)
    flat_v = v.reshape(-1, v.shape[-1])
    flat_m = m.reshape(-1, m.shape[-1])
    out = np.array([masked_quantile_1d(a, b, q) for a, b in zip(flat_v, flat_m, strict=True)])
    return out.reshape(v.shape[:-1])


def low_prob_confidence_1d(logp: Any, mask: Any, low_frac: float) -> float:
    """ProGRPO confidence ``exp(mean of log p over T_low)`` of one sequence (seed 003, Eq. 5-6).

    ``T_low`` holds the ``k = clip(ceil(low_frac * n), 1, n)`` unmasked positions of lowest log-prob
    (documented choice); the mean of the ``k`` smallest values does not depend on how ties are
    broken. An empty sequence has confidence 1 (documented choice: ``exp(0)``).
    """
    xs = sorted(float(v) for v, m in zip(logp, mask, strict=True) if m > 0.5)
    if not xs:
        return 1.0
    k = min(max(1, math.ceil(_snap(low_frac * len(xs)))), len(xs))
    return math.exp(sum(xs[:k]) / k)


def comb(n: int, k: int) -> int:
    """Binomial coefficient, 0 outside ``0 <= k <= n`` (so ``C(-1, k) = 0``)."""
    if n < 0 or k < 0 or k > n:
        return 0
    return math.comb(n, k)


def passk_advantages(rewards: Any, k: int, eps: float = 0.0) -> np.ndarray:
    """Pass@k-training advantages (Chen et al. 2025), binary rewards; (B, G) -> (B, G).

    ``R = 1 - C(N_neg, k)/C(N, k)``, ``s = sqrt(R (1 - R))``, ``A_pos = (1 - R)/s``,
    ``A_neg = (1 - R - C(N_neg - 1, k - 1)/C(N - 1, k - 1))/s``; ``s = 0`` gives 0.
    """
    r = _rows(rewards)
    n_b, n = r.shape
    out = np.zeros((n_b, n))
    for b in range(n_b):
        n_neg = sum(1 for g in range(n) if r[b, g] < 0.5)
        mean = 1.0 - comb(n_neg, k) / comb(n, k)
        std = math.sqrt(max(mean * (1.0 - mean), 0.0))
        if std == 0.0:
            continue
        a_pos = (1.0 - mean) / (std + eps)
        a_neg = (1.0 - mean - comb(n_neg - 1, k - 1) / comb(n - 1, k - 1)) / (std + eps)
        for g in range(n):
            out[b, g] = a_pos if r[b, g] > 0.5 else a_neg
    return out


def unbiased_pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k ``1 - C(n - c, k)/C(n, k)`` (Chen et al. 2021)."""
    return 1.0 - comb(n - c, k) / comb(n, k)


def ascending_ranks(values: list[float]) -> list[int]:
    """0-based ascending ranks; ties broken by position (stable sort; documented choice)."""
    order = sorted(range(len(values)), key=lambda i: (values[i], i))
    ranks = [0] * len(values)
    for rank, i in enumerate(order):
        ranks[i] = rank
    return ranks


# --------------------------------------------------------------------------------------------
# Per-token loss pieces (scalars: floats or 0-d torch tensors)
# --------------------------------------------------------------------------------------------


def _exp(x: Any) -> Any:
    if isinstance(x, float | int):
        return math.exp(x)
    import torch

    return torch.exp(x)


def clip_scalar(x: Any, lo: float, hi: float) -> Any:
    """``clip(x, lo, hi)``: the constant bound outside, ``x`` itself (gradient 1) inside."""
    if x < lo:
        return lo + 0.0 * x
    if x > hi:
        return hi + 0.0 * x
    return x


def clipped_surrogate_ratio(ratio: Any, adv: float, eps_low: float, eps_high: float) -> Any:
    """PPO token loss ``-min(ratio A, clip(ratio, 1 - eps_low, 1 + eps_high) A)``."""
    unclipped = ratio * adv
    clipped = clip_scalar(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    return -(unclipped if unclipped <= clipped else clipped)


def clipped_surrogate(
    logp: Any, logp_old: float, adv: float, eps_low: float = 0.2, eps_high: float = 0.2
) -> Any:
    """Clipped surrogate of one token with ratio ``exp(logp - logp_old)``."""
    return clipped_surrogate_ratio(_exp(logp - logp_old), adv, eps_low, eps_high)


def k3(logp: Any, logp_ref: float) -> Any:
    """k3 KL estimator ``exp(q - p) - (q - p) - 1`` with ``p = logp``, ``q = logp_ref``."""
    d = logp_ref - logp
    return _exp(d) - d - 1.0


def aggregate(loss_tok: list, mask: Any, mode: str, norm_length: int | None = None) -> Any:
    """Aggregate a nested (B, G, T) list of token losses under ``mask`` (a scalar).

    - ``token-mean``: ``sum(mask * loss) / sum(mask)`` over the whole batch;
    - ``seq-mean-token-mean``: the mean over sequences of each sequence's token mean;
    - ``seq-mean-token-sum-norm``: the mean over sequences of each sequence's token sum / L,
      ``L = norm_length`` (Dr. GRPO's constant), or T when it is None.

    Empty denominators (no token at all / an empty sequence / no sequence) are read as 1 so
    that masked tokens contribute 0 and an empty batch gives 0 (documented choice).
    """
    m = _rows(mask)
    n_b, n_g, n_t = m.shape
    if mode == "token-mean":
        total, count = 0.0, 0
        for b in range(n_b):
            for g in range(n_g):
                for t in range(n_t):
                    if m[b, g, t] > 0.5:
                        total = total + loss_tok[b][g][t]
                        count += 1
        return total / max(count, 1)
    if mode not in LOSS_AGGS:
        raise ValueError(f"loss_agg must be one of {LOSS_AGGS}, got {mode!r}")
    seq_total = 0.0
    for b in range(n_b):
        for g in range(n_g):
            s = 0.0
            n = 0
            for t in range(n_t):
                if m[b, g, t] > 0.5:
                    s = s + loss_tok[b][g][t]
                    n += 1
            length = max(n_t, 1) if norm_length is None else norm_length
            seq_total = seq_total + (s / max(n, 1) if mode == "seq-mean-token-mean" else s / length)
    return seq_total / max(n_b * n_g, 1)


# --------------------------------------------------------------------------------------------
# Advantages per method (detached, (B, G))
# --------------------------------------------------------------------------------------------


def _correct(r: float) -> bool:
    return r > 0.5


def _ds_advantages(batch: Mapping, h: Mapping, gamma_p: float, gamma_n: float) -> np.ndarray:
    adv = group_advantages(batch["rewards"], h["std_correction"], h["eps"])
    ell = seq_logp(batch["logp_old"], batch["mask"], h["logp_reduction"])
    r = _rows(batch["rewards"])
    for b in range(r.shape[0]):
        for g in range(r.shape[1]):
            if _correct(r[b, g]):
                adv[b, g] -= gamma_p * ell[b, g]
            else:
                adv[b, g] += gamma_n * ell[b, g]
    return adv


def _entropy_trajectory(batch: Mapping, h: Mapping, eta: float) -> np.ndarray:
    adv = group_advantages(batch["rewards"], h["std_correction"], h["eps"])
    if h["form"] != "trajectory":
        return adv
    ell = seq_logp(batch["logp_old"], batch["mask"], h["logp_reduction"])
    return adv - eta * ell


def _dsdr_rewards(batch: Mapping, h: Mapping) -> np.ndarray:
    r = _rows(batch["rewards"])
    s = _rows(batch["diversity"])
    out = r.copy()
    for b in range(r.shape[0]):
        for g in range(r.shape[1]):
            if _correct(r[b, g]):
                out[b, g] = r[b, g] + h["lam"] * min(s[b, g], h["sigma"])
    return out


def _progrpo_advantages(batch: Mapping, h: Mapping) -> np.ndarray:
    adv = group_advantages(batch["rewards"], h["std_correction"], h["eps"])
    r = _rows(batch["rewards"])
    lp_old, mask = _rows(batch["logp_old"]), _rows(batch["mask"])
    n_b, n_g = r.shape
    for b in range(n_b):
        n_correct = sum(1 for g in range(n_g) if _correct(r[b, g]))
        if n_correct in (0, n_g):
            continue
        conf = [low_prob_confidence_1d(lp_old[b, g], mask[b, g], h["low_frac"]) for g in range(n_g)]
        if h["confidence_ref"] == "prompt":
            ref = low_prob_confidence_1d(
                _rows(batch["prompt_logp"])[b], _rows(batch["prompt_mask"])[b], h["low_frac"]
            )
        else:
            ref = sum(conf) / n_g
        for g in range(n_g):
            adv[b, g] += h["alpha"] * (ref - conf[g])
    return adv


def _unlikeliness_advantages(batch: Mapping, h: Mapping) -> np.ndarray:
    r = _rows(batch["rewards"]).copy()
    norm = seq_logp(batch["logp_old"], batch["mask"], "mean")
    n_b, n_g = r.shape
    for b in range(n_b):
        ranks = ascending_ranks([norm[b, g] for g in range(n_g)])
        for g in range(n_g):
            r[b, g] = r[b, g] * (1.0 - h["beta_rank"] * ranks[g] / n_g)
    adv = group_advantages(r, h["std_correction"], h["eps"])
    if h["skip_uniform_groups"]:
        # Authors' advantage_threshold: a group without mixed outcomes leaves the batch.
        adv = adv * _kept_rows("unlikeliness", batch, h)
    return adv


def _kept_rows(name: str, batch: Mapping, h: Mapping) -> np.ndarray:
    """(B, G) 1.0 for the responses that enter the loss, 0.0 for those the method drops.

    Unlikeliness with ``skip_uniform_groups`` drops groups that are all correct or all wrong;
    PSR / NSR with ``subset_normalization`` keep only the correct / incorrect responses (the
    authors' ``batch.subset``). Every other method keeps everything.
    """
    r = _rows(batch["rewards"])
    n_b, n_g = r.shape
    out = np.ones((n_b, n_g))
    for b in range(n_b):
        n_correct = sum(1 for g in range(n_g) if _correct(r[b, g]))
        for g in range(n_g):
            if name == "unlikeliness" and h.get("skip_uniform_groups"):
                out[b, g] = 1.0 if 0 < n_correct < n_g else 0.0
            elif name in ("psr", "nsr") and h.get("subset_normalization"):
                out[b, g] = 1.0 if _correct(r[b, g]) == (name == "psr") else 0.0
    return out


def _fixed_advantages(batch: Mapping, pos: float, neg: float) -> np.ndarray:
    r = _rows(batch["rewards"])
    out = np.zeros(r.shape)
    for b in range(r.shape[0]):
        for g in range(r.shape[1]):
            out[b, g] = pos if _correct(r[b, g]) else neg
    return out


def _grpo(batch: Mapping, h: Mapping) -> np.ndarray:
    return group_advantages(batch["rewards"], h["std_correction"], h["eps"])


ADVANTAGES: dict[str, Callable[[Mapping, Mapping], np.ndarray]] = {
    "grpo": _grpo,
    "dr_grpo": lambda batch, h: dr_grpo_advantages(batch["rewards"]),
    "ds_grpo": lambda batch, h: _ds_advantages(batch, h, h["gamma_p"], h["gamma_n"]),
    "ds_grpo_pos": lambda batch, h: _ds_advantages(batch, h, h["gamma_p"], 0.0),
    "ds_grpo_neg": lambda batch, h: _ds_advantages(batch, h, 0.0, h["gamma_n"]),
    "entropy_bonus": lambda batch, h: _entropy_trajectory(batch, h, h["eta"]),
    "entropy_penalty": lambda batch, h: _entropy_trajectory(batch, h, -h["eta"]),
    "diff_entropy": _grpo,
    "dsdr": lambda batch, h: group_advantages(
        _dsdr_rewards(batch, h), h["std_correction"], h["eps"]
    ),
    "progrpo": _progrpo_advantages,
    "casp": _grpo,
    "unlikeliness": _unlikeliness_advantages,
    "passk": lambda batch, h: passk_advantages(batch["rewards"], h["k"]),
    "w_reinforce": lambda batch, h: _fixed_advantages(batch, h["lam"], -1.0),
    "psr": lambda batch, h: _fixed_advantages(batch, 1.0, 0.0),
    "nsr": lambda batch, h: _fixed_advantages(batch, 0.0, -1.0),
    "dual_clip": _grpo,
    "gspo": _grpo,
    "cispo": _grpo,
    "clip_cov": _grpo,
    "kl_cov": _grpo,
    "entropy_adv": _grpo,
    "lite_ppo": lambda batch, h: _lite_ppo_advantages(batch, h),
    "grpo_passk": lambda batch, h: _grpo_passk_advantages(batch, h),
    "pkpo": lambda batch, h: pkpo_advantages(batch["rewards"], h["k"]),
}


def _lite_ppo_advantages(batch: Mapping, h: Mapping) -> np.ndarray:
    """Group-centred rewards over the std of all B x G rewards (ddof std_correction)."""
    r = _rows(batch["rewards"])
    n_b, n_g = r.shape
    flat = [r[b, g] for b in range(n_b) for g in range(n_g)]
    dof = len(flat) - h["std_correction"]
    out = np.zeros((n_b, n_g))
    if dof <= 0:
        return out
    mean = sum(flat) / len(flat)
    std = math.sqrt(sum((x - mean) ** 2 for x in flat) / dof)
    for b in range(n_b):
        group_mean = sum(r[b, g] for g in range(n_g)) / n_g
        for g in range(n_g):
            # Equal rewards with eps = 0 get 0, as a constant GRPO group (documented choice).
            den = std + h["eps"]
            out[b, g] = (r[b, g] - group_mean) / den if den > 0 else 0.0
    return out


def _grpo_passk_advantages(batch: Mapping, h: Mapping) -> np.ndarray:
    """verl's best-of-k: the group's unique best gets (r_max - r_second) / (std + eps)."""
    r = _rows(batch["rewards"])
    n_b, n_g = r.shape
    out = np.zeros((n_b, n_g))
    if n_g < 2:
        return out
    for b in range(n_b):
        row = [r[b, g] for g in range(n_g)]
        ordered = sorted(row, reverse=True)
        gap = ordered[0] - ordered[1]
        if gap <= 0:
            continue
        mean = sum(row) / n_g
        std = math.sqrt(sum((x - mean) ** 2 for x in row) / (n_g - h["std_correction"]))
        out[b, row.index(ordered[0])] = gap / (std + h["eps"])
    return out


def max_at_k(values: list[float], k: int) -> float:
    """Unbiased max@k estimate of ``values``: the mean over every k-subset of its maximum.

    PKPO (Walder & Karkhanis 2025) Eq. 12 before its closed form: the subsets are enumerated.
    """
    subsets = list(itertools.combinations(values, k))
    return sum(max(s) for s in subsets) / len(subsets)


def pkpo_weights(row: list[float], k: int) -> list[float]:
    """PKPO's ``s_i^(loo-1)`` (Eq. 33) of one group, by enumerating subsets, for ``k >= 2``.

    ``s_i = C(n, k)^-1 sum_{|S| = k, S contains i} max_S g`` minus the baseline
    ``(k/n) max@(k-1)`` of the other ``n - 1`` responses (`max_at_k`).
    """
    n = len(row)
    weights = []
    for i in range(n):
        with_i = [s for s in itertools.combinations(range(n), k) if i in s]
        s_i = sum(max(row[j] for j in s) for s in with_i) / comb(n, k)
        others = row[:i] + row[i + 1 :]
        weights.append(s_i - k / n * max_at_k(others, k - 1))
    return weights


def pkpo_advantages(rewards: Any, k: int) -> np.ndarray:
    """PKPO advantages ``G s_i^(loo-1)`` per group, binary or continuous rewards; (B, G) -> (B, G).

    ``k = 1`` (documented choice): the leave-one-out mean baseline ``r_i - mean_{j != i} r_j``
    (the paper's k_opt = 1 runs, its Eq. 26); a group of one gets 0.
    """
    r = _rows(rewards)
    n_b, n = r.shape
    out = np.zeros((n_b, n))
    if n < 2:
        return out
    for b in range(n_b):
        row = [float(x) for x in r[b]]
        if k == 1:
            for i in range(n):
                others = row[:i] + row[i + 1 :]
                out[b, i] = row[i] - sum(others) / len(others)
        else:
            out[b] = [n * s for s in pkpo_weights(row, k)]
    return out


def hyper(name: str, **overrides: object) -> dict[str, object]:
    """The method's defaults (CONTRACT.md) updated by ``overrides``; unknown names raise."""
    unknown = set(overrides) - set(DEFAULTS[name])
    if unknown:
        raise ValueError(f"unknown hyper-parameters for {name}: {sorted(unknown)}")
    return {**DEFAULTS[name], **overrides}


def advantages(name: str, batch: Mapping, **overrides: object) -> np.ndarray:
    """Reference advantages of method ``name``; (B, G), detached."""
    return ADVANTAGES[name](batch, hyper(name, **overrides))


# --------------------------------------------------------------------------------------------
# Losses with reference gradients
# --------------------------------------------------------------------------------------------

DIFFERENTIABLE_KEYS = ("logp", "entropy", "cand_logp")


def _casp_ratio(s: Mapping, h: Mapping, b: int, g: int, t: int, adv: float, high: bool) -> Any:
    """CaSP's token ratio (seed 004 Eq. 4.1 and §4.2; authors' ``compute_policy_loss_simko``)."""
    rho = _exp(s["logp"][b, g, t] - s["logp_old"][b, g, t])
    w = 1.0 if high else 0.0
    if adv > 0:
        n_top = h["top_n"]
        smooth = 0.0
        for n in range(n_top):
            rho_n = _exp(s["cand_logp"][b, g, t, n] - s["cand_logp_old"][b, g, t, n])
            smooth = smooth + (rho / rho_n).detach() * rho_n
        return (1.0 - h["alpha"] * w) * rho + (h["alpha"] * w / n_top) * smooth
    if adv < 0 and high and int(s["sampled_rank"][b, g, t]) == 0:
        return h["lam_top1"] * rho
    return rho


def loss(name: str, batch: Mapping, **overrides: object) -> tuple[float, dict[str, np.ndarray]]:
    """Reference loss of method ``name`` and its gradients.

    Returns ``(loss, grads)`` where ``grads[key]`` is ``d loss / d batch[key]`` (float64 NumPy) for
    every differentiable key present (``logp``, ``entropy``, ``cand_logp``).

    Per token: ``is_weight * clipped surrogate(ratio, A) + kl_coef * k3(logp, logp_ref)
    - entropy_coef * entropy``
    (``is_weight`` = 1 when absent), aggregated by
    ``loss_agg``; then the method's extra terms (token-entropy terms, DSDR's local term). Under
    the 80/20 mask (``top_entropy_quantile < 1``) the entropy bonus is TRL's instead:
    ``- entropy_coef * agg(entropy)`` over the kept tokens alone.
    """
    import torch

    h = hyper(name, **overrides)
    adv = advantages(name, batch, **overrides)
    leaves = {
        k: torch.tensor(np.asarray(batch[k], dtype=np.float64), requires_grad=True)
        for k in DIFFERENTIABLE_KEYS
        if k in batch
    }
    # Object arrays of Python floats: a NumPy scalar on the left of a tensor would take the
    # arithmetic over and silently drop the autograd graph.
    s: dict[str, Any] = {k: _rows(v).astype(object) for k, v in batch.items() if k not in leaves}
    s.update(leaves)
    mask = _rows(batch["mask"])
    n_b, n_g, n_t = mask.shape
    # The casp quantile is over the response's own tokens; dropped responses leave only the loss.
    full_mask = mask
    mask = mask * _kept_rows(name, batch, h)[..., None]
    norm_length = (
        h.get("max_response_length") if h["loss_agg"] == "seq-mean-token-sum-norm" else None
    )
    high = None
    if name == "casp":
        ent = _rows(batch["entropy"])
        tau = masked_quantile(ent, full_mask, h["quantile"])
        high = ent > tau[..., None]

    chosen = _cov_selection(name, batch, h, adv, mask)
    top = _top_entropy(batch, h, mask)
    loss_tok = [[[None] * n_t for _ in range(n_g)] for _ in range(n_b)]
    for b in range(n_b):
        for g in range(n_g):
            a = float(adv[b, g])
            for t in range(n_t):
                if name == "casp":
                    ratio = _casp_ratio(s, h, b, g, t, a, bool(high[b, g, t]))
                elif name == "gspo":
                    ratio = _gspo_ratio(s, mask, b, g, t)
                else:
                    ratio = _exp(s["logp"][b, g, t] - s["logp_old"][b, g, t])
                tok = _policy_token(name, s, h, (b, g, t), ratio, a, bool(chosen[b, g, t]))
                if not top[b, g, t]:
                    tok = 0.0 * tok
                if "is_weight" in s:
                    tok = tok * s["is_weight"][b, g, t]
                if h["kl_coef"] > 0:
                    tok = tok + h["kl_coef"] * kl_estimate(
                        s["logp"][b, g, t], s["logp_ref"][b, g, t], h["kl_estimator"]
                    )
                if h["entropy_coef"] > 0 and h["top_entropy_quantile"] == 1.0:
                    tok = tok - h["entropy_coef"] * s["entropy"][b, g, t]
                loss_tok[b][g][t] = tok
    total = aggregate(loss_tok, mask, h["loss_agg"], norm_length)
    if h["entropy_coef"] > 0 and h["top_entropy_quantile"] < 1.0:
        # Under the 80/20 mask, TRL's bonus: on the kept tokens, aggregated over them alone.
        ent_tok = [[[s["entropy"][b, g, t] for t in range(n_t)] for g in range(n_g)]
                   for b in range(n_b)]  # fmt: skip
        total = total - h["entropy_coef"] * aggregate(ent_tok, top, h["loss_agg"], norm_length)
    total = total + _extra_terms(name, s, h, mask, norm_length)

    total = total if isinstance(total, torch.Tensor) else torch.tensor(float(total))
    grads: dict[str, np.ndarray] = {}
    if total.requires_grad:
        total.backward()
    for k, leaf in leaves.items():
        grads[k] = np.zeros(leaf.shape) if leaf.grad is None else leaf.grad.numpy().copy()
    return float(total.detach()), grads


def kl_estimate(logp: Any, logp_ref: float, estimator: str) -> Any:
    """Schulman's per-token KL estimators: k1 ``d``, k2 ``d^2/2``, k3, and k3+ (k3's value with
    k2's gradient), ``d = logp - logp_ref``."""
    d = logp - logp_ref
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return k3(logp, logp_ref)
    k2 = 0.5 * d * d
    return k2 - k2.detach() + k3(logp, logp_ref).detach()


def _value(x: Any) -> float:
    return float(x.detach()) if hasattr(x, "detach") else float(x)


def _policy_token(
    name: str, s: Mapping, h: Mapping, at: tuple, ratio: Any, a: float, chosen: bool
) -> Any:
    """The policy term of one token for every method (dual clip, CISPO, Clip-Cov, KL-Cov and the
    entropy-shaped advantage written out; the others take PPO's clipped surrogate)."""
    b, g, t = at
    el, eh = h["eps_low"], h["eps_high"]
    if name == "dual_clip":
        tok = clipped_surrogate_ratio(ratio, a, el, eh)
        cap = -h["clip_ratio_c"] * a
        return tok if a >= 0 or _value(tok) <= cap else cap + 0.0 * ratio
    if name == "cispo":
        weight = min(max(_value(ratio), 1.0 - el), 1.0 + eh)
        return -weight * a * s["logp"][b, g, t]
    if name == "clip_cov":
        return 0.0 * ratio if chosen else clipped_surrogate_ratio(ratio, a, el, eh)
    if name == "kl_cov":
        tok = -ratio * a
        if chosen:
            d = s["logp"][b, g, t] - s["logp_old"][b, g, t]
            v = _value(d)
            # |d| with the subgradient 0 at d = 0 (torch's abs, documented choice).
            tok = tok + h["ppo_kl_coef"] * (d if v > 0 else -d if v < 0 else 0.0 * d)
        return tok
    if name == "entropy_adv":
        bonus = min(h["alpha"] * float(s["entropy"][b, g, t].detach()), abs(a) / h["kappa"])
        return clipped_surrogate_ratio(ratio, a + bonus, el, eh)
    return clipped_surrogate_ratio(ratio, a, el, eh)


def _gspo_ratio(s: Mapping, mask: np.ndarray, b: int, g: int, t: int) -> Any:
    """GSPO-token ratio ``sg(s_i) * exp(logp_t - sg(logp_t))``, ``s_i`` the geometric mean."""
    n = 0
    total = 0.0
    for u in range(mask.shape[-1]):
        if mask[b, g, u] > 0.5:
            total += _value(s["logp"][b, g, u]) - float(s["logp_old"][b, g, u])
            n += 1
    seq = math.exp(total / max(n, 1))
    lp = s["logp"][b, g, t]
    return seq * _exp(lp - lp.detach())


def _covariances(adv: np.ndarray, batch: Mapping, mask: np.ndarray) -> np.ndarray:
    """``(A - mean A)(logp - mean logp)`` per token, means over the valid tokens (floats)."""
    lp = _rows(batch["logp"])
    # Tokens of log-prob -inf are left out (documented choice): -inf, never selected.
    cells = [tuple(i) for i in np.argwhere((mask > 0.5) & (lp > -math.inf))]
    out = np.full(mask.shape, -math.inf)
    if not cells:
        return out
    a_mean = sum(float(adv[b, g]) for b, g, _ in cells) / len(cells)
    lp_mean = sum(lp[c] for c in cells) / len(cells)
    for b, g, t in cells:
        out[b, g, t] = (float(adv[b, g]) - a_mean) * (lp[b, g, t] - lp_mean)
    return out


def _cov_selection(
    name: str, batch: Mapping, h: Mapping, adv: np.ndarray, mask: np.ndarray
) -> np.ndarray:
    """Clip-Cov's / KL-Cov's selected tokens (bool (B, G, T)); all False for other methods.

    ``k = max(floor(ratio * n_valid), 1)`` of the largest covariances among the eligible tokens,
    ties by row-major position (documented choice); Clip-Cov's eligible tokens are the valid
    ones not clipped by the surrogate with covariance strictly inside (lb, ub).
    """
    out = np.zeros(mask.shape, dtype=bool)
    if name not in ("clip_cov", "kl_cov"):
        return out
    cov = _covariances(adv, batch, mask)
    lp, lp_old = _rows(batch["logp"]), _rows(batch["logp_old"])
    eligible = []
    for b, g, t in (tuple(i) for i in np.argwhere(mask > 0.5)):
        if cov[b, g, t] == -math.inf:
            continue
        if name == "clip_cov":
            a = float(adv[b, g])
            rho = math.exp(lp[b, g, t] - lp_old[b, g, t])
            clipped = min(max(rho, 1.0 - h["eps_low"]), 1.0 + h["eps_high"]) * a
            if clipped < rho * a:
                continue
            if not h["clip_cov_lb"] < cov[b, g, t] < h["clip_cov_ub"]:
                continue
        eligible.append((b, g, t))
    fraction = h["clip_cov_ratio"] if name == "clip_cov" else h["kl_cov_ratio"]
    count = max(math.floor(fraction * int((mask > 0.5).sum())), 1)
    order = sorted(eligible, key=lambda c: (-cov[c], c))
    for c in order[:count]:
        out[c] = True
    return out


def _top_entropy(batch: Mapping, h: Mapping, mask: np.ndarray) -> np.ndarray:
    """The "80/20" mask: tokens with entropy >= the (1 - q) quantile over the valid tokens."""
    q = h["top_entropy_quantile"]
    if q == 1.0:
        return np.ones(mask.shape, dtype=bool)
    ent = _rows(batch["entropy"])
    flat_mask = (mask > 0.5).reshape(1, -1)
    threshold = masked_quantile_1d(ent.reshape(1, -1)[0], flat_mask[0], 1.0 - q)
    return (ent >= threshold) & (mask > 0.5)


def _entropy_coefficients(name: str, s: Mapping, h: Mapping, n_b: int, n_g: int) -> list:
    """Per-response coefficient ``c_i`` of the token-entropy term ``-agg(c_i H_t)``."""
    if name in ("entropy_bonus", "entropy_penalty"):
        if h["form"] != "token":
            return []
        eta = h["eta"] if name == "entropy_bonus" else -h["eta"]
        return [[eta] * n_g for _ in range(n_b)]
    if name == "diff_entropy":
        r = s["rewards"]
        return [
            [h["eta_pos"] if _correct(r[b, g]) else -h["eta_neg"] for g in range(n_g)]
            for b in range(n_b)
        ]
    return []


def _extra_terms(
    name: str, s: Mapping, h: Mapping, mask: np.ndarray, norm_length: int | None
) -> Any:
    n_b, n_g, n_t = mask.shape
    coef = _entropy_coefficients(name, s, h, n_b, n_g)
    if coef:
        ent_tok = [
            [[-coef[b][g] * s["entropy"][b, g, t] for t in range(n_t)] for g in range(n_g)]
            for b in range(n_b)
        ]
        return aggregate(ent_tok, mask, h["loss_agg"], norm_length)
    if name == "dsdr":
        return -h["lam_loc"] * _dsdr_local(s, h, mask)
    return 0.0


def dsdr_weights(rewards: Any, diversity: Any, tau: float) -> np.ndarray:
    """DSDR coupling ``w_i = softmax_{j in C}(s_j / tau)_i`` on correct responses, 0 elsewhere."""
    r, d = _rows(rewards), _rows(diversity)
    out = np.zeros(r.shape)
    for b in range(r.shape[0]):
        correct = [g for g in range(r.shape[1]) if _correct(r[b, g])]
        if not correct:
            continue
        top = max(d[b, g] / tau for g in correct)
        z = sum(math.exp(d[b, g] / tau - top) for g in correct)
        for g in correct:
            out[b, g] = math.exp(d[b, g] / tau - top) / z
    return out


def _dsdr_local(s: Mapping, h: Mapping, mask: np.ndarray) -> Any:
    """DSDR local term, the mean over prompts of ``sum_{i in C} w_i mean_t rho (-log pi)``."""
    n_b, n_g, n_t = mask.shape
    w = dsdr_weights(s["rewards"], s["diversity"], h["tau"])
    total = 0.0
    for b in range(n_b):
        for g in range(n_g):
            if w[b, g] == 0.0:
                continue
            tok_sum, n = 0.0, 0
            for t in range(n_t):
                if mask[b, g, t] > 0.5:
                    lp = s["logp"][b, g, t]
                    n += 1
                    if float(lp.detach() if hasattr(lp, "detach") else lp) == -math.inf:
                        continue  # rho (-log pi) -> 0 as log pi -> -inf (documented choice)
                    tok_sum = tok_sum + _exp(lp - s["logp_old"][b, g, t]) * (-lp)
            total = total + float(w[b, g]) * tok_sum / max(n, 1)
    return total / max(n_b, 1)
