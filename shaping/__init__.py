"""Shared shaping core: advantages, ratios, surrogate losses, aggregation, KL and entropy terms,
and a registry of named methods used by both `toymdp/` (JAX) and `llm/` (torch).

Backend-agnostic through `array_api_compat`; imports neither JAX nor torch. See ``CONTRACT.md``.
A method is one decorated function (`register`); the batch keys are one table (`BATCH_KEYS`), from
which `example_batch` builds a valid batch for any method on any array backend.
"""

import numerics  # noqa: F401  (pins numpy's, torch's and XLA's code paths before they load)
from shaping.backend import stop_gradient
from shaping.contract import BATCH_KEYS, example_batch
from shaping.core import (
    AGG_MODES,
    LOG_RATIO_MAX,
    agg_loss,
    casp_ratio,
    clip_fraction,
    clipped_surrogate,
    dr_grpo_advantages,
    group_rank,
    grpo_advantages,
    high_entropy_mask,
    importance_ratio,
    is_correct,
    kl_k3,
    low_prob_confidence,
    masked_mean,
    masked_quantile,
    masked_sum,
    passk_advantages,
    sequence_logp,
    token_entropy,
    topn_smoothed_ratio,
)
from shaping.methods import (
    COMMON_DEFAULTS,
    METHODS,
    OFF_POLICY_ONLY,
    Extra,
    Method,
    Shaping,
    code_digest,
    get_method,
    import_methods,
    imported_methods,
    method_code,
    methods_table,
    register,
)

__all__ = [
    "AGG_MODES",
    "BATCH_KEYS",
    "COMMON_DEFAULTS",
    "LOG_RATIO_MAX",
    "METHODS",
    "OFF_POLICY_ONLY",
    "Extra",
    "Method",
    "Shaping",
    "agg_loss",
    "casp_ratio",
    "clip_fraction",
    "clipped_surrogate",
    "code_digest",
    "dr_grpo_advantages",
    "example_batch",
    "get_method",
    "group_rank",
    "grpo_advantages",
    "high_entropy_mask",
    "import_methods",
    "importance_ratio",
    "imported_methods",
    "is_correct",
    "kl_k3",
    "low_prob_confidence",
    "masked_mean",
    "masked_quantile",
    "masked_sum",
    "method_code",
    "methods_table",
    "passk_advantages",
    "register",
    "sequence_logp",
    "stop_gradient",
    "token_entropy",
    "topn_smoothed_ratio",
]
