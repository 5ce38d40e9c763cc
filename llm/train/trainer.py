"""GRPO-family trainer on torch + transformers, driven by `shaping.METHODS`.

`train` is the process engine of the one training loop (`llm.train.loop.train_loop`): one run, in
one process or a torchrun world, sampling through a rollout backend. Each block of a step lives in
its own module:

1. **rollout**: B prompts in a deterministic order (a permutation per data epoch seeded by
   ``(seed, epoch)``; prompts consumed = the resumable data position), G responses each with a
   per-step generator (`llm.run.distributed.generate_shared` over `llm.rollout.backend.make_backend`;
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
import json
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

import shaping
from llm.config import TrainConfig, save_config
from llm.data import check_data_files, data_indices, tiny_config
from llm.eval.diversity import load_encoder
from llm.model.load import load_policy_and_reference
from llm.model.tiny import BUILD_FILE, ensure_base_model
from llm.rollout.backend import RolloutBackendLike, make_backend
from llm.rollout.base import stop_token_ids
from llm.run.checkpoint import (
    CONFIG_CHANGES,
    MetricsLogger,
    check_resume_config,
    find_resume_checkpoint,
    reference_folder,
    restore_checkpoint,
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
from llm.train.behaviour import BehaviourBatch, sampler_is_behaviour
from llm.train.loop import USER_CODE, Engine, Rollout, Run, problems_of, train_loop, user_code
from llm.train.update import UpdateResult, make_optimizer, update_policy

# The names other modules, tests and benchmarks import from here stay importable from here.
__all__ = ["check_user_code", "start_run", "train"]


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
        progress: report the steps on stderr (rank 0; `experiment.cli.progress_bar`): a tqdm
            bar on a terminal, a line per step in a log.
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
    start_run(cfg, out, resume=resume, info=info, change_optimizer=change_optimizer,
              progress=progress)  # fmt: skip
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
    controls = control.Controls.start(cfg, saved, ckpt)
    if ckpt is not None:
        backend.sync_weights(model)  # an engine with its own copy starts from cfg.model_path

    problems = problems_of(cfg, tokenizer)
    needs = shaping.METHODS[cfg.method].needs_for(**cfg.loss_hyper)
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
    run = Run(cfg, out, policy, tokenizer, optimizer, scheduler, position, controls, needs,
              ref_model, encoder, stop_ids, logger)  # fmt: skip

    def sample(step: int, runs: Sequence[Run]) -> list[Rollout]:
        """This rank's share of the step's prompts, G responses each, and their rewards."""
        if cfg.rollout.dynamic_sampling:  # DAPO: rounds of prompts until B mixed groups
            batch_problems, roll, rewards, run.position, extra = rollout_step.dynamic_rollout(
                backend, problems, run.position, cfg, info, step, sampler_stats,
                tokenizer.pad_token_id,
            )  # fmt: skip
            return [Rollout(batch_problems, roll, rewards, extra)]
        idx = data_indices(run.position, cfg.rollout.prompts_per_step, len(problems), cfg.data.seed)
        run.position += cfg.rollout.prompts_per_step
        batch_problems = [problems[i] for i in rank_share(idx, info, per_update)]
        roll = rollout_step.rollout(backend, batch_problems, cfg, info, step, sampler_stats)
        return [Rollout(batch_problems, roll, rollout_step.score(roll, batch_problems, cfg,
                                                                 info.device))]  # fmt: skip

    def update(step: int, runs: Sequence[Run], batches: Sequence[BehaviourBatch],
               hypers: Sequence[Mapping[str, Any]]) -> list[UpdateResult]:  # fmt: skip
        """mu passes over the mini-batches, one optimizer step each."""
        return [update_policy(policy, optimizer, scheduler, batches[0], cfg=cfg, info=info,
                              step=step, hyper=hypers[0])]  # fmt: skip

    engine = Engine(sample, update, sync=lambda run: backend.sync_weights(model))
    last = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    if started is not None:
        started["loop"] = True  # start-up checks passed: from here on the folder holds a run
    return train_loop([run], engine, info=info, start=start, last=last, progress=progress,
                      desc=f"train {cfg.method}")[0]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Run set-up, data order and seeds


def check_user_code(cfg: TrainConfig, ckpt: Path | None) -> None:
    """Refuse to resume from `ckpt` a run of a method or task defined outside the package
    (``--import``) whose file changed since that checkpoint was saved (`llm.train.loop.user_code`,
    which the checkpoint's trainer state records): the run would mix two methods, or two
    rewards. What a checkpoint did not record (the package's methods and tasks, or a checkpoint
    saved before the code was recorded) is not checked.

    Raises:
        ValueError: naming the method or task, the checkpoint and both digests.
    """
    saved, now = trainer_extra(ckpt) or {}, user_code(cfg)
    for key, (what, name) in zip(
        USER_CODE, (("method", cfg.method), ("task", cfg.task)), strict=True
    ):
        if key in saved and saved[key] != now.get(key):
            raise ValueError(
                f"--resume: {what} {name!r}: its code changed since {ckpt} was saved (digest "
                f"{saved[key]} then, {now.get(key)} now; shaping.code_digest): train the edited "
                f"{what} into a fresh folder, or restore its file to resume"
            )


def start_run(
    cfg: TrainConfig,
    out: Path,
    *,
    resume: bool,
    info: DistInfo,
    change_optimizer: bool = False,
    progress: bool = False,
) -> None:
    """Check the launch, write ``config.toml`` (building the tiny base model when asked: with
    `progress` a bar on a terminal, else a line on stderr when the build starts and ends) and seed
    every global RNG.

    Raises:
        ValueError: the mini-batch is not divisible by the number of processes, dynamic sampling
            or the historical exploration bonus under several processes, or a resumed run's
            config differs from the saved one.
        FileNotFoundError, IsADirectoryError: a data file of the config is missing or a folder
            (`llm.data.check_data_files`), before the base model's build.
        ValueError: a resumed run of a method or task of the user's own whose file changed since
            its checkpoint (`check_user_code`).
    """
    check_data_files(cfg)
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
    if resume:
        check_user_code(cfg, find_resume_checkpoint(out, cfg.steps))
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        if changes:
            record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "changes": changes}
            with (out / CONFIG_CHANGES).open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        save_config(cfg, out / "config.toml")
        if cfg.build_base_model:
            check_base_model_folder(cfg.model_path, BUILD_FILE)
            ensure_base_model(cfg.model_path, config=tiny_config(cfg),
                              progress=progress and sys.stderr.isatty())  # fmt: skip
    if info.enabled:
        torch.distributed.barrier()
    if cfg.system.num_threads > 0:
        torch.set_num_threads(cfg.system.num_threads)
    set_matmul_precision(cfg.system.device, cfg.system.tf32)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)  # noqa: NPY002 (seeds the legacy global RNG that libraries use)
    torch.manual_seed(cfg.seed)
