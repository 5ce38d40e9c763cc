"""Training configuration: `TrainConfig` and its tables (`RolloutConfig`, ..., `VLLMConfig`), the
rules between fields, and the loss coefficients resolved once (`loss_hyper`).

Each field is declared once: its default, choices and bounds with `experiment.schema.option` (or
``field(default_factory=..., metadata=meta(...))``), its help text as the docstring under it;
`experiment.schema` (one validation loop, `describe`, the ``--set`` parser) reads them.
`TrainConfig.__post_init__` is that loop plus the rules between fields and the method's
``[hyper]`` check, so every `TrainConfig` (a `dataclasses.replace` too) is valid; `describe`
(``python -m llm train --describe``) and the comments of the resolved config written to
``DIR/config.toml`` read the same metadata.

A config file holds a few top-level keys (task, model, method and its method-wide `kl_coef` /
`entropy_coef`, steps, seed, prompt template and reward) and one-level tables by concern:
``[hyper]`` (the method's hyper-parameters, names and types as in
``shaping.METHODS[method].defaults``), ``[rollout]`` (`RolloutConfig`: B x G sampling and the
behaviour pass), ``[optim]`` (`OptimConfig`: AdamW, schedule, inner epochs, mini-batches),
``[system]`` (`SystemConfig`: device, precision, parallelism, micro-batches), ``[run]``
(`RunConfig`: checkpoints and logs), ``[control]`` (`ControlConfig`: the adaptive entropy
coefficient, the KL penalty in the reward, the adaptive KL coefficient, reference resets),
``[explore]`` (`ExploreConfig`: outcome-based exploration bonuses), ``[data]``,
``[eval]`` and ``[vllm]``. The keys of
[rollout], [optim], [system] and [run] were top-level before: the flat spelling (and
``eval.n_samples``, now ``eval.samples``) is refused with an error naming the new key
(`OLD_KEYS`). `apply_overrides` sets any key from
``key=value`` strings (the ``--set`` of the command line). A bad value or an unknown key raises
``ValueError`` naming it.
"""

from __future__ import annotations

import dataclasses
import operator
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import shaping
from experiment import schema
from experiment.cli import OWN_METHOD, OWN_TASK, add_set_argument
from experiment.schema import (
    check_hyper,
    config_error,
    meta,
    migrate_moved,
    option,
    read_toml,
    refuse_moved,
    removed,
    require,
    source_error,
)
from experiment.store import write_text
from llm.tasks import TASKS

__all__ = [
    "ENTROPY_GATES",
    "EVAL_PRECISION",
    "MAX_EVAL_SAMPLES",
    "OLD_KEYS",
    "ControlConfig",
    "DataConfig",
    "EvalConfig",
    "ExploreConfig",
    "OptimConfig",
    "RolloutConfig",
    "RunConfig",
    "SystemConfig",
    "TrainConfig",
    "VLLMConfig",
    "add_set_argument",
    "apply_overrides",
    "check_model_path",
    "config_from_dict",
    "config_to_toml",
    "describe",
    "load_config",
    "load_saved_config",
    "loss_hyper",
    "refuse_old_key",
    "save_config",
    "source_error",
]


SCHEDULES = ("constant", "cosine", "linear")
BACKENDS = ("transformers", "vllm")
DISTINCT = ("commutative", "ac")
DATA_SOURCES = ("tiny", "generate", "file")
EVAL_SOURCES = ("tiny", "generate", "file")
PRECISIONS = ("fp32", "bf16-mixed", "bf16")
PARALLEL = ("auto", "ddp", "fsdp2")
ROLLOUT_IS = ("truncate", "none")
VLLM_DTYPES = ("bfloat16", "float16", "float32", "auto")
EVAL_PRECISION = {"float32": "fp32", "bfloat16": "bf16"}
"""`EvalConfig.dtype` -> the precision `llm.model.load.load_model_and_tokenizer` loads the policy in."""
EVAL_DTYPES = tuple(EVAL_PRECISION)
ENTROPY_GATES = ("step", "trl", "skywork")
"""`ControlConfig.entropy_gate`: which entropy switches the adaptive entropy term on
(`llm.train.control.applied_entropy_coef`)."""
EVAL_SAMPLERS = ("generate", "stacked")
"""`EvalConfig.sampler`: transformers' generate, or the package's `llm.rollout.stacked`."""
MAX_EVAL_SAMPLES = 4096
"""Most samples per problem at evaluation (``eval.samples``, ``llm eval --samples``): pass@k to
k = 4096, sixteen times the k = 256 of Yue et al. 2025; a problem's samples are decoded, graded and
held in memory together, so 1e9 would never end."""
MAX_SEED = 2**32 - 1
"""Largest seed: the trainer seeds NumPy's legacy global RNG, which takes 32-bit seeds."""
MAX_LR = 1.0
"""Largest accepted `lr` (AdamW steps above 1 are never meaningful; near 1e38 its update overflows)."""


@dataclass(frozen=True)
class DataConfig:
    """Training problems: the tiny model's training stream, generated, or a local file."""

    source: str = option("tiny", choices=DATA_SOURCES)
    """tiny (llm.model.tiny's train stream, countdown only), generate, or file"""
    path: str = ""
    """source = file: a local .jsonl/.parquet file (Countdown-Tasks-3to4; math: MATH, DAPO-Math)"""
    n_problems: int = option(1000, ge=1)
    """number of problems to draw (source = tiny or generate)"""
    seed: int = option(1, ge=0, le=MAX_SEED)
    """seed of the generator (source = generate; held-out eval problems use `eval.seed`)"""
    num_numbers: list[int] = field(
        default_factory=lambda: [3], metadata=meta(ge=2, le=5, length=(1, None))
    )
    """source = generate: how many numbers a problem has (each problem draws one of these)"""
    min_number: int = option(1, ge=0)
    """source = generate: smallest operand"""
    max_number: int = 20
    """source = generate: largest operand (>= min_number)"""
    min_target: int = option(1, ge=0)
    """source = generate: smallest target"""
    max_target: int = 100
    """source = generate: largest target (>= min_target; the tiny model's vocabulary stops at
    100)"""


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation settings used by `python -m llm eval --config FILE`."""

    source: str = option("tiny", choices=EVAL_SOURCES)
    """tiny (llm.model.tiny's held-out stream), generate (the bounds of [data] with `seed`) or
    file"""
    paths: list[str] = field(default_factory=list)
    """source = file: local evaluation files (MATH500 / AIME / AMC formats), each reported apart"""
    n_problems: int = option(64, ge=1)
    """number of held-out problems (per file with source = file; fewer if the file is shorter)"""
    seed: int = option(12345, ge=0, le=MAX_SEED)
    """source = generate: seed of the held-out problems (must differ from `data.seed`)"""
    samples: int = option(16, ge=1, le=MAX_EVAL_SAMPLES)
    """samples per problem n; pass@k is reported for k = 1, 2, 4, ..., n"""
    temperature: float = option(1.0, gt=0)
    """sampling temperature at evaluation"""
    top_p: float = option(1.0, gt=0, le=1)
    """nucleus sampling threshold at evaluation"""
    top_k: int = option(0, ge=0)
    """top-k sampling at evaluation (0 = off)"""
    max_new_tokens: int = option(0, ge=0)
    """longest response at evaluation (0 = the training max_new_tokens)"""
    max_responses_per_call: int = option(4096, ge=1)
    """responses per rollout call at evaluation, at most (bounds the engine's outputs)"""
    prompts_per_batch: int = option(8, ge=1)
    """prompts per transformers generate call at evaluation, at most (more fill a GPU)"""
    dtype: str = option("float32", choices=EVAL_DTYPES)
    """weights of the policy while it samples at evaluation: float32, or bfloat16 (on a GPU half the
    KV cache's bytes and flash attention kernels: docs/gpu.md); logits are sampled in float32 either
    way"""
    sampler: str = option("generate", choices=EVAL_SAMPLERS)
    """the evaluation's sampler (rollout.backend = transformers): generate (transformers' generate,
    a call per prompts_per_batch prompts) or stacked (llm.rollout.stacked, as the batched engine
    samples: each prompt run once and its keys and values shared by its samples, a cache of fixed
    size read once per key-value head; another random stream, so another evaluation key)"""


@dataclass(frozen=True)
class VLLMConfig:
    """The colocated vLLM engine of ``backend = "vllm"`` (`llm.rollout.vllm_engine.VLLMBackend`)."""

    gpu_memory_utilization: float = option(0.3, gt=0, lt=1)
    """fraction of the GPU's memory vLLM may take (weights + KV cache); the trainer gets the rest"""
    sleep_mode: bool = True
    """put the engine to sleep (free its KV cache and weights) during each update"""
    tensor_parallel_size: int = option(1, ge=1)
    """vLLM tensor parallelism (GPUs per engine)"""
    max_model_len: int = option(0, ge=0)
    """longest prompt + response the engine accepts (0 = vLLM's default for the model)"""
    enforce_eager: bool = False
    """disable CUDA graphs (less memory, slower generation)"""
    dtype: str = option("bfloat16", choices=VLLM_DTYPES)
    """engine weight dtype"""


@dataclass(frozen=True)
class RolloutConfig:
    """The rollout of a training step: B prompts x G sampled responses, and how pi_old's view of
    them is obtained."""

    group_size: int = option(8, ge=2)
    """G: responses sampled per prompt (at least 2: a group of one has advantage 0)"""
    prompts_per_step: int = option(4, ge=1)
    """B: prompts per training step"""
    temperature: float = option(1.0, gt=0)
    """sampling temperature; the trainer's log-probs use logits / temperature as well"""
    top_p: float = option(1.0, gt=0, le=1)
    """nucleus sampling threshold of the rollout backend"""
    max_new_tokens: int = option(16, ge=1)
    """longest response, in tokens"""
    max_prompt_tokens: int = option(0, ge=0)
    """training problems whose prompt is longer (in tokens) are dropped, as verl's
    filter_overlong_prompts; 0 = keep all"""
    top_n: int = option(0, ge=0)
    """candidates tracked per token (Lambda^(n) metrics, CaSP); CaSP raises it to its own top_n"""
    backend: str = option("transformers", choices=BACKENDS)
    """rollout backend: transformers (model.generate) or vllm (colocated engine, [vllm] table)"""
    rollout_is: str = option("truncate", choices=ROLLOUT_IS)
    """correction for sampler/trainer log-prob mismatch: truncate (per-token weight min(exp(logp_old
    - logp_sampler), rollout_is_cap) on the surrogate, as TRL and verl) or none"""
    rollout_is_cap: float = option(2.0, ge=1)
    """upper bound of the truncated importance-sampling weight"""
    behaviour_pass: str = option("auto", choices=("auto", "always"))
    """how pi_old's log-probs, entropies and top-N candidates are obtained: auto (from the sampler
    when it is exactly the policy: transformers backend, fp32, top_p = 1, one inner epoch, no prompt
    log-probs needed; else a forward pass) or always (a forward pass, as TRL and verl do)"""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling (verl filter_groups): draw rounds of prompts_per_step more prompts
    until the step holds B groups whose rewards are not all equal, or max_resample_rounds extra
    rounds are spent (then the uniform groups drawn first fill the batch, and
    dynamic/budget_exhausted says so); single process only"""
    max_resample_rounds: int = option(9, ge=0)
    """dynamic_sampling: extra rounds of prompts_per_step prompts a step may draw (verl's DAPO
    recipe: max_num_gen_batches = 10 in all; 0 = one round, reported but not filtered)"""
    mask_truncated: bool = False
    """DAPO overlong masking (TRL mask_truncated_completions): responses that use all max_new_tokens
    without a stop token leave the loss (they still count in their group's advantages)"""


KL_REWARD_ESTIMATORS = ("k1", "k2", "k3")
"""Per-token KL estimators the in-reward penalty takes (`shaping.core.kl_penalty`; verl's
``algorithm.kl_penalty`` "kl", "mse", "low_var_kl"). k3+ is left out: it differs from k3 in its
gradient only, and the reward is detached."""


@dataclass(frozen=True)
class ControlConfig:
    """Driver-level controls of the trainer (`llm.train.control`): Skywork-OR1's adaptive entropy
    control (the coefficient of the token-entropy term, `entropy_coef` its starting value, moved
    each step toward a target entropy); the KL penalty in the reward (verl use_kl_in_reward), its
    adaptive coefficient (Ziegler et al. 2019, verl AdaptiveKLController) and ProRL's reference
    resets."""

    adaptive_entropy: bool = False
    """adapt entropy_coef each step (TRL use_adaptive_entropy): the term is on only while the token
    entropy is <= entropy_target (entropy_gate says which step's), and the coefficient then moves by
    entropy_coef_delta (up at or below the target, down above it); checkpointed"""
    entropy_gate: str = option("step", choices=ENTROPY_GATES)
    """which entropy gates the adaptive term: step (this step's, at or below the target; the
    committed studies'), trl (the previous step's, at or below; off at the first step: TRL
    GRPOTrainer) or skywork (the previous step's, strictly below, which also lowers the coefficient
    at equality; on at the first step: Skywork-OR1's EntController)"""
    entropy_target: float = option(0.2, ge=0)
    """target mean token entropy in nats (TRL's and Skywork-OR1's tgt-ent)"""
    entropy_coef_delta: float = option(0.005, ge=0)
    """change of the coefficient per step (TRL's; Skywork-OR1's scripts: 1e-4)"""
    entropy_coef_min: float = option(0.0, ge=0)
    """lower clamp of the adaptive coefficient (TRL's and Skywork-OR1's)"""
    entropy_coef_max: float = option(1.0, ge=0)
    """upper clamp of the adaptive coefficient (TRL's; Skywork-OR1's scripts: 0.005)"""
    kl_in_reward: bool = False
    """KL penalty in the reward (verl algorithm.use_kl_in_reward): each response's reward becomes r
    - kl_reward_coef * sum_t kl_t before any advantage is computed, kl_t the kl_reward_estimator of
    the sampled token between pi_old and the reference (detached); loads the reference; combines
    with the in-loss kl_coef"""
    kl_reward_coef: float = option(0.001, ge=0)
    """beta of kl_in_reward (verl algorithm.kl_ctrl.kl_coef); with adaptive_kl its starting value"""
    kl_reward_estimator: str = option("k1", choices=KL_REWARD_ESTIMATORS)
    """per-token KL estimate of kl_in_reward and of the adaptive controller's measured KL: k1 (log
    pi_old - log pi_ref; verl's default kl_penalty = "kl"), k2 or k3"""
    adaptive_kl: bool = False
    """adapt the KL coefficients each step (Ziegler et al. 2019; verl kl_ctrl.type = "adaptive"):
    beta *= 1 + clip(KL / kl_target - 1, -0.2, 0.2) * n / kl_horizon, KL the batch's mean per-token
    KL, n its responses; moves kl_reward_coef (kl_in_reward) and the in-loss kl_coef, whichever is
    on; checkpointed"""
    kl_target: float = option(0.1, gt=0)
    """adaptive_kl: target mean per-token KL in nats (verl kl_ctrl.target_kl)"""
    kl_horizon: int = option(10000, ge=1)
    """adaptive_kl: horizon in responses (verl kl_ctrl.horizon): the gain per response is
    1/horizon"""
    reference_reset_every: int = option(0, ge=0)
    """ProRL reference reset: after every this many steps the KL reference becomes a copy of the
    current policy (checkpointed with the run); 0 = off; needs kl_coef > 0 or kl_in_reward"""
    reset_optimizer: bool = False
    """with reference_reset_every: also clear AdamW's moments at each reset (ProRL re-initializes
    the optimizer states)"""


@dataclass(frozen=True)
class ExploreConfig:
    """Outcome-based exploration (Song, Kempe & Munos 2025): reward bonuses on final answers
    (`Task.answer_key`), added to the verifier's reward before the method sees it."""

    ucb_coef: float = option(0.0, ge=0)
    """historical bonus c / sqrt(1 + N(prompt, answer)), N the answer's count over earlier steps
    (checkpointed); 0 = off; format_score + ucb_coef must stay below 0.5 (the correct-set
    threshold)"""
    batch_coef: float = option(0.0, ge=0, lt=0.5)
    """within-group penalty -c (n - 1) / (G - 1), n the responses of the group with the same answer;
    0 = off"""


@dataclass(frozen=True)
class OptimConfig:
    """The update of a training step: mu passes of AdamW steps over mini-batches of whole groups,
    with a learning-rate schedule and gradient clipping."""

    lr: float = option(1e-4, gt=0, le=MAX_LR)
    """AdamW learning rate (peak, after warm-up); at most 1 (larger steps are never meaningful for
    AdamW, and near 1e38 its fp32 update overflows)"""
    weight_decay: float = option(0.0, ge=0, le=1)
    """AdamW decoupled weight decay (per step: w -= lr * wd * w)"""
    adam_betas: list[float] = field(
        default_factory=lambda: [0.9, 0.999], metadata=meta(ge=0, lt=1, length=(2, 2))
    )
    """AdamW (beta1, beta2)"""
    schedule: str = option("constant", choices=SCHEDULES)
    """learning-rate schedule after warm-up: constant, cosine (to 0) or linear (to 0)"""
    warmup_steps: int = option(0, ge=0)
    """optimizer steps of linear warm-up from 0"""
    max_grad_norm: float = option(1.0, ge=0)
    """global gradient-norm clip (0 = no clipping; the norm is still logged)"""
    inner_epochs: int = option(1, ge=1)
    """mu: passes over each rollout batch (PPO epochs)"""
    prompts_per_update: int = option(0, ge=0)
    """prompts (whole groups) per optimizer step, verl's ppo_mini_batch_size: each inner epoch takes
    rollout.prompts_per_step / prompts_per_update steps in data order (0 = all: one step)"""


@dataclass(frozen=True)
class SystemConfig:
    """Where and how the computation runs; none of these changes the loss (up to rounding)."""

    device: str = option("cpu", pattern=r"cpu|cuda(:\d+)?", expect="cpu, cuda or cuda:N")
    """torch device of the policy (cpu, cuda, cuda:0, ...); under torchrun cuda means
    cuda:LOCAL_RANK"""
    precision: str = option("fp32", choices=PRECISIONS)
    """fp32; bf16-mixed (fp32 weights and optimizer, bf16 compute); bf16 (bf16 weights too)"""
    micro_batch_size: int = option(8, ge=1)
    """responses per forward/backward pass; gradients are accumulated over the batch"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass (transformers' gradient checkpointing)"""
    parallel: str = option("auto", choices=PARALLEL)
    """data parallelism under torchrun: ddp, fsdp2 (fully_shard) or auto (fsdp2 on CUDA, else
    ddp)"""
    num_threads: int = option(0, ge=0)
    """torch CPU threads (torch.set_num_threads); 0 = leave torch's default"""
    tf32: bool = False
    """CUDA: float32 matrix products on TF32 tensor cores (torch.set_float32_matmul_precision
    'high'; ~10 mantissa bits per product, fp32 accumulation)"""


@dataclass(frozen=True)
class RunConfig:
    """What the run folder records: checkpoints, metrics.jsonl and TensorBoard."""

    save_every: int = option(10, ge=0)
    """checkpoint every this many steps (the last step is always saved; 0 = only the last)"""
    log_every: int = option(1, ge=1)
    """write metrics.jsonl / TensorBoard every this many steps"""
    tensorboard: bool = True
    """write TensorBoard events to DIR/tb (skipped with a warning if tensorboard is missing)"""


@dataclass(frozen=True)
class TrainConfig:
    """One RL fine-tuning run of a causal LM on Countdown or math with a `shaping.METHODS` method.

    Frozen, as are its tables: resolved once (`load_config`, `config_from_dict`), then carried
    as is by the trainer, a sweep's jobs and its records; a variant is `dataclasses.replace`."""

    task: str = option("countdown", choices=lambda: sorted(TASKS), hint=OWN_TASK)
    """a task of llm.tasks.TASKS: countdown (seed 000 App. C.1), math (boxed answers graded by
    math-verify), or any registered task"""
    model_path: str = option("runs/base_tiny", length=(1, None))
    """local Hugging Face model directory (model + tokenizer); nothing is downloaded"""
    build_base_model: bool = False
    """build the offline tiny base model at `model_path` first (llm.model.tiny.ensure_base_model)"""
    tiny_data_seed: int = option(0, ge=0, le=MAX_SEED)
    """seed of llm.model.tiny's problem streams (TinyConfig.data_seed): the training and held-out
    problems of the `tiny` data and eval sources, and the base model `build_base_model` warm- starts
    on them (give each seed its own `model_path`)"""
    tiny_sum_fraction: float = option(0.0, ge=0.0, le=1.0)
    """share of llm.model.tiny's problems whose target is the sum of their numbers
    (TinyConfig.sum_fraction; the designed regime of configs/study_countdown_rule.toml, where the
    "add every number" rule is right that often; give each setting its own `model_path`)"""
    tiny_rule_fraction: float = option(0.0, ge=0.0, le=1.0)
    """share of the tiny base model's warm-start examples that are the "add every number" rule,
    right or wrong (TinyConfig.rule_fraction; the strategy a pretrained model brings)"""
    method: str = option("grpo", choices=lambda: sorted(shaping.METHODS), hint=OWN_METHOD)
    """shaping method, a key of shaping.METHODS"""
    hyper: dict[str, Any] = field(default_factory=dict)
    """the method's hyper-parameters (the [hyper] table); unset ones take the method's defaults"""
    kl_coef: float = option(0.0, ge=0)
    """KL penalty to the frozen reference in the loss (hyper.kl_estimator, k3 by default), any
    method; > 0 loads a reference copy; with control.adaptive_kl its starting value"""
    entropy_coef: float = option(0.0, ge=0)
    """token-entropy bonus of any method, verl's entropy_coeff (loss -= c * entropy); with
    control.adaptive_entropy its starting value"""
    steps: int = option(20, ge=1)
    """number of training steps (rollout + update rounds)"""
    seed: int = option(0, ge=0, le=MAX_SEED)
    """seed of sampling, data order and initialization of anything random"""
    template: str = "compact"
    """prompt template; countdown: compact (tiny model), base or qwen-instruct (TinyZero); math:
    llm.tasks.MATH_TEMPLATES (qwen-math, qwen3, qwen3-nothink, plain)"""
    format_score: float = option(0.1, ge=0, lt=1)
    """reward of a well-formed but wrong answer (TinyZero: 0.1; correct answers score 1)"""
    distinct: str = option("commutative", choices=DISTINCT)
    """what makes two solutions different (llm.tasks.solution_key): commutative or ac"""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """sampling of a step's B x G responses"""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """AdamW, its schedule and the update's mini-batches"""
    system: SystemConfig = field(default_factory=SystemConfig)
    """device, precision, parallelism, memory"""
    run: RunConfig = field(default_factory=RunConfig)
    """checkpoints and logs of the run folder"""
    control: ControlConfig = field(default_factory=ControlConfig)
    """adaptive entropy coefficient (Skywork-OR1), KL in the reward, adaptive KL coefficient,
    reference resets (ProRL)"""
    explore: ExploreConfig = field(default_factory=ExploreConfig)
    """outcome-based exploration bonuses on final answers"""
    data: DataConfig = field(default_factory=DataConfig)
    """training problems"""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """held-out evaluation"""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """the vLLM engine's settings (with rollout.backend = vllm)"""

    def __post_init__(self) -> None:
        """Validation at construction (`config_from_dict`, a `dataclasses.replace`): every field
        against its metadata (type, choices, bounds; `experiment.schema.check_fields`), then the
        rules between fields, ``(holds, key, expected)`` in order, then the method's [hyper]
        (`_validate_hyper`).

        Raises:
            ValueError: the first invalid field, named with its value.
        """
        c = self
        schema.check_fields(c)
        for key in _METHOD_WIDE:
            if key in c.hyper:
                raise ValueError(
                    f"hyper.{key} = {c.hyper[key]!r}: set the top-level {key} instead"
                    + (" (it also loads the reference)" if key == "kl_coef" else "")
                )
        task, d, e, ctl = TASKS[c.task], c.data, c.eval, c.control
        per_step, per_update = c.rollout.prompts_per_step, c.optim.prompts_per_update
        vllm, kl_on = c.rollout.backend == "vllm", c.kl_coef > 0 or ctl.kl_in_reward
        # fmt: off
        rules = (
            (per_update == 0 or per_step % per_update == 0, "optim.prompts_per_update",
             f"0 or an integer dividing rollout.prompts_per_step ({per_step})"),
            (c.template in task.templates, "template", f"one of {task.templates} ({c.task})"),
            (not vllm or c.system.device.startswith("cuda"), "system.device",
             "cuda with rollout.backend = vllm"),
            (not vllm or e.sampler == "generate", "eval.sampler", "generate with rollout.backend = "
             "vllm (the stacked sampler runs the transformers model)"),
            (task.tiny_data or d.source != "tiny", "data.source",
             f"generate or file (task = {c.task})"),
            (task.tiny_data or e.source != "tiny", "eval.source",
             f"generate or file (task = {c.task})"),
            ((d.source == "file") == bool(d.path), "data.path", "set iff data.source = 'file'"),
            (all(e.paths), "eval.paths", "a list of file paths (none empty)"),
            ((e.source == "file") == bool(e.paths), "eval.paths", "set iff eval.source = 'file'"),
            (d.max_number >= d.min_number, "data.max_number",
             f"an integer >= data.min_number ({d.min_number})"),
            (d.max_target >= d.min_target, "data.max_target",
             f"an integer >= data.min_target ({d.min_target})"),
            (not e.source == d.source == "generate" or e.seed != d.seed, "eval.seed",
             f"a seed other than data.seed ({d.seed})"),
            (ctl.entropy_coef_max >= ctl.entropy_coef_min, "control.entropy_coef_max",
             f"a number >= control.entropy_coef_min ({ctl.entropy_coef_min})"),
            (not ctl.adaptive_kl or kl_on, "control.adaptive_kl",
             "false unless kl_coef > 0 or control.kl_in_reward (no KL coefficient to adapt)"),
            (not (ctl.adaptive_kl and ctl.kl_in_reward) or ctl.kl_reward_coef > 0,
             "control.kl_reward_coef",
             "a number > 0 with control.adaptive_kl (the controller multiplies it: 0 stays 0)"),
            (ctl.reference_reset_every == 0 or kl_on, "control.reference_reset_every",
             "0 unless kl_coef > 0 or control.kl_in_reward (there is no reference to reset)"),
            (not ctl.reset_optimizer or ctl.reference_reset_every > 0, "control.reset_optimizer",
             "false unless control.reference_reset_every > 0 (it acts at the resets)"),
            # The bonus must not lift a wrong answer over the correct-set threshold (rewards > 0.5).
            (c.format_score + c.explore.ucb_coef < 0.5, "explore.ucb_coef",
             f"a number below 0.5 - format_score ({c.format_score})"),
        )
        # fmt: on
        for holds, key, expect in rules:
            require(holds, key, operator.attrgetter(key)(c), expect)
        _validate_hyper(c)

    @property
    def loss_hyper(self) -> Mapping[str, Any]:
        """The resolved keyword arguments of ``shaping.METHODS[method].loss`` (read-only): see
        `loss_hyper`, the one place they are computed."""
        return loss_hyper(self)

    @property
    def uses_reference(self) -> bool:
        """Whether the run loads the frozen KL reference: the in-loss ``kl_coef > 0`` or the
        in-reward penalty (``control.kl_in_reward``)."""
        return self.kl_coef > 0 or self.control.kl_in_reward

    @property
    def n_candidates(self) -> int:
        """Candidates N to compute per token: `rollout.top_n`, raised to the method's `top_n` for
        CaSP."""
        hyper = self.loss_hyper
        if "cand_logp" in shaping.METHODS[self.method].needs_for(**hyper):
            return max(self.rollout.top_n, int(hyper.get("top_n", 0)))
        return self.rollout.top_n


def loss_hyper(cfg: TrainConfig) -> Mapping[str, Any]:
    """The keyword arguments of ``shaping.METHODS[cfg.method].loss`` and ``.needs_for``, resolved
    once, read-only: the method's defaults, then ``[hyper]``, then the method-wide top-level
    `kl_coef` and `entropy_coef`. Dr. GRPO's constant length divisor ``max_response_length`` is the
    generation budget ``rollout.max_new_tokens`` (as TRL's max_completion_length,
    docs/formulas.md §2.2) unless ``[hyper]`` sets it. The one place the loss coefficients are
    resolved: the trainer, the behaviour pass, the update, validation and the benches read it
    (``cfg.loss_hyper``)."""
    defaults = shaping.METHODS[cfg.method].defaults
    hyper = {**defaults, **cfg.hyper, "kl_coef": cfg.kl_coef, "entropy_coef": cfg.entropy_coef}
    if "max_response_length" in defaults and "max_response_length" not in cfg.hyper:
        hyper["max_response_length"] = cfg.rollout.max_new_tokens
    return MappingProxyType(hyper)


_TABLES: dict[str, type] = schema.tables(TrainConfig)  # rollout, optim, ..., vllm
_METHOD_WIDE = ("kl_coef", "entropy_coef")  # top-level keys, not [hyper] entries

OLD_KEYS: dict[str, str] = {
    **{f.name: f"{table}.{f.name}"
       for table in ("rollout", "optim", "system", "run")
       for f in dataclasses.fields(_TABLES[table])},
    "eval.n_samples": "eval.samples",
}  # fmt: skip
"""A removed spelling -> the key that replaced it: every key of [rollout], [optim], [system] and
[run] was top-level before these tables (``lr`` -> ``optim.lr``), and the evaluation's sample
count is ``samples`` from the TOML to the code (``eval.n_samples``). Each was accepted with a
`FutureWarning` for one release; a config file, ``--set`` pair, keyword override or sweep setting
that still spells one is refused with a one-line error naming the new key (`refuse_old_key`,
`experiment.schema.removed`). A run folder's saved ``config.toml``, written by the program, is
upgraded instead (`load_saved_config`, `llm.run.checkpoint.upgrade_run_config`: the value moves to
the new key, the move is recorded in the folder)."""


def describe() -> str:
    """Every config key with its default (as TOML), documentation and accepted values, then each
    method's hyper-parameters with their defaults (the `--help` of a config file)."""
    lines = [
        schema.describe(TrainConfig),
        "",
        "hyper.NAME = VALUE  # the method's hyper-parameters ([hyper]); per method, with defaults:",
    ]
    for name, m in sorted(shaping.METHODS.items()):
        own = ", ".join(
            f"{k} = {schema.toml_value(v)}" for k, v in m.defaults.items() if k not in _METHOD_WIDE
        )
        lines.append(f"  {name}: {own or '(none)'}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Loading, --set overrides and validation


def refuse_old_key(key: str) -> str:
    """`key` (a ``KEY`` or ``TABLE.NAME``), unless it is a removed spelling of `OLD_KEYS`.

    Raises:
        ValueError: ``OLD: removed; write NEW`` (`experiment.schema.removed`).
    """
    if key in OLD_KEYS:
        removed(key, OLD_KEYS[key])
    return key


def config_from_dict(raw: Mapping[str, Any]) -> TrainConfig:
    """A validated `TrainConfig` from a parsed TOML document (`experiment.schema.from_dict`).

    Raises:
        ValueError: an unknown key, a removed spelling (`OLD_KEYS`, naming the new key) or an
            invalid value (the message names the field).
    """
    refuse_moved(raw, OLD_KEYS)
    return schema.from_dict(TrainConfig, raw)


def apply_overrides(raw: Mapping[str, Any], pairs: Iterable[str]) -> dict[str, Any]:
    """A copy of the parsed config `raw` with each ``KEY=VALUE`` of `pairs` applied in order
    (`experiment.schema.apply_overrides` over `TrainConfig`).

    KEY is a top-level key (``steps``) or ``TABLE.NAME`` (``optim.lr``, ``data.seed``,
    ``hyper.gamma_p``); a removed spelling (``lr``, `OLD_KEYS`) is refused, naming the new key.
    VALUE is parsed by `experiment.schema.parse_value`. A table value (``data={seed = 3}``) is
    merged into the table. Values are checked later, by `config_from_dict`.

    Raises:
        ValueError: a pair without ``=``, an unknown key (the message names the pair) or a
            removed spelling (naming the new key).
    """
    pairs = list(pairs)
    for pair in pairs:
        refuse_old_key(pair.partition("=")[0].strip())
    refuse_moved(raw, OLD_KEYS)
    return schema.apply_overrides(TrainConfig, raw, pairs, example="optim.lr=3e-4 or data.seed=3")


def load_config(
    path: str | os.PathLike[str] | None, *, sets: Iterable[str] = (), **overrides: Any
) -> TrainConfig:
    """Read a TOML config (None: the defaults), apply the ``KEY=VALUE`` strings of `sets`
    (`apply_overrides`), then `overrides` (top-level fields, e.g. ``steps=2``, or tables merged
    into the file's, e.g. ``optim={"lr": 1e-3}``; None leaves a field alone), and validate
    (`config_from_dict`): the one way from a file and the command line to a `TrainConfig`.

    Raises:
        ValueError: invalid TOML, an unknown key or an invalid value (naming the field and where
            its value came from: ``--set``, or the file and the field's line, `source_error`).
        FileNotFoundError: no such file.
    """
    raw = {} if path is None else read_toml(path)
    if path is not None:
        try:
            refuse_moved(raw, OLD_KEYS)
        except ValueError as e:  # a removed spelling in the file: the file and its line
            raise config_error(path, e) from None
    raw = apply_overrides(raw, sets)
    by_set = [pair.split("=", 1)[0].strip() for pair in sets]
    given = list(by_set)  # keys set otherwise than by the file
    for key, value in ((k, v) for k, v in overrides.items() if v is not None):
        given += [f"{key}.{k}" for k in value] if isinstance(value, dict) else [key]
        table, _, name = refuse_old_key(key).rpartition(".")
        target = raw.setdefault(table, {}) if table else raw
        if isinstance(value, dict) and isinstance(target.get(name), dict):
            value = {**target[name], **value}  # a table is merged, as by --set
        target[name] = value
    try:
        return config_from_dict(raw)
    except ValueError as e:  # the file and the key's line, or --set for a key it gave
        raise source_error(path, e, by_set, given) from None


def load_saved_config(path: str | os.PathLike[str]) -> tuple[TrainConfig, dict[str, str]]:
    """A run folder's saved ``config.toml`` (written by the program, `save_config`), with every
    removed spelling of `OLD_KEYS` moved to the key that replaced it
    (`experiment.schema.migrate_moved`: the value moves as it is, so the config means what it meant
    when it was saved), and the moves made, ``{old: new}`` (empty for a current file). What a
    person writes is refused instead (`load_config`); `llm.run.checkpoint.upgrade_run_config`
    rewrites the folder and records the moves.

    Raises:
        ValueError: invalid TOML, an old key and its replacement both set, an unknown key or an
            invalid value (naming the file and the field).
        FileNotFoundError: no such file.
    """
    path = Path(path)
    raw = read_toml(path)
    try:
        raw, moved = migrate_moved(raw, OLD_KEYS)
        return config_from_dict(raw), moved
    except ValueError as e:
        raise config_error(path, e) from None


def check_model_path(cfg: TrainConfig) -> None:
    """Refuse a `model_path` that is not a local folder (unless `build_base_model` creates it):
    transformers would take the path for a hub name and fail on the network, naming nothing.

    Raises:
        FileNotFoundError: naming the folder.
    """
    path = Path(cfg.model_path)
    if not cfg.build_base_model and not path.is_dir():
        what = "is not a folder" if path.exists() else "does not exist"
        raise FileNotFoundError(
            f"model_path: {str(path)!r} {what}; it must be a local Hugging Face model folder "
            "(nothing is downloaded), or set build_base_model = true for the tiny model"
        )


def _validate_hyper(c: TrainConfig) -> None:
    """Names and types of [hyper] against ``shaping.METHODS[method].defaults`` (a float default
    takes any finite number, an int default an integer, ...), then the method run once on a tiny
    batch (B=1, G=rollout.group_size, T=2) so that shaping's own rules (ranges, ``k <= G``, ...) apply."""
    method = shaping.METHODS[c.method]
    for key, value in c.hyper.items():
        if key not in method.defaults:
            known = sorted(k for k in method.defaults if k not in _METHOD_WIDE)
            raise ValueError(
                f"hyper.{key} = {value!r}: not a hyper-parameter of {c.method}; known: {known}"
            )
    # Types, then the method's own rules, on the resolved values (the top-level keys too).
    check_hyper(
        c.method, c.loss_hyper, where="hyper", group_size=c.rollout.group_size,
        num_candidates=c.n_candidates,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Writing TOML (flat keys and one-level tables are all a config holds)


def config_to_toml(cfg: TrainConfig) -> str:
    """The resolved config as TOML: top-level keys, then [hyper] (with the method's defaults filled
    in), then the tables of `TrainConfig` in declaration order ([rollout], [optim], [system], [run],
    [control], [explore], [data], [eval], [vllm]). `load_config` of the result gives back an equal config."""
    docs = schema.field_docs(TrainConfig)
    lines = ["# Resolved training config (every key: python -m llm train --describe)."]
    for f, _ in schema.options(TrainConfig):
        if f.name == "hyper":
            continue
        lines.append(f"{f.name} = {schema.toml_value(getattr(cfg, f.name))}  # {docs[f.name]}")
    defaults = {
        k: v for k, v in shaping.METHODS[cfg.method].defaults.items() if k not in _METHOD_WIDE
    }
    hyper = {**defaults, **cfg.hyper}
    lines += ["", "[hyper]  # method hyper-parameters, resolved with the method's defaults"]
    lines += [f"{k} = {schema.toml_value(v)}" for k, v in hyper.items()]
    for name in _TABLES:
        sub = getattr(cfg, name)
        sub_docs = schema.field_docs(type(sub))
        lines += ["", f"[{name}]"]
        for f in dataclasses.fields(sub):
            lines.append(
                f"{f.name} = {schema.toml_value(getattr(sub, f.name))}  # {sub_docs[f.name]}"
            )
    return "\n".join(lines) + "\n"


def save_config(cfg: TrainConfig, path: str | os.PathLike[str]) -> None:
    """Write `config_to_toml(cfg)` to `path` atomically (`experiment.store.write_text`)."""
    write_text(path, config_to_toml(cfg))
