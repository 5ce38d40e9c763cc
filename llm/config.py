"""Training configuration: dataclasses whose fields carry their own documentation and rules.

Each field is declared once, with `option` or ``field(default_factory=..., metadata=meta(...))``
(TRL's ``field(metadata={"help": ...})`` pattern, as in trl/trainer/grpo_config.py): its default,
help text, choices and bounds live in that one place.
`validate` is one loop over that metadata plus the cross-field rules of `_cross_field_rules`;
`describe` (``python -m llm train --describe``) and the comments of the resolved config written to
``DIR/config.toml`` read the same metadata. A config file holds the top-level fields and four
one-level tables: ``[hyper]`` (the method's hyper-parameters, names and types as in
``shaping.METHODS[method].defaults``), ``[data]`` (`DataConfig`), ``[eval]`` (`EvalConfig`) and
``[vllm]`` (`VLLMConfig`). `apply_overrides` sets any key from ``key=value`` strings (the
``--set`` of the command line). A bad value or an unknown key raises ``ValueError`` naming it.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import os
import re
import tomllib
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import shaping
from llm.tasks import TASKS

__all__ = [
    "DataConfig",
    "EvalConfig",
    "TrainConfig",
    "VLLMConfig",
    "apply_overrides",
    "check_model_path",
    "config_from_dict",
    "config_to_toml",
    "describe",
    "load_config",
    "meta",
    "option",
    "parse_value",
    "save_config",
    "validate",
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
MAX_SEED = 2**32 - 1
MAX_LR = 1.0
"""Largest accepted `lr` (AdamW steps above 1 are never meaningful; near 1e38 its update overflows)."""
"""Largest seed: the trainer seeds NumPy's legacy global RNG, which takes 32-bit seeds."""


def meta(
    help: str,
    *,
    choices: Sequence[str] | Callable[[], Sequence[str]] = (),
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    length: tuple[int, int | None] | None = None,
    pattern: str | None = None,
    expect: str = "",
) -> dict[str, Any]:
    """The metadata of a config field: its documentation and the rules `validate` applies.

    Args:
        help: one-sentence documentation (whitespace is collapsed).
        choices: the allowed strings, or a function giving them when validating (a registry).
        ge, gt, le, lt: bounds of a number, or of every element of a list of numbers.
        length: ``(min, max)`` number of elements of a list (``max`` None: unbounded), or
            characters of a string.
        pattern: a regular expression a string must match in full.
        expect: what the field accepts, in words, where the rules above do not say it well.
    """
    return {
        "help": " ".join(help.split()),
        "choices": choices,
        "ge": ge,
        "gt": gt,
        "le": le,
        "lt": lt,
        "length": length,
        "pattern": pattern,
        "expect": expect,
    }


def option(default: Any, help: str, **rules: Any) -> Any:
    """A dataclass field with an immutable `default` and ``metadata=meta(help, **rules)``; list
    and table fields use ``field(default_factory=..., metadata=meta(...))`` directly."""
    return field(default=default, metadata=meta(help, **rules))


@dataclass
class DataConfig:
    """Training problems: the tiny model's training stream, generated, or a local file."""

    source: str = option(
        "tiny",
        "tiny (llm.tiny's train stream, countdown only), generate, or file",
        choices=DATA_SOURCES,
    )
    path: str = option(
        "",
        "source = file: a local .jsonl/.parquet file (Countdown-Tasks-3to4; math: MATH, DAPO-Math)",
    )
    n_problems: int = option(1000, "number of problems to draw (source = tiny or generate)", ge=1)
    seed: int = option(
        1,
        "seed of the generator (source = generate; held-out eval problems use `eval.seed`)",
        ge=0,
        le=MAX_SEED,
    )
    num_numbers: list[int] = field(
        default_factory=lambda: [3],
        metadata=meta(
            "source = generate: how many numbers a problem has (each problem draws one of these)",
            ge=2,
            le=5,
            length=(1, None),
        ),
    )
    min_number: int = option(1, "source = generate: smallest operand", ge=0)
    max_number: int = option(20, "source = generate: largest operand (>= min_number)")
    min_target: int = option(1, "source = generate: smallest target", ge=0)
    max_target: int = option(
        100,
        "source = generate: largest target (>= min_target; the tiny model's vocabulary stops at 100)",
    )


@dataclass
class EvalConfig:
    """Held-out evaluation settings used by `python -m llm eval --config FILE`."""

    source: str = option(
        "tiny",
        "tiny (llm.tiny's held-out stream), generate (the bounds of [data] with `seed`) or file",
        choices=EVAL_SOURCES,
    )
    paths: list[str] = field(
        default_factory=list,
        metadata=meta(
            "source = file: local evaluation files (MATH500 / AIME / AMC formats), each reported apart"
        ),
    )
    n_problems: int = option(
        64,
        "number of held-out problems (per file with source = file; fewer if the file is shorter)",
        ge=1,
    )
    seed: int = option(
        12345,
        "source = generate: seed of the held-out problems (must differ from `data.seed`)",
        ge=0,
        le=MAX_SEED,
    )
    n_samples: int = option(
        16, "samples per problem n; pass@k is reported for k = 1, 2, 4, ..., n", ge=1
    )
    temperature: float = option(1.0, "sampling temperature at evaluation", gt=0)
    top_p: float = option(1.0, "nucleus sampling threshold at evaluation", gt=0, le=1)
    top_k: int = option(0, "top-k sampling at evaluation (0 = off)", ge=0)
    max_new_tokens: int = option(
        0, "longest response at evaluation (0 = the training max_new_tokens)", ge=0
    )
    max_responses_per_call: int = option(
        4096,
        "responses per rollout call at evaluation, at most (bounds the engine's outputs)",
        ge=1,
    )


@dataclass
class VLLMConfig:
    """The colocated vLLM engine of ``backend = "vllm"`` (`llm.vllm_backend.VLLMBackend`)."""

    gpu_memory_utilization: float = option(
        0.3,
        "fraction of the GPU's memory vLLM may take (weights + KV cache); the trainer gets the rest",
        gt=0,
        lt=1,
    )
    sleep_mode: bool = option(
        True, "put the engine to sleep (free its KV cache and weights) during each update"
    )
    tensor_parallel_size: int = option(1, "vLLM tensor parallelism (GPUs per engine)", ge=1)
    max_model_len: int = option(
        0, "longest prompt + response the engine accepts (0 = vLLM's default for the model)", ge=0
    )
    enforce_eager: bool = option(False, "disable CUDA graphs (less memory, slower generation)")
    dtype: str = option("bfloat16", "engine weight dtype", choices=VLLM_DTYPES)


@dataclass
class TrainConfig:
    """One RL fine-tuning run of a causal LM on Countdown or math with a `shaping.METHODS` method."""

    task: str = option(
        "countdown",
        """a task of llm.tasks.TASKS: countdown (seed 000 App. C.1), math (boxed answers graded by
        math-verify), or any registered task""",
        choices=lambda: sorted(TASKS),
    )
    model_path: str = option(
        "runs/base_tiny",
        "local Hugging Face model directory (model + tokenizer); nothing is downloaded",
        length=(1, None),
    )
    build_base_model: bool = option(
        False,
        "build the offline tiny base model at `model_path` first (llm.tiny.ensure_base_model)",
    )
    method: str = option(
        "grpo", "shaping method, a key of shaping.METHODS", choices=lambda: sorted(shaping.METHODS)
    )
    hyper: dict[str, Any] = field(
        default_factory=dict,
        metadata=meta(
            "the method's hyper-parameters (the [hyper] table); unset ones take the method's defaults"
        ),
    )
    group_size: int = option(
        8,
        "G: responses sampled per prompt (at least 2: a group of one has advantage 0)",
        ge=2,
    )
    prompts_per_step: int = option(4, "B: prompts per training step", ge=1)
    steps: int = option(20, "number of training steps (rollout + update rounds)", ge=1)
    prompts_per_update: int = option(
        0,
        """prompts (whole groups) per optimizer step, verl's ppo_mini_batch_size: each inner epoch
        takes prompts_per_step / prompts_per_update steps in data order (0 = all: one step)""",
        ge=0,
    )
    inner_epochs: int = option(1, "mu: passes over each rollout batch (PPO epochs)", ge=1)
    micro_batch_size: int = option(
        8, "responses per forward/backward pass; gradients are accumulated over the batch", ge=1
    )
    lr: float = option(
        1e-4,
        "AdamW learning rate (peak, after warm-up); at most 1 (larger steps are never meaningful "
        "for AdamW, and near 1e38 its fp32 update overflows)",
        gt=0,
        le=MAX_LR,
    )
    weight_decay: float = option(0.0, "AdamW decoupled weight decay", ge=0)
    adam_betas: list[float] = field(
        default_factory=lambda: [0.9, 0.999],
        metadata=meta("AdamW (beta1, beta2)", ge=0, lt=1, length=(2, 2)),
    )
    schedule: str = option(
        "constant",
        "learning-rate schedule after warm-up: constant, cosine (to 0) or linear (to 0)",
        choices=SCHEDULES,
    )
    warmup_steps: int = option(0, "optimizer steps of linear warm-up from 0", ge=0)
    max_grad_norm: float = option(
        1.0, "global gradient-norm clip (0 = no clipping; the norm is still logged)", ge=0
    )
    kl_coef: float = option(
        0.0, "k3 KL penalty to the frozen base model; > 0 loads a reference copy", ge=0
    )
    entropy_coef: float = option(
        0.0, "token-entropy bonus of any method, verl's entropy_coeff (loss -= c * entropy)", ge=0
    )
    temperature: float = option(
        1.0, "sampling temperature; the trainer's log-probs use logits / temperature as well", gt=0
    )
    top_p: float = option(1.0, "nucleus sampling threshold of the rollout backend", gt=0, le=1)
    max_new_tokens: int = option(16, "longest response, in tokens", ge=1)
    max_prompt_tokens: int = option(
        0,
        """training problems whose prompt is longer (in tokens) are dropped, as verl's
        filter_overlong_prompts; 0 = keep all""",
        ge=0,
    )
    top_n: int = option(
        0,
        "candidates tracked per token (Lambda^(n) metrics, CaSP); CaSP raises it to its own top_n",
        ge=0,
    )
    template: str = option(
        "compact",
        """prompt template; countdown: compact (tiny model), base or qwen-instruct (TinyZero); math:
        llm.tasks.MATH_TEMPLATES (qwen-math, qwen3, qwen3-nothink, plain)""",
    )
    format_score: float = option(
        0.1,
        "reward of a well-formed but wrong answer (TinyZero: 0.1; correct answers score 1)",
        ge=0,
        lt=1,
    )
    distinct: str = option(
        "commutative",
        "what makes two solutions different (llm.tasks.solution_key): commutative or ac",
        choices=DISTINCT,
    )
    data: DataConfig = field(
        default_factory=DataConfig, metadata={"help": "training problems", "table": True}
    )
    eval: EvalConfig = field(
        default_factory=EvalConfig, metadata={"help": "held-out evaluation", "table": True}
    )
    seed: int = option(
        0, "seed of sampling, data order and initialization of anything random", ge=0, le=MAX_SEED
    )
    save_every: int = option(
        10,
        "checkpoint every this many steps (the last step is always saved; 0 = only the last)",
        ge=0,
    )
    log_every: int = option(1, "write metrics.jsonl / TensorBoard every this many steps", ge=1)
    backend: str = option(
        "transformers",
        "rollout backend: transformers (model.generate) or vllm (colocated engine, [vllm] table)",
        choices=BACKENDS,
    )
    vllm: VLLMConfig = field(
        default_factory=VLLMConfig,
        metadata={"help": "the vLLM engine's settings (used with backend = vllm)", "table": True},
    )
    rollout_is: str = option(
        "truncate",
        """correction for sampler/trainer log-prob mismatch: truncate (per-token weight
        min(exp(logp_old - logp_sampler), rollout_is_cap) on the surrogate, as TRL and verl) or none""",
        choices=ROLLOUT_IS,
    )
    rollout_is_cap: float = option(
        2.0, "upper bound of the truncated importance-sampling weight", ge=1
    )
    behaviour_pass: str = option(
        "auto",
        """how pi_old's log-probs, entropies and top-N candidates are obtained: auto (from the
        sampler when it is exactly the policy: transformers backend, fp32, top_p = 1, one inner
        epoch, no prompt log-probs needed; else a forward pass) or always (a forward pass, as TRL
        and verl do)""",
        choices=("auto", "always"),
    )
    device: str = option(
        "cpu",
        "torch device of the policy (cpu, cuda, cuda:0, ...); under torchrun cuda means cuda:LOCAL_RANK",
        pattern=r"cpu|cuda(:\d+)?",
        expect="cpu, cuda or cuda:N",
    )
    precision: str = option(
        "fp32",
        "fp32; bf16-mixed (fp32 weights and optimizer, bf16 compute); bf16 (bf16 weights too)",
        choices=PRECISIONS,
    )
    gradient_checkpointing: bool = option(
        False, "recompute activations in the backward pass (transformers' gradient checkpointing)"
    )
    parallel: str = option(
        "auto",
        "data parallelism under torchrun: ddp, fsdp2 (fully_shard) or auto (fsdp2 on CUDA, else ddp)",
        choices=PARALLEL,
    )
    tensorboard: bool = option(
        True,
        "write TensorBoard events to DIR/tb (skipped with a warning if tensorboard is missing)",
    )
    num_threads: int = option(
        0, "torch CPU threads (torch.set_num_threads); 0 = leave torch's default", ge=0
    )

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
        hyper = {**self.hyper, "kl_coef": self.kl_coef, "entropy_coef": self.entropy_coef}
        # Dr. GRPO divides by a constant length: the generation budget, as TRL's
        # max_completion_length (docs/formulas.md §2.2), unless [hyper] sets it.
        if "max_response_length" in shaping.METHODS[self.method].defaults:
            hyper.setdefault("max_response_length", self.max_new_tokens)
        return hyper


# ---------------------------------------------------------------------------------------------
# Field metadata: rules in words, the validation of one value, --describe

_TABLES: dict[str, type] = {"data": DataConfig, "eval": EvalConfig, "vllm": VLLMConfig}
_METHOD_WIDE = ("kl_coef", "entropy_coef")  # top-level keys, not [hyper] entries


def _options(cls: type) -> list[tuple[dataclasses.Field[Any], Any]]:
    """(field, resolved type) of every field of `cls` but the sub-tables, in declaration order."""
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls) if not f.metadata.get("table")]


def _field_docs(cls: type) -> dict[str, str]:
    """The help text of each field of the dataclass `cls` (``metadata["help"]``; '' if none)."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _choices(meta: Mapping[str, Any]) -> tuple[str, ...]:
    choices = meta.get("choices") or ()
    return tuple(choices() if callable(choices) else choices)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _bounds_text(meta: Mapping[str, Any]) -> str:
    lo = (meta.get("ge"), "[") if meta.get("ge") is not None else (meta.get("gt"), "(")
    hi = (meta.get("le"), "]") if meta.get("le") is not None else (meta.get("lt"), ")")
    if lo[0] is not None and hi[0] is not None:
        return f" in {lo[1]}{_fmt(lo[0])}, {_fmt(hi[0])}{hi[1]}"
    if lo[0] is not None:
        return f" {'>=' if lo[1] == '[' else '>'} {_fmt(lo[0])}"
    if hi[0] is not None:
        return f" {'<=' if hi[1] == ']' else '<'} {_fmt(hi[0])}"
    return ""


_NOUNS = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}
_PLURALS = {bool: "booleans", int: "integers", float: "finite numbers", str: "strings"}


def _rule_text(hint: Any, meta: Mapping[str, Any]) -> str:
    """What a field accepts, in words (e.g. 'an integer >= 2'): the errors' and --describe's text."""
    if meta.get("expect"):
        return meta["expect"]
    if typing.get_origin(hint) is dict:
        return "a table"
    if typing.get_origin(hint) is list:
        (elem,) = typing.get_args(hint)
        n_min, n_max = meta.get("length") or (0, None)
        if n_min == n_max:
            head = f"a list of {n_min}"
        else:
            head = "a non-empty list of" if n_min >= 1 else "a list of"
            head += f" at most {n_max}" if n_max is not None else ""
        return f"{head} {_PLURALS[elem]}{_bounds_text(meta)}"
    if _choices(meta):
        return f"one of {list(_choices(meta))}"
    if meta.get("pattern"):
        return f"a string matching {meta['pattern']!r}"
    if hint is str and (meta.get("length") or (0,))[0] >= 1:
        return "a non-empty string"
    return _NOUNS[hint] + _bounds_text(meta)


def _scalar_ok(value: Any, hint: Any, meta: Mapping[str, Any]) -> bool:
    if hint is bool or hint is str:
        return isinstance(value, hint)
    # bool is an int subclass, and an integer is a valid float (TOML writes 1e-4 but also 0).
    numeric = (int, float) if hint is float else (int,)
    if isinstance(value, bool) or not isinstance(value, numeric):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return not (
        (meta.get("ge") is not None and value < meta["ge"])
        or (meta.get("gt") is not None and value <= meta["gt"])
        or (meta.get("le") is not None and value > meta["le"])
        or (meta.get("lt") is not None and value >= meta["lt"])
    )


def _value_ok(value: Any, hint: Any, meta: Mapping[str, Any]) -> bool:
    """Whether `value` has the type `hint` and obeys the rules in `meta` (see `option`)."""
    if typing.get_origin(hint) is dict:
        return isinstance(value, dict)
    if typing.get_origin(hint) is list:
        (elem,) = typing.get_args(hint)
        n_min, n_max = meta.get("length") or (0, None)
        return (
            isinstance(value, list)
            and n_min <= len(value)
            and (n_max is None or len(value) <= n_max)
            and all(_scalar_ok(v, elem, meta) for v in value)
        )
    if hint is str and isinstance(value, str):
        n_min, n_max = meta.get("length") or (0, None)
        choices, pattern = _choices(meta), meta.get("pattern")
        return (
            n_min <= len(value)
            and (n_max is None or len(value) <= n_max)
            and (not choices or value in choices)
            and (pattern is None or re.fullmatch(pattern, value) is not None)
        )
    return _scalar_ok(value, hint, meta)


def describe() -> str:
    """Every config key with its default (as TOML), documentation and accepted values, then each
    method's hyper-parameters with their defaults (the `--help` of a config file)."""
    lines = []
    for prefix, cls in (("", TrainConfig), *((f"{n}.", c) for n, c in _TABLES.items())):
        for f, hint in _options(cls):
            rule = _rule_text(hint, f.metadata)
            help_ = f.metadata.get("help", "")
            lines.append(f"{prefix}{f.name} = {_toml_value(_default(f))}  # {help_} ({rule})")
    lines += [
        "",
        "hyper.NAME = VALUE  # the method's hyper-parameters ([hyper]); per method, with defaults:",
    ]
    for name, m in sorted(shaping.METHODS.items()):
        own = ", ".join(
            f"{k} = {_toml_value(v)}" for k, v in m.defaults.items() if k not in _METHOD_WIDE
        )
        lines.append(f"  {name}: {own or '(none)'}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Loading, --set overrides and validation


def _build(cls: type, table: dict[str, Any], where: str) -> Any:
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ValueError(f"{where}unknown key(s) {unknown}; known: {sorted(known)}")
    return cls(**table)


def config_from_dict(raw: Mapping[str, Any]) -> TrainConfig:
    """A validated `TrainConfig` from a parsed TOML document.

    Raises:
        ValueError: an unknown key or an invalid value (the message names the field).
    """
    raw = dict(raw)
    tables = {name: raw.pop(name, {}) for name in _TABLES}
    for name, table in (*tables.items(), ("hyper", raw.get("hyper", {}))):
        if not isinstance(table, dict):
            raise ValueError(f"{name}: expected a table, got {table!r}")
    cfg = _build(TrainConfig, raw, "")
    for name, cls in _TABLES.items():
        setattr(cfg, name, _build(cls, tables[name], f"{name}: "))
    validate(cfg)
    return cfg


def parse_value(text: str) -> Any:
    """A ``--set`` value: a TOML literal (``3e-4``, ``true``, ``"grpo"``, ``[1, 8]``,
    ``{seed = 3}``, ``inf``), else `text` itself as a string (so ``method=ds_grpo`` works)."""
    try:
        doc = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return text
    return doc["v"] if doc.keys() == {"v"} else text


def _check_override_key(key: str, pair: str) -> None:
    *tables, name = key.split(".")
    top = [f.name for f in dataclasses.fields(TrainConfig)]
    if not tables:
        known = top
    elif len(tables) == 1 and tables[0] == "hyper":
        return  # the method's names are checked by validate, once the method is known
    elif len(tables) == 1 and tables[0] in _TABLES:
        known = [f.name for f in dataclasses.fields(_TABLES[tables[0]])]
    else:
        raise ValueError(
            f"--set {pair}: unknown key {key!r}; dotted keys are TABLE.NAME with TABLE one of "
            f"{['hyper', *_TABLES]}"
        )
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"did you mean {close}?" if close else f"known: {known}"
        raise ValueError(f"--set {pair}: unknown key {key!r}; {hint} (see --describe)")


def apply_overrides(raw: Mapping[str, Any], pairs: Iterable[str]) -> dict[str, Any]:
    """A copy of the parsed config `raw` with each ``KEY=VALUE`` of `pairs` applied in order.

    KEY is a top-level key (``lr``) or ``TABLE.NAME`` (``data.seed``, ``vllm.dtype``,
    ``hyper.gamma_p``); VALUE is parsed by `parse_value`. A table value (``data={seed = 3}``) is
    merged into the table. Values are checked later, by `config_from_dict`.

    Raises:
        ValueError: a pair without ``=``, or an unknown key (the message names the pair).
    """
    out = copy.deepcopy(dict(raw))
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--set {pair!r}: expected KEY=VALUE (e.g. lr=3e-4 or data.seed=3)")
        _check_override_key(key, pair)
        value = parse_value(text.strip())
        *tables, name = key.split(".")
        target = out
        for t in tables:
            target = target.setdefault(t, {})
            if not isinstance(target, dict):
                raise ValueError(f"--set {pair}: [{t}] of the config is {target!r}, not a table")
        if isinstance(value, dict) and isinstance(target.get(name), dict):
            target[name] = {**target[name], **value}
        else:
            target[name] = value
    return out


def load_config(
    path: str | os.PathLike[str], *, sets: Iterable[str] = (), **overrides: Any
) -> TrainConfig:
    """Read a TOML config, apply the ``KEY=VALUE`` strings of `sets` (`apply_overrides`), then
    `overrides` (top-level fields, e.g. ``steps=2``; None leaves a field alone), and validate.

    Raises:
        ValueError: invalid TOML, an unknown key or an invalid value (naming the field).
        FileNotFoundError: no such file.
    """
    if Path(path).is_dir():
        raise IsADirectoryError(f"config: {str(path)!r} is a folder, not a TOML file")
    with Path(path).open("rb") as f:
        try:
            raw = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: invalid TOML: {e}") from None
        except UnicodeDecodeError as e:
            raise ValueError(
                f"{path}: not a UTF-8 text file (a TOML config is text; byte {e.start})"
            ) from None
    raw = apply_overrides(raw, sets)
    raw.update({k: v for k, v in overrides.items() if v is not None})
    return config_from_dict(raw)


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


def _require(ok: bool, name: str, value: object, expect: str) -> None:
    if not ok:
        raise ValueError(f"{name}: expected {expect}, got {value!r}")


def validate(cfg: TrainConfig) -> None:
    """Check every field of `cfg` and its tables against its metadata (type, choices, bounds; see
    `option`), then the rules between fields (`_cross_field_rules`), then the method's
    hyper-parameters (`_validate_hyper`).

    Raises:
        ValueError: the first invalid field, named with its value.
    """
    for prefix, obj in (("", cfg), *((f"{n}.", getattr(cfg, n)) for n in _TABLES)):
        for f, hint in _options(type(obj)):
            value = getattr(obj, f.name)
            _require(
                _value_ok(value, hint, f.metadata),
                prefix + f.name,
                value,
                _rule_text(hint, f.metadata),
            )
    _cross_field_rules(cfg)
    _validate_hyper(cfg)


def _cross_field_rules(c: TrainConfig) -> None:
    """Every rule that involves more than one field (each field's own rules are its metadata)."""
    for key in _METHOD_WIDE:
        if key in c.hyper:
            raise ValueError(
                f"hyper.{key} = {c.hyper[key]!r}: set the top-level {key} instead"
                + (" (it also loads the reference)" if key == "kl_coef" else "")
            )
    _require(
        c.prompts_per_update == 0 or c.prompts_per_step % c.prompts_per_update == 0,
        "prompts_per_update",
        c.prompts_per_update,
        f"0 or an integer dividing prompts_per_step ({c.prompts_per_step})",
    )
    task = TASKS[c.task]
    _require(
        c.template in task.templates, "template", c.template, f"one of {task.templates} ({c.task})"
    )
    if c.backend == "vllm":
        _require(c.device.startswith("cuda"), "device", c.device, "cuda with backend = vllm")
    d, e = c.data, c.eval
    if not task.tiny_data:
        _require(d.source != "tiny", "data.source", d.source, f"generate or file (task = {c.task})")
        _require(e.source != "tiny", "eval.source", e.source, f"generate or file (task = {c.task})")
    _require(
        (d.source == "file") == bool(d.path), "data.path", d.path, "set iff data.source = 'file'"
    )
    _require(all(e.paths), "eval.paths", e.paths, "a list of file paths (none empty)")
    _require(
        (e.source == "file") == bool(e.paths), "eval.paths", e.paths, "set iff eval.source = 'file'"
    )
    _require(
        d.max_number >= d.min_number,
        "data.max_number",
        d.max_number,
        f"an integer >= data.min_number ({d.min_number})",
    )
    _require(
        d.max_target >= d.min_target,
        "data.max_target",
        d.max_target,
        f"an integer >= data.min_target ({d.min_target})",
    )
    if e.source == d.source == "generate":
        _require(e.seed != d.seed, "eval.seed", e.seed, f"a seed other than data.seed ({d.seed})")


def _validate_hyper(c: TrainConfig) -> None:
    """Names and types of [hyper] against ``shaping.METHODS[method].defaults`` (a float default
    takes any finite number, an int default an integer, ...), then the method run once on a tiny
    batch (B=1, G=group_size, T=2) so that shaping's own rules (ranges, ``k <= G``, ...) apply."""
    method = shaping.METHODS[c.method]
    for key, value in c.hyper.items():
        if key not in method.defaults:
            known = sorted(k for k in method.defaults if k not in _METHOD_WIDE)
            raise ValueError(
                f"hyper.{key} = {value!r}: not a hyper-parameter of {c.method}; known: {known}"
            )
        default = method.defaults[key]
        if type(default) in _NOUNS:
            _require(
                _value_ok(value, type(default), {}),
                f"hyper.{key}",
                value,
                f"{_rule_text(type(default), {})} (as {c.method}'s default {default!r})",
            )
    try:
        needs = method.needs_for(**c.method_hyper())
        batch = shaping.example_batch(needs, 1, c.group_size, 2, max(c.n_candidates, 1), np)
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
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise ValueError(f"cannot write {type(v).__name__} {v!r} to TOML")


def config_to_toml(cfg: TrainConfig) -> str:
    """The resolved config as TOML: top-level keys, then [hyper] (with the method's defaults filled
    in), [data], [eval] and [vllm]. `load_config` of the result gives back an equal config."""
    docs = _field_docs(TrainConfig)
    lines = ["# Resolved training config (llm/config.py documents every key)."]
    for f, _ in _options(TrainConfig):
        if f.name == "hyper":
            continue
        lines.append(f"{f.name} = {_toml_value(getattr(cfg, f.name))}  # {docs[f.name]}")
    defaults = {
        k: v for k, v in shaping.METHODS[cfg.method].defaults.items() if k not in _METHOD_WIDE
    }
    hyper = {**defaults, **cfg.hyper}
    lines += ["", "[hyper]  # method hyper-parameters, resolved with the method's defaults"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in hyper.items()]
    for name in _TABLES:
        sub = getattr(cfg, name)
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
