"""Training configuration: a documented dataclass loaded from TOML, validated field by field.

CleanRL style: each field's docstring is its documentation (`describe()` prints them, and the
resolved config written to ``DIR/config.toml`` is the record of a run). A config file holds the
top-level fields and four one-level tables: ``[hyper]`` (the method's hyper-parameters, names as
in ``shaping.METHODS[method].defaults``), ``[data]`` (`DataConfig`), ``[eval]`` (`EvalConfig`) and
``[vllm]`` (`VLLMConfig`).
Every field is checked by `validate`; a bad value or an unknown key raises ``ValueError`` naming it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import shaping
from llm.tasks import TEMPLATES
from llm.tasks.math import MATH_TEMPLATES

__all__ = [
    "DataConfig",
    "EvalConfig",
    "TrainConfig",
    "VLLMConfig",
    "config_to_toml",
    "describe",
    "load_config",
    "save_config",
    "validate",
]

SCHEDULES = ("constant", "cosine", "linear")
BACKENDS = ("transformers", "vllm")
DISTINCT = ("commutative", "ac")
TASKS = ("countdown", "math")
DATA_SOURCES = ("tiny", "generate", "file")
EVAL_SOURCES = ("tiny", "generate", "file")
PRECISIONS = ("fp32", "bf16-mixed", "bf16")
PARALLEL = ("auto", "ddp", "fsdp2")
ROLLOUT_IS = ("truncate", "none")
VLLM_DTYPES = ("bfloat16", "float16", "float32", "auto")


@dataclass
class DataConfig:
    """Training problems: the tiny model's training stream, generated, or a local file."""

    source: str = "tiny"
    """tiny (llm.tiny's train stream, countdown only), generate, or file"""
    path: str = ""
    """source = file: a local .jsonl/.parquet file (Countdown-Tasks-3to4; math: MATH, DAPO-Math)"""
    n_problems: int = 1000
    """number of problems to draw (source = tiny or generate)"""
    seed: int = 1
    """seed of the generator (source = generate; held-out eval problems use `eval.seed`)"""
    num_numbers: list[int] = field(default_factory=lambda: [3])
    """source = generate: how many numbers a problem has (each problem draws one of these)"""
    min_number: int = 1
    """source = generate: smallest operand"""
    max_number: int = 20
    """source = generate: largest operand"""
    min_target: int = 1
    """source = generate: smallest target"""
    max_target: int = 100
    """source = generate: largest target (the tiny model's vocabulary stops at 100)"""


@dataclass
class EvalConfig:
    """Held-out evaluation settings used by `python -m llm eval --config FILE`."""

    source: str = "tiny"
    """tiny (llm.tiny's held-out stream), generate (the bounds of [data] with `seed`) or file"""
    paths: list[str] = field(default_factory=list)
    """source = file: local evaluation files (MATH500 / AIME / AMC formats), each reported apart"""
    n_problems: int = 64
    """number of held-out problems (per file with source = file; fewer if the file is shorter)"""
    seed: int = 12345
    """source = generate: seed of the held-out problems (must differ from `data.seed`)"""
    n_samples: int = 16
    """samples per problem n; pass@k is reported for k = 1, 2, 4, ..., n"""
    temperature: float = 1.0
    """sampling temperature at evaluation"""
    top_p: float = 1.0
    """nucleus sampling threshold at evaluation"""
    top_k: int = 0
    """top-k sampling at evaluation (0 = off)"""
    max_new_tokens: int = 0
    """longest response at evaluation (0 = the training max_new_tokens)"""


@dataclass
class VLLMConfig:
    """The colocated vLLM engine of ``backend = "vllm"`` (`llm.vllm_backend.VLLMBackend`)."""

    gpu_memory_utilization: float = 0.3
    """fraction of the GPU's memory vLLM may take (weights + KV cache); the trainer gets the rest"""
    sleep_mode: bool = True
    """put the engine to sleep (free its KV cache and weights) during each update"""
    tensor_parallel_size: int = 1
    """vLLM tensor parallelism (GPUs per engine)"""
    max_model_len: int = 0
    """longest prompt + response the engine accepts (0 = vLLM's default for the model)"""
    enforce_eager: bool = False
    """disable CUDA graphs (less memory, slower generation)"""
    dtype: str = "bfloat16"
    """engine weight dtype: bfloat16, float16, float32 or auto"""


@dataclass
class TrainConfig:
    """One RL fine-tuning run of a causal LM on Countdown or math with a `shaping.METHODS` method."""

    task: str = "countdown"
    """countdown (seed 000 App. C.1) or math (boxed answers graded by math-verify)"""
    model_path: str = "runs/base_tiny"
    """local Hugging Face model directory (model + tokenizer); nothing is downloaded"""
    build_base_model: bool = False
    """build the offline tiny base model at `model_path` first (llm.tiny.ensure_base_model)"""
    method: str = "grpo"
    """shaping method, a key of shaping.METHODS"""
    hyper: dict[str, Any] = field(default_factory=dict)
    """the method's hyper-parameters (the [hyper] table); unset ones take the method's defaults"""
    group_size: int = 8
    """G: responses sampled per prompt"""
    prompts_per_step: int = 4
    """B: prompts per training step"""
    steps: int = 20
    """number of training steps (rollout + update rounds)"""
    prompts_per_update: int = 0
    """prompts (whole groups) per optimizer step, verl's ppo_mini_batch_size: each inner epoch
    takes prompts_per_step / prompts_per_update steps in data order (0 = all: one step)"""
    inner_epochs: int = 1
    """mu: passes over each rollout batch (PPO epochs)"""
    micro_batch_size: int = 8
    """responses per forward/backward pass; gradients are accumulated over the batch"""
    lr: float = 1e-4
    """AdamW learning rate (peak, after warm-up)"""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay"""
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW (beta1, beta2)"""
    schedule: str = "constant"
    """learning-rate schedule after warm-up: constant, cosine (to 0) or linear (to 0)"""
    warmup_steps: int = 0
    """optimizer steps of linear warm-up from 0"""
    max_grad_norm: float = 1.0
    """global gradient-norm clip (0 = no clipping; the norm is still logged)"""
    kl_coef: float = 0.0
    """k3 KL penalty to the frozen base model; > 0 loads a reference copy"""
    entropy_coef: float = 0.0
    """token-entropy bonus of any method, verl's entropy_coeff (loss -= c * entropy)"""
    temperature: float = 1.0
    """sampling temperature; the trainer's log-probs use logits / temperature as well"""
    top_p: float = 1.0
    """nucleus sampling threshold of the rollout backend"""
    max_new_tokens: int = 16
    """longest response, in tokens"""
    max_prompt_tokens: int = 0
    """training problems whose prompt is longer (in tokens) are dropped, as verl's
    filter_overlong_prompts; 0 = keep all"""
    top_n: int = 0
    """candidates tracked per token (Lambda^(n) metrics, CaSP); CaSP raises it to its own top_n"""
    template: str = "compact"
    """prompt template; countdown: compact (tiny model), base or qwen-instruct (TinyZero); math:
    llm.tasks.MATH_TEMPLATES (qwen-math, qwen3, plain)"""
    format_score: float = 0.1
    """reward of a well-formed but wrong answer (TinyZero: 0.1)"""
    distinct: str = "commutative"
    """what makes two solutions different (llm.tasks.solution_key): commutative or ac"""
    data: DataConfig = field(default_factory=DataConfig)
    """training problems ([data] table)"""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """held-out evaluation ([eval] table)"""
    seed: int = 0
    """seed of sampling, data order and initialization of anything random"""
    save_every: int = 10
    """checkpoint every this many steps (the last step is always saved; 0 = only the last)"""
    log_every: int = 1
    """write metrics.jsonl / TensorBoard every this many steps"""
    backend: str = "transformers"
    """rollout backend: transformers (model.generate) or vllm (colocated engine, [vllm] table)"""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """the vLLM engine's settings ([vllm] table; used with backend = vllm)"""
    rollout_is: str = "truncate"
    """correction for sampler/trainer log-prob mismatch: truncate (per-token weight
    min(exp(logp_old - logp_sampler), rollout_is_cap) on the surrogate, as TRL and verl) or none"""
    rollout_is_cap: float = 2.0
    """upper bound of the truncated importance-sampling weight"""
    device: str = "cpu"
    """torch device of the policy (cpu, cuda, cuda:0, ...); under torchrun cuda means cuda:LOCAL_RANK"""
    precision: str = "fp32"
    """fp32; bf16-mixed (fp32 weights and optimizer, bf16 compute); bf16 (bf16 weights too)"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass (transformers' gradient checkpointing)"""
    parallel: str = "auto"
    """data parallelism under torchrun: ddp, fsdp2 (fully_shard) or auto (fsdp2 on CUDA, else ddp)"""
    tensorboard: bool = True
    """write TensorBoard events to DIR/tb (skipped with a warning if tensorboard is missing)"""
    num_threads: int = 0
    """torch CPU threads (torch.set_num_threads); 0 = leave torch's default"""

    @property
    def n_candidates(self) -> int:
        """Candidates N to compute per token: `top_n`, raised to the method's `top_n` for CaSP."""
        needs = shaping.METHODS[self.method].needs_for(**self.method_hyper())
        if "cand_logp" in needs:
            return max(self.top_n, int(self.method_hyper().get("top_n", 0)))
        return self.top_n

    def method_hyper(self) -> dict[str, Any]:
        """The keyword arguments of ``shaping.METHODS[method].loss``: `hyper` plus `kl_coef` and
        `entropy_coef`."""
        return {**self.hyper, "kl_coef": self.kl_coef, "entropy_coef": self.entropy_coef}


_TABLES = ("data", "eval", "vllm")


def _field_docs(cls: type) -> dict[str, str]:
    """Field docstrings (the string literal after each annotated field), read from the source."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def describe() -> str:
    """Every config key with its default and documentation (the `--help` of a config file)."""
    lines = []
    tables = (
        ("", TrainConfig),
        ("data.", DataConfig),
        ("eval.", EvalConfig),
        ("vllm.", VLLMConfig),
    )
    for prefix, cls in tables:
        docs = _field_docs(cls)
        for f in dataclasses.fields(cls):
            if f.name in _TABLES:
                continue
            default = f.default_factory() if callable(f.default_factory) else f.default
            lines.append(f"{prefix}{f.name} = {default!r}  # {docs.get(f.name, '')}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Loading and validation


def _build(cls: type, table: dict[str, Any], where: str) -> Any:
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ValueError(f"{where}unknown key(s) {unknown}; known: {sorted(known)}")
    return cls(**table)


def config_from_dict(raw: dict[str, Any]) -> TrainConfig:
    """A validated `TrainConfig` from a parsed TOML document.

    Raises:
        ValueError: an unknown key or an invalid value (the message names the field).
    """
    raw = dict(raw)
    data = raw.pop("data", {})
    ev = raw.pop("eval", {})
    vl = raw.pop("vllm", {})
    tables = (("data", data), ("eval", ev), ("vllm", vl), ("hyper", raw.get("hyper", {})))
    for name, table in tables:
        if not isinstance(table, dict):
            raise ValueError(f"{name}: expected a table, got {table!r}")
    cfg = _build(TrainConfig, raw, "")
    cfg.data = _build(DataConfig, data, "data: ")
    cfg.eval = _build(EvalConfig, ev, "eval: ")
    cfg.vllm = _build(VLLMConfig, vl, "vllm: ")
    validate(cfg)
    return cfg


def load_config(path: str | os.PathLike[str], **overrides: Any) -> TrainConfig:
    """Read a TOML config (`overrides` replace top-level fields, e.g. ``steps=2``) and validate it.

    Raises:
        ValueError: invalid TOML, an unknown key or an invalid value (naming the field).
        FileNotFoundError: no such file.
    """
    with Path(path).open("rb") as f:
        try:
            raw = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: invalid TOML: {e}") from None
    raw.update({k: v for k, v in overrides.items() if v is not None})
    return config_from_dict(raw)


def _check(ok: bool, name: str, value: object, expect: str) -> None:
    if not ok:
        raise ValueError(f"{name}: expected {expect}, got {value!r}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def validate(cfg: TrainConfig) -> None:
    """Check every field of `cfg` (and its tables); method hyper-parameters are checked by calling
    the method once on a tiny NumPy batch with the run's group size and candidate count, so the
    shaping core's own rules (names, ranges, ``k <= G`` for pass@k, ...) apply.

    Raises:
        ValueError: the first invalid field, named in the message.
    """
    c = cfg
    _check(
        isinstance(c.model_path, str) and c.model_path != "", "model_path", c.model_path, "a path"
    )
    _check(c.task in TASKS, "task", c.task, f"one of {TASKS}")
    for name in ("build_base_model", "tensorboard", "gradient_checkpointing"):
        _check(isinstance(getattr(c, name), bool), name, getattr(c, name), "true or false")
    _check(
        isinstance(c.method, str) and c.method in shaping.METHODS,
        "method",
        c.method,
        f"one of {sorted(shaping.METHODS)}",
    )
    _check(isinstance(c.hyper, dict), "hyper", c.hyper, "a table")
    if "kl_coef" in c.hyper:
        raise ValueError(
            "hyper.kl_coef: set the top-level kl_coef instead (it also loads the reference)"
        )
    if "entropy_coef" in c.hyper:
        raise ValueError("hyper.entropy_coef: set the top-level entropy_coef instead")
    for name in ("group_size", "prompts_per_step", "steps", "inner_epochs", "micro_batch_size"):
        v = getattr(c, name)
        _check(_is_int(v) and v >= 1, name, v, "an integer >= 1")
    for name in ("warmup_steps", "save_every", "top_n", "num_threads", "max_prompt_tokens"):
        v = getattr(c, name)
        _check(_is_int(v) and v >= 0, name, v, "an integer >= 0")
    _check(_is_int(c.log_every) and c.log_every >= 1, "log_every", c.log_every, "an integer >= 1")
    _check(_is_int(c.seed) and c.seed >= 0, "seed", c.seed, "an integer >= 0")
    _check(_is_num(c.lr) and c.lr > 0, "lr", c.lr, "a number > 0")
    _check(_is_num(c.weight_decay) and c.weight_decay >= 0, "weight_decay", c.weight_decay, ">= 0")
    _check(
        isinstance(c.adam_betas, list)
        and len(c.adam_betas) == 2
        and all(_is_num(b) and 0 <= b < 1 for b in c.adam_betas),
        "adam_betas",
        c.adam_betas,
        "two numbers in [0, 1)",
    )
    _check(c.schedule in SCHEDULES, "schedule", c.schedule, f"one of {SCHEDULES}")
    _check(
        _is_num(c.max_grad_norm) and c.max_grad_norm >= 0, "max_grad_norm", c.max_grad_norm, ">= 0"
    )
    _check(_is_num(c.kl_coef) and c.kl_coef >= 0, "kl_coef", c.kl_coef, "a number >= 0")
    _check(
        _is_num(c.entropy_coef) and c.entropy_coef >= 0,
        "entropy_coef",
        c.entropy_coef,
        "a number >= 0",
    )
    _check(
        _is_int(c.prompts_per_update)
        and c.prompts_per_update >= 0
        and (c.prompts_per_update == 0 or c.prompts_per_step % c.prompts_per_update == 0),
        "prompts_per_update",
        c.prompts_per_update,
        f"0 or an integer dividing prompts_per_step ({c.prompts_per_step})",
    )
    _check(_is_num(c.temperature) and c.temperature > 0, "temperature", c.temperature, "> 0")
    _check(_is_num(c.top_p) and 0 < c.top_p <= 1, "top_p", c.top_p, "a number in (0, 1]")
    _check(
        _is_int(c.max_new_tokens) and c.max_new_tokens >= 1,
        "max_new_tokens",
        c.max_new_tokens,
        "an integer >= 1",
    )
    templates = TEMPLATES if c.task == "countdown" else MATH_TEMPLATES
    _check(c.template in templates, "template", c.template, f"one of {templates} ({c.task})")
    _check(
        _is_num(c.format_score) and 0 <= c.format_score < 1,
        "format_score",
        c.format_score,
        "a number in [0, 1) (correct answers score 1)",
    )
    _check(c.distinct in DISTINCT, "distinct", c.distinct, f"one of {DISTINCT}")
    _check(c.backend in BACKENDS, "backend", c.backend, f"one of {BACKENDS}")
    _check(
        isinstance(c.device, str) and (c.device == "cpu" or c.device.startswith("cuda")),
        "device",
        c.device,
        "cpu or cuda[:i]",
    )
    if c.backend == "vllm":
        _check(c.device.startswith("cuda"), "device", c.device, "cuda with backend = vllm")
    _check(c.rollout_is in ROLLOUT_IS, "rollout_is", c.rollout_is, f"one of {ROLLOUT_IS}")
    _check(
        _is_num(c.rollout_is_cap) and c.rollout_is_cap >= 1,
        "rollout_is_cap",
        c.rollout_is_cap,
        "a number >= 1",
    )
    _check(c.precision in PRECISIONS, "precision", c.precision, f"one of {PRECISIONS}")
    _check(c.parallel in PARALLEL, "parallel", c.parallel, f"one of {PARALLEL}")
    _validate_vllm(c.vllm)
    _validate_data(c.data, c.task)
    _validate_eval(c.eval, c.data, c.task)
    _validate_hyper(c)


def _validate_vllm(v: VLLMConfig) -> None:
    _check(
        _is_num(v.gpu_memory_utilization) and 0 < v.gpu_memory_utilization < 1,
        "vllm.gpu_memory_utilization",
        v.gpu_memory_utilization,
        "a number in (0, 1)",
    )
    for name in ("sleep_mode", "enforce_eager"):
        value = getattr(v, name)
        _check(isinstance(value, bool), f"vllm.{name}", value, "true or false")
    _check(
        _is_int(v.tensor_parallel_size) and v.tensor_parallel_size >= 1,
        "vllm.tensor_parallel_size",
        v.tensor_parallel_size,
        "an integer >= 1",
    )
    _check(
        _is_int(v.max_model_len) and v.max_model_len >= 0,
        "vllm.max_model_len",
        v.max_model_len,
        "an integer >= 0",
    )
    _check(v.dtype in VLLM_DTYPES, "vllm.dtype", v.dtype, f"one of {VLLM_DTYPES}")


def _validate_data(d: DataConfig, task: str) -> None:
    _check(d.source in DATA_SOURCES, "data.source", d.source, f"one of {DATA_SOURCES}")
    if task == "math":
        _check(d.source != "tiny", "data.source", d.source, "generate or file (task = math)")
    _check(isinstance(d.path, str), "data.path", d.path, "a path string")
    _check(
        (d.source == "file") == bool(d.path), "data.path", d.path, "set iff data.source = 'file'"
    )
    _check(_is_int(d.n_problems) and d.n_problems >= 1, "data.n_problems", d.n_problems, ">= 1")
    _check(_is_int(d.seed) and d.seed >= 0, "data.seed", d.seed, "an integer >= 0")
    _check(
        isinstance(d.num_numbers, list)
        and len(d.num_numbers) > 0
        and all(_is_int(k) and 2 <= k <= 5 for k in d.num_numbers),
        "data.num_numbers",
        d.num_numbers,
        "a non-empty list of integers in [2, 5]",
    )
    _check(_is_int(d.min_number) and d.min_number >= 0, "data.min_number", d.min_number, ">= 0")
    _check(
        _is_int(d.max_number) and d.max_number >= d.min_number,
        "data.max_number",
        d.max_number,
        f"an integer >= data.min_number ({d.min_number})",
    )
    _check(_is_int(d.min_target) and d.min_target >= 0, "data.min_target", d.min_target, ">= 0")
    _check(
        _is_int(d.max_target) and d.max_target >= d.min_target,
        "data.max_target",
        d.max_target,
        f"an integer >= data.min_target ({d.min_target})",
    )


def _validate_eval(e: EvalConfig, d: DataConfig, task: str) -> None:
    _check(e.source in EVAL_SOURCES, "eval.source", e.source, f"one of {EVAL_SOURCES}")
    if task == "math":
        _check(e.source != "tiny", "eval.source", e.source, "generate or file (task = math)")
    _check(
        isinstance(e.paths, list) and all(isinstance(x, str) and x for x in e.paths),
        "eval.paths",
        e.paths,
        "a list of file paths",
    )
    _check(
        (e.source == "file") == bool(e.paths), "eval.paths", e.paths, "set iff eval.source = 'file'"
    )
    _check(_is_num(e.top_p) and 0 < e.top_p <= 1, "eval.top_p", e.top_p, "a number in (0, 1]")
    for name in ("top_k", "max_new_tokens"):
        value = getattr(e, name)
        _check(_is_int(value) and value >= 0, f"eval.{name}", value, "an integer >= 0")
    _check(_is_int(e.n_problems) and e.n_problems >= 1, "eval.n_problems", e.n_problems, ">= 1")
    _check(_is_int(e.seed) and e.seed >= 0, "eval.seed", e.seed, "an integer >= 0")
    if e.source == d.source == "generate":
        _check(e.seed != d.seed, "eval.seed", e.seed, f"a seed other than data.seed ({d.seed})")
    _check(_is_int(e.n_samples) and e.n_samples >= 1, "eval.n_samples", e.n_samples, ">= 1")
    _check(_is_num(e.temperature) and e.temperature > 0, "eval.temperature", e.temperature, "> 0")


def _validate_hyper(c: TrainConfig) -> None:
    """Run the method once on a tiny batch (B=1, G=group_size, T=2) so shaping validates values."""
    method = shaping.METHODS[c.method]
    try:
        needs = method.needs_for(**c.method_hyper())
        n = max(c.n_candidates, 1)
        g, t = c.group_size, 2
        rewards = np.zeros((1, g))
        rewards[0, 0] = 1.0
        tok = np.full((1, g, t), -1.0)
        batch = {"rewards": rewards, "mask": np.ones((1, g, t)), "logp": tok, "logp_old": tok}
        extra = {
            "logp_ref": tok,
            "entropy": np.ones((1, g, t)),
            "cand_logp": np.full((1, g, t, n), -1.0),
            "cand_logp_old": np.full((1, g, t, n), -1.0),
            "sampled_rank": np.zeros((1, g, t), dtype=np.int64),
            "diversity": np.full((1, g), 0.5),
            "prompt_logp": np.full((1, 3), -1.0),
            "prompt_mask": np.ones((1, 3)),
        }
        batch.update({k: extra[k] for k in needs})
        method.loss(batch, **c.method_hyper())
    except ValueError as e:
        raise ValueError(f"hyper ({c.method}): {e}") from None


# ---------------------------------------------------------------------------------------------
# Writing TOML (flat keys and one-level tables are all a config holds)


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"cannot write non-finite float {v!r} to TOML")
        return repr(v)
    if isinstance(v, str):
        # JSON string escapes are valid TOML basic-string escapes for these characters.
        escaped = v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise ValueError(f"cannot write {type(v).__name__} {v!r} to TOML")


def config_to_toml(cfg: TrainConfig) -> str:
    """The resolved config as TOML: top-level keys, then [hyper] (with the method's defaults filled
    in), [data] and [eval]. `load_config` of the result gives back an equal config."""
    docs = _field_docs(TrainConfig)
    lines = ["# Resolved training config (llm/config.py documents every key)."]
    for f in dataclasses.fields(TrainConfig):
        if f.name == "hyper" or f.name in _TABLES:
            continue
        lines.append(f"{f.name} = {_toml_value(getattr(cfg, f.name))}  # {docs[f.name]}")
    defaults = dict(shaping.METHODS[cfg.method].defaults)
    defaults.pop("kl_coef", None)
    defaults.pop("entropy_coef", None)
    hyper = {**defaults, **cfg.hyper}
    lines += ["", "[hyper]  # method hyper-parameters, resolved with the method's defaults"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in hyper.items()]
    for name, sub in (("data", cfg.data), ("eval", cfg.eval), ("vllm", cfg.vllm)):
        sub_docs = _field_docs(type(sub))
        lines += ["", f"[{name}]"]
        for f in dataclasses.fields(sub):
            lines.append(f"{f.name} = {_toml_value(getattr(sub, f.name))}  # {sub_docs[f.name]}")
    return "\n".join(lines) + "\n"


def save_config(cfg: TrainConfig, path: str | os.PathLike[str]) -> None:
    """Write `config_to_toml(cfg)` to `path` atomically (temp file, then rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(config_to_toml(cfg), encoding="utf-8")
    tmp.replace(path)
