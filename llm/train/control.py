"""Driver-level controls of a training step that act around the method's loss: DAPO's dynamic
sampling and overlong masking, Skywork-OR1's adaptive entropy coefficient, outcome-based exploration
bonuses on final answers, the KL penalty in the reward, the adaptive KL coefficient and ProRL's
reference reset. First pure functions of tensors, answers and counts (and one in-place weight copy);
then the same controls applied to a step's batch (`Controls`, `explore_rewards`, `kl_control`,
`mask_truncated`, `adapt_entropy`), which `llm.train.trainer` calls; their state (the coefficients,
the answer counts, the reference's step) travels in the checkpoint.

Shapes: B prompts, G responses per prompt (a group), P prompt tokens, T response tokens, N
candidates. Formulas: docs/formulas.md §2.31-§2.33, §2.35-§2.37.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from llm.config import ENTROPY_GATES, TrainConfig
from llm.rollout.base import RolloutBatch
from llm.run.distributed import DistInfo, gather_batch, unwrap
from llm.tasks import TASKS
from llm.train.behaviour import BehaviourBatch, reference_logp
from llm.train.update import masked_mean
from shaping.core import kl_penalty

__all__ = [
    "AnswerCounts",
    "Controls",
    "applied_entropy_coef",
    "batch_bonus",
    "concat_rollouts",
    "kl_reward_penalty",
    "mixed_groups",
    "next_entropy_coef",
    "next_kl_coef",
    "reset_reference",
    "select_groups",
    "truncated_responses",
    "ucb_bonus",
    "update_counts",
]

Tensor = torch.Tensor

AnswerCounts = dict[str, dict[str, int]]
"""``N(x, a)``: prompt text -> canonical answer (`Task.answer_key`) -> times sampled in training."""


# ---------------------------------------------------------------------------------------------
# DAPO dynamic sampling and overlong masking (§2.31)


def mixed_groups(rewards: Tensor) -> Tensor:
    """(B,) bool: the groups whose rewards are not all equal (``max_j r_j > min_j r_j``).

    DAPO's dynamic-sampling filter (Yu et al. 2025, arXiv 2503.14476, Eq. 11 ``0 < |{correct}| <
    G``; verl ``algorithm.filter_groups``, which keeps a group when the std of its metric is > 0).
    On the verifier's reward, so with a format score a group of wrong answers that differ in form
    counts as mixed: its GRPO advantages are not zero either.

    Args:
        rewards: (B, G) verifier rewards.
    """
    return rewards.amax(dim=1) > rewards.amin(dim=1)


def select_groups(
    mixed: Sequence[bool], want: int, *, exhausted: bool
) -> tuple[list[int], bool] | None:
    """Which of the drawn groups (in draw order) a dynamic-sampling step trains on.

    Args:
        mixed: one flag per group drawn so far, in draw order (round by round).
        want: B, the groups a step trains on.
        exhausted: no resampling round is left.

    Returns:
        None while fewer than `want` groups are mixed and rounds remain (draw another round);
        else ``(indices, budget_ran_out)``: the first `want` mixed groups in draw order, or, when
        the budget ran out first, every mixed group plus the first uniform ones in draw order up
        to `want` (a step keeps B groups: fixed shapes and mini-batches), the indices sorted.

    Raises:
        ValueError: fewer than `want` groups drawn when `exhausted`.
    """
    hits = [i for i, m in enumerate(mixed) if m]
    if len(hits) >= want:
        return hits[:want], False
    if not exhausted:
        return None
    if len(mixed) < want:
        raise ValueError(f"select_groups: {len(mixed)} groups drawn, fewer than B = {want}")
    fill = [i for i, m in enumerate(mixed) if not m][: want - len(hits)]
    return sorted(hits + fill), True


def truncated_responses(
    response_ids: Tensor, response_mask: Tensor, stop_ids: Sequence[int], max_new_tokens: int
) -> Tensor:
    """(B, G) bool: responses that used all `max_new_tokens` without ending on a stop id.

    DAPO's overlong filtering (arXiv 2503.14476 §3.4, "truncated samples are masked"; TRL
    ``mask_truncated_completions``): these responses leave the loss.

    Args:
        response_ids, response_mask: (B, G, T) ids (right-padded) and the 1-on-response mask.
        stop_ids: the ids that end a response (`llm.rollout.base.stop_token_ids`).
        max_new_tokens: the generation budget (T <= max_new_tokens).
    """
    b, g, t = response_ids.shape
    if t < max_new_tokens:
        return torch.zeros(b, g, dtype=torch.bool, device=response_ids.device)
    length = response_mask.sum(-1).to(torch.long)  # (B, G)
    stops = torch.as_tensor(list(stop_ids), dtype=response_ids.dtype, device=response_ids.device)
    ended = torch.isin(response_ids[..., max_new_tokens - 1], stops)
    return (length >= max_new_tokens) & ~ended


def concat_rollouts(
    parts: Sequence[tuple[RolloutBatch, Sequence[int]]], pad_id: int
) -> RolloutBatch:
    """One `RolloutBatch` of the chosen groups of several rollouts, in the order given.

    Prompts are left-padded and responses right-padded to the widest part with `pad_id` (masks,
    log-probs, entropies and candidate log-probs 0 there, as `RolloutBatch` documents).

    Args:
        parts: ``(rollout, group indices)`` pairs.
        pad_id: the tokenizer's pad id.

    Raises:
        ValueError: no group chosen, or the parts disagree on G or on which optional fields they
            hold.
    """
    chosen = [(roll, list(idx)) for roll, idx in parts if len(idx)]
    if not chosen:
        raise ValueError("concat_rollouts: no group chosen")
    if len({roll.group_size for roll, _ in chosen}) != 1:
        raise ValueError("concat_rollouts: the rollouts differ in group size")
    p = max(roll.prompt_ids.shape[1] for roll, _ in chosen)
    t = max(roll.response_ids.shape[2] for roll, _ in chosen)

    def left(x: Tensor, value: float) -> Tensor:
        return torch.nn.functional.pad(x, (p - x.shape[1], 0), value=value)

    def right(x: Tensor | None, value: float, last: int = 2) -> Tensor | None:
        if x is None:
            return None
        pad = [0, 0] * (x.dim() - 1 - last) + [0, t - x.shape[last]]
        return torch.nn.functional.pad(x, pad, value=value)

    def cat(name: str, fn: Callable[[Tensor], Tensor | None]) -> Tensor | None:
        values = [
            None if getattr(roll, name) is None else fn(getattr(roll, name)[idx])
            for roll, idx in chosen
        ]
        if all(v is None for v in values):
            return None
        if any(v is None for v in values):
            raise ValueError(f"concat_rollouts: {name} is set in some rollouts only")
        return torch.cat(values, dim=0)

    return RolloutBatch(
        prompts=[roll.prompts[i] for roll, idx in chosen for i in idx],
        prompt_ids=cat("prompt_ids", lambda x: left(x, pad_id)),
        prompt_mask=cat("prompt_mask", lambda x: left(x, 0.0)),
        response_ids=cat("response_ids", lambda x: right(x, pad_id)),
        response_mask=cat("response_mask", lambda x: right(x, 0.0)),
        logp=cat("logp", lambda x: right(x, 0.0)),
        texts=[roll.texts[i] for roll, idx in chosen for i in idx],
        cand_ids=cat("cand_ids", lambda x: right(x, pad_id)),
        cand_logp=cat("cand_logp", lambda x: right(x, 0.0)),
        entropy=cat("entropy", lambda x: right(x, 0.0)),
    )


# ---------------------------------------------------------------------------------------------
# Adaptive entropy coefficient (§2.32)


def applied_entropy_coef(
    coef: float,
    entropy: float,
    *,
    target: float,
    gate: str = "step",
    previous: float | None = None,
) -> float:
    """The entropy coefficient step k's loss uses, ``c_k`` or 0, by `gate`
    (``control.entropy_gate``):

    - ``step``: ``c_k · 1[e_k <= target]``, `entropy` (``e_k``) this step's (the default);
    - ``trl``: ``c_k · 1[e_{k-1} <= target]``, `previous` (``e_{k-1}``) the previous step's,
      None at the first step (off: TRL's ``_last_world_entropy`` starts at +inf);
    - ``skywork``: ``c_k · 1[e_{k-1} < target]``, on at the first step (Skywork-OR1's
      ``EntController.entropy_loss_enabled`` starts at 1).

    Source: Skywork-OR1 (arXiv 2505.22312 §4, adaptive entropy control; its verl
    ``EntController``); TRL ``GRPOTrainer`` ``use_adaptive_entropy``; docs/formulas.md §2.32.

    Raises:
        ValueError: an unknown `gate`.
    """
    if gate == "step":
        on = entropy <= target
    elif gate == "trl":
        on = previous is not None and previous <= target
    elif gate == "skywork":
        on = previous is None or previous < target
    else:
        raise ValueError(f"control.entropy_gate: expected one of {ENTROPY_GATES}, got {gate!r}")
    return coef if on else 0.0


def next_entropy_coef(
    coef: float,
    entropy: float,
    *,
    target: float,
    delta: float,
    lo: float = 0.0,
    hi: float = 1.0,
    strict: bool = False,
) -> float:
    """The coefficient after a step with token entropy `entropy`: ``c + delta`` when
    ``entropy <= target`` (``<`` when `strict`, Skywork-OR1's), else ``c - delta``, clamped to
    ``[lo, hi]``.

    Skywork-OR1 (arXiv 2505.22312 §4: ``c_{k+1} = c_k ± Δ``, ``c >= 0``; its code lowers the
    coefficient at equality); TRL ``GRPOTrainer`` (``entropy_coef_delta``, ``entropy_coef_min``,
    ``entropy_coef_max``, ``entropy_target``: raises at equality). docs/formulas.md §2.32.

    Raises:
        ValueError: ``delta < 0`` or ``lo > hi``.
    """
    if delta < 0 or lo > hi:
        raise ValueError(
            f"next_entropy_coef: expected delta >= 0 and lo <= hi, got {delta}, [{lo}, {hi}]"
        )
    below = entropy < target if strict else entropy <= target
    step = delta if below else -delta
    return min(max(coef + step, lo), hi)


# ---------------------------------------------------------------------------------------------
# Outcome-based exploration (§2.33)


def ucb_bonus(
    counts: AnswerCounts, prompts: Sequence[str], answers: Sequence[Sequence[str | None]], c: float
) -> Tensor:
    """(B, G) historical bonus ``c / sqrt(1 + N(x, a))`` of each response's answer `a` to prompt
    `x`, with the counts of earlier steps (0 for a response without an answer).

    Song, Kempe & Munos 2025 (arXiv 2509.06941), historical exploration (UCB-style count bonus
    on final outcomes); the ``1 +`` and the unanswered-response rule are ours (§2.33).
    """
    rows = []
    for x, group in zip(prompts, answers, strict=True):
        seen = counts.get(x, {})
        rows.append([0.0 if a is None else c / math.sqrt(1 + seen.get(a, 0)) for a in group])
    return torch.tensor(rows, dtype=torch.float32)


def batch_bonus(answers: Sequence[Sequence[Hashable | None]], c: float) -> Tensor:
    """(B, G) within-group penalty ``-c (n_a - 1) / (G - 1)``, ``n_a`` the number of the group's
    responses with the same answer (itself included; 0 for a response without an answer).

    A unique answer gets 0, a group that all says the same gets ``-c`` each. Song, Kempe & Munos
    2025 (arXiv 2509.06941), batch exploration (penalise repetition within the batch); the
    normalization by ``G - 1`` is ours (§2.33).

    Raises:
        ValueError: a group of fewer than 2 responses.
    """
    rows = []
    for group in answers:
        g = len(group)
        if g < 2:
            raise ValueError(f"batch_bonus: a group needs >= 2 responses, got {g}")
        rows.append(
            [0.0 if a is None else -c * (sum(b == a for b in group) - 1) / (g - 1) for a in group]
        )
    return torch.tensor(rows, dtype=torch.float32)


def update_counts(
    counts: AnswerCounts, prompts: Sequence[str], answers: Sequence[Sequence[str | None]]
) -> None:
    """Add each answered response of the step to ``N(x, a)`` (in place)."""
    for x, group in zip(prompts, answers, strict=True):
        seen = counts.setdefault(x, {})
        for a in group:
            if a is not None:
                seen[a] = seen.get(a, 0) + 1


# ---------------------------------------------------------------------------------------------
# KL penalty in the reward (§2.35), adaptive KL coefficient (§2.36), reference reset (§2.37)


def kl_reward_penalty(
    logp_old: Tensor, logp_ref: Tensor, mask: Tensor, *, estimator: str = "k1"
) -> tuple[Tensor, Tensor]:
    """The summed and the mean per-token KL estimate of each response, between the behaviour
    policy and the reference, on the sampled tokens (no gradient).

    ``kl_t`` is `shaping.core.kl_penalty` of ``logp_old`` against ``logp_ref`` (k1: ``log
    pi_old - log pi_ref``, verl's default ``algorithm.kl_penalty = "kl"``). The in-reward penalty
    is ``beta * sum_t kl_t``: verl subtracts ``beta * kl_t`` from every token's reward
    (``apply_kl_penalty``) and its outcome advantages sum the token rewards
    (``compute_grpo_outcome_advantage``: ``token_level_rewards.sum(-1)``). The mean is the
    quantity verl's controller measures (``masked_mean(kld, mask, axis=-1)``).

    Args:
        logp_old, logp_ref, mask: (B, G, T) log-probs of the sampled tokens under pi_old and the
            reference, and the response mask.
        estimator: "k1", "k2" or "k3" (`shaping.core.KL_ESTIMATORS`).

    Returns:
        ``(kl_sum, kl_mean)``, each (B, G): ``sum_t kl_t m_t`` and that sum over
        ``max(sum_t m_t, 1)`` (0 for an empty response).
    """
    with torch.no_grad():
        kl = kl_penalty(logp_old, logp_ref, mask, estimator) * mask  # (B, G, T)
        total = kl.sum(-1)
        return total, total / mask.sum(-1).clamp(min=1)


def next_kl_coef(coef: float, kl: float, *, target: float, horizon: int, n_steps: int) -> float:
    """Ziegler et al. 2019's proportional controller (arXiv 1909.08593 §2.2; verl
    ``AdaptiveKLController.update``): ``coef * (1 + clip(kl / target - 1, -0.2, 0.2) * n_steps /
    horizon)``. In float64, in verl's order of operations. docs/formulas.md §2.36.

    Args:
        coef: the coefficient the step used.
        kl: the step's measured KL (mean per-token KL of its responses).
        target: target KL (> 0).
        horizon: the controller's horizon (> 0), in responses.
        n_steps: responses in the step (verl passes its batch size).

    Raises:
        ValueError: ``target <= 0`` or ``horizon <= 0``.
    """
    if not target > 0 or not horizon > 0:
        raise ValueError(
            f"next_kl_coef: expected target > 0 and horizon > 0, got {target}, {horizon}"
        )
    error = min(max(kl / target - 1, -0.2), 0.2)
    return coef * (1 + error * n_steps / horizon)


def reset_reference(reference: torch.nn.Module, policy: torch.nn.Module) -> None:
    """Copy the policy's weights into the frozen reference, in place, in the reference's dtype
    (ProRL's "reference policy reset", arXiv 2505.24864; docs/formulas.md §2.37).

    Parameters and persistent buffers are matched by name (`unwrap`: DDP or FSDP2 wrappers
    aside; under FSDP2 both models are sharded alike, each rank copies its shards).

    Raises:
        ValueError: the two models do not hold the same tensors.
    """
    ref, pol = unwrap(reference), unwrap(policy)
    dst = dict(ref.state_dict(keep_vars=True))
    src = dict(pol.state_dict(keep_vars=True))
    if dst.keys() != src.keys():
        raise ValueError(
            "reset_reference: the reference and the policy hold different tensors: "
            f"{sorted(dst.keys() ^ src.keys())[:5]}"
        )
    with torch.no_grad():
        for name, t in dst.items():
            t.copy_(src[name])


# ---------------------------------------------------------------------------------------------
# Applied to a step's batch (`llm.train.trainer` calls these)


@dataclass(frozen=True, slots=True)
class Controls:
    """A run's own control state, saved in its checkpoints (``extra``, `state`): the adaptive
    entropy coefficient (``control.adaptive_entropy``, starting at `entropy_coef`; with
    ``control.entropy_gate`` other than ``step`` also the previous step's entropy
    ``last_entropy``, None before the first step), the answer counts ``N(x, a)``
    (``explore.ucb_coef``), the adaptive KL coefficients (``control.adaptive_kl``:
    ``kl_reward_coef`` with ``control.kl_in_reward``, ``kl_coef`` when the in-loss ``kl_coef > 0``)
    and the step whose policy the reference holds (``control.reference_reset_every``; 0 = the
    base model). `keys` names the entries the config turns on, in the saved order; the others
    stay None. A step returns a new `Controls` (`dataclasses.replace`); only the answer counts
    are updated in place (`update_counts`)."""

    keys: tuple[str, ...] = ()
    entropy_coef: float | None = None
    last_entropy: float | None = None
    answer_counts: AnswerCounts | None = None
    kl_reward_coef: float | None = None
    kl_coef: float | None = None
    reference_step: int | None = None

    @classmethod
    def start(cls, cfg: TrainConfig, saved: dict[str, Any] | None, ckpt: Path | None) -> Controls:
        """The state a run starts with: the config's initial values, or, for a resumed run, its
        checkpoint's (`saved`, what `state` wrote).

        Raises:
            ValueError: the checkpoint lacks a state the config needs.
        """
        state: dict[str, Any] = {}
        c = cfg.control
        if c.adaptive_entropy:
            state["entropy_coef"] = float(cfg.entropy_coef)
            if c.entropy_gate != "step":  # the previous step's entropy gates this step's term
                state["last_entropy"] = None
        if cfg.explore.ucb_coef > 0:
            state["answer_counts"] = {}
        if c.adaptive_kl and c.kl_in_reward:
            state["kl_reward_coef"] = float(c.kl_reward_coef)
        if c.adaptive_kl and cfg.kl_coef > 0:
            state["kl_coef"] = float(cfg.kl_coef)
        if c.reference_reset_every:
            state["reference_step"] = 0
        if ckpt is not None and state:
            missing = sorted(k for k in state if saved is None or k not in saved)
            if missing:
                raise ValueError(f"--resume: {ckpt} holds no trainer state {missing}")
            state.update({k: saved[k] for k in state})
        return cls(keys=tuple(state), **state)

    def state(self) -> dict[str, Any] | None:
        """The checkpoint's ``extra``: the entries of `keys` in order, or None when none is on."""
        return {k: getattr(self, k) for k in self.keys} or None


def explore_rewards(
    roll: Any,
    rewards: torch.Tensor,
    cfg: TrainConfig,
    counts: AnswerCounts | None,
    metrics: dict[str, float],
) -> torch.Tensor:
    """The verifier's rewards plus the outcome-based exploration bonuses of ``[explore]``
    (historical: counts of earlier steps, then this step's answers are counted; within-group);
    ``explore/`` metrics into `metrics`."""
    task = TASKS[cfg.task]
    answers = [[task.answer_key(t, distinct=cfg.distinct) for t in texts] for texts in roll.texts]
    bonus = torch.zeros_like(rewards)
    if cfg.explore.ucb_coef > 0:
        assert counts is not None  # Controls.start holds them whenever ucb_coef > 0
        bonus += ucb_bonus(counts, roll.prompts, answers, cfg.explore.ucb_coef).to(bonus)
        update_counts(counts, roll.prompts, answers)
    if cfg.explore.batch_coef > 0:
        bonus += batch_bonus(answers, cfg.explore.batch_coef).to(bonus)
    metrics["explore/verifier_reward_mean"] = rewards.mean().item()
    metrics["explore/bonus_mean"] = bonus.mean().item()
    metrics["explore/distinct_answers"] = sum(
        len({a for a in group if a is not None}) for group in answers
    ) / max(len(answers), 1)
    return rewards + bonus


def mask_truncated(
    behaviour: BehaviourBatch,
    cfg: TrainConfig,
    stop_ids: list[int],
    info: DistInfo,
    metrics: dict[str, float],
) -> BehaviourBatch:
    """`behaviour` with the responses that hit ``max_new_tokens`` unfinished masked out of the
    loss (DAPO overlong masking, `truncated_responses`); their rewards still
    count in their groups. ``overlong/masked_rate`` into `metrics`."""
    b, g, t = behaviour.shape
    mask = behaviour.fixed["mask"]
    ids = behaviour.rows.response_ids.reshape(b, g, t)
    cut = truncated_responses(ids, mask, stop_ids, cfg.rollout.max_new_tokens)
    metrics["overlong/masked_rate"] = gather_batch({"cut": cut.float()}, info)["cut"].mean().item()
    fixed = {**behaviour.fixed, "mask": mask * (~cut).unsqueeze(-1).to(mask.dtype)}
    return replace(behaviour, fixed=fixed)


def kl_control(
    behaviour: BehaviourBatch,
    ref_model: torch.nn.Module | None,
    hyper: Mapping[str, Any],
    cfg: TrainConfig,
    info: DistInfo,
    ctl: Controls,
    metrics: dict[str, float],
) -> tuple[BehaviourBatch, Mapping[str, Any], Controls]:
    """The KL penalty in the reward and the adaptive KL coefficients of ``[control]``.

    With ``kl_in_reward`` the batch's rewards become ``r - beta sum_t kl_t`` (`
    kl_reward_penalty`: pi_old against the reference on the sampled tokens, over the response
    mask before any overlong masking), beta the step's coefficient. With ``adaptive_kl`` the
    step's measured KL (the mean over the global batch's responses of their per-token mean) moves
    the coefficients for the next step (`next_kl_coef`, in the returned `Controls`), and the
    in-loss ``kl_coef`` of this step's hyper-parameters is the controller's. ``control/``
    metrics into `metrics`.

    Returns:
        (the behaviour batch with the penalised rewards, this step's hyper-parameters, the
        controls for the next step).
    """
    c = cfg.control
    fixed = behaviour.fixed
    logp_ref = fixed.get("logp_ref")
    if logp_ref is None:
        logp_ref = reference_logp(ref_model, behaviour, cfg)
    kl_sum, kl_mean = kl_reward_penalty(
        fixed["logp_old"], logp_ref, fixed["mask"], estimator=c.kl_reward_estimator
    )
    full = gather_batch({"kl_mean": kl_mean}, info)["kl_mean"]
    kl = full.mean().item()
    metrics["control/kl"] = kl
    step_hyper = hyper
    if c.kl_in_reward:
        beta = c.kl_reward_coef if ctl.kl_reward_coef is None else ctl.kl_reward_coef
        penalty = beta * kl_sum
        metrics["control/kl_reward_coef"] = beta
        metrics["control/kl_penalty"] = gather_batch({"p": penalty}, info)["p"].mean().item()
        behaviour = replace(behaviour, fixed={**fixed, "rewards": fixed["rewards"] - penalty})
    if c.adaptive_kl:
        n = full.numel()
        move = {"target": c.kl_target, "horizon": c.kl_horizon, "n_steps": n}
        if ctl.kl_reward_coef is not None:
            ctl = replace(ctl, kl_reward_coef=next_kl_coef(ctl.kl_reward_coef, kl, **move))
            metrics["control/next_kl_reward_coef"] = ctl.kl_reward_coef
        if ctl.kl_coef is not None:
            metrics["control/kl_coef"] = ctl.kl_coef
            step_hyper = MappingProxyType({**hyper, "kl_coef": ctl.kl_coef})
            ctl = replace(ctl, kl_coef=next_kl_coef(ctl.kl_coef, kl, **move))
            metrics["control/next_kl_coef"] = ctl.kl_coef
    return behaviour, step_hyper, ctl


def adapt_entropy(
    batch: BehaviourBatch,
    hyper: Mapping[str, Any],
    cfg: TrainConfig,
    info: DistInfo,
    ctl: Controls,
    metrics: dict[str, float],
) -> tuple[Mapping[str, Any], Controls]:
    """This step's loss hyper-parameters with the adaptive entropy coefficient (Skywork-OR1:
    ``c_k 1[e <= target]``, `e_k` the batch's mean token entropy under pi_old over the loss
    mask, ``e = e_k`` or the previous step's by ``control.entropy_gate``:
    `applied_entropy_coef`), and the controls with the coefficient moved for the next step (and
    `e_k`, kept for the next step's gate); ``control/`` metrics into `metrics`."""
    b, g, t = batch.shape
    full = gather_batch(
        {"entropy": batch.old.entropy.reshape(b, g, t), "mask": batch.fixed["mask"]}, info
    )
    entropy = masked_mean(full["entropy"], full["mask"])
    c = cfg.control
    coef = ctl.entropy_coef
    applied = applied_entropy_coef(coef, entropy, target=c.entropy_target, gate=c.entropy_gate,
                                   previous=ctl.last_entropy)  # fmt: skip
    ctl = replace(ctl, entropy_coef=next_entropy_coef(
        coef, entropy, target=c.entropy_target, delta=c.entropy_coef_delta,
        lo=c.entropy_coef_min, hi=c.entropy_coef_max, strict=c.entropy_gate == "skywork",
    ))  # fmt: skip
    if c.entropy_gate != "step":
        ctl = replace(ctl, last_entropy=entropy)
    metrics["control/entropy"] = entropy
    metrics["control/entropy_coef"] = applied
    metrics["control/next_entropy_coef"] = ctl.entropy_coef
    return MappingProxyType({**hyper, "entropy_coef": applied}), ctl
