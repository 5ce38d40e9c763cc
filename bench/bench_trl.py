"""Benchmark: this project's GRPO trainer (`llm.train.trainer.train`) next to TRL's `GRPOTrainer`.

Both train the same model (the offline tiny Countdown model by default) on the same prompts in the
same order (`llm.data.data_indices` of the config's training stream, given to TRL as a dataset
with ``shuffle_dataset=False``), with the same group size G, prompts per step B, micro-batch,
max new tokens, temperature, top-p, learning rate, AdamW settings, gradient clipping, number of
steps, reward (`llm.tasks.compute_score`, format score 0.1) and torch thread count, one after the
other in one process (with ``--vllm`` each run in a spawned process of its own: vLLM allows one
engine per process). One step = one rollout of B x G responses + one optimizer step.

Timing (wall clock, `time.perf_counter`):

- ours: ``time/step`` of `train`'s history (rollout + scoring + behaviour pass + update; model
  loading, metrics logging and the last-step checkpoint are outside it), broken into
  ``time/rollout``, ``time/logprob`` and ``time/optim``;
- TRL: a `TrainerCallback` from ``on_step_begin`` to ``on_step_end`` (generation, scoring and the
  micro-batched update of one optimizer step; the dataloader fetch and the logging hook are
  outside it), with generation timed by a subclass around ``_generate_single_turn``;
- both: the loop interval, from one step's start to the next (ours: successive rollout calls,
  TRL: successive ``on_step_begin``), which also counts the per-step bookkeeping, in wall time
  and in process CPU time (all threads; less sensitive to other jobs on a shared machine).

The first ``--warmup`` steps (default 2) are left out; medians are reported, with the ratio
ours / TRL (goal: <= 0.5). ``--rounds R`` repeats both runs R times in the order ours, TRL, TRL,
ours, ... and pools the steps, so a load drift on the machine hits both alike.

What the two compute differently (printed by the benchmark and written to the JSON; versions read:
TRL 1.16.0 `trainer/grpo_trainer.py`, `trainer/grpo_config.py`, `trainer/utils.py`, transformers
5.23 `trainer.py`):

- old log-probs: ours runs a no-grad behaviour forward pass over the whole batch every step
  (``logp_old``, token entropy, top-N candidates); TRL skips it when ``num_iterations == 1`` and
  ``steps_per_generation`` divides ``gradient_accumulation_steps`` (set here, its default) and uses
  the grad pass's ``per_token_logps.detach()`` (ratio 1 by construction). TRL recomputes it only for
  ``num_iterations > 1``, misaligned generation, or vLLM with importance-sampling correction.
- update passes: both re-forward every micro-batch with grad and backpropagate it; ours first
  evaluates the shaping loss once on full-batch leaf copies (`accumulate_gradients`), TRL evaluates
  its loss per micro-batch ("dapo": masked sum / tokens of the whole generation batch).
- log-prob head: TRL patches the model with a fused, chunked LM head (`add_fused_lm_head`) that
  projects only the completion positions and returns log-probs and entropy without materializing
  ``(R, P + T, V)`` logits; ours projects the response positions only (``logits_to_keep``;
  ProGRPO needs all), in blocks of `llm.model.forward.LOGIT_CHUNK` positions recomputed in the backward
  pass (one block at the tiny model's lengths), then log-softmax, a gather, and in the behaviour
  pass the entropy and a top-N (``top_n = 3`` in `configs/countdown_tiny.toml`, for the
  Lambda^(n) metrics).
- entropy: TRL computes it in the grad pass (metric only); ours in the behaviour pass, and in the
  grad pass only for methods that need it (not GRPO).
- sampler: ours passes B prompts with ``num_return_sequences = G`` and keeps ``output_scores``, then
  takes each step's log-softmax for ``logp``/``charts/sampler_logp_gap``; TRL passes B x G prompt
  rows and discards the scores. Both use `model.generate` with the KV cache, temperature only
  (``top_k = 0``, ``top_p = 1``).
- advantages: both ``(r - mean) / (std_ddof1 + eps)`` per group; TRL's eps is 1e-4, ours defaults to
  1e-6, so the benchmark sets ``hyper.eps = 1e-4``. Clipping: both eps 0.2 on each side; ours also
  clamps the log-ratio at 20 (inactive at ratio 1).
- positions: ours passes ``position_ids = cumsum(mask) - 1`` in the training forward (as `generate`
  does for left padding); TRL passes no position ids (left pads shift positions). Equal here: every
  compact 3-number prompt is 8 tokens.
- randomness: ours samples under a per-step generator seeded from (seed, step); TRL from the global
  RNG after ``set_seed(seed, device_specific=True)``. The samples, hence response lengths, differ;
  the mean response length of each run is reported.
- bookkeeping: ours keeps the model in eval mode, computes per-step statistics (advantages, top-N,
  grad norm, sampler gap), appends ``metrics.jsonl`` every step (TensorBoard off here) and saves a
  checkpoint after the last step (outside the timing); TRL runs in train mode with dropout disabled
  (the tiny model has none), keeps its metrics in memory (logging off), shuffles the generation
  batch before splitting it into micro-batches and saves nothing.
- optimizer: both `torch.optim.AdamW` (TRL with ``optim="adamw_torch"``; its default on torch >= 2.8
  would be the fused kernel), same betas, eps 1e-8, weight decay, clip norm, constant LR.

- sampler correction: TRL weights the surrogate by the sampler / trainer importance ratio only
  with vLLM, so on transformers rollouts the benchmark sets our ``rollout_is = "none"`` (its
  default, a truncated token-level weight, is 1 up to rounding there).

``--vllm`` (GPU only) runs both with vLLM rollouts: ours with ``backend = "vllm"``,
``device = "cuda"`` and ``vllm.dtype = "auto"``, TRL with ``use_vllm=True,
vllm_mode="colocate"``, our ``[vllm]`` memory, sleep and parallelism settings, and our truncated
token-level importance weight (``vllm_importance_sampling_mode = "token_truncate"``, clip at
``rollout_is_cap``); TRL then recomputes the old log-probs as ours does. It exits with a message
when CUDA, vLLM or our vLLM backend is missing.

    python bench/bench_trl.py --steps 10
    python bench/bench_trl.py --steps 20 --threads 1 --rounds 2 --out runs/bench_trl.json

On a shared machine (other jobs running) two threads per process oversubscribe the cores and
wall-clock medians swing by 10x; ``--threads 1 --rounds 2`` and the CPU-time row are the stable
comparison.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import platform
import queue
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numerics  # noqa: F401  (first: pins the numeric code paths before numpy, torch, JAX load)

# isort: split
import numpy as np
import torch

from llm.config import TrainConfig, load_config
from llm.data import data_indices, load_train_problems
from llm.model.load import load_model_and_tokenizer
from llm.rollout.backend import make_backend
from llm.tasks import CountdownProblem, compute_score, make_prompt
from llm.train.batched import train_batch
from llm.train.trainer import train

ROOT = Path(__file__).resolve().parent.parent
GOAL = 0.5
TRL_REWARD_EPS = 1e-4  # TRL adds 1e-4 to the group std (grpo_trainer.py, advantages)


@dataclass
class Args:
    """Command-line arguments (see ``--help``)."""

    steps: int = 10
    """training steps of each trainer (one rollout + one optimizer step each)"""
    group_size: int = 0
    """G, responses per prompt (0: the config's)"""
    prompts_per_step: int = 0
    """B, prompts per step (0: the config's)"""
    micro_batch_size: int = 0
    """responses per forward/backward pass, both trainers (0: the config's; must divide B * G)"""
    max_new_tokens: int = 0
    """longest response in tokens (0: the config's)"""
    threads: int = 0
    """torch intra-op threads for both (0: the config's num_threads, else torch's default)"""
    model: str = ""
    """model folder (default: build or reuse the tiny base model at runs/base_tiny)"""
    config: str = "configs/countdown_tiny.toml"
    """our TOML config; method must be grpo with kl_coef 0 and inner_epochs 1"""
    warmup: int = 2
    """steps left out of the medians"""
    rounds: int = 1
    """runs of each trainer, alternated ours, TRL, TRL, ours, ...; post-warm-up steps are pooled"""
    vllm: bool = False
    """vLLM rollouts on a GPU for both (ours: backend vllm; TRL: use_vllm, colocate)"""
    batched: int = 8
    """also time our batched engine (`llm.train.batched.train_batch`): R runs of the config
    (seeds seed .. seed + R - 1) as one program, its step per run next to TRL's (0: off; not with
    --vllm)"""
    out: str = ""
    """write the results as JSON to this file"""


# ---------------------------------------------------------------------------------------------
# Setup


def differences() -> list[str]:
    """The bullet list of what the two trainers compute differently, from the module docstring."""
    doc = __doc__ or ""
    section = doc.split("What the two compute differently", 1)[1].split("\n\n``--vllm``", 1)[0]
    items = section.split("\n- ")[1:]
    return [" ".join(item.split()) for item in items]


def check_vllm() -> None:
    """Exit with a message unless CUDA and vLLM are available (the ``--vllm`` path)."""
    if not torch.cuda.is_available():
        sys.exit("--vllm needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
    if importlib.util.find_spec("vllm") is None:
        sys.exit("--vllm needs vLLM: pip install -e '.[gpu]' (and trl[vllm]) on a GPU machine")


def make_config(args: Args, model_path: str) -> TrainConfig:
    """Our `TrainConfig`: the TOML config with the benchmark's overrides, validated.

    Raises:
        SystemExit: a method other than GRPO, ``kl_coef > 0``, ``inner_epochs > 1``, a micro-batch
            that does not divide B * G, or (``--vllm``) a trainer without a vLLM backend.
    """
    rollout = {n: getattr(args, n) for n in ("group_size", "prompts_per_step", "max_new_tokens")}
    overrides: dict[str, Any] = {
        "model_path": model_path,
        "build_base_model": False,
        "steps": args.steps,
        # only the last step is saved, after its time/step is taken
        "run": {"save_every": 0, "tensorboard": False},
        "rollout": {k: v for k, v in rollout.items() if v},
        "system": {"micro_batch_size": args.micro_batch_size} if args.micro_batch_size else {},
    }
    if args.vllm:
        overrides["rollout"]["backend"] = "vllm"
        overrides["system"]["device"] = "cuda"
    path = Path(args.config)
    if not path.is_absolute() and not path.exists():
        path = ROOT / path
    try:
        cfg = load_config(path, **overrides)
    except ValueError as e:
        if args.vllm and "backend" in str(e):
            sys.exit(f"--vllm: this checkout's trainer has no vLLM backend yet ({e})")
        raise
    task = cfg.task
    per_update = cfg.optim.prompts_per_update or cfg.rollout.prompts_per_step
    entropy_coef = cfg.entropy_coef
    if (
        cfg.method != "grpo"
        or cfg.kl_coef != 0
        or cfg.optim.inner_epochs != 1
        or task != "countdown"
        or per_update != cfg.rollout.prompts_per_step
        or entropy_coef != 0
    ):
        sys.exit(
            "bench_trl compares GRPO on Countdown with kl_coef = 0, entropy_coef = 0, "
            "inner_epochs = 1 and one optimizer step per rollout; got "
            f"method={cfg.method!r}, kl_coef={cfg.kl_coef}, entropy_coef={entropy_coef}, "
            f"inner_epochs={cfg.optim.inner_epochs}, task={task!r}, prompts_per_update={per_update}"
        )
    # TRL corrects for the sampler only with vLLM; on transformers rollouts the two agree.
    rollout = cfg.rollout if args.vllm else replace(cfg.rollout, rollout_is="none")
    # TRL's colocated engine loads the model's own dtype.
    vllm = replace(cfg.vllm, dtype="auto") if args.vllm else cfg.vllm
    system = replace(cfg.system, num_threads=args.threads) if args.threads else cfg.system
    # Validated by the replace (TrainConfig.__post_init__).
    cfg = replace(cfg, hyper={**cfg.hyper, "eps": TRL_REWARD_EPS}, rollout=rollout, vllm=vllm,
                  system=system)  # fmt: skip
    rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    if rows % cfg.system.micro_batch_size:
        sys.exit(f"micro_batch_size ({cfg.system.micro_batch_size}) must divide B * G ({rows})")
    return cfg


def prompt_stream(cfg: TrainConfig) -> list[CountdownProblem]:
    """The problems our trainer consumes over ``cfg.steps`` steps, in order (B per step)."""
    problems = load_train_problems(cfg)
    count = cfg.steps * cfg.rollout.prompts_per_step
    return [problems[i] for i in data_indices(0, count, len(problems), cfg.data.seed)]


def _threads(cfg: TrainConfig) -> None:
    if cfg.system.num_threads > 0:
        torch.set_num_threads(cfg.system.num_threads)


# ---------------------------------------------------------------------------------------------
# Ours


class _TimedBackend:
    """Our rollout backend, recording when each step's rollout starts and which prompts it got."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.starts: list[float] = []
        self.cpu_starts: list[float] = []
        self.prompts: list[str] = []

    def generate(self, prompts: list[str], group_size: int, **kwargs: Any) -> Any:
        self.starts.append(time.perf_counter())
        self.cpu_starts.append(time.process_time())
        self.prompts.extend(prompts)
        return self.inner.generate(prompts, group_size, **kwargs)

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.inner.sync_weights(model)

    @property
    def samples_from_policy(self) -> bool:
        """Forwarded: this wrapper passes the rollout through unchanged (the trainer may then skip
        its behaviour pass, as it does without the wrapper)."""
        return getattr(self.inner, "samples_from_policy", False)


def run_ours(cfg: TrainConfig) -> dict[str, Any]:
    """Train `cfg` in a temporary folder; per-step times (s) and the prompts seen, in order."""
    _threads(cfg)
    backends: list[_TimedBackend] = []

    def factory(c: TrainConfig, model: Any, tokenizer: Any) -> _TimedBackend:
        backends.append(_TimedBackend(make_backend(c, model, tokenizer)))
        return backends[-1]

    with tempfile.TemporaryDirectory(prefix="bench_trl_ours_") as out:
        start = time.perf_counter()
        history = train(cfg, out, backend_factory=factory, progress=False)
        total = time.perf_counter() - start
    backend = backends[0]

    def column(key: str) -> list[float]:
        return [float(h.get(key, float("nan"))) for h in history]

    steps = column("time/step")
    return {
        "step": steps,
        "loop": np.diff(backend.starts).tolist(),
        "loop_cpu": np.diff(backend.cpu_starts).tolist(),
        "rollout": column("time/rollout"),
        "logprob": column("time/logprob"),
        "optim": column("time/optim"),
        "update": column("time/update"),
        # Scoring, batch building, advantages and statistics: the step outside the three phases.
        "other": [
            s - r - lp - o
            for s, r, lp, o in zip(
                steps,
                column("time/rollout"),
                column("time/logprob"),
                column("time/optim"),
                strict=True,
            )
        ],
        "reward_mean": column("charts/reward_mean"),
        "response_len": column("charts/response_len"),
        # Model loading, data, and the last-step checkpoint: train()'s time outside its steps.
        "outside_steps": total - sum(steps),
        "prompts": backend.prompts,
    }


def run_batched(cfg: TrainConfig, runs: int) -> dict[str, Any]:
    """Train `runs` copies of `cfg` (seeds `cfg.seed + r`) as one batch in a temporary folder;
    the batch's per-step times divided by `runs` (s per run)."""
    _threads(cfg)
    cfgs = [replace(cfg, seed=cfg.seed + r) for r in range(runs)]
    with tempfile.TemporaryDirectory(prefix="bench_trl_batched_") as out:
        history = train_batch(cfgs, [Path(out) / f"r{r}" for r in range(runs)])[0]
    return {
        key: [float(h[f"time/{key}"]) / runs for h in history]
        for key in ("step", "rollout", "logprob", "optim")
    }


# ---------------------------------------------------------------------------------------------
# TRL


def trl_config(cfg: TrainConfig, out_dir: str, *, vllm: bool) -> Any:
    """The `trl.GRPOConfig` equivalent to `cfg` (one optimizer step = B prompts x G responses)."""
    from trl import GRPOConfig

    rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    accum = rows // cfg.system.micro_batch_size
    kwargs: dict[str, Any] = {}
    if vllm:
        # The engine settings of our [vllm] table where this checkout has one.
        v = getattr(cfg, "vllm", None)
        kwargs = {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": getattr(v, "gpu_memory_utilization", 0.3),
            "vllm_enable_sleep_mode": bool(getattr(v, "sleep_mode", False)),
            "vllm_tensor_parallel_size": getattr(v, "tensor_parallel_size", 1),
        }
        if getattr(v, "max_model_len", None):
            kwargs["vllm_max_model_length"] = v.max_model_len
        # Ours: token-level truncated importance weight min(exp(logp_old - logp_vllm), cap).
        rollout_is = cfg.rollout.rollout_is
        kwargs["vllm_importance_sampling_correction"] = rollout_is == "truncate"
        if rollout_is == "truncate":
            kwargs["vllm_importance_sampling_mode"] = "token_truncate"
            kwargs["vllm_importance_sampling_clip_max"] = cfg.rollout.rollout_is_cap
    return GRPOConfig(
        output_dir=out_dir,
        # Batching: micro-batches of our size, accumulated over one generation batch of B * G.
        per_device_train_batch_size=cfg.system.micro_batch_size,
        gradient_accumulation_steps=accum,
        steps_per_generation=accum,
        num_generations=cfg.rollout.group_size,
        num_iterations=cfg.optim.inner_epochs,
        max_steps=cfg.steps,
        shuffle_dataset=False,
        # Sampling.
        max_completion_length=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        top_k=0,
        # Loss: GRPO clip 0.2, token-mean over the batch, group std (ddof 1) normalization, no KL.
        beta=cfg.kl_coef,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        mask_truncated_completions=False,
        disable_dropout=True,
        # Optimizer.
        learning_rate=cfg.optim.lr,
        lr_scheduler_type="constant",
        warmup_steps=cfg.optim.warmup_steps,
        weight_decay=cfg.optim.weight_decay,
        adam_beta1=cfg.optim.adam_betas[0],
        adam_beta2=cfg.optim.adam_betas[1],
        adam_epsilon=1e-8,
        optim="adamw_torch",
        max_grad_norm=cfg.optim.max_grad_norm,
        # Precision and device as ours (float32 by default; bf16-mixed = autocast in both).
        use_cpu=not vllm,
        bf16=_precision(cfg) == "bf16-mixed",
        fp16=False,
        **_checkpointing(bool(cfg.system.gradient_checkpointing)),
        # No logging, saving or evaluation.
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        seed=cfg.seed,
        **kwargs,
    )


def _checkpointing(on: bool) -> dict[str, bool]:
    # transformers 5.23 renamed gradient_checkpointing to activation_checkpointing (the old name
    # warns); TRL's config turns it on by default, ours only with gradient_checkpointing = true.
    from transformers import TrainingArguments

    names = {f.name for f in fields(TrainingArguments)}
    key = (
        "activation_checkpointing"
        if "activation_checkpointing" in names
        else "gradient_checkpointing"
    )
    return {key: on}


def _precision(cfg: TrainConfig) -> str:
    return cfg.system.precision


def _load_model(cfg: TrainConfig) -> tuple[Any, Any]:
    # Checkouts with a `precision` key load bf16 weights for precision = "bf16".
    extra = [] if _precision(cfg) == "fp32" else [_precision(cfg)]
    return load_model_and_tokenizer(cfg.model_path, cfg.system.device, *extra)


def run_trl(cfg: TrainConfig, problems: list[CountdownProblem], *, vllm: bool) -> dict[str, Any]:
    """Train TRL's `GRPOTrainer` on `problems` (in order) with `cfg`'s settings; per-step times."""
    import transformers
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    transformers.logging.set_verbosity_error()
    _threads(cfg)
    g = cfg.rollout.group_size
    seen: list[str] = []
    rewards: list[float] = []
    lengths: list[float] = []

    def countdown_reward(
        prompts: list[str], completions: list[str], nums: list, target: list, **_: Any
    ) -> list[float]:
        """`llm.tasks.compute_score` of each completion (rows are prompt-major, G per prompt)."""
        seen.extend(prompts[::g])
        scores = [
            compute_score(c, CountdownProblem(tuple(n), int(t)), format_score=cfg.format_score)
            for c, n, t in zip(completions, nums, target, strict=True)
        ]
        rewards.append(float(np.mean(scores)))
        return scores

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.begin: list[float] = []
            self.end: list[float] = []
            self.cpu_begin: list[float] = []

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.begin.append(time.perf_counter())
            self.cpu_begin.append(time.process_time())

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.end.append(time.perf_counter())

    phases: dict[str, list[float]] = defaultdict(list)

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer with its rollout and rollout + scoring timed."""

        def _generate_single_turn(self, *a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            out = super()._generate_single_turn(*a, **kw)
            phases["rollout"].append(time.perf_counter() - t0)
            lengths.append(float(np.mean([len(ids) for ids in out[0]])))
            return out

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            phases["rollout_and_score"].append(time.perf_counter() - t0)
            return out

    model, tokenizer = _load_model(cfg)
    tokenizer.padding_side = "left"
    dataset = Dataset.from_dict(
        {
            "prompt": [make_prompt(p, cfg.template) for p in problems],
            "nums": [list(p.nums) for p in problems],
            "target": [p.target for p in problems],
        }
    )
    timer = StepTimer()
    with tempfile.TemporaryDirectory(prefix="bench_trl_trl_") as out:
        trainer = TimedGRPOTrainer(
            model=model,
            reward_funcs=countdown_reward,
            args=trl_config(cfg, out, vllm=vllm),
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[timer],
        )
        trainer.remove_callback(PrinterCallback)  # it prints the end-of-training summary
        _threads(cfg)
        start = time.perf_counter()
        with warnings.catch_warnings():
            # TRL 1.16 reads model.is_gradient_checkpointing, deprecated in transformers 5.23.
            warnings.simplefilter("ignore", FutureWarning)
            trainer.train()
        total = time.perf_counter() - start
    steps = [e - b for b, e in zip(timer.begin, timer.end, strict=True)]
    rollout_and_score = phases["rollout_and_score"]
    return {
        "step": steps,
        "loop": np.diff(timer.begin).tolist(),
        "loop_cpu": np.diff(timer.cpu_begin).tolist(),
        "rollout": phases["rollout"],
        "rollout_and_score": rollout_and_score,
        "update": [s - r for s, r in zip(steps, rollout_and_score, strict=True)],
        "score": [rs - r for rs, r in zip(rollout_and_score, phases["rollout"], strict=True)],
        "reward_mean": rewards,
        "response_len": lengths,
        "outside_steps": total - sum(steps),
        "prompts": seen,
    }


# ---------------------------------------------------------------------------------------------
# Driver and report


def resolve_model(args: Args) -> str:
    """`args.model`, or the tiny base model at runs/base_tiny (built on first use, ~1-3 min)."""
    if args.model:
        return args.model
    from llm.model.tiny import ensure_base_model

    return str(ensure_base_model(ROOT / "runs" / "base_tiny"))


def _median(
    runs: list[dict[str, Any]], key: str, warmup: int, stat: Any = statistics.median
) -> float:
    values = [v for run in runs for v in run[key][warmup:]]
    return stat(values) if values else float("nan")


def _child(results: Any, fn: Any, args: tuple, kwargs: dict) -> None:
    """The spawned side of `call`: put ``("ok", result)`` or ``("error", traceback)`` on
    `results`, so the parent tells a failure from a result and can show where it happened."""
    try:
        results.put(("ok", fn(*args, **kwargs)))
    except BaseException:  # reported to the parent with its traceback
        results.put(("error", traceback.format_exc()))


def call(fn: Any, *args: Any, own_process: bool = False, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``; with `own_process` in a fresh process started by ``spawn`` (fn and
    its arguments are pickled; the result comes back through a queue).

    Raises:
        RuntimeError: fn raised in the child (its traceback is in the message), or the child
            died without a result (e.g. a crash in native code; its exit code is named).
    """
    if not own_process:
        return fn(*args, **kwargs)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=_child, args=(results, fn, args, kwargs))
    child.start()
    while True:  # read before join: a large result would block the child's exit
        alive = child.is_alive()  # before the read: a child that exits after it is seen next time
        try:
            status, value = results.get(timeout=1.0)
            break
        except queue.Empty:
            if not alive:
                raise RuntimeError(
                    f"{getattr(fn, '__name__', fn)} in its own process exited with code "
                    f"{child.exitcode} without a result"
                ) from None
    child.join()
    if status != "ok":
        raise RuntimeError(f"{getattr(fn, '__name__', fn)} failed in its own process:\n{value}")
    return value


def run(args: Args) -> dict[str, Any]:
    """Both trainers, `args.rounds` times each; the results as a JSON-ready dict."""
    if args.vllm:
        check_vllm()
    if importlib.util.find_spec("trl") is None:
        sys.exit("bench_trl needs TRL: pip install -e '.[bench]'")
    if args.steps <= args.warmup:
        sys.exit(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    import transformers
    import trl

    cfg = make_config(args, resolve_model(args))
    _threads(cfg)  # as in each run (they set it again: with --vllm they run in other processes)
    problems = prompt_stream(cfg)
    expected = [make_prompt(p, cfg.template) for p in problems]
    load_before = os.getloadavg()
    if args.batched and args.vllm:
        sys.exit(
            "--batched: the batched engine samples with its own decoder (CPU); not with --vllm"
        )
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    batched: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = ("ours", "trl") if r % 2 == 0 else ("trl", "ours")
        if args.batched:
            batched.append(call(run_batched, cfg, args.batched))
        for name in order:
            # --vllm: each run in its own spawned process, since vLLM allows one engine per
            # process (its executor initializes torch.distributed; sleep mode's allocator).
            if name == "ours":
                ours.append(call(run_ours, cfg, own_process=args.vllm))
            else:
                theirs.append(call(run_trl, cfg, problems, vllm=args.vllm, own_process=args.vllm))
    same_prompts = all(run["prompts"] == expected for run in ours + theirs)
    w = args.warmup
    summary = {
        "ours_step_s": _median(ours, "step", w),
        "trl_step_s": _median(theirs, "step", w),
        "ours_loop_s": _median(ours, "loop", w),
        "trl_loop_s": _median(theirs, "loop", w),
        "ours_loop_cpu_s": _median(ours, "loop_cpu", w),
        "trl_loop_cpu_s": _median(theirs, "loop_cpu", w),
        "ours_rollout_s": _median(ours, "rollout", w),
        "ours_logprob_s": _median(ours, "logprob", w),
        "ours_optim_s": _median(ours, "optim", w),
        "ours_other_s": _median(ours, "other", w),
        "trl_rollout_s": _median(theirs, "rollout", w),
        "trl_rollout_and_score_s": _median(theirs, "rollout_and_score", w),
        "trl_update_s": _median(theirs, "update", w),
        "trl_score_s": _median(theirs, "score", w),
    }
    summary["ours_step_min_s"] = _median(ours, "step", w, min)
    summary["trl_step_min_s"] = _median(theirs, "step", w, min)
    summary["ratio_step"] = summary["ours_step_s"] / summary["trl_step_s"]
    summary["ratio_step_min"] = summary["ours_step_min_s"] / summary["trl_step_min_s"]
    summary["ratio_loop"] = summary["ours_loop_s"] / summary["trl_loop_s"]
    summary["ratio_loop_cpu"] = summary["ours_loop_cpu_s"] / summary["trl_loop_cpu_s"]
    summary["goal_met"] = bool(summary["ratio_step"] <= GOAL)
    if batched:
        summary["batched_runs"] = args.batched
        for key in ("step", "rollout", "logprob", "optim"):
            summary[f"batched_{key}_s"] = _median(batched, key, w)
        summary["batched_step_min_s"] = _median(batched, "step", w, min)
        summary["ratio_batched_step"] = summary["batched_step_s"] / summary["trl_step_s"]
        summary["goal_met_batched"] = bool(summary["ratio_batched_step"] <= GOAL)
    strip = ("prompts",)
    return {
        "args": asdict(args),
        "config": {
            "model_path": cfg.model_path,
            "group_size": cfg.rollout.group_size,
            "prompts_per_step": cfg.rollout.prompts_per_step,
            "micro_batch_size": cfg.system.micro_batch_size,
            "max_new_tokens": cfg.rollout.max_new_tokens,
            "temperature": cfg.rollout.temperature,
            "top_p": cfg.rollout.top_p,
            "top_n": cfg.rollout.top_n,
            "lr": cfg.optim.lr,
            "max_grad_norm": cfg.optim.max_grad_norm,
            "hyper": cfg.hyper,
            "precision": _precision(cfg),
            "rollout_is": cfg.rollout.rollout_is,
            "device": cfg.system.device,
            "backend": cfg.rollout.backend,
            "seed": cfg.seed,
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
        },
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "loadavg_before_after": [load_before, os.getloadavg()],
        "same_prompts": same_prompts,
        "summary": summary,
        "ours": [{k: v for k, v in run.items() if k not in strip} for run in ours],
        "trl": [{k: v for k, v in run.items() if k not in strip} for run in theirs],
        "batched": batched,
        "differences": differences(),
    }


def report(res: dict[str, Any]) -> str:
    """The result as text: a Markdown table, the phase breakdown and the differences."""
    s, c, a = res["summary"], res["config"], res["args"]
    ms = 1e3
    steps_used = (a["steps"] - a["warmup"]) * a["rounds"]
    head = (
        f"torch {res['versions']['torch']}, transformers {res['versions']['transformers']}, "
        f"TRL {res['versions']['trl']}; {c['device']} ({c['backend']}), {res['threads']} threads\n"
        f"B = {c['prompts_per_step']} prompts x G = {c['group_size']}, micro-batch "
        f"{c['micro_batch_size']}, max {c['max_new_tokens']} new tokens, {a['steps']} steps x "
        f"{a['rounds']} round(s); median of {steps_used} steps after {a['warmup']} warm-up; "
        f"same prompts in the same order: {'yes' if res['same_prompts'] else 'NO'}\n"
    )
    rows = [
        "| per step (ms) | ours | TRL | ours / TRL |",
        "|---|---:|---:|---:|",
        f"| step | {s['ours_step_s'] * ms:.1f} | {s['trl_step_s'] * ms:.1f} | "
        f"{s['ratio_step']:.2f} |",
        f"| fastest step | {s['ours_step_min_s'] * ms:.1f} | {s['trl_step_min_s'] * ms:.1f} | "
        f"{s['ratio_step_min']:.2f} |",
        f"| loop interval | {s['ours_loop_s'] * ms:.1f} | {s['trl_loop_s'] * ms:.1f} | "
        f"{s['ratio_loop']:.2f} |",
        f"| loop interval, process CPU time | {s['ours_loop_cpu_s'] * ms:.1f} | "
        f"{s['trl_loop_cpu_s'] * ms:.1f} | {s['ratio_loop_cpu']:.2f} |",
        f"| rollout (generate) | {s['ours_rollout_s'] * ms:.1f} | {s['trl_rollout_s'] * ms:.1f} | "
        f"{s['ours_rollout_s'] / s['trl_rollout_s']:.2f} |",
    ]
    mean = statistics.fmean

    def avg(runs: list[dict[str, Any]], key: str) -> float:
        return mean(v for run in runs for v in run[key])

    load = res["loadavg_before_after"][0][0]  # 1-min load average before the runs
    busy = []
    if load > 0.5 * (res["cpu_count"] or 1):
        busy = [
            f"WARNING: 1-min load average {load:.1f} on {res['cpu_count']} cores before the runs: "
            "other jobs share the CPU, so wall-clock medians are unreliable; compare the fastest "
            "steps, the CPU times, and --threads 1 --rounds 2 runs.",
            "",
        ]
    lines = [
        head,
        *busy,
        *rows,
        "",
        f"ours: rollout {s['ours_rollout_s'] * ms:.1f}, behaviour pass (logp_old, entropy, "
        f"top-{c['top_n']}) {s['ours_logprob_s'] * ms:.1f}, update {s['ours_optim_s'] * ms:.1f}, "
        f"scoring + rest {s['ours_other_s'] * ms:.1f} ms (medians per phase)",
        f"TRL : rollout {s['trl_rollout_s'] * ms:.1f}, scoring + rest of generation "
        f"{s['trl_score_s'] * ms:.1f}, update (micro-batch passes, optimizer) "
        f"{s['trl_update_s'] * ms:.1f} ms",
        f"mean reward: ours {avg(res['ours'], 'reward_mean'):.3f}, TRL "
        f"{avg(res['trl'], 'reward_mean'):.3f}; mean response length: ours "
        f"{avg(res['ours'], 'response_len'):.2f}, TRL {avg(res['trl'], 'response_len'):.2f} tokens",
        f"outside the steps (load, data, last checkpoint): ours "
        f"{mean(r['outside_steps'] for r in res['ours']):.2f} s, TRL "
        f"{mean(r['outside_steps'] for r in res['trl']):.2f} s",
        f"goal ours / TRL <= {GOAL}: {'met' if s['goal_met'] else 'NOT met'} "
        f"({s['ratio_step']:.2f}x per step)",
        *batched_lines(s),
        "",
        "What the two compute differently:",
        *(f"- {d}" for d in res["differences"]),
    ]
    return "\n".join(lines)


def batched_lines(s: dict[str, Any]) -> list[str]:
    """The batched engine's per-run step next to TRL's (empty when it was not timed)."""
    if "batched_runs" not in s:
        return []
    ms = 1e3
    return [
        f"ours, batched ({s['batched_runs']} runs as one program; per run): step "
        f"{s['batched_step_s'] * ms:.1f} ms (fastest {s['batched_step_min_s'] * ms:.1f}): rollout "
        f"{s['batched_rollout_s'] * ms:.1f}, behaviour pass {s['batched_logprob_s'] * ms:.1f}, "
        f"update {s['batched_optim_s'] * ms:.1f}",
        f"goal ours (batched) / TRL <= {GOAL}: "
        f"{'met' if s['goal_met_batched'] else 'NOT met'} ({s['ratio_batched_step']:.2f}x per "
        "step and run)",
    ]


def parse(argv: list[str] | None = None) -> Args:
    """Parse the command line into `Args` (each field's docstring is its help)."""
    from experiment.schema import field_docs

    docs = field_docs(Args)
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    for f in fields(Args):
        default = getattr(Args(), f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(flag, action="store_true", help=docs.get(f.name))
        else:
            parser.add_argument(flag, type=type(default), default=default, help=docs.get(f.name))
    ns = parser.parse_args(argv)
    return replace(Args(), **vars(ns))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    res = run(args)
    print(report(res))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    return res


if __name__ == "__main__":
    main()
