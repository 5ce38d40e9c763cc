"""GRPO-family trainer on torch + transformers, driven by `shaping.METHODS` (issue 5).

`train` is one CleanRL-style loop; each block of a step lives in its own module:

1. **rollout**: B prompts in a deterministic order (a permutation per data epoch seeded by
   ``(seed, epoch)``; prompts consumed = the resumable data position), G responses each with a
   per-step generator (`llm.run.distributed.generate_shared` over `llm.model.load.make_backend`;
   `llm.train.rollout_step`, with DAPO's dynamic sampling);
2. **score**: the task's verifier gives ``rewards (B, G)`` (`llm.train.rollout_step.score`);
3. **behaviour batch** (`llm.train.behaviour`): a no-grad forward of pi_old on prompt + response
   (`llm.model.forward`): ``logp_old (B, G, T)``, token entropy, top-N candidates (CaSP, Lambda^(n)),
   prompt log-probs (ProGRPO); ``logp_ref`` from the frozen base model when ``kl_coef > 0``;
   DSDR's ``diversity (B, G)`` (`llm.eval.diversity`). The keys built are the method's needs;
   the driver-level controls (`llm.train.control`) act around it: the KL penalty in the reward,
   the adaptive KL and entropy coefficients, overlong masking, and after the update the
   reference reset;
4. **update** (`llm.train.update`): mu inner epochs, each ONE optimizer step per mini-batch with
   gradients accumulated over micro-batches (`accumulate_gradients`, exact for every method),
   clipping, AdamW and a warm-up + decay schedule;
5. **log and checkpoint** (`llm.run.checkpoint`): metrics.jsonl / TensorBoard, and atomic checkpoints
   that a resumed run continues exactly (weights, optimizer, scheduler, RNG, data position).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

import shaping
from llm.config import TrainConfig, save_config
from llm.data import data_indices, drop_long_prompts, load_train_problems, tiny_config
from llm.eval.diversity import load_encoder
from llm.model.load import (
    load_policy_and_reference,
)
from llm.model.tiny import BUILD_FILE, ensure_base_model
from llm.rollout.backend import RolloutBackendLike, make_backend
from llm.rollout.base import stop_token_ids
from llm.run.checkpoint import (
    CONFIG_CHANGES,
    CheckpointState,
    MetricsLogger,
    check_resume_config,
    find_resume_checkpoint,
    reference_folder,
    restore_checkpoint,
    save_checkpoint,
    trainer_extra,
    weights_folder,
)
from llm.run.distributed import (
    DistInfo,
    broadcast_object,
    init_distributed,
    rank_share,
    set_matmul_precision,
    wrap_policy,
    wrap_reference,
)
from llm.run.folder import (
    LOCK_FILE,
    RunLock,
    check_base_model_folder,
    claim_run_folder,
    restore_files,
    snapshot_files,
)
from llm.train import control, rollout_step
from llm.train.behaviour import (
    behaviour_batch,
    sampler_is_behaviour,
)
from llm.train.update import (
    make_optimizer,
    step_metrics,
    update_policy,
)

# The names other modules, tests and benchmarks import from here stay importable from here.
__all__ = ["start_run", "train"]


def train(
    cfg: TrainConfig,
    out_dir: str | os.PathLike[str],
    *,
    resume: bool = False,
    backend_factory: Callable[[TrainConfig, Any, Any], RolloutBackendLike] | None = None,
    stop_after: int | None = None,
    progress: bool = True,
    move_aside: bool = False,
    change_optimizer: bool = False,
) -> list[dict[str, float]]:
    """Train `cfg` into `out_dir`; returns the metrics of the steps run by this call.

    Writes ``DIR/config.toml``, ``DIR/metrics.jsonl`` (one line per logged step),
    ``DIR/tb/`` (TensorBoard) and ``DIR/checkpoints/step_NNNNNN/`` (model + tokenizer via
    `save_pretrained`, and ``trainer_state.pt``: optimizer, scheduler, RNG states, data
    position, step, the controls' state; ``reference/`` once the KL reference was reset) every
    `save_every` steps and at the last step; under FSDP2 sharded
    (`llm.run.checkpoint`), the last one with a Hugging Face export that ``llm eval --model`` reads.

    Under ``torchrun --nproc_per_node W`` each of the W processes samples and scores
    ``prompts_per_step / W`` of the step's prompts, the update is the single-process update of the
    global batch (`accumulate_gradients`), the policy is wrapped by DDP or FSDP2 (``parallel``),
    and rank 0 logs and writes checkpoints (FSDP2: every rank writes its shards).

    Args:
        resume: continue from the newest checkpoint in `out_dir` (fresh start if none); the
            config must equal the saved one except `steps`.
        backend_factory: ``(cfg, model, tokenizer) -> backend``; default `make_backend`.
        stop_after: stop after this step without saving (simulates a kill; tests use it).
        progress: show a tqdm bar (rank 0).
        move_aside: a fresh run into a folder holding a run renames that run's folder to
            ``DIR.old-<time>`` instead of refusing (`llm.run.folder.claim_run_folder`); the
            folder's lock is taken first, so a folder in use by a live run is never moved.
        change_optimizer: with `resume`, the `llm.run.checkpoint.OPTIMIZER_KEYS` may differ from
            the saved config (e.g. a lower lr after a non-finite stop); the change is appended
            to ``DIR/config_changes.jsonl``, the new config saved, and the new settings applied
            over the checkpoint's (`llm.run.checkpoint.restore_checkpoint`).

    A fresh run whose start fails (a bad device, data file or base-model folder; any error
    before its first step) removes what it wrote, so the corrected command starts normally; a
    resume whose start fails (e.g. ``--steps`` below its checkpoint) puts ``config.toml`` and
    ``config_changes.jsonl`` back as they were.

    Raises:
        ValueError: invalid config, `change_optimizer` without `resume`, a resumed run whose
            config differs, or a mini-batch
            (``prompts_per_update``, else ``prompts_per_step``) not divisible by the number of
            processes.
        FileNotFoundError: the model folder does not exist.
        llm.run.folder.RunFolderError: `out_dir` holds another run (without `resume`), is in use
            by a live process, or `build_base_model` would replace a folder it did not build.
        llm.run.folder.NonFiniteError: a loss, gradient norm or parameter became NaN/inf (the
            newest checkpoint is then the last good state).
    """
    if change_optimizer and not resume:
        raise ValueError("--change-optimizer: only with --resume (it changes a resumed run)")
    info = init_distributed(cfg.system.device, vllm=cfg.rollout.backend == "vllm")
    out = Path(out_dir)
    lock = RunLock(out) if info.is_main else None
    created = not out.exists()
    before: set[str] = set()
    kept: dict[str, bytes | None] = {}
    started = {"loop": False}
    if lock is not None:
        # The lock first: a folder in use by a live process is refused before anything in it is
        # read, moved or written (--move-aside included).
        lock.acquire()
        try:
            moved = claim_run_folder(out, resume=resume, move_aside=move_aside)
            if moved is not None:  # our lock file went along with the old run: take a new one
                (moved / LOCK_FILE).unlink(missing_ok=True)
                lock.held = False
                lock.acquire()
        except BaseException:
            lock.release()
            raise
        before = {p.name for p in out.iterdir()}
        # A refused resume (a step past --steps, a bad data file) leaves its files as they were.
        kept = snapshot_files(out, ("config.toml", CONFIG_CHANGES)) if resume else {}
    try:
        return _train(
            cfg, out, info, resume, backend_factory, stop_after, progress, change_optimizer, started
        )
    except BaseException:
        if lock is not None and not started["loop"]:
            if resume:
                restore_files(out, kept)
            else:
                _undo_failed_start(out, before)
        raise
    finally:
        if lock is not None:
            lock.release()
            if created and not resume and not started["loop"] and out.is_dir():
                with contextlib.suppress(OSError):
                    out.rmdir()  # only when empty


def _undo_failed_start(out: Path, before: set[str]) -> None:
    """Remove what a fresh run wrote into `out` before its first step (config.toml, an empty
    metrics.jsonl, tb/), keeping whatever the folder held before and the lock."""
    for p in out.iterdir():
        if p.name in before or p.name == LOCK_FILE:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _train(
    cfg: TrainConfig,
    out: Path,
    info: DistInfo,
    resume: bool,
    backend_factory: Callable[[TrainConfig, Any, Any], RolloutBackendLike] | None,
    stop_after: int | None,
    progress: bool,
    change_optimizer: bool = False,
    started: dict[str, bool] | None = None,
) -> list[dict[str, float]]:
    start_run(cfg, out, resume=resume, info=info, change_optimizer=change_optimizer)
    ckpt = find_resume_checkpoint(out, cfg.steps) if resume and info.is_main else None
    ckpt = broadcast_object(ckpt, info)
    saved = trainer_extra(ckpt)
    model, tokenizer, ref_model = load_policy_and_reference(
        cfg, weights_folder(ckpt, cfg.model_path), info.device,
        ref_path=reference_folder(ckpt, saved) if cfg.uses_reference else None,
    )  # fmt: skip
    policy = wrap_policy(model, info, cfg.system.parallel, cfg.system.precision)
    ref_model = wrap_reference(ref_model, info, cfg.system.parallel)
    backend = (backend_factory or make_backend)(cfg, model, tokenizer)
    optimizer, scheduler = make_optimizer(cfg, policy)
    # Loads a sharded (FSDP2) checkpoint's weights too, so the engine is synced after it.
    start, position = restore_checkpoint(ckpt, policy, optimizer, scheduler, info)
    ctl = control.Controls.start(cfg, saved, ckpt)
    if ckpt is not None:
        backend.sync_weights(model)  # an engine with its own copy starts from cfg.model_path

    problems = load_train_problems(cfg, tokenizer)
    if cfg.rollout.max_prompt_tokens > 0:
        problems = drop_long_prompts(problems, cfg, tokenizer)
    hyper = cfg.loss_hyper
    needs = shaping.METHODS[cfg.method].needs_for(**hyper)
    encoder = None
    if "diversity" in needs:  # the sentence encoder loads only for DSDR
        encoder = load_encoder(info.device)
    # Only a sampler that declares it draws from exactly pi_old can replace the behaviour pass.
    from_policy = getattr(backend, "samples_from_policy", False) is True
    sampler_stats = from_policy and sampler_is_behaviour(cfg, needs)
    per_update = cfg.optim.prompts_per_update or cfg.rollout.prompts_per_step
    stop_ids: list[int] = []  # read only for overlong masking (the model folder's EOS ids)
    if cfg.rollout.mask_truncated:
        stop_ids = getattr(backend, "stop_token_ids", None) or stop_token_ids(
            tokenizer, cfg.model_path
        )

    logger = (
        MetricsLogger(out, tensorboard=cfg.run.tensorboard, start_step=start)
        if info.is_main
        else None
    )
    history: list[dict[str, float]] = []
    last = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    steps = range(start + 1, last + 1)
    bar = tqdm(steps, disable=not (progress and info.is_main), desc=f"train {cfg.method}")
    if started is not None:
        started["loop"] = True  # start-up checks passed: from here on the folder holds a run
    try:
        for step in bar:
            # Rollout: this rank's share of the step's prompts, G responses each.
            t0 = time.perf_counter()
            extra: dict[str, float] = {}
            if cfg.rollout.dynamic_sampling:  # DAPO: rounds of prompts until B mixed groups
                batch_problems, roll, rewards, position, extra = rollout_step.dynamic_rollout(
                    backend, problems, position, cfg, info, step, sampler_stats,
                    tokenizer.pad_token_id,
                )  # fmt: skip
            else:
                idx = data_indices(
                    position, cfg.rollout.prompts_per_step, len(problems), cfg.data.seed
                )
                position += cfg.rollout.prompts_per_step
                batch_problems = [problems[i] for i in rank_share(idx, info, per_update)]
                roll = rollout_step.rollout(backend, batch_problems, cfg, info, step, sampler_stats)
            t_roll = time.perf_counter()

            # Score, then the behaviour batch: pi_old's view of the rollout, keys by the method.
            if not cfg.rollout.dynamic_sampling:
                rewards = rollout_step.score(roll, batch_problems, cfg, info.device)
            if cfg.explore.ucb_coef > 0 or cfg.explore.batch_coef > 0:
                rewards = control.explore_rewards(roll, rewards, cfg, ctl.answer_counts, extra)
            t_behaviour = time.perf_counter()
            diversity = rollout_step.diversity(roll, cfg, encoder) if "diversity" in needs else None
            behaviour = behaviour_batch(
                policy, ref_model, roll, rewards, cfg=cfg, needs=needs, diversity=diversity
            )
            t_old = time.perf_counter()

            # Update: mu passes over the mini-batches, one optimizer step each, on the loss batch
            # (KL penalty in the reward, overlong responses masked) with this step's KL and
            # entropy coefficients.
            step_hyper: Mapping[str, Any] = hyper
            if cfg.control.kl_in_reward or cfg.control.adaptive_kl:
                behaviour, step_hyper, ctl = control.kl_control(
                    behaviour, ref_model, hyper, cfg, info, ctl, extra
                )
            loss_batch = behaviour
            if cfg.rollout.mask_truncated:
                loss_batch = control.mask_truncated(behaviour, cfg, stop_ids, info, extra)
            if cfg.control.adaptive_entropy:
                step_hyper, ctl = control.adapt_entropy(
                    loss_batch, step_hyper, cfg, info, ctl, extra
                )
            update = update_policy(
                policy, optimizer, scheduler, loss_batch, cfg=cfg, info=info, step=step,
                hyper=step_hyper,
            )  # fmt: skip
            t_upd = time.perf_counter()

            # Log and checkpoint.
            lr = scheduler.get_last_lr()[0]
            metrics = step_metrics(
                behaviour, update, cfg=cfg, hyper=step_hyper, lr=lr, info=info,
                chart_rewards=rewards if cfg.control.kl_in_reward else None,
            )  # fmt: skip
            metrics.update(extra)
            backend.sync_weights(model)
            every = cfg.control.reference_reset_every
            if every and step % every == 0:  # ProRL: the reference becomes the policy
                control.reset_reference(ref_model, policy)
                ctl = dataclasses.replace(ctl, reference_step=step)
                if cfg.control.reset_optimizer:
                    optimizer.state.clear()
            if every:
                metrics["control/reference_step"] = float(ctl.reference_step)
            t_end = time.perf_counter()
            metrics.update(
                {
                    "time/logprob": t_old - t_behaviour,
                    "time/optim": t_upd - t_old,
                    "time/rollout": t_roll - t0,
                    "time/update": t_end - t_roll,
                    "time/step": t_end - t0,
                    "charts/prompts_seen": float(position),
                }
            )
            history.append({"step": step, **metrics})
            if logger is not None and (step % cfg.run.log_every == 0 or step == cfg.steps):
                logger.log(step, metrics)
            bar.set_postfix(reward=f"{metrics['charts/reward_mean']:.3f}")
            if step == cfg.steps or (cfg.run.save_every and step % cfg.run.save_every == 0):
                reset = ref_model if (ctl.reference_step or 0) > 0 else None
                state = CheckpointState(step, policy, tokenizer, optimizer, scheduler, position,
                                        extra=ctl.state(), reference=reset)  # fmt: skip
                save_checkpoint(out, state, info, last=step == cfg.steps)
    finally:
        if logger is not None:
            logger.close()
    return history


# ---------------------------------------------------------------------------------------------
# Run set-up, data order and seeds


def start_run(
    cfg: TrainConfig, out: Path, *, resume: bool, info: DistInfo, change_optimizer: bool = False
) -> None:
    """Check the launch, write ``config.toml`` (building the tiny base model when asked) and seed
    every global RNG.

    Raises:
        ValueError: the mini-batch is not divisible by the number of processes, dynamic sampling
            or the historical exploration bonus under several processes, or a resumed run's
            config differs from the saved one.
    """
    per_update = cfg.optim.prompts_per_update or cfg.rollout.prompts_per_step
    if per_update % info.world_size:
        name = "prompts_per_update" if cfg.optim.prompts_per_update else "prompts_per_step"
        raise ValueError(
            f"{name}: {per_update} is not divisible by the {info.world_size} processes (each "
            "rank takes whole groups of every mini-batch)"
        )
    if info.world_size > 1 and (cfg.rollout.dynamic_sampling or cfg.explore.ucb_coef > 0):
        raise ValueError(
            "rollout.dynamic_sampling and explore.ucb_coef run in one process only (the "
            "resampling rounds and the answer counts are not shared between ranks)"
        )
    changes = check_resume_config(cfg, out, change_optimizer=change_optimizer) if resume else {}
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        if changes:
            record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "changes": changes}
            with (out / CONFIG_CHANGES).open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        save_config(cfg, out / "config.toml")
        if cfg.build_base_model:
            check_base_model_folder(cfg.model_path, BUILD_FILE)
            ensure_base_model(cfg.model_path, config=tiny_config(cfg))
    if info.enabled:
        torch.distributed.barrier()
    if cfg.system.num_threads > 0:
        torch.set_num_threads(cfg.system.num_threads)
    set_matmul_precision(cfg.system.device, cfg.system.tf32)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)  # noqa: NPY002 (seeds the legacy global RNG that libraries use)
    torch.manual_seed(cfg.seed)
