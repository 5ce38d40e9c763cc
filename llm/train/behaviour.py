"""The behaviour batch of a training step: a rollout and its rewards turned into the no-grad
entries of the shaping batch (``shaping.BATCH_KEYS``), by one forward pass of the policy that
sampled it.

Why recompute ``logp_old`` rather than use the sampler's log-probs: verl's actor recomputes the old
log-probs with the training forward pass (TRL 1.16's `GRPOTrainer` does when it needs them: several
iterations, or vLLM with importance-sampling correction; with one iteration it takes the detached
log-probs of its gradient pass), so that the ratio is exactly 1 on the first inner epoch whatever
the sampler's numerics (KV cache, batching, vLLM kernels, top-p truncation). The sampler's own
log-probs weight the surrogate (truncated IS, ``rollout_is``) and are logged
(``charts/sampler_logp_gap``, ``charts/sampler_kl``). For the same reason the CaSP candidates are
the top-N of that pi_old forward (so ``sampled_rank``, ``cand_logp`` and ``logp_old`` share one
distribution), and the model stays in eval mode throughout (no dropout), as RL fine-tuning recipes
do.

Which keys are built is read from the method's needs (``shaping.METHODS[name].needs_for``): each
optional key has one producer in `PRODUCERS`, so a new batch key is one entry there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import torch

import shaping
from llm.config import TrainConfig
from llm.model.forward import PolicyOutputs, Rows, build_rows, forward_all, sampled_rank
from llm.run.distributed import autocast_precision

__all__ = [
    "GRAD_KEYS",
    "PRODUCERS",
    "BehaviourBatch",
    "behaviour_batch",
    "fixed_keys",
    "reference_logp",
    "rollout_is_weight",
]

Tensor = torch.Tensor

GRAD_KEYS = ("logp", "entropy", "cand_logp")
"""Batch keys of the current policy, differentiable: the update recomputes them
(`llm.train.update.accumulate_gradients`), the behaviour batch never holds them."""


@dataclass
class BehaviourBatch:
    """One step's rollout as seen by the behaviour policy pi_old.

    Attributes:
        rows: the R = B * G prompt + response rows (`llm.model.forward.Rows`).
        old: the behaviour forward pass per row: log-probs, entropy, top-N candidates, and the
            prompt log-probs when the method needs them.
        fixed: the no-grad shaping batch, ``rewards (B, G)``, ``mask (B, G, T)``,
            ``logp_old (B, G, T)`` and the optional keys of `fixed_keys`.
        sampler_logp: (B, G, T) the sampler's log-probs of its tokens (float32), or None.
    """

    rows: Rows
    old: PolicyOutputs
    fixed: dict[str, Tensor]
    sampler_logp: Tensor | None

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(B, G, T)``."""
        b, g, t = self.fixed["mask"].shape
        return b, g, t


@dataclass
class _Sources:
    """What the producers of optional keys read."""

    cfg: TrainConfig
    batch: BehaviourBatch
    prompt_mask: Tensor  # (B, P) float
    ref_model: torch.nn.Module | None
    diversity: Any  # (B, G) DSDR scores, or None


def reference_logp(
    ref_model: torch.nn.Module | None, batch: BehaviourBatch, cfg: TrainConfig
) -> Tensor:
    """``logp_ref (B, G, T)``: the frozen reference's log-probs of the sampled tokens of `batch`
    (one no-grad forward, micro-batched; logits / temperature as the policy's).

    Raises:
        ValueError: no reference model (``kl_coef > 0`` or ``control.kl_in_reward`` loads it).
    """
    if ref_model is None:
        raise ValueError(
            "logp_ref: needs the reference model (kl_coef > 0 or control.kl_in_reward loads it)"
        )
    ref = forward_all(
        ref_model,
        batch.rows,
        cfg.system.micro_batch_size,
        temperature=cfg.rollout.temperature,
        precision=autocast_precision(ref_model, cfg.system.precision),
    )
    return ref.logp.reshape(batch.shape)


def _logp_ref(s: _Sources) -> Tensor:
    return reference_logp(s.ref_model, s.batch, s.cfg)


def _diversity(s: _Sources) -> Tensor:
    if s.diversity is None:
        raise ValueError("diversity: the method needs DSDR's diversity scores; none were given")
    return torch.tensor(s.diversity, dtype=torch.float32, device=s.prompt_mask.device)


def _sampled_rank(s: _Sources) -> Tensor:
    ranks = sampled_rank(s.batch.old.cand_ids, s.batch.rows.response_ids)  # (R, T)
    return ranks.reshape(s.batch.shape)


def _is_weight(s: _Sources) -> Tensor:
    f = s.batch.fixed
    assert s.batch.sampler_logp is not None  # fixed_keys asks for is_weight only with it
    return rollout_is_weight(
        f["logp_old"], s.batch.sampler_logp, f["mask"], cap=s.cfg.rollout.rollout_is_cap
    )


PRODUCERS: dict[str, Callable[[_Sources], Tensor]] = {
    "logp_ref": _logp_ref,
    "cand_logp_old": lambda s: s.batch.old.cand_logp.reshape(*s.batch.shape, -1),
    "sampled_rank": _sampled_rank,
    "diversity": _diversity,
    # The prompt is the same for the G rows of a group: read it from each group's first row.
    "prompt_logp": lambda s: s.batch.old.prompt_logp[:: s.batch.shape[1]],
    "prompt_mask": lambda s: s.prompt_mask[:, 1:] * s.prompt_mask[:, :-1],
    "is_weight": _is_weight,
}
"""The producer of each optional no-grad batch key (``shaping.BATCH_KEYS``)."""


def fixed_keys(method: str, needs: Collection[str], *, is_weight: bool) -> list[str]:
    """The optional no-grad keys a step's behaviour batch holds, in ``shaping.BATCH_KEYS`` order:
    the method's `needs` but the differentiable `GRAD_KEYS`, plus ``is_weight`` when the rollout
    importance-sampling correction applies.

    Raises:
        ValueError: a needed key has no producer (the message names the method and the key).
    """
    wanted = set(needs) - set(GRAD_KEYS) - set(shaping.contract.BASE_KEYS)
    if is_weight:
        wanted.add("is_weight")
    missing = sorted(wanted - PRODUCERS.keys())
    if missing:
        raise ValueError(
            f"method: {method!r} needs batch keys {missing} that the LLM trainer does not produce"
        )
    return [k for k in shaping.BATCH_KEYS if k in wanted]


def sampler_is_behaviour(cfg: TrainConfig, needs: Collection[str]) -> bool:
    """Whether the rollout's own log-probs, entropies and top-N candidates ARE pi_old's, so the
    behaviour forward pass can be skipped (``behaviour_pass = "auto"``).

    True only when the sampler is the training policy computed the same way: the transformers
    backend (`HFGenerateBackend` samples from the policy's own logits), fp32 (bf16 kernels for
    generation and a full forward differ), ``top_p = 1`` (top-p renormalizes the sampler's
    log-probs), one inner epoch (with mu > 1 the later passes need fresh forwards anyway) and no
    prompt log-probs (ProGRPO's prompt confidence needs a forward of the prompt). The two agree to
    ~1e-5 per token there (tests/llm/test_rollout.py); TRL 1.16 makes the same choice for one
    iteration.
    """
    return (
        cfg.rollout.behaviour_pass == "auto"
        and cfg.rollout.backend == "transformers"
        and cfg.system.precision == "fp32"
        and cfg.rollout.top_p == 1.0
        and cfg.optim.inner_epochs == 1
        and "prompt_logp" not in needs
    )


def _sampler_outputs(roll: Any, device: str | torch.device) -> PolicyOutputs:
    """The rollout's (B, G, T[, N]) sampler quantities as (B*G, T[, N]) `PolicyOutputs`."""

    def rows_of(x: Tensor | None) -> Tensor | None:
        if x is None:
            return None
        return x.reshape(-1, *x.shape[2:]).to(device)

    return PolicyOutputs(
        logp=rows_of(roll.logp.float()),
        entropy=rows_of(roll.entropy),
        cand_ids=rows_of(roll.cand_ids),
        cand_logp=rows_of(roll.cand_logp),
    )


def behaviour_batch(
    policy: torch.nn.Module,
    ref_model: torch.nn.Module | None,
    roll: Any,
    rewards: Tensor,
    *,
    cfg: TrainConfig,
    needs: Collection[str],
    diversity: Any = None,
) -> BehaviourBatch:
    """The no-grad shaping batch of a rollout (see the module docstring).

    Args:
        policy: the policy that sampled `roll` (pi_old; the update has not moved it yet).
        ref_model: the frozen base model when the method needs ``logp_ref``, else None.
        roll: an `llm.rollout.base.RolloutBatch` of B prompts x G responses of T tokens.
        rewards: (B, G) float32 on the training device.
        needs: ``shaping.METHODS[cfg.method].needs_for(**cfg.loss_hyper)``.
        diversity: (B, G) DSDR diversity scores when the method needs them.

    Raises:
        ValueError: a needed key cannot be produced (no reference model, no diversity scores).
    """
    device = rewards.device
    b, g, t = roll.response_ids.shape
    rows = build_rows(
        roll.prompt_ids.to(device),
        roll.prompt_mask.to(device),
        roll.response_ids.to(device),
        roll.response_mask.to(device),
    )
    has_stats = getattr(roll, "entropy", None) is not None and (
        cfg.n_candidates == 0 or getattr(roll, "cand_ids", None) is not None
    )
    if has_stats and sampler_is_behaviour(cfg, needs):
        old = _sampler_outputs(roll, device)
    else:
        old = forward_all(
            policy,
            rows,
            cfg.system.micro_batch_size,
            want_entropy=True,
            n_top=cfg.n_candidates,
            want_prompt="prompt_logp" in needs,
            temperature=cfg.rollout.temperature,
            precision=autocast_precision(policy, cfg.system.precision),
        )
    fixed = {
        "rewards": rewards,
        "mask": rows.response_mask.reshape(b, g, t),
        "logp_old": old.logp.reshape(b, g, t),
    }
    sampler_logp = getattr(roll, "logp", None)
    if sampler_logp is not None:
        sampler_logp = sampler_logp.to(device=device, dtype=torch.float32)
    batch = BehaviourBatch(rows, old, fixed, sampler_logp)
    prompt_mask = roll.prompt_mask.to(device=device, dtype=torch.float32)
    sources = _Sources(cfg, batch, prompt_mask, ref_model, diversity)
    use_is = cfg.rollout.rollout_is == "truncate" and sampler_logp is not None
    for key in fixed_keys(cfg.method, needs, is_weight=use_is):
        fixed[key] = PRODUCERS[key](sources)
    return batch


def rollout_is_weight(
    logp_old: Tensor, logp_sampler: Tensor, mask: Tensor, *, cap: float
) -> Tensor:
    """Truncated importance weight of each sampled token, ``min(exp(logp_old - logp_sampler), cap)``
    (1 on padding): corrects the surrogate for sampling from the rollout engine's distribution
    rather than the trainer's (vLLM kernels, bf16, top-p), as TRL's
    ``vllm_importance_sampling_correction`` and verl's truncated IS (TIS) do
    (docs/formulas.md §2.22).

    Args:
        logp_old, logp_sampler, mask: (B, G, T) trainer and sampler log-probs of the sampled
            tokens, and the response mask.
        cap: upper bound C >= 1 of the weight.

    Returns:
        (B, G, T) weights in (0, cap].
    """
    diff = torch.where(mask > 0, logp_old - logp_sampler, torch.zeros_like(logp_old))
    return torch.exp(diff.clamp(max=math.log(cap)))
