"""Batched runs: R training runs of one base model as one program, the stacked engine of the one
training loop (`llm.train.loop.train_loop`: this module brings the sampling and the gradient pass).

Each run keeps everything a run of `llm.train.trainer.train` has: its own model (a transformers
`LlamaForCausalLM`), AdamW, schedule, data position, seed, run folder, metrics.jsonl and atomic
checkpoints that `train(..., resume=True)` or this function resumes. What the runs share is the
arithmetic: every step's sampling (`llm.rollout.stacked.sample_groups`: one stacked pass of all
runs' prompts, a KV-cached decode of all runs' rows) and every gradient pass
(`stacked_policy_forward`: one forward + backward of all runs' rows with the weights stacked
along a run axis, `llm.model.stacked`). The loss of each run is its own shaping loss
(`llm.train.update.leaf_gradients`, the method and coefficients of that run); the backward pass
of the stacked surrogate ``sum_r sum_k <d loss_r / d q_k, q_k>`` puts into each model's
``.grad`` exactly the gradient of its own loss (the runs' parameters are disjoint). Each run then
takes its own clipped AdamW step.

Per-run randomness: run r samples step s with a generator on the models' device seeded with
``step_seed(seed_r, s)``, so a run trained in a batch equals the same run trained alone by this
function (`tests/llm/test_batched.py`, on the CPU: equal completions and parameters, to the bit;
on a GPU the kernels' choice may depend on the batch, and the GPU path has a `-m gpu` test that
has not run yet). The stream differs from `train`'s (transformers' `generate` draws from
the global RNG), so a batched run and a `train` run of one config are different samples of the
same procedure; sweeps record which engine trained a run (``engine`` in ``sweep_run.json``).

Which runs can share a batch (`batch_key`): equal configs up to `PER_RUN` (seed, method,
coefficients, KL, optimizer settings); which configs can be batched at all (`batchable`): the
transformers backend without parallelism, on any ``system.device`` and in any
``system.precision`` (``bf16``: bfloat16 weights; ``bf16-mixed``: the gradient passes under
bfloat16 autocast, as the process engine's), and a `StackedLM` architecture (activation
checkpointing included: `StackedLM(checkpointing=True)`; a sweep of a model folder it cannot stack
is refused before any run, `llm.orchestrate.sweep.check_engine`). With DAPO dynamic sampling each round
samples the runs still short of B mixed groups (`llm.train.rollout_step.DynamicRounds`), so runs
draw their own numbers of rounds, each as alone.
Every method and every other control (`llm.train.loop`) trains in a batch as alone, to the bit
(tests/llm/test_batched.py). Anything else trains alone in its own process
(`llm.orchestrate.jobs`).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import shaping
from llm.config import TrainConfig
from llm.data import Problem, data_indices
from llm.eval.diversity import load_encoder
from llm.model.forward import PolicyOutputs, slice_outputs
from llm.model.load import load_model, load_model_and_tokenizer, reference_precision
from llm.model.stacked import StackedLM, check_stackable, stacked_policy_forward
from llm.rollout.base import Sampling, stop_token_ids
from llm.rollout.stacked import left_pad, sample_groups
from llm.run.checkpoint import (
    MetricsLogger,
    find_resume_checkpoint,
    reference_folder,
    restore_checkpoint,
    trainer_extra,
    weights_folder,
)
from llm.run.distributed import DistInfo, check_device
from llm.run.folder import RunLock, claim_run_folder
from llm.tasks import TASKS
from llm.train.behaviour import BehaviourBatch, sampler_is_behaviour
from llm.train.control import Controls
from llm.train.loop import Engine, Rollout, Run, problems_of, train_loop
from llm.train.rollout_step import DynamicRounds, score, step_seed
from llm.train.trainer import start_run
from llm.train.update import UpdateResult, leaf_gradients, make_optimizer, optimizer_step

__all__ = [
    "PER_RUN",
    "VERSION",
    "batch_key",
    "batchable",
    "train_batch",
]

Tensor = torch.Tensor

PER_RUN: tuple[str, ...] = (
    "seed",
    "method",
    "hyper",
    "kl_coef",
    "entropy_coef",
    "optim.lr",
    "optim.weight_decay",
    "optim.adam_betas",
    "optim.max_grad_norm",
    "optim.schedule",
    "optim.warmup_steps",
)
"""Config keys that may differ between the runs of one batch; all others must be equal."""

VERSION = 2
"""The batched trainer's arithmetic, recorded in run markers and evaluation keys so that runs of
another version are trained again, not reused: 2 pads responses to ``max_new_tokens``, so that
a run's training does not depend on its batch-mates (`_batch_tensors`; its stacked evaluation
neither, since `llm.rollout.stacked.VERSION` 2); 1 padded to the batch's longest response."""


def batch_key(cfg: TrainConfig) -> str:
    """A string equal for two configs exactly when they may share a batch (`PER_RUN` aside)."""
    d = dataclasses.asdict(cfg)
    for key in PER_RUN:
        table, _, name = key.rpartition(".")
        (d[table] if table else d).pop(name)
    return repr(sorted(d.items()))


def batchable(cfg: TrainConfig) -> str | None:
    """None when `cfg` can train in a batch, else the reason it cannot (module docstring)."""
    if cfg.rollout.backend != "transformers":
        return f"rollout.backend {cfg.rollout.backend!r} (transformers only)"
    if cfg.system.parallel not in ("none", "auto"):
        return f"system.parallel {cfg.system.parallel!r}"
    return None


def _batch_tensors(
    behaviours: Sequence[BehaviourBatch], start: int, stop: int, cand_n: int, t_max: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, list[int]]:
    """Prompt groups ``start:stop`` of every run, padded to common widths: prompts (R * B', P)
    on the left, responses (R * B', G, `t_max`) and candidates (R * B' * G, `t_max`, N) on the
    right. Returns them and each run's own T.

    `t_max` is the config's ``max_new_tokens``, not the batch's longest response: the weight
    gradients sum over rows × positions, and a wider row moves where each row's positions fall
    in those sums, so padding to the batch-mates' widths would change a run's bytes with its
    batch (measured: the same run alone and in a batch of 6 parted at step 3)."""
    g = behaviours[0].shape[1]
    p_ids, p_mask, r_ids, r_mask, cands, widths = [], [], [], [], [], []
    p_max = max(beh.rows.prompt_len for beh in behaviours)
    longest = max(beh.shape[2] for beh in behaviours)
    if longest > t_max:
        raise ValueError(f"responses of {longest} tokens exceed max_new_tokens = {t_max}")
    for beh in behaviours:
        rows = beh.rows.slice(start * g, stop * g)
        p, t = rows.prompt_len, beh.shape[2]
        widths.append(t)
        # Zeros (the pad id's place in ids, 0 in masks) to the common widths: prompts on the
        # left, responses (B', G, T) and candidates (B' G, T, N) on the right.
        p_ids.append(F.pad(rows.input_ids[::g, :p], (p_max - p, 0)))
        p_mask.append(F.pad(rows.attention_mask[::g, :p], (p_max - p, 0)))
        r_ids.append(F.pad(rows.response_ids.reshape(-1, g, t), (0, t_max - t)))
        r_mask.append(F.pad(rows.response_mask.reshape(-1, g, t), (0, t_max - t)))
        if cand_n:
            c = beh.old.cand_ids
            dev = rows.input_ids.device
            c = torch.zeros(len(rows), t, cand_n, dtype=torch.long, device=dev) if c is None else c[
                start * g : stop * g, :, :cand_n]  # fmt: skip
            cands.append(F.pad(c, (0, cand_n - c.shape[2], 0, t_max - t)))
    return (
        torch.cat(p_ids),
        torch.cat(p_mask),
        torch.cat(r_ids),
        torch.cat(r_mask),
        torch.cat(cands) if cand_n else None,
        widths,
    )


def _update_runs(
    lm: StackedLM,
    optimizers: Sequence[torch.optim.Optimizer],
    schedulers: Sequence[Any],
    behaviours: Sequence[BehaviourBatch],
    cfgs: Sequence[TrainConfig],
    step: int,
    hypers: Sequence[Mapping[str, Any]] | None = None,
) -> list[UpdateResult]:
    """`llm.train.update.update_policy` of every run, the gradient passes stacked; `hypers`
    (default: each config's ``loss_hyper``) are the runs' hyper-parameters of this step."""
    cfg0 = cfgs[0]
    hypers = [c.loss_hyper for c in cfgs] if hypers is None else hypers
    needs = [shaping.METHODS[c.method].needs_for(**h) for c, h in zip(cfgs, hypers, strict=True)]
    want_entropy = any("entropy" in n for n in needs)
    cand_n = max((c.n_candidates for c, n in zip(cfgs, needs, strict=True)
                  if "cand_logp" in n), default=0)  # fmt: skip
    b, g, _ = behaviours[0].shape
    per_update = cfg0.optim.prompts_per_update or cfg0.rollout.prompts_per_step
    results = [UpdateResult() for _ in cfgs]
    temperature, precision = cfg0.rollout.temperature, cfg0.system.precision
    for epoch in range(cfg0.optim.inner_epochs):
        for start in range(0, b, per_update):
            stop = min(start + per_update, b)
            rows_per_run = (stop - start) * g
            batch = _batch_tensors(behaviours, start, stop, cand_n, cfg0.rollout.max_new_tokens)
            p_ids, p_mask, r_ids, r_mask, cands, widths = batch
            if epoch == 0 and start == 0:
                currents = [slice_outputs(beh.old, 0, rows_per_run) for beh in behaviours]
            else:  # the parameters moved since the behaviour pass
                with torch.no_grad():
                    now = stacked_policy_forward(
                        lm, p_ids, p_mask, r_ids, r_mask, temperature=temperature,
                        want_entropy=want_entropy, cand_ids=cands, precision=precision,
                    )  # fmt: skip
                currents = [_run_outputs(now, i, rows_per_run, widths[i], cfgs[i].n_candidates)
                            for i in range(len(cfgs))]  # fmt: skip
            losses, leaf_grads = [], []
            for i, (cfg, beh) in enumerate(zip(cfgs, behaviours, strict=True)):
                optimizers[i].zero_grad(set_to_none=True)
                fixed = {k: v[start:stop] for k, v in beh.fixed.items()}
                loss, metrics, _, leaves = leaf_gradients(
                    fixed, currents[i], method=cfg.method, hyper=hypers[i]
                )
                losses.append((loss, metrics))
                leaf_grads.append(leaves)
            out = stacked_policy_forward(
                lm, p_ids, p_mask, r_ids, r_mask, temperature=temperature,
                want_entropy=want_entropy, cand_ids=cands, precision=precision,
            )  # fmt: skip
            surrogate = _surrogate(out, leaf_grads, rows_per_run, widths)
            surrogate.backward()
            for i, cfg in enumerate(cfgs):
                loss, metrics = losses[i]
                optimizer_step(lm.models[i], optimizers[i], schedulers[i], loss, metrics, cfg=cfg,
                               step=step, result=results[i])  # fmt: skip
    return results


def _run_outputs(out: PolicyOutputs, i: int, rows: int, width: int, n_cand: int) -> PolicyOutputs:
    """Run `i`'s rows of a stacked `PolicyOutputs`, trimmed to its own T and N."""
    sl = slice(i * rows, (i + 1) * rows)

    def part(x: Tensor | None, n: int = 0) -> Tensor | None:
        if x is None:
            return None
        y = x[sl, :width]
        return y[..., :n] if n else y

    return PolicyOutputs(
        logp=part(out.logp),
        entropy=part(out.entropy),
        cand_ids=part(out.cand_ids, n_cand) if n_cand else None,
        cand_logp=part(out.cand_logp, n_cand) if n_cand else None,
    )


def _surrogate(
    out: PolicyOutputs, leaf_grads: Sequence[dict[str, Tensor]], rows: int, widths: Sequence[int]
) -> Tensor:
    """``sum_r sum_k <leaf_grads[r][k], q_k(run r)>``: its gradient with respect to run r's
    parameters is the gradient of run r's loss (`llm.train.update.accumulate_gradients`)."""
    total = out.logp.new_zeros(())
    for i, leaves in enumerate(leaf_grads):
        sl = slice(i * rows, (i + 1) * rows)
        for key, grad in leaves.items():
            q = getattr(out, key)[sl, : widths[i]]
            if key == "cand_logp":
                q = q[..., : grad.shape[-1]]
            total = total + (q * grad).sum()
    return total


# ---------------------------------------------------------------------------------------------
# The loop


def train_batch(
    cfgs: Sequence[TrainConfig],
    outs: Sequence[str | os.PathLike[str]],
    *,
    resume: bool = False,
    progress: bool = False,
    stop_after: int | None = None,
) -> list[list[dict[str, float]]]:
    """Train the runs `cfgs` into the folders `outs` as one batch; returns each run's metrics of
    the steps run by this call.

    Every folder gets what `llm.train.trainer.train` writes (config.toml, metrics.jsonl,
    checkpoints with model, tokenizer and trainer state), plus ``time/batch_runs`` (R) in the
    metrics; ``time/*`` are the batch's wall-clock seconds per step, shared by its runs.

    Args:
        resume: continue every run from its newest checkpoint (all at the same step).
        stop_after: stop after this step without saving (tests simulate a kill with it).

    Raises:
        ValueError: no runs, as many folders as configs not given, a config that cannot be
            batched (`batchable`) or differs from the first outside `PER_RUN`, a
            ``system.device`` that cannot run here (`llm.run.distributed.check_device`; before
            any folder is touched), or resumed runs at different steps.
        llm.run.folder.RunFolderError: a folder in use, or holding another run (without `resume`).
        llm.run.folder.NonFiniteError: a run's loss, gradient norm or parameters became
            non-finite (every run stops; each newest checkpoint is a good state).
    """
    if not cfgs or len(cfgs) != len(outs):
        raise ValueError(f"cfgs, outs: expected as many folders as configs (>= 1), got "
                         f"{len(cfgs)} and {len(outs)}")  # fmt: skip
    key = batch_key(cfgs[0])
    for i, cfg in enumerate(cfgs):
        reason = batchable(cfg)
        if reason is not None:
            raise ValueError(f"cfgs[{i}]: cannot train in a batch: {reason}")
        if batch_key(cfg) != key:
            raise ValueError(
                f"cfgs[{i}]: differs from cfgs[0] outside the per-run keys {', '.join(PER_RUN)}"
            )
    check_device(cfgs[0].system.device)
    folders = [Path(o) for o in outs]
    if len(set(folders)) != len(folders):
        raise ValueError("outs: every run needs its own folder")
    locks = [RunLock(f) for f in folders]
    try:
        for lock, folder in zip(locks, folders, strict=True):
            lock.acquire()
            claim_run_folder(folder, resume=resume, move_aside=False)
        return _train_batch(list(cfgs), folders, resume, progress, stop_after)
    finally:
        for lock in locks:
            if lock.held:
                lock.release()


def _train_batch(
    cfgs: list[TrainConfig],
    outs: list[Path],
    resume: bool,
    progress: bool,
    stop_after: int | None,
) -> list[list[dict[str, float]]]:
    cfg0 = cfgs[0]
    info = DistInfo(device=cfg0.system.device)
    device = info.device
    for cfg, out in zip(cfgs, outs, strict=True):
        start_run(cfg, out, resume=resume, info=info, progress=progress)
    base_ref = None  # the base model, the KL reference of every run that has not reset its own
    if any(c.uses_reference for c in cfgs):
        base_ref = load_model(cfg0.model_path, device, reference_precision(cfg0))
        base_ref.requires_grad_(False)
    encoder = load_encoder(device) if any(_needs(c) & {"diversity"} for c in cfgs) else None
    runs, starts = [], []
    for cfg, out in zip(cfgs, outs, strict=True):
        ckpt = find_resume_checkpoint(out, cfg.steps) if resume else None
        saved = trainer_extra(ckpt)
        model, tokenizer = load_model_and_tokenizer(weights_folder(ckpt, cfg.model_path), device,
                                                    cfg.system.precision)  # fmt: skip
        optimizer, scheduler = make_optimizer(cfg, model)
        start, position = restore_checkpoint(ckpt, model, optimizer, scheduler, info)
        ref = base_ref if cfg.uses_reference else None
        if ref is not None and cfg.control.reference_reset_every:  # its own, reset in place
            folder = reference_folder(ckpt, saved)
            ref = (copy.deepcopy(base_ref) if folder is None
                   else load_model(folder, device, reference_precision(cfg)))  # fmt: skip
            ref.requires_grad_(False)
        runs.append(Run(cfg, out, model, tokenizer, optimizer, scheduler, position,
                        Controls.start(cfg, saved, ckpt), _needs(cfg), ref, encoder))  # fmt: skip
        starts.append(start)
    if len(set(starts)) != 1:
        raise ValueError(f"resume: the runs stopped at different steps {starts}; resume them "
                         "one by one (or in batches of equal steps)")  # fmt: skip
    models = [run.policy for run in runs]
    check_stackable(models)
    lm = StackedLM(models, checkpointing=cfg0.system.gradient_checkpointing)
    problems = problems_of(cfg0, tokenizer)
    task = TASKS[cfg0.task]
    # The prompts' width is fixed by the problem set, so a run's arithmetic does not depend on
    # which other runs share its batch.
    width = left_pad(tokenizer, [task.prompt(p, cfg0.template) for p in problems])[0].shape[1]
    stops = stop_token_ids(tokenizer, cfg0.model_path)
    for run in runs:
        run.stop_ids = stops
        run.logger = MetricsLogger(run.out, tensorboard=run.cfg.run.tensorboard,
                                   start_step=starts[0])  # fmt: skip
    # The sampler's statistics serve the runs whose behaviour they are; the others (ProGRPO's
    # prompt log-probs) take the behaviour pass, so no run depends on its batch-mates.
    sampler_stats = any(sampler_is_behaviour(r.cfg, r.needs) for r in runs)
    n_cand = max(c.n_candidates for c in cfgs)
    b = cfg0.rollout.prompts_per_step
    sampling = Sampling(
        cfg0.rollout.max_new_tokens, temperature=cfg0.rollout.temperature,
        top_p=cfg0.rollout.top_p, top_n=n_cand if sampler_stats else 0, want_entropy=sampler_stats,
    )  # fmt: skip

    def draw(step: int, runs: Sequence[Run], batch_problems: Sequence[list[Problem]],
             round_: int = 0) -> list[tuple[Any, Tensor]]:  # fmt: skip
        """The runs' rollouts of their problems, sampled in one stacked program (run r from its
        own generator seeded by its seed, the step and the dynamic-sampling round) and their
        rewards; each run's candidates trimmed to its own N."""
        stack = lm if len(runs) == len(lm.models) else StackedLM([r.policy for r in runs])
        generators = [torch.Generator(device=lm.device).manual_seed(
            step_seed(r.cfg.seed, step, round_=round_)) for r in runs]  # fmt: skip
        rolls = sample_groups(
            stack, tokenizer, [[task.prompt(p, cfg0.template) for p in ps] for ps in batch_problems],
            cfg0.rollout.group_size, sampling, generators=generators, stop_token_ids=stops,
            prompt_width=width,
        )  # fmt: skip
        out = []
        for run, ps, roll in zip(runs, batch_problems, rolls, strict=True):
            n = run.cfg.n_candidates
            if roll.cand_ids is not None and n < n_cand:
                roll = dataclasses.replace(roll, cand_ids=roll.cand_ids[..., :n],
                                           cand_logp=roll.cand_logp[..., :n])  # fmt: skip
            out.append((roll, score(roll, ps, run.cfg, device)))
        return out

    def sample(step: int, runs: Sequence[Run]) -> list[Rollout]:
        """Every run's next B prompts and their rewards (`draw`); with dynamic sampling, rounds
        of the runs still short of B mixed groups, each run's rounds as alone (`DynamicRounds`)."""
        if not cfg0.rollout.dynamic_sampling:
            batch_problems = []
            for run in runs:
                idx = data_indices(run.position, b, len(problems), run.cfg.data.seed)
                run.position += b
                batch_problems.append([problems[j] for j in idx])
            return [Rollout(ps, roll, rewards) for ps, (roll, rewards)
                    in zip(batch_problems, draw(step, runs, batch_problems), strict=True)]  # fmt: skip
        states = [DynamicRounds(problems, run.position, run.cfg) for run in runs]
        while active := [i for i, st in enumerate(states) if not st.done]:
            round_ = len(states[active[0]].rounds)  # the runs still drawing are all at it
            drawn = [states[i].next_problems() for i in active]
            rolls = draw(step, [runs[i] for i in active], drawn, round_)
            for i, ps, (roll, rewards) in zip(active, drawn, rolls, strict=True):
                states[i].add(ps, roll, rewards)
        out = []
        for run, st in zip(runs, states, strict=True):
            run.position = st.position
            ps, roll, rewards, metrics = st.result(tokenizer.pad_token_id)
            out.append(Rollout(ps, roll, rewards, metrics))
        return out

    def update(step: int, runs: Sequence[Run], batches: Sequence[BehaviourBatch],
               hypers: Sequence[Mapping[str, Any]]) -> list[UpdateResult]:  # fmt: skip
        return _update_runs(lm, [r.optimizer for r in runs], [r.scheduler for r in runs],
                            batches, cfgs, step, hypers)  # fmt: skip

    engine = Engine(sample, update, metrics={"time/batch_runs": float(len(cfgs))})
    last = cfg0.steps if stop_after is None else min(cfg0.steps, stop_after)
    return train_loop(runs, engine, info=info, start=starts[0], last=last, progress=progress,
                      desc=f"train {len(cfgs)} runs")  # fmt: skip


def _needs(cfg: TrainConfig) -> frozenset[str]:
    return frozenset(shaping.METHODS[cfg.method].needs_for(**cfg.loss_hyper))
