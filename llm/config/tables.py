"""The tables of a training config (`llm.config.TrainConfig`): ``[data]``, ``[eval]``, ``[vllm]``,
``[rollout]``, ``[optim]``, ``[system]``, ``[run]``, ``[control]`` and ``[explore]``, each field
declared once with its default, choices and bounds (`experiment.schema.option`) and its help as
the docstring under it, and the
accepted values they name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from experiment.schema import meta, option

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
