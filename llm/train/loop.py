"""The one training loop: R >= 1 runs, each step rollout -> score -> behaviour batch and controls ->
update -> log and checkpoint, with the engine's parts swapped in.

What is the same for every engine lives here: the step's order, each run's driver-level controls
(`llm.train.control`: exploration bonuses, the behaviour batch, the KL penalty and the adaptive
coefficients, overlong masking, the reference reset), its metrics, metrics.jsonl and its atomic
checkpoints. What an engine brings (`Engine`) is how the step's responses are sampled and scored
(``sample``, which also advances each run's data position) and how the update's gradient passes run
(``update``): one process or a torchrun world sampling through a rollout backend and updating with
`llm.train.update.update_policy` (`llm.train.trainer`), or R runs stacked into one program
(`llm.train.batched`).

``time/*`` are wall-clock seconds of the step, shared by the runs of a batch: ``rollout`` (sampling
and scoring), ``logprob`` (the behaviour and reference passes and the controls), ``optim`` (the
update), ``update`` (everything after the rollout) and ``step``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

import shaping
from experiment.cli import progress_bar
from llm.config import TrainConfig
from llm.data import Problem, drop_long_prompts, load_train_problems
from llm.run.checkpoint import CheckpointState, MetricsLogger, save_checkpoint
from llm.run.distributed import DistInfo
from llm.tasks import TASKS
from llm.train import control, rollout_step
from llm.train.behaviour import BehaviourBatch, behaviour_batch
from llm.train.update import UpdateResult, step_metrics

__all__ = ["Engine", "Rollout", "Run", "problems_of", "train_loop"]


@dataclass(slots=True)
class Run:
    """One run's state in the loop (what a checkpoint saves of it, `CheckpointState`, and what the
    step reads).

    Attributes:
        cfg, out: the run's config and folder.
        policy: the model the update steps (a transformers model, or its DDP / FSDP2 wrapping).
        tokenizer, optimizer, scheduler: as `llm.run.checkpoint.CheckpointState`.
        position: prompts consumed (`llm.data.data_indices`); the engine's ``sample`` advances it.
        controls: the control state (`llm.train.control.Controls`).
        needs: ``shaping.METHODS[cfg.method].needs_for(**cfg.loss_hyper)``.
        ref_model: the frozen KL reference, or None.
        encoder: DSDR's sentence encoder, or None.
        stop_ids: the model folder's stop ids (read by overlong masking only).
        logger: the run's metrics log (None on ranks other than 0).
        history: the metrics of the steps run by this call.
    """

    cfg: TrainConfig
    out: Path
    policy: torch.nn.Module
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    position: int
    controls: control.Controls
    needs: Collection[str]
    ref_model: torch.nn.Module | None = None
    encoder: Any = None
    stop_ids: list[int] = field(default_factory=list)
    logger: MetricsLogger | None = None
    history: list[dict[str, float]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Rollout:
    """A run's sampled step: its B problems, the `RolloutBatch`, the verifier's ``rewards (B, G)``
    and the sampler's metrics (``dynamic/``)."""

    problems: list[Problem]
    roll: Any
    rewards: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Engine:
    """The swappable parts of a step.

    Attributes:
        sample: ``(step, runs) -> one Rollout per run``; advances each ``run.position``.
        update: ``(step, runs, loss batches, hypers) -> one UpdateResult per run``: the
            optimizer steps of every run on its loss batch with its step's hyper-parameters.
        sync: ``(run)``: after the update, the sampler's copy of the weights follows the policy.
        metrics: extra ``time/`` entries of every step (``time/batch_runs``).
    """

    sample: Callable[[int, Sequence[Run]], list[Rollout]]
    update: Callable[
        [int, Sequence[Run], Sequence[BehaviourBatch], Sequence[Mapping[str, Any]]],
        list[UpdateResult],
    ]
    sync: Callable[[Run], None] = lambda run: None
    metrics: Mapping[str, float] = field(default_factory=dict)


USER_CODE = ("method_code", "task_code")
"""The keys of `user_code`: the run's method's and task's code (a run marker's and a checkpoint's)."""


def user_code(cfg: TrainConfig) -> dict[str, str]:
    """The digests of the run's method and task where they are the user's own (``--import``):
    ``method_code`` (`shaping.method_code`) and ``task_code`` (`llm.tasks.Task.code`), each only
    when set; empty for the package's. What a sweep's run reuse (`llm.orchestrate.jobs`), a run's
    checkpoints and its ``--resume`` (`llm.train.trainer.check_user_code`) are keyed by: an edited
    method or task trains again."""
    codes = (shaping.method_code([cfg.method]).get(cfg.method), TASKS[cfg.task].code)
    return {k: v for k, v in zip(USER_CODE, codes, strict=True) if v is not None}


def problems_of(cfg: TrainConfig, tokenizer: Any) -> list[Problem]:
    """The run's training problems (`llm.data.load_train_problems`), those with prompts over
    ``rollout.max_prompt_tokens`` dropped when set."""
    problems = load_train_problems(cfg, tokenizer)
    if cfg.rollout.max_prompt_tokens > 0:
        problems = drop_long_prompts(problems, cfg, tokenizer)
    return problems


def train_loop(
    runs: Sequence[Run],
    engine: Engine,
    *,
    info: DistInfo,
    start: int,
    last: int,
    progress: bool,
    desc: str,
) -> list[list[dict[str, float]]]:
    """Steps ``start + 1 .. last`` of every run; returns each run's metrics of those steps.

    Every run logs each ``run.log_every``-th step and the last, and checkpoints each
    ``run.save_every``-th step and the last (`llm.run.checkpoint.save_checkpoint`).

    Raises:
        llm.run.folder.NonFiniteError: a loss, gradient norm or parameter became non-finite.
    """
    bar = progress_bar(last - start, desc, "step", progress=progress and info.is_main)
    try:
        for step in range(start + 1, last + 1):
            t0 = time.perf_counter()
            rollouts = engine.sample(step, runs)
            t_roll = time.perf_counter()
            prepared = [_prepare(run, r, info) for run, r in zip(runs, rollouts, strict=True)]
            t_old = time.perf_counter()
            updates = engine.update(
                step, runs, [p.loss for p in prepared], [p.hyper for p in prepared]
            )
            t_upd = time.perf_counter()
            metrics = [
                _step_end(run, p, u, step, engine, info)
                for run, p, u in zip(runs, prepared, updates, strict=True)
            ]
            t_end = time.perf_counter()
            logprob = sum(p.seconds for p in prepared)
            for run, m in zip(runs, metrics, strict=True):
                m.update({
                    "time/logprob": logprob,
                    "time/optim": t_upd - t_old,
                    "time/rollout": t_roll - t0,
                    "time/update": t_end - t_roll,
                    "time/step": t_end - t0,
                    **engine.metrics,
                    "charts/prompts_seen": float(run.position),
                })  # fmt: skip
                _log_and_save(run, m, step, info)
            bar.set_postfix_str(f"reward={metrics[0]['charts/reward_mean']:.3f}")
            bar.update()
    finally:
        bar.close()
        for run in runs:
            if run.logger is not None:
                run.logger.close()
    return [run.history for run in runs]


@dataclass(frozen=True, slots=True)
class _Prepared:
    rewards: torch.Tensor  # (B, G) before the KL penalty
    behaviour: BehaviourBatch  # the rewards after it
    loss: BehaviourBatch  # what the loss reads (overlong responses masked)
    hyper: Mapping[str, Any]  # this step's loss hyper-parameters
    metrics: dict[str, float]
    seconds: float  # the behaviour and reference passes and the controls


def _prepare(run: Run, rollout: Rollout, info: DistInfo) -> _Prepared:
    """The exploration bonuses, the behaviour batch (pi_old's view of the rollout, keys by the
    method) and the controls around it: the KL penalty in the reward and the adaptive KL and
    entropy coefficients (``run.controls`` moves to the next step's), overlong masking."""
    cfg, extra = run.cfg, dict(rollout.metrics)
    roll, rewards = rollout.roll, rollout.rewards
    if cfg.explore.ucb_coef > 0 or cfg.explore.batch_coef > 0:
        rewards = control.explore_rewards(roll, rewards, cfg, run.controls.answer_counts, extra)
    t0 = time.perf_counter()
    diversity = rollout_step.diversity(roll, cfg, run.encoder) if "diversity" in run.needs else None
    behaviour = behaviour_batch(run.policy, run.ref_model, roll, rewards, cfg=cfg,
                                needs=run.needs, diversity=diversity)  # fmt: skip
    hyper: Mapping[str, Any] = cfg.loss_hyper
    if cfg.control.kl_in_reward or cfg.control.adaptive_kl:
        behaviour, hyper, run.controls = control.kl_control(
            behaviour, run.ref_model, hyper, cfg, info, run.controls, extra
        )
    loss = behaviour
    if cfg.rollout.mask_truncated:
        loss = control.mask_truncated(behaviour, cfg, run.stop_ids, info, extra)
    if cfg.control.adaptive_entropy:
        hyper, run.controls = control.adapt_entropy(loss, hyper, cfg, info, run.controls, extra)
    return _Prepared(rewards, behaviour, loss, hyper, extra, time.perf_counter() - t0)


def _step_end(
    run: Run, p: _Prepared, update: UpdateResult, step: int, engine: Engine, info: DistInfo
) -> dict[str, float]:
    """The step's metrics of `run`, the sampler synced, and ProRL's reference reset when due
    (the reference becomes the policy; with ``control.reset_optimizer`` AdamW's moments go)."""
    cfg = run.cfg
    metrics = step_metrics(
        p.behaviour, update, cfg=cfg, hyper=p.hyper, lr=run.scheduler.get_last_lr()[0], info=info,
        chart_rewards=p.rewards if cfg.control.kl_in_reward else None,
    )  # fmt: skip
    metrics.update(p.metrics)
    engine.sync(run)
    every = cfg.control.reference_reset_every
    if every and step % every == 0:
        control.reset_reference(run.ref_model, run.policy)
        run.controls = replace(run.controls, reference_step=step)
        if cfg.control.reset_optimizer:
            run.optimizer.state.clear()
    if every:
        metrics["control/reference_step"] = float(run.controls.reference_step)
    return metrics


def _log_and_save(run: Run, metrics: dict[str, float], step: int, info: DistInfo) -> None:
    """Record the step's metrics (history; metrics.jsonl every ``log_every`` steps and at the
    last) and checkpoint every ``save_every`` steps and at the last."""
    cfg = run.cfg
    run.history.append({"step": step, **metrics})
    if run.logger is not None and (step % cfg.run.log_every == 0 or step == cfg.steps):
        run.logger.log(step, metrics)
    if step == cfg.steps or (cfg.run.save_every and step % cfg.run.save_every == 0):
        reset = run.ref_model if (run.controls.reference_step or 0) > 0 else None
        # A method or task of the user's own (--import) records its code: a resume checks it.
        extra = {**(run.controls.state() or {}), **user_code(cfg)}
        state = CheckpointState(step, run.policy, run.tokenizer, run.optimizer, run.scheduler,
                                run.position, extra=extra or None, reference=reset)  # fmt: skip
        save_checkpoint(run.out, state, info, last=step == cfg.steps)
