"""The update of a training step: mu inner epochs of full-batch shaping-loss optimizer steps with
micro-batched gradients, the learning-rate schedule, and the step's metrics.

Micro-batching without changing the loss (`accumulate_gradients`): a shaping loss is not a sum of
per-response terms (group normalization, token-mean over the whole batch, DSDR's softmax over
the correct set), so it is evaluated ONCE on the full batch, on leaf copies of the per-token
policy quantities (``logp``, ``entropy``, ``cand_logp``, each (B, G, T[, N])). Backpropagating
that scalar gives the exact gradient with respect to those leaves; each micro-batch is then
re-forwarded with grad and backpropagates ``sum(leaf_grad * quantity)``, so by the chain rule the
accumulated parameter gradient equals the full-batch gradient of the full-batch loss, for every
method and aggregation mode, with any micro-batch size (whole groups or not). Cost: the
quantities at the current parameters are needed before the micro-batch passes; on the first
inner epoch they are the behaviour pass itself, later epochs add one no-grad forward.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import shaping
from llm.config import TrainConfig
from llm.model.forward import (
    PolicyOutputs,
    Rows,
    chunks,
    forward_all,
    policy_forward,
    slice_outputs,
)
from llm.run.distributed import DistInfo, autocast_precision, gather_batch, grad_sync, local_rows
from llm.run.folder import NON_FINITE_ADVICE, NonFiniteError, check_finite
from llm.train.behaviour import GRAD_KEYS, BehaviourBatch

__all__ = [
    "UpdateResult",
    "accumulate_gradients",
    "leaf_gradients",
    "make_optimizer",
    "make_scheduler",
    "masked_mean",
    "optimizer_step",
    "stats",
    "step_metrics",
    "update_policy",
]

Tensor = torch.Tensor


def accumulate_gradients(
    model: torch.nn.Module,
    rows: Rows,
    fixed: dict[str, Tensor],
    current: PolicyOutputs,
    *,
    method: str,
    hyper: dict[str, Any],
    temperature: float,
    micro_batch_size: int,
    precision: str = "fp32",
    info: DistInfo | None = None,
) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
    """Accumulate into ``.grad`` the exact gradient of the full-batch shaping loss.

    With several processes (`info`), the full batch is the global one: every rank gathers the
    detached quantities of all ranks (`llm.run.distributed.gather_batch`), evaluates the same loss,
    and back-propagates the gradient of its own rows scaled by the world size, so that the
    engines' gradient mean over ranks is the full-batch gradient.

    Args:
        model: the policy (a transformers model, or its DDP / FSDP2 wrapping).
        rows: this rank's R = B * G rows.
        fixed: no-grad batch entries already shaped (B, G, ...): rewards, mask, logp_old and the
            method's other non-differentiable keys.
        current: the policy quantities at the current parameters (no grad), per row; their values
            enter the loss, their gradients come from the micro-batch passes.
        method, hyper: `shaping.METHODS[method].loss(batch, **hyper)`.
        precision: `llm.model.forward.policy_forward`'s (``"fp32"``, no autocast, for an FSDP2 policy
            with a bf16 mixed-precision policy: `llm.run.distributed.autocast_precision`).

    Returns:
        (loss, metrics, batch): the full-batch loss (detached) equal to the shaping core's value,
        its metrics, and the (global) batch it was evaluated on (leaves detached).

    Raises:
        ValueError: the method needs a policy quantity that `current` lacks.
    """
    info = info or DistInfo()
    loss, metrics, batch, leaf_grads = leaf_gradients(
        fixed, current, method=method, hyper=hyper, info=info
    )
    leaves = leaf_grads
    cand_ids = current.cand_ids
    pieces = chunks(len(rows), micro_batch_size)
    for i, (s, e) in enumerate(pieces):
        with grad_sync(model, enabled=i == len(pieces) - 1):
            out = policy_forward(
                model,
                rows.slice(s, e),
                temperature=temperature,
                want_entropy="entropy" in leaves,
                cand_ids=None if "cand_logp" not in leaves else cand_ids[s:e],
                precision=precision,
            )
            surrogate = sum((getattr(out, k) * leaf_grads[k][s:e]).sum() for k in leaves)
            surrogate.backward()
    return loss.detach(), metrics, batch


def leaf_gradients(
    fixed: dict[str, Tensor],
    current: PolicyOutputs,
    *,
    method: str,
    hyper: dict[str, Any],
    info: DistInfo | None = None,
) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]]:
    """The full-batch shaping loss on detached copies of the policy quantities and its gradient
    with respect to them (the first half of `accumulate_gradients`, shared with the batched
    trainer `llm.train.batched`).

    Args:
        fixed: no-grad batch entries (B, G, ...); current: the policy quantities per row
            (B * G rows); method, hyper, info: as `accumulate_gradients`.

    Returns:
        (loss, metrics, batch, leaf_grads): the detached loss, its metrics, the (global) batch
        it was evaluated on (detached), and ``d loss / d quantity`` for this rank's rows, flattened
        to rows (B * G, T[, N]) and scaled by the world size, for each quantity the loss reads
        (``logp`` always; ``entropy`` and ``cand_logp`` when the method needs them).

    Raises:
        ValueError: the method needs a policy quantity that `current` lacks.
    """
    info = info or DistInfo()
    b, g = fixed["rewards"].shape
    t = fixed["mask"].shape[-1]
    needs = shaping.METHODS[method].needs_for(**hyper)
    local: dict[str, Tensor] = {}
    for key in GRAD_KEYS:
        value = getattr(current, key)
        if key == "logp" or key in needs:
            if value is None:
                raise ValueError(f"{method}: needs {key!r} but the forward pass did not compute it")
            local[key] = value.detach().reshape(b, g, *value.shape[1:])
    batch = gather_batch({**fixed, **local}, info)
    leaves = {k: batch[k].detach().requires_grad_(True) for k in local}
    batch.update(leaves)
    loss, metrics = shaping.METHODS[method].loss(batch, **hyper)
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    # d loss / d leaf for this rank's rows, flattened back to rows (R, T[, N]); an unused leaf has
    # zero gradient. The world-size factor undoes the engines' mean over ranks.
    leaf_grads = {
        k: local_rows(torch.zeros_like(v) if gr is None else gr, info, b, t).reshape(
            b * g, *local[k].shape[2:]
        )
        * info.world_size
        for (k, v), gr in zip(leaves.items(), grads, strict=True)
    }
    detached = {k: v.detach() for k, v in batch.items()}
    return loss.detach(), metrics, detached, leaf_grads


def make_scheduler(
    optimizer: torch.optim.Optimizer, schedule: str, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up from 0 over `warmup_steps`, then constant, cosine or linear decay to 0 at
    `total_steps` (optimizer steps), the shapes of `transformers.get_scheduler`."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - progress

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@dataclass
class UpdateResult:
    """What the optimizer steps of one training step leave to log.

    Attributes:
        losses: the full-batch loss of each optimizer step (scalar tensors).
        loss_metrics: the method's scalar metrics of each optimizer step.
        grad_norms: the gradient norm of each optimizer step, before clipping.
    """

    losses: list[Tensor] = field(default_factory=list)
    loss_metrics: list[dict[str, Tensor]] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)


def update_policy(
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    behaviour: BehaviourBatch,
    *,
    cfg: TrainConfig,
    info: DistInfo,
    step: int = 0,
    hyper: Mapping[str, Any] | None = None,
) -> UpdateResult:
    """``cfg.optim.inner_epochs`` passes over the step's mini-batches, each ONE optimizer step
    (`accumulate_gradients`, gradient-norm clipping, AdamW, the schedule).

    `hyper` replaces ``cfg.loss_hyper`` for this step (the adaptive entropy coefficient,
    `llm.train.control`); the method's needs follow it.

    Mini-batches are whole groups (verl's ppo_mini_batch_size), in data order; this rank's share
    of a mini-batch is ``prompts_per_update / W`` groups (``prompts_per_step`` when unset).

    Raises:
        llm.run.folder.NonFiniteError: the loss, the gradient norm or, after the step, a parameter
            is NaN/inf (`step` names the training step in the message).
    """
    hyper = cfg.loss_hyper if hyper is None else hyper
    needs = shaping.METHODS[cfg.method].needs_for(**hyper)
    b, g, _ = behaviour.shape
    rows, old, fixed = behaviour.rows, behaviour.old, behaviour.fixed
    per_update = (cfg.optim.prompts_per_update or cfg.rollout.prompts_per_step) // info.world_size
    result = UpdateResult()
    for epoch in range(cfg.optim.inner_epochs):
        for start in range(0, b, per_update):
            stop = min(start + per_update, b)
            sub_rows = rows.slice(start * g, stop * g)
            if epoch == 0 and start == 0:
                current = slice_outputs(old, start * g, stop * g)
            else:  # the parameters moved since the behaviour pass
                current = forward_all(
                    policy,
                    sub_rows,
                    cfg.system.micro_batch_size,
                    want_entropy="entropy" in needs,
                    cand_ids=old.cand_ids[start * g : stop * g] if "cand_logp" in needs else None,
                    temperature=cfg.rollout.temperature,
                    precision=autocast_precision(policy, cfg.system.precision),
                )
            optimizer.zero_grad(set_to_none=True)
            loss, loss_metrics, _ = accumulate_gradients(
                policy,
                sub_rows,
                {k: v[start:stop] for k, v in fixed.items()},
                current,
                method=cfg.method,
                hyper=hyper,
                temperature=cfg.rollout.temperature,
                micro_batch_size=cfg.system.micro_batch_size,
                precision=autocast_precision(policy, cfg.system.precision),
                info=info,
            )
            optimizer_step(policy, optimizer, scheduler, loss, loss_metrics, cfg=cfg, step=step,
                           result=result)  # fmt: skip
    return result


def optimizer_step(
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    loss: Tensor,
    loss_metrics: dict[str, Tensor],
    *,
    cfg: TrainConfig,
    step: int,
    result: UpdateResult,
) -> None:
    """One optimizer step on the gradients in ``.grad``: the norm clipped to
    ``optim.max_grad_norm`` (0: not clipped), AdamW and the schedule stepped, the gradients freed;
    the loss, its scalar metrics and the norm before clipping appended to `result` (both engines'
    updates, `update_policy` and `llm.train.batched`).

    Raises:
        llm.run.folder.NonFiniteError: the loss, the gradient norm or, after the step, a parameter
            is NaN/inf (`step` names the training step in the message).
    """
    clip = cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), clip))
    # Stop before a non-finite update reaches the weights: the newest checkpoint stays the last good
    # state.
    try:
        check_finite(step, loss=float(loss), grad_norm=grad_norm)
    except NonFiniteError:
        adv = loss_metrics.get("adv_mean")
        if adv is None or math.isfinite(float(adv)):
            raise
        raise NonFiniteError(  # the method's shaping, which no learning rate mends
            f"step {step}: method {cfg.method!r} returned non-finite advantages (adv_mean "
            f"{float(adv)}), so the loss is {float(loss)}; training stopped before the optimizer "
            "step, so the newest checkpoint is the last good state (check the method's "
            "advantages on this step's rewards)"
        ) from None
    result.grad_norms.append(grad_norm)
    optimizer.step()
    scheduler.step()
    if not all(bool(torch.isfinite(p).all()) for p in _local_params(policy)):
        raise NonFiniteError(
            f"step {step}: the optimizer step made parameters non-finite (lr "
            f"{scheduler.get_last_lr()[0]:g}); {NON_FINITE_ADVICE}"
        )
    # Free the gradients now: the rollout engine wakes up before the next zero_grad.
    optimizer.zero_grad(set_to_none=True)
    result.losses.append(loss)
    result.loss_metrics.append({k: v for k, v in loss_metrics.items() if v.numel() == 1})


def _local_params(policy: torch.nn.Module) -> list[Tensor]:
    """This rank's parameter values (an FSDP2 DTensor's local shard)."""
    return [p.to_local() if hasattr(p, "to_local") else p for p in policy.parameters()]


def step_metrics(
    behaviour: BehaviourBatch,
    update: UpdateResult,
    *,
    cfg: TrainConfig,
    hyper: dict[str, Any],
    lr: float,
    info: DistInfo,
    chart_rewards: Tensor | None = None,
) -> dict[str, float]:
    """The step's ``charts/``, ``losses/``, ``adv/`` and ``topn/`` metrics: over the global batch
    for the behaviour pass and the rollout (every rank takes part in the gather), as the mean over
    the step's optimizer steps for the loss terms and the gradient norm.

    `chart_rewards` (B, G), when given, are the rewards the ``charts/`` reward, accuracy, pass
    and format rates read instead of the batch's (the trainer passes the rewards before the
    in-reward KL penalty, `llm.train.control.kl_reward_penalty`); the advantages always read
    the batch's."""
    b, g, t = behaviour.shape
    old = behaviour.old
    # The behaviour pass is the policy at the rollout: its values stand in for the current ones.
    local = {**behaviour.fixed, "logp": behaviour.fixed["logp_old"]}
    if chart_rewards is not None:
        local["chart_rewards"] = chart_rewards
    local["entropy"] = old.entropy.reshape(b, g, t)
    if old.cand_logp is not None:
        local["cand_logp"] = old.cand_logp.reshape(b, g, t, -1)
    if behaviour.sampler_logp is not None:
        local["sampler_logp"] = behaviour.sampler_logp
    full = gather_batch(local, info)
    rewards, mask = full.pop("chart_rewards", full["rewards"]), full["mask"]
    adv = shaping.METHODS[cfg.method].advantages(full, **hyper)
    correct = (rewards > 0.5).float()
    metrics = {
        "charts/reward_mean": rewards.mean().item(),
        "charts/accuracy": correct.mean().item(),
        "charts/pass_rate": correct.amax(dim=1).mean().item(),
        "charts/format_rate": (rewards > 0).float().mean().item(),
        "charts/response_len": mask.sum(-1).mean().item(),
        "charts/entropy": masked_mean(full["entropy"], mask),
        "charts/lr": lr,
        "charts/grad_norm": float(np.mean(update.grad_norms)),
        "charts/optimizer_steps": float(len(update.grad_norms)),
    }
    if "sampler_logp" in full:
        diff = full["logp_old"] - full["sampler_logp"]
        metrics["charts/sampler_logp_gap"] = masked_mean(diff.abs(), mask)
        # k3 estimate of KL(sampler || trainer) per token: the mismatch TRL and verl log.
        metrics["charts/sampler_kl"] = masked_mean(torch.expm1(diff) - diff, mask)
    if "is_weight" in full:
        w = full["is_weight"]
        metrics["charts/is_weight_mean"] = masked_mean(w, mask)
        metrics["charts/is_weight_capped"] = masked_mean(
            (w >= cfg.rollout.rollout_is_cap).float(), mask
        )
    metrics["losses/loss"] = float(torch.stack(update.losses).mean())
    for k in update.loss_metrics[0]:
        metrics[f"losses/{k}"] = float(np.mean([float(m[k]) for m in update.loss_metrics]))
    metrics.update(stats(adv, "adv"))
    if "cand_logp" in full:
        cand = full["cand_logp"]
        for n in range(cand.shape[-1]):
            metrics[f"topn/lambda_{n + 1}"] = masked_mean(cand[..., n], mask)
    if "diversity" in full:
        metrics["charts/diversity"] = masked_mean(full["diversity"], torch.ones_like(rewards))
    return metrics


def stats(x: Tensor, prefix: str) -> dict[str, float]:
    """``PREFIX/{mean,std,min,max}`` of all entries of `x` (population std), in float64."""
    x = x.detach().double()
    return {
        f"{prefix}/mean": x.mean().item(),
        f"{prefix}/std": x.std(correction=0).item(),
        f"{prefix}/min": x.min().item(),
        f"{prefix}/max": x.max().item(),
    }


def masked_mean(x: Tensor, mask: Tensor) -> float:
    """Mean of `x` over the entries where `mask` is 1 (0 when the mask is empty)."""
    return ((x * mask).sum() / mask.sum().clamp(min=1)).item()


def make_optimizer(
    cfg: TrainConfig, policy: torch.nn.Module
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW on the policy's parameters (``lr``, ``adam_betas``, ``weight_decay``) and its
    `make_scheduler` over ``steps * inner_epochs`` optimizer steps.

    With plain (unsharded) parameters AdamW runs ``fused``. On CUDA torch's default ``foreach``
    step allocates a temporary copy of the weights (4P bytes, the peak of every one-GPU update
    measured on an H100: docs/gpu_memory.md); the fused kernel updates in place. On the CPU the
    default step takes the square root of its second moment with torch's ``sqrt``, which is not
    correctly rounded and whose last bits change with the CPU (an AMD EPYC and an emulated AVX2
    CPU differ: docs/numerics.md); the fused kernel's step is the same on both. FSDP2's sharded
    DTensors keep torch's default implementation.
    """
    params = list(policy.parameters())
    fused = bool(params) and all(
        p.device.type in ("cuda", "cpu") and not hasattr(p, "to_local") for p in params
    )
    optimizer = torch.optim.AdamW(
        params,
        lr=cfg.optim.lr,
        betas=tuple(cfg.optim.adam_betas),
        weight_decay=cfg.optim.weight_decay,
        **({"fused": True} if fused else {}),
    )
    total = cfg.steps * cfg.optim.inner_epochs
    return optimizer, make_scheduler(optimizer, cfg.optim.schedule, cfg.optim.warmup_steps, total)
